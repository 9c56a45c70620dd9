"""The steps after a video is written, on this machine's CPU, through the app's own StepRunner (engine/post/apply.py):
the rates the time plan predicts them from where no GPU runs them (engine/planning/post_time.py).

Each method runs on small videos of the moving pattern bench/post_gpu.py uses, at two lengths, two sizes and both
factors, so its fixed cost is told apart from its work: smoother 2x and 4x with ffmpeg's minterpolate and with RIFE
4.7 (random weights, float32), larger 2x and 4x with Lanczos and with two ESRGANs (random weights, float32, in
512-pixel tiles): one of RealESRGAN_x4plus's size and a small one, to check the work grows with the file's size.
Beside them, the app's own quick CPU calibration (engine/device/calibrate.py, as the engine runs it on a CPU), whose
matrix rate the predictions of RIFE and an upscaler on a CPU scale by on another machine. Each run is made three
times and the median kept (the cores are shared), and each method's seconds are fitted as a fixed cost plus its work
over a rate: the megapixels of the frames it writes (minterpolate, Lanczos), of the frames RIFE makes (padded as
RIFE pads them), of the frames an upscaler reads times its file's size against RealESRGAN_x4plus's; the two
upscalers together also give the share of an upscaler's work that does not grow with its file ("upscaler").

    python -m bench.post_cpu OUT.json
    python -m bench.post_cpu OUT.json --refit     (the fits again from the runs OUT.json holds)

Run offline (HF_HUB_OFFLINE=1, set here): with no RIFE file the smoother would first try to fetch one, and the
fallback's seconds are what is measured.
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.post_gpu import clip
from engine.device.calibrate import calibrate
from engine.outputs.export import write_mp4
from engine.outputs.export_rates import export_rates
from engine.post.apply import Media, StepRunner, run_steps
from engine.post.rife import PAD_MULTIPLE, write_random_rife
from engine.post.steps import PostStep
from engine.post.upscale import write_random_esrgan
from engine.run.job import Job

FPS = 16
# (width, height, frames) of the videos each method runs on: two lengths at one size, and a larger size.
VIDEOS = {"minterpolate": ((416, 240, 17), (416, 240, 33), (832, 480, 9)),
          "lanczos": ((416, 240, 17), (416, 240, 33), (832, 480, 9)),
          "rife": ((416, 240, 9), (416, 240, 17), (832, 480, 5)),
          "esrgan": ((128, 96, 2), (128, 96, 4)),
          "esrgan_small": ((128, 96, 2), (256, 192, 4))}
FACTORS = {"minterpolate": (2, 4), "lanczos": (2, 4), "rife": (2, 4), "esrgan": (2,), "esrgan_small": (2, 4)}
REPEATS = 3
# About RealESRGAN_x4plus.pth's size (ESRGAN, 64 features, 23 blocks, float32): what an upscaler's work is counted
# against.
REFERENCE_UPSCALER_BYTES = 67_000_000
# The work each method's seconds are fitted against.
WORK = {"minterpolate": "out_mp", "lanczos": "out_mp", "rife": "made_mp", "esrgan": "model_mp",
        "esrgan_small": "model_mp"}


def _padded(side: int) -> int:
    return -(-side // PAD_MULTIPLE) * PAD_MULTIPLE


def _work(method: str, step: PostStep, width: int, height: int, frames: int, models: Path) -> dict:
    """What the time model counts for this step: the frames' megapixels in and out, those RIFE makes (padded)."""
    out_frames = (frames - 1) * step.factor + 1 if step.kind == "interpolate" else frames
    out_pixels = width * height * (1 if step.kind == "interpolate" else step.factor ** 2)
    work = {"in_mp": frames * width * height / 1e6, "out_mp": out_frames * out_pixels / 1e6}
    if method == "rife":
        work["made_mp"] = (out_frames - frames) * _padded(width) * _padded(height) / 1e6
    if method.startswith("esrgan"):
        work["file_bytes"] = next((models / "upscalers").iterdir()).stat().st_size
        work["model_mp"] = work["in_mp"] * work["file_bytes"] / REFERENCE_UPSCALER_BYTES
    return work


def _run_once(step: PostStep, media: Media, models: Path, dest: Path) -> tuple[float, str]:
    job = Job("bench", lambda event: None)
    start = time.perf_counter()
    _, records = run_steps(job, StepRunner(models, "cpu", job), (step,), media, dest)
    return time.perf_counter() - start, records[0].method


def _models(root: Path) -> dict:
    """The models folder each method reads: none (the fallbacks), a RIFE file, one ESRGAN file or the other."""
    folders = {name: root / name for name in ("none", "rife", "esrgan", "esrgan_small")}
    for folder in folders.values():
        folder.mkdir()
    write_random_rife(folders["rife"] / "interpolators" / "rife47.pth")
    (folders["esrgan"] / "upscalers").mkdir()
    write_random_esrgan(folders["esrgan"] / "upscalers" / "x4plus.pth", scale=4, features=64, blocks=23)
    (folders["esrgan_small"] / "upscalers").mkdir()
    write_random_esrgan(folders["esrgan_small"] / "upscalers" / "small.pth", scale=4, features=32, blocks=2)
    return {"minterpolate": folders["none"], "lanczos": folders["none"], "rife": folders["rife"],
            "esrgan": folders["esrgan"], "esrgan_small": folders["esrgan_small"]}


