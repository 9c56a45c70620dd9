"""What the built-in self-test models' phases cost on this machine, in its small operations: the figures the time
plan predicts them from (engine/planning/small_work.py, the SmallWork in engine/models/spec.py).

The self-test models' layers are a few channels wide: their arithmetic is nothing, their time is the calls and the
narrow layers' work per pixel, which the calibrated rates (measured at the released models' widths) do not tell.
So each phase is counted in this machine's small operations (the calibration's ``small_op_seconds``), fitted here
as a fixed cost plus what grows with the video: the engine (engine/run/engine.py, as a job runs it, the CPU plan)
runs both self-test models at two sizes and three lengths, a longer video in windows, a still and a run without
guidance, and video to video from three of the outputs; each first on a fresh engine (a load) and then loaded. The fits:

- denoise of text to video: steps x passes x (a pass's fixed + per token);
- image to video's condition through the VAE's encoder (inside its denoise): per frame-pixel, beyond the pass's;
- a video-to-video input read and through the VAE's encoder: fixed + per frame-pixel;
- the VAE's decode: fixed + per latent frame x (fixed + per output pixel);
- load, placing, a prompt's first encode, the image's encode: their means.

    python -m bench.small_work OUT.json
    python -m bench.small_work OUT.json --refit     (the fits again from the runs OUT.json holds)
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

CONFIGS = [dict(mode=mode, width=size, height=size, frames=frames, guidance=5.0)
           for mode in ("t2v", "i2v") for size in (64, 128) for frames in (9, 41, 121)] + [
    dict(mode="t2v", width=64, height=64, frames=9, guidance=1.0),
    dict(mode="t2v", width=64, height=64, frames=241, guidance=5.0),
    dict(mode="t2v", width=64, height=64, frames=1, guidance=5.0)]
# Video to video from the outputs of these text-to-video runs (width, height, frames), as the runs made them.
FROM_VIDEOS = ((64, 64, 9), (64, 64, 41), (128, 128, 41))


def measure(folder: Path) -> dict:
    """Each configuration run twice (loaded the second time) through the engine; their phases' seconds."""
    from PIL import Image

    from engine.device.calibrate import Calibration
    from engine.device.hardware import detect_hardware
    from engine.events import JobFinished
    from engine.models.spec import SELFTEST_SPECS
    from engine.run.engine import Engine
    from engine.settings.presets import load_presets
    from engine.settings.request import GenerationRequest, check_request

    presets, image = load_presets(), folder / "image.png"
    Image.new("RGB", (128, 128), (200, 40, 10)).save(image)
    hardware, outputs, runs, made = detect_hardware(), folder / "outputs", [], {}
    for config in CONFIGS + [dict(mode="v2v", width=w, height=h, frames=f, guidance=5.0) for w, h, f in FROM_VIDEOS]:
        config = dict(config)
        mode = config.pop("mode")
        ref = "selftest-i2v" if mode == "i2v" else "selftest-t2v"
        engine = Engine(folder / "models", hardware=hardware, preview_seconds=-1, calibrate=True)
        for again in (False, True):
            size = (config["width"], config["height"], config["frames"])
            extra = ({"image": str(image)} if mode == "i2v" else
                     {"video": made[size], "strength": 0.6} if mode == "v2v" else {})
            request = check_request(GenerationRequest.from_preset(
                presets[ref], "a red fox in the snow", mode=mode, model=ref, outputs_dir=str(outputs),
                seed=int(again), **config, **extra))
            events: list = []
            result = engine.run(request, "bench", events.append, lambda: False)
            if not isinstance(result, JobFinished):
                raise SystemExit(f"{ref} {config}: {result}")
            made.setdefault(size, result.paths[0])
            spec = SELFTEST_SPECS[ref]
            runs.append(dict(mode=mode, loaded=again, **config, steps=request.settings.denoise_steps,
                             tokens=spec.tokens(config["width"], config["height"], min(config["frames"],
                                                                                       spec.clip_frames)),
                             windows=-(-config["frames"] // spec.clip_frames),
                             timings={str(k): v for k, v in result.timings.items()}))
            print(mode, config, "loaded" if again else "first", runs[-1]["timings"], flush=True)
    calibration = Calibration.load(outputs, hardware)
    return {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "small_op_seconds": calibration.small_op_seconds, "runs": runs}


def _least_squares(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares of the relative error (each row over its own measured value): a short run's figure counts as
    much as a long one's."""
    import numpy

    weighted = numpy.array(rows) / numpy.array(ys)[:, None]
    solved, *_ = numpy.linalg.lstsq(weighted, numpy.ones(len(ys)), rcond=None)
    return [max(float(v), 0.0) for v in solved]


def fit(data: dict) -> dict:
    """The SmallWork figures, in small operations, from the runs."""
    op, runs = data["small_op_seconds"], data["runs"]

    def passes(run) -> int:
        return run["steps"] * (2 if run["guidance"] > 1.0 else 1) * run["windows"]

    t2v = [r for r in runs if r["mode"] == "t2v" and r["frames"] > 1]   # (v2v's passes are fewer: its steps)
    pass_fixed, pass_token = _least_squares([[1.0, r["tokens"]] for r in t2v],
                                            [r["timings"]["denoise"] / passes(r) / op for r in t2v])
    i2v = [r for r in runs if r["mode"] == "i2v"]
    encode = [(r["timings"]["denoise"] / op - passes(r) * (pass_fixed + pass_token * r["tokens"]))
              / (r["frames"] * r["width"] * r["height"]) for r in i2v]
    from_video = [r for r in runs if r["mode"] == "v2v"]
    video = _least_squares([[1.0, r["frames"] * r["width"] * r["height"]] for r in from_video],
                           [r["timings"]["video_encode"] / op for r in from_video])
    videos = [r for r in runs if r["frames"] > 1]
    decode = _least_squares([[1.0, _latent(r), _latent(r) * r["width"] * r["height"]] for r in videos],
                            [r["timings"]["vae_decode"] / op for r in videos])
    first = [r for r in runs if not r["loaded"]]
    prompts = [r["timings"]["text_encode"] / op / (2 if r["guidance"] > 1.0 else 1) for r in first]
    return {"load": statistics.median(r["timings"]["load"] / op for r in first),
            "transfer": statistics.median(r["timings"]["transfer"] / op for r in first),
            "prompt": statistics.median(prompts),
            "image": statistics.median(r["timings"]["image_encode"] / op for r in i2v),
            "pass_fixed": pass_fixed, "pass_token": pass_token,
            "encode_pixel": max(statistics.median(encode), 0.0),
            "video_fixed": video[0], "video_pixel": video[1],
            "decode_fixed": decode[0], "decode_latent": decode[1], "decode_pixel": decode[2]}


def _latent(run) -> int:
    return (run["frames"] - 1) // 4 + 1


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    if "--refit" in argv:
        data = json.loads(out.read_text())
    else:
        with tempfile.TemporaryDirectory() as folder:
            data = measure(Path(folder))
    data["fit"] = {k: round(v, 4) for k, v in fit(data).items()}
    out.write_text(json.dumps(data, indent=1))
    print(json.dumps(data["fit"], indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main(sys.argv[1:]))
