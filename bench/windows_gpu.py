"""A long video's denoising step in windows against an 81-frame step, side by side on one GPU.

Wan2.1 T2V 1.3B at real size (random weights, bf16) at 832x480: one denoising step (two transformer passes:
guidance) at 81 frames, at 241 frames in windows of 81 (the engine's own blended pass, engine/run/windows.py,
overlap 16), and at 241 frames in one pass (what the model was not trained for, for scale). Each: seconds per step
(the median of a few after a warm-up) and the device memory the step adds to the weights at its peak.

    python -m bench.windows_gpu OUT.json
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from bench.realsize import latent_shape, transformer
from engine.models.windows import OVERLAP_FRAMES, windows_for
from engine.run.windows import blended_pass

WIDTH, HEIGHT = 832, 480
STEPS = 4   # timed, after one warm-up step


def _step(model, latents, text, windows):
    """One step's two passes (conditional and unconditional) over ``latents``, whole or in ``windows``."""
    timestep = torch.tensor([500.0], device="cuda")
    for _ in range(2):
        kwargs = {"hidden_states": latents, "timestep": timestep, "encoder_hidden_states": text, "return_dict": False}
        if windows is None:
            model(**kwargs)
        else:
            blended_pass(model.forward, windows, lambda i, n: None, model, (), kwargs)


def measure(model, frames: int, window: int | None) -> dict:
    windows = windows_for(frames, window, OVERLAP_FRAMES) if window else None
    latents = torch.randn(latent_shape(WIDTH, HEIGHT, frames), device="cuda", dtype=torch.bfloat16)
    text = torch.randn(1, 512, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        _step(model, latents, text, windows)   # warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        seconds = []
        for _ in range(STEPS):
            start = time.perf_counter()
            _step(model, latents, text, windows)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() - before
    return {"frames": frames, "window": window, "windows": windows.count if windows else 1,
            "windows_spans": [list(s) for s in windows.spans] if windows else None,
            "step_seconds": round(statistics.median(seconds), 4), "all_step_seconds": [round(s, 4) for s in seconds],
            "step_peak_gib": round(peak / 2**30, 3)}


def main(out: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    model = transformer("wan21-1.3b")
    weights = torch.cuda.memory_allocated()
    rows = [measure(model, 81, None), measure(model, 241, 81), measure(model, 241, None)]
    short = rows[0]
    for row in rows:
        row["step_vs_81"] = round(row["step_seconds"] / short["step_seconds"], 3)
        row["peak_vs_81"] = round(row["step_peak_gib"] / short["step_peak_gib"], 3)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "size": f"{WIDTH}x{HEIGHT}",
              "model": "Wan2.1 T2V 1.3B (random weights, bf16, SDPA)", "weights_gib": round(weights / 2**30, 3),
              "overlap_frames": OVERLAP_FRAMES, "rows": rows}
    print(json.dumps(result, indent=2))
    with open(out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
