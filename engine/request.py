"""A generation request and the checks it must pass before anything heavy runs."""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .planner import LADDER, TEXT_ENCODER_PLACES
from .presets import Preset

MODES = ("t2v", "i2v", "t2i")
MIN_SIDE, MAX_SIDE = 32, 2048
MAX_FRAMES = 257
MAX_STEPS = 200
MAX_GUIDANCE = 30.0
MAX_SHIFT = 50.0
MAX_SEED = 2**32 - 1
MAX_PROMPT_CHARS = 4000


class InputError(ValueError):
    """The request cannot run; the message says what to change."""


@dataclass(frozen=True)
class GenerationRequest:
    mode: str
    prompt: str
    model: str
    width: int
    height: int
    frames: int
    steps: int
    guidance: float
    shift: float
    seed: int = -1
    fps: int = 16
    negative_prompt: str = ""
    image: str | None = None          # path of the first-frame image (i2v)
    last_image: str | None = None     # optional last frame (i2v)
    preset: str | None = None
    size_multiple: int = 16
    scheduler: str = "unipc"
    sigmas: tuple[float, ...] | None = None
    outputs_dir: str = "outputs"
    # Memory-plan overrides; None leaves each choice to the planner.
    strategy: str | None = None
    text_encoder: str | None = None
    vae_tiling: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_preset(cls, preset: Preset, prompt: str, **overrides) -> "GenerationRequest":
        """A request filled from ``preset``; keyword arguments that are not None override it."""
        base = dict(
            mode=preset.mode, prompt=prompt, model=preset.model, width=preset.width,
            height=preset.height, frames=preset.frames, steps=preset.steps,
            guidance=preset.guidance, shift=preset.shift, fps=preset.fps,
            negative_prompt=preset.negative_prompt, preset=preset.name,
            size_multiple=preset.size_multiple, scheduler=preset.scheduler, sigmas=preset.sigmas,
        )
        base.update({k: v for k, v in overrides.items() if v is not None})
        request = cls(**base)
        if request.sigmas is not None and request.steps != len(request.sigmas):
            # The preset's fixed schedule only fits its own step count.
            request = replace(request, scheduler="unipc", sigmas=None)
        return request


def _as_int(name: str, value, problems: list[str]) -> int | None:
    if isinstance(value, bool):
        problems.append(f"{name} must be a whole number, got {value!r}")
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            problems.append(f"{name} must be a whole number, got {value!r}")
            return None
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            problems.append(f"{name} must be a whole number, got {value!r}")
            return None
    if isinstance(value, int):
        return value
    problems.append(f"{name} must be a whole number, got {type(value).__name__}")
    return None


def _as_float(name: str, value, problems: list[str]) -> float | None:
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not math.isfinite(number):
        problems.append(f"{name} must be a number, got {value!r}")
        return None
    return number


