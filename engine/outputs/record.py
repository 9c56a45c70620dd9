"""What a run leaves beside its frames: the video or image file and the sidecar that describes it."""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from engine import __version__
from engine.models.limits import SIDE_MULTIPLE
from engine.device.runtime import peak_vram_gb
from engine.outputs.bundle import Bundle
from engine.outputs.export import Mp4Stream, ensure_room, expected_bytes, write_mp4, write_png
from engine.outputs.sidecar import DecodeDetails, RunDetails, Sidecar, model_name
from engine.settings.request import GenerationRequest


def write_media(request: GenerationRequest, frames, bundle: Bundle) -> Path:
    """The PNG of a still (mode t2i) or the mp4 of a video, complete or not at all; refused before anything
    is written (DiskFull) when the outputs folder has not the room it may take."""
    ensure_media_room(request, frames.shape, bundle)
    if request.settings.mode == "t2i":
        return write_png(frames[0], bundle.image)
    return write_mp4(frames, bundle.video, request.settings.fps)


def ensure_media_room(request: GenerationRequest, shape: tuple, bundle: Bundle) -> None:
    """DiskFull unless the outputs folder has the room the output of ``shape`` (frames, height, width, ...)
    may take; a streamed video asks before its decode starts, so a full disk costs no decode."""
    count, height, width = shape[:3]
    ensure_room(bundle.stem.parent, expected_bytes(count, width, height), "image" if request.settings.mode == "t2i" else "video")


def open_video_stream(request: GenerationRequest, shape: tuple, bundle: Bundle) -> Mp4Stream:
    """The mp4 of a video of ``shape`` (frames, height, width, 3) whose frames are still being decoded
    (export.Mp4Stream: complete or absent), refused first (DiskFull) when the disk has not the room."""
    ensure_media_room(request, shape, bundle)
    count, height, width = shape[:3]
    return Mp4Stream(bundle.video, request.settings.fps, width, height, count)


def versions() -> dict:
    import diffusers
    import torch
    import transformers

    return {"app": __version__, "torch": str(torch.__version__), "diffusers": diffusers.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def _as_json(value):
    """``value`` as its JSON holds it (tuples become lists, other objects text), so a sidecar read back
    equals the one written."""
    return json.loads(json.dumps(value, default=str))


def _made_with(request: GenerationRequest, parameters: dict, model: dict | None, timings: dict,
               peak_ram_gb: float, hardware: dict) -> dict:
    """What both kinds of sidecar record: the request's values and what making the output cost."""
    parameters = _as_json(parameters)
    return dict(mode=request.settings.mode, prompt=request.prompt, negative_prompt=request.negative_prompt,
                seed=request.seed, model=model_name(model, parameters), preset=request.preset,
                parameters=parameters, model_details=_as_json(model), timings=dict(timings),
                peak_vram_gb=peak_vram_gb(), peak_ram_gb=peak_ram_gb, versions=versions(),
                hardware=_as_json(hardware), app_version=__version__)


def run_record(request: GenerationRequest, media: Path, frames, *, model, plan: dict, step_downs, latents,
               decode_fallback, timings: dict, step_seconds, peak_ram_gb: float, hardware: dict,
               inputs: dict | None = None, note: str = "", speed: dict | None = None,
               experts: dict | None = None, windows: dict | None = None, post: list | None = None,
               extend: dict | None = None) -> Sidecar:
    """The sidecar of a finished run: everything needed to understand it and to make it again.

    ``frames``: the frames written, or only their shape (frames, height, width, ...): a streamed video
    keeps no frames. ``inputs``: the input images kept beside it ({field: file name or None}; None: the run had none).
    ``post``: the steps after the decode (engine/post/steps.py's records), which made the file ``frames`` describes;
    ``extend``: an extension's join (engine/post/extend.py), which made it the video extended and the new part."""
    count, height, width = (int(n) for n in getattr(frames, "shape", frames)[:3])
    fps = request.settings.fps if request.settings.mode != "t2i" else None
    if post:
        fps = post[-1]["fps"]
    parameters = {k: v for k, v in request.to_dict().items() if k not in ("prompt", "negative_prompt", "outputs_dir")}
    # The model's own (its spec's; sidecars always held it, when it was a setting too).
    parameters["size_multiple"] = model.spec.size_multiple if model.spec is not None else SIDE_MULTIPLE
    details = {"ref": model.ref, "source": model.source, "revision": model.revision, "pipeline": model.pipeline_class}
    return Sidecar(
        **_made_with(request, parameters, details, timings, peak_ram_gb, hardware),
        file=media.name, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), plan=_as_json(plan),
        output={"frames": count, "height": height, "width": width, "fps": fps},
        run=RunDetails(step_downs=_as_json(list(step_downs)), latents=latents, decode_fallback=decode_fallback,
                       model_reused="load" not in timings, step_seconds=list(step_seconds),
                       experts=_as_json(experts) if experts is not None else None, windows=windows),
        inputs=inputs, note=note, speed=_as_json(speed) if speed is not None else None, post=list(post or []),
        extend=_as_json(extend) if extend is not None else None)


def redecode_record(request: GenerationRequest, media: Path, latents: Path, how: str, model: dict | None,
                    parameters: dict, timings: dict, peak_ram_gb: float, hardware: dict,
                    inputs: dict | None = None, extend: dict | None = None, shape: tuple | None = None) -> Sidecar:
    """The sidecar of a video decoded again from saved latents (``model``: as the latents recorded it; ``extend``:
    an extension's part joined again after its video, as ``run_record`` has it, and ``shape`` the joined video's)."""
    output = None
    if shape is not None:
        count, height, width = (int(n) for n in shape[:3])
        output = {"frames": count, "height": height, "width": width, "fps": request.settings.fps}
    return Sidecar(
        **_made_with(request, parameters, model, timings, peak_ram_gb, hardware),
        file=media.name, decoded=DecodeDetails(how=how, latents=str(latents)), inputs=inputs, output=output,
        extend=_as_json(extend) if extend is not None else None)
