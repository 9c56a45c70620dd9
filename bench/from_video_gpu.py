"""Runs that start from a video, on one GPU: what the planner and the time plan count for them, measured.

- Video to video's input encode (engine/run/video_input.py's encode_video, the app's own code) at real size
  (the Wan2.1 VAE, and Wan2.2 TI2V-5B's, random weights) for an 81-frame 832x480 input: its seconds against
  decoding as many frames (the time plan counts encode = VIDEO_ENCODE_SHARE x decode), and the device memory it
  adds at its peak against the planner's vae_encode_gb.
- An extension's join (engine/post/extend.py's join) of an 81-frame 832x480 video and an 81-frame part: its seconds
  against the time plan's, and that the video's frames come through bit for bit.

    python -m bench.from_video_gpu OUT.json
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from bench.realsize import vae as real_vae
from engine.models.spec import KNOWN_MODELS
from engine.outputs.export import read_video, write_mp4
from engine.planning import memory
from engine.planning.export_time import join_seconds as _join
from engine.planning.vae_time import VIDEO_ENCODE_SHARE, VIDEO_ENCODE_SHARE_WAN22
from engine.post.extend import join
from engine.run.job import Job
from engine.run.video_input import encode_video
from engine.settings.request import GenerationRequest
from engine.settings.values import Settings
from engine.settings.videos import read_video as read_input

WIDTH, HEIGHT, FRAMES, FPS = 832, 480, 81, 16
GPU = "cuda" if torch.cuda.is_available() else "cpu"
if GPU == "cpu":   # a small run of the same code, to check the script before it spends GPU time
    WIDTH, HEIGHT, FRAMES = 64, 64, 9
MODELS = {"wan21": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "wan22-5b": "Wan-AI/Wan2.2-TI2V-5B-Diffusers"}


def clip(width: int, height: int, frames: int, shift: int = 0) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = [np.stack([np.sin((x + 6 * i + shift) / 23.0), np.cos((y - 4 * i) / 17.0),
                     np.sin((x + y + 5 * i) / 31.0)], -1) for i in range(frames)]
    return ((np.stack(out) * 0.5 + 0.5) * 255).astype(np.uint8)


def _cpu_vae(wan22: bool, dtype):
    from diffusers import AutoencoderKLWan

    from bench.realsize import VAE22
    return (AutoencoderKLWan(**VAE22) if wan22 else AutoencoderKLWan()).to(dtype).eval()


def _sync():
    if GPU == "cuda":
        torch.cuda.synchronize()


def encode_row(name: str, dtype, video: Path) -> dict:
    """The input encode through the app's code, and the decode of what it made, each timed after a warm-up."""
    wan22 = name == "wan22-5b"
    vae = real_vae(wan22, dtype) if GPU == "cuda" else _cpu_vae(wan22, dtype)
    request = GenerationRequest(Settings("m", "v2v", WIDTH, HEIGHT, FRAMES, 10, 5.0, 3.0, fps=FPS), "x", video=str(video))
    pipe = SimpleNamespace(vae=vae)
    with torch.inference_mode():
        warm = GenerationRequest(Settings("m", "v2v", WIDTH, HEIGHT, 5, 10, 5.0, 3.0, fps=FPS), "x", video=str(video))
        encode_video(pipe, warm, GPU)
        _sync()
        weights = torch.cuda.memory_allocated() if GPU == "cuda" else 0
        if GPU == "cuda":
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        latents = encode_video(pipe, request, GPU)
        _sync()
        encode_s = time.perf_counter() - started
        peak = (torch.cuda.max_memory_allocated() - weights) / 2**30 if GPU == "cuda" else None
        started = time.perf_counter()
        vae.decode(latents.to(vae.dtype)).sample
        _sync()
        decode_s = time.perf_counter() - started
    spec = KNOWN_MODELS[MODELS[name]]
    bytes_ = 2 if dtype == torch.bfloat16 else 4
    predicted = memory.vae_encode_gb(spec, WIDTH, HEIGHT, FRAMES, None, bytes_)
    del vae
    if GPU == "cuda":
        torch.cuda.empty_cache()
    return {"vae": name, "dtype": str(dtype).removeprefix("torch."), "encode_s": round(encode_s, 3),
            "decode_s": round(decode_s, 3), "encode_vs_decode": round(encode_s / decode_s, 3),
            "planned_share": VIDEO_ENCODE_SHARE_WAN22 if wan22 else VIDEO_ENCODE_SHARE, "peak_gib_above_weights": None if peak is None else round(peak, 3),
            "planned_gib": round(predicted, 3), "latents": list(latents.shape)}


class _Quiet:
    """The job's events, kept (the join reports its frames as it goes)."""

    def __init__(self):
        self.events = []

    def __call__(self, event):
        self.events.append(event)


def join_row(folder: Path) -> dict:
    source = write_mp4(clip(WIDTH, HEIGHT, FRAMES), folder / "video.mp4", FPS)
    part = write_mp4(np.clip(clip(WIDTH, HEIGHT, FRAMES, 40).astype(int) + 12, 0, 255).astype(np.uint8),
                     folder / "part.mp4", FPS)
    events = _Quiet()
    job = Job("bench", events)
    started = time.perf_counter()
    record = join(job, read_input(source), part, folder / "joined.mp4", "video.mp4", [])
    seconds = time.perf_counter() - started
    joined, _ = read_video(folder / "joined.mp4")
    before, _ = read_video(source)
    # The time plan's figure with the default encoder rate (the machine's own is measured by its calibration).
    planned, how = _join(FRAMES, WIDTH, HEIGHT, SimpleNamespace(encode_megapixels_per_s=None, encode_fixed_s=None))
    return {"frames": [FRAMES, FRAMES], "joined_frames": len(joined), "how": record.how,
            "video_frames_exact": bool(np.array_equal(joined[:FRAMES], before)), "seconds": round(seconds, 3),
            "planned_seconds": round(planned, 3), "planned_how": how, "colours": record.colours}


def main(out: str) -> None:
    video_dir = Path(tempfile.mkdtemp())
    video = write_mp4(clip(WIDTH, HEIGHT, FRAMES), video_dir / "input.mp4", FPS)
    rows = [encode_row("wan21", torch.float32, video), encode_row("wan21", torch.bfloat16, video),
            encode_row("wan22-5b", torch.bfloat16, video)]
    result = {"gpu": torch.cuda.get_device_name() if GPU == "cuda" else "cpu", "torch": torch.__version__,
              "size": f"{WIDTH}x{HEIGHT}x{FRAMES}", "encode": rows, "join": join_row(video_dir)}
    print(json.dumps(result, indent=2))
    with open(out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