def _check_size(name: str, value: int, multiple: int, problems: list[str]) -> None:
    if value < MIN_SIDE or value > MAX_SIDE:
        problems.append(f"{name} {value} is out of range: use {MIN_SIDE} to {MAX_SIDE} pixels")
    elif value % multiple:
        lower = max(multiple, value // multiple * multiple)
        problems.append(f"{name} {value} is not a multiple of {multiple}: try {lower} or {lower + multiple}")


def _check_frames(frames: int, mode: str, problems: list[str]) -> None:
    if mode == "t2i":
        if frames != 1:
            problems.append(f"text-to-image makes 1 frame, got frames={frames}")
        return
    if frames < 1 or frames > MAX_FRAMES:
        problems.append(f"frames {frames} is out of range: use 1 to {MAX_FRAMES}")
    elif (frames - 1) % 4:
        lower = (frames - 1) // 4 * 4 + 1
        problems.append(f"frames must be 4k+1 (1, 5, 9, ..., 81): {frames} is not; try {lower} or {lower + 4}")


def _check_image(name: str, path: str, problems: list[str]) -> None:
    from PIL import Image, UnidentifiedImageError

    file = Path(path)
    if not file.is_file():
        problems.append(f"{name} {path!r} does not exist; check the path or upload it again")
        return
    if file.stat().st_size == 0:
        problems.append(f"{name} {file.name!r} is empty (0 bytes); upload a PNG, JPEG or WebP image")
        return
    try:
        with Image.open(file) as img:
            img.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        problems.append(f"{name} {file.name!r} is not a readable image ({exc.__class__.__name__}); upload a PNG, JPEG or WebP image")
    except Image.DecompressionBombError:
        problems.append(f"{name} {file.name!r} is far too large; use an image under 80 megapixels")


def check_outputs_dir(path: str) -> str | None:
    """None if ``path`` can take new files, else the reason it cannot."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"the outputs folder {str(folder)!r} is not writable ({exc.strerror or exc}); choose another with --outputs"
    return None


def _shape(request: GenerationRequest, problems: list[str]):
    """Width, height and frames as whole numbers, each checked; problems are appended."""
    multiple = _as_int("size_multiple", request.size_multiple, problems) or 16
    width = _as_int("width", request.width, problems)
    height = _as_int("height", request.height, problems)
    frames = _as_int("frames", request.frames, problems)
    if width is not None:
        _check_size("width", width, multiple, problems)
    if height is not None:
        _check_size("height", height, multiple, problems)
    if frames is not None:
        _check_frames(frames, request.mode, problems)
    return width, height, frames, multiple


def check_shape(request: GenerationRequest) -> GenerationRequest:
    """Only the size checks (what a memory plan depends on), with the same messages as a run."""
    problems: list[str] = []
    width, height, frames, _ = _shape(request, problems)
    if problems:
        raise InputError("; ".join(problems))
    return replace(request, width=width, height=height, frames=frames)


def check_inputs(request: GenerationRequest) -> GenerationRequest:
    """Validate ``request`` and return it with numbers normalised.

    Raises InputError listing every problem, each saying what to change.
    """
    problems: list[str] = []
    if request.mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {request.mode!r}")
    prompt = request.prompt if isinstance(request.prompt, str) else ""
    if not prompt.strip():
        problems.append("the prompt is empty: describe what the video should show")
    elif len(prompt) > MAX_PROMPT_CHARS:
        problems.append(f"the prompt has {len(prompt)} characters; keep it under {MAX_PROMPT_CHARS}")
    if not isinstance(request.model, str) or not request.model.strip():
        problems.append("no model chosen: pick a preset or give a model (repo id, folder or selftest-t2v)")

    width, height, frames, multiple = _shape(request, problems)
    steps = _as_int("steps", request.steps, problems)
    seed = _as_int("seed", request.seed, problems)
    fps = _as_int("fps", request.fps, problems)
    guidance = _as_float("guidance", request.guidance, problems)
    shift = _as_float("shift", request.shift, problems)

    if steps is not None and not 1 <= steps <= MAX_STEPS:
        problems.append(f"steps {steps} is out of range: use 1 to {MAX_STEPS}")
    if guidance is not None and not 0 <= guidance <= MAX_GUIDANCE:
        problems.append(f"guidance {guidance} is out of range: use 0 to {MAX_GUIDANCE} (1 or less turns guidance off)")
    if shift is not None and not 0 < shift <= MAX_SHIFT:
        problems.append(f"shift {shift} is out of range: use a value above 0 and at most {MAX_SHIFT}")
    if seed is not None and not -1 <= seed <= MAX_SEED:
        problems.append(f"seed {seed} is out of range: use -1 for random or 0 to {MAX_SEED}")
    if fps is not None and not 1 <= fps <= 120:
        problems.append(f"fps {fps} is out of range: use 1 to 120")

    if request.mode == "i2v":
        if not request.image:
            problems.append("image-to-video needs an image: upload one, or use the Text to Video tab")
        else:
            _check_image("image", request.image, problems)
        if request.last_image:
            _check_image("last image", request.last_image, problems)
    elif request.image:
        problems.append("an image was given but the mode is text-to-video; use image-to-video")

    if request.strategy not in (None, *LADDER):
        problems.append(f"strategy {request.strategy!r} is unknown: use auto or one of {', '.join(LADDER)}")
    if request.text_encoder not in (None, *TEXT_ENCODER_PLACES):
        problems.append(f"text encoder place {request.text_encoder!r} is unknown: use {', '.join(TEXT_ENCODER_PLACES)}")
    outputs_problem = check_outputs_dir(request.outputs_dir)
    if outputs_problem:
        problems.append(outputs_problem)

    if problems:
        raise InputError("; ".join(problems))
    return replace(
        request, prompt=prompt.strip(), width=width, height=height, frames=frames, steps=steps,
        seed=seed, fps=fps, guidance=guidance, shift=shift, size_multiple=multiple,
    )
