"""The steps after a video is written, on one GPU, side by side with their fallbacks: smoother 2x (RIFE 4.7 at real
size, random weights, float16, against ffmpeg's minterpolate on the CPU) and larger 2x (an ESRGAN of
RealESRGAN_x4plus's size, random weights, float16 in 512-pixel tiles, against Lanczos), each on an 81-frame video at
832x480 through the app's own StepRunner (engine/post/apply.py): seconds in all, frames made a second, and the
device memory at its peak (what the planner counts for the step).

    python -m bench.post_gpu OUT.json
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from engine.outputs.export import write_mp4
from engine.post.apply import Media, StepRunner, run_steps
from engine.post.rife import write_random_rife
from engine.post.steps import PostStep
from engine.post.upscale import write_random_esrgan
from engine.run.job import Job

WIDTH, HEIGHT, FRAMES, FPS = 832, 480, 81, 16
# On a machine without a GPU: a small run of the same code, to check the script before it spends GPU time.
GPU = "cuda" if torch.cuda.is_available() else "cpu"
if GPU == "cpu":
    WIDTH, HEIGHT, FRAMES = 64, 48, 5


def clip(width: int, height: int, frames: int) -> np.ndarray:
    """A moving pattern (so motion search and the codec have something to do), uint8 (F, H, W, 3)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = [np.stack([np.sin((x + 6 * i) / 23.0), np.cos((y - 4 * i) / 17.0), np.sin((x + y + 5 * i) / 31.0)], -1)
           for i in range(frames)]
    return ((np.stack(out) * 0.5 + 0.5) * 255).astype(np.uint8)


def run(step: PostStep, media: Media, models: Path, dest: Path, device: str) -> dict:
    job = Job("bench", lambda event: None)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if device == "cuda" else 0
    start = time.perf_counter()
    made, records = run_steps(job, StepRunner(models, device, job), (step,), media, dest)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30 if device == "cuda" else None
    return {"step": step.kind, "factor": step.factor, "method": records[0].method, "device": device,
            "seconds": round(seconds, 3), "frames_made": made.frames, "frames_per_s": round(made.frames / seconds, 2),
            "size": f"{made.width}x{made.height}", "peak_device_gb": None if peak is None else round(peak, 3)}


def main(out: str) -> None:
    root = Path(tempfile.mkdtemp())
    media_path = root / "in.mp4"
    write_mp4(clip(WIDTH, HEIGHT, FRAMES), media_path, FPS)
    media = Media.read(media_path)
    rife_models, esrgan_models, none = root / "rife", root / "esrgan", root / "none"
    (rife_models / "interpolators").mkdir(parents=True)
    (esrgan_models / "upscalers").mkdir(parents=True)
    write_random_rife(rife_models / "interpolators" / "rife47.pth")
    write_random_esrgan(esrgan_models / "upscalers" / "RealESRGAN_x4plus.pth", scale=4, features=64, blocks=23)
    results = {"gpu": torch.cuda.get_device_name(0) if GPU == "cuda" else "none (a check run)", "torch": torch.__version__,
               "video": {"frames": FRAMES, "width": WIDTH, "height": HEIGHT, "fps": FPS}, "runs": []}
    smoother, larger = PostStep("interpolate", 2), PostStep("upscale", 2)
    run(smoother, media, rife_models, root / "warm.mp4", GPU)   # warm-up: cuDNN's choices, the file read once
    for step, models, device, name in ((smoother, rife_models, GPU, "rife"), (smoother, none, "cpu", "mint"),
                                       (larger, esrgan_models, GPU, "esrgan"), (larger, none, "cpu", "lanczos")):
        result = run(step, media, models, root / f"{name}.mp4", device)
        results["runs"].append(result)
        print(json.dumps(result), flush=True)
    write_mp4(clip(1280, 720, 17), root / "720.mp4", FPS)
    result = run(smoother, Media.read(root / "720.mp4"), rife_models, root / "rife720.mp4", GPU)
    results["runs"].append({**result, "note": "17 frames at 1280x720: RIFE's peak grows with the frame's pixels"})
    print(json.dumps(results["runs"][-1]), flush=True)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