def _calibrations() -> dict:
    """The quick CPU calibration, three times: the median of the rates the predictions scale by."""
    made = [calibrate("cpu", "float32", quick=True, export_rates=export_rates) for _ in range(3)]
    return {"cpu_matmul_tflops": statistics.median(c.cpu_matmul_tflops for c in made),
            "encode_megapixels_per_s": statistics.median(c.encode_megapixels_per_s or 0.0 for c in made),
            "encode_fixed_s": statistics.median(c.encode_fixed_s or 0.0 for c in made),
            "each": [{"cpu_matmul_tflops": c.cpu_matmul_tflops, "encode_megapixels_per_s": c.encode_megapixels_per_s}
                     for c in made]}


def main(out: str) -> None:
    import os

    import torch

    os.environ["HF_HUB_OFFLINE"] = "1"   # the fallback's own seconds, not a fetch's (engine/post/apply.py)

    root = Path(tempfile.mkdtemp())
    models = _models(root)
    results = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
               "calibration": _calibrations(), "runs": []}
    for method, videos in VIDEOS.items():
        kind = "interpolate" if method in ("minterpolate", "rife") else "upscale"
        for width, height, frames in videos:
            path = root / f"in-{width}x{height}x{frames}.mp4"
            if not path.exists():
                write_mp4(clip(width, height, frames), path, FPS)
            media = Media.read(path)
            for factor in FACTORS[method]:
                step = PostStep(kind, factor)
                _run_once(step, media, models[method], root / "warm.mp4")   # warm-up: imports, the file read once
                timed = [_run_once(step, media, models[method], root / f"out{i}.mp4") for i in range(REPEATS)]
                seconds, how = statistics.median(t for t, _ in timed), timed[0][1]
                run = {"method": method, "how": how, "step": kind, "factor": factor, "width": width,
                       "height": height, "frames": frames, "seconds": round(seconds, 3),
                       **_work(method, step, width, height, frames, models[method])}
                results["runs"].append(run)
                print(json.dumps(run), flush=True)
    _write_fits(results, out)


def _write_fits(results: dict, out: str) -> None:
    results["fits"] = {method: _fit(method, results["runs"]) for method in VIDEOS}
    results["fits"]["upscaler"] = _upscaler_fit(results["runs"])
    print(json.dumps(results["fits"], indent=2))
    Path(out).write_text(json.dumps(results, indent=2) + "\n")


def _upscaler_fit(runs: list[dict]) -> dict:
    """The two ESRGANs together: seconds a megapixel read = a x (file bytes / REFERENCE_UPSCALER_BYTES) + b, the b
    the work that does not grow with the file (the upsampling layers at the larger sizes, the tiles' conversions);
    ``base`` is b / a, ``reference_mp_per_s`` the reference-size file's megapixels read a second, and each file's
    fixed seconds (reading and building it)."""
    per = {}
    for method in ("esrgan", "esrgan_small"):
        points = [(run["in_mp"], run["seconds"]) for run in runs if run["method"] == method and run["factor"] == 2]
        (x0, y0), (x1, y1) = sorted(points)
        slope = (y1 - y0) / (x1 - x0)
        ratio = next(run["file_bytes"] for run in runs if run["method"] == method) / REFERENCE_UPSCALER_BYTES
        per[method] = (ratio, slope, y0 - slope * x0)
    (r_big, s_big, f_big), (r_small, s_small, f_small) = per["esrgan"], per["esrgan_small"]
    a = (s_big - s_small) / (r_big - r_small)
    b = s_big - a * r_big
    return {"base": round(b / a, 3), "reference_mp_per_s": round(1 / (a + b), 5),
            "fixed_s": {"esrgan": round(f_big, 3), "esrgan_small": round(f_small, 3)},
            "size_ratio": {"esrgan": round(r_big, 4), "esrgan_small": round(r_small, 4)}}


def _fit(method: str, runs: list[dict]) -> dict:
    """seconds = fixed + work / rate over ``method``'s runs (least squares; the fixed cost at least 0)."""
    points = [(run[WORK[method]], run["seconds"]) for run in runs if run["method"] == method]
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    fixed = my - slope * mx
    if fixed < 0:
        fixed, slope = 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    return {"work": WORK[method], "mp_per_s": round(1 / slope, 4), "fixed_s": round(fixed, 3)}


if __name__ == "__main__":
    if sys.argv[2:] == ["--refit"]:
        _write_fits(json.loads(Path(sys.argv[1]).read_text()), sys.argv[1])
    else:
        main(sys.argv[1])
