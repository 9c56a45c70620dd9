"""What a run leaves beside its frames: the video or image file and the JSON sidecar that describes it."""
from __future__ import annotations

import platform
import time
from pathlib import Path

from engine import APP_ID, __version__
from engine.device.runtime import peak_vram_gb
from engine.outputs.export import ensure_room, expected_bytes, write_mp4, write_png
from engine.settings.request import GenerationRequest


def write_media(request: GenerationRequest, frames, stem: Path) -> Path:
    """The PNG of a still (mode t2i) or the mp4 of a video, complete or not at all; refused before anything
    is written (DiskFull) when the outputs folder has not the room it may take."""
    count, height, width = frames.shape[:3]
    ensure_room(stem.parent, expected_bytes(count, width, height), "image" if request.settings.mode == "t2i" else "video")
    if request.settings.mode == "t2i":
        return write_png(frames[0], stem.with_suffix(".png"))
    return write_mp4(frames, stem.with_suffix(".mp4"), request.settings.fps)


def versions() -> dict:
    import diffusers
    import torch
    import transformers

    return {"app": __version__, "torch": torch.__version__, "diffusers": diffusers.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def run_record(request: GenerationRequest, media: Path, frames, *, model, plan: dict, step_downs, latents,
               decode_fallback, timings: dict, step_seconds, peak_ram_gb: float, hardware: dict) -> dict:
    """The sidecar of a finished run: everything needed to understand it and to make it again."""
    return {
        "app": {"name": APP_ID, "version": __version__},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "file": media.name,
        "mode": request.settings.mode,
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt,
        "seed": request.seed,
        "model": {"ref": model.ref, "source": model.source, "revision": model.revision,
                  "pipeline": model.pipeline_class},
        "preset": request.preset,
        "parameters": {k: v for k, v in request.to_dict().items()
                       if k not in ("prompt", "negative_prompt", "outputs_dir")},
        "output": {"frames": int(frames.shape[0]), "height": int(frames.shape[1]),
                   "width": int(frames.shape[2]), "fps": request.settings.fps if request.settings.mode != "t2i" else None},
        "plan": plan,
        "step_downs": list(step_downs),
        "latents": latents,
        "decode_fallback": decode_fallback,
        "model_reused": "load" not in timings,
        "timings": dict(timings),
        "step_seconds": list(step_seconds),
        "peak_vram_gb": peak_vram_gb(),
        "peak_ram_gb": peak_ram_gb,
        "versions": versions(),
        "hardware": hardware,
    }


def redecode_record(request: GenerationRequest, media: Path, latents: Path, how: str, model: dict | None,
                    parameters: dict, timings: dict, peak_ram_gb: float, hardware: dict) -> dict:
    """The sidecar of a video decoded again from saved latents."""
    return {
        "app": {"name": APP_ID, "version": __version__}, "file": media.name,
        "decoded_from": str(latents), "decoded": how, "prompt": request.prompt, "seed": request.seed,
        "model": model, "parameters": parameters, "timings": dict(timings),
        "peak_vram_gb": peak_vram_gb(), "peak_ram_gb": peak_ram_gb, "versions": versions(),
        "hardware": hardware,
    }
