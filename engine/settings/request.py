"""A generation request and the checks it must pass before anything heavy runs."""
from __future__ import annotations

import math
import numbers
import os
import re
import tempfile
import unicodedata
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.planning.planner import LADDER, TEXT_ENCODER_PLACES
from engine.settings.presets import Preset
from engine.words import plural, sentence

if TYPE_CHECKING:
    from engine.models.limits import Limits

MODES = ("t2v", "i2v", "t2i")
MODE_NAMES = {"t2v": "text to video", "i2v": "image to video", "t2i": "text to image"}
MIN_SIDE, MAX_SIDE = 32, 2048
MAX_FRAMES = 257
MAX_STEPS = 200
MAX_GUIDANCE = 30.0
MAX_SHIFT = 50.0
MAX_SEED = 2**32 - 1
MAX_PROMPT_CHARS = 4000


class InputError(ValueError):
    """The request cannot run; each problem says what is wrong and what to change.

    Built from one problem or a list of them (short clauses such as "width 70 is not a multiple of 16:
    try 64 or 80"); ``problems`` holds them as sentences, and ``str()`` is those sentences in a row.
    """

    def __init__(self, problems: str | list[str] | tuple[str, ...]):
        listed = [problems] if isinstance(problems, str) else list(problems)
        self.problems = tuple(sentence(p) for p in listed if p.strip())
        super().__init__(" ".join(self.problems))


# Control characters that separate words: turned into whitespace, not counted as removed.
_SEPARATORS = {"\t": " ", "\x0b": "\n", "\x0c": "\n", "\x1c": "\n", "\x1d": "\n", "\x1e": "\n", "\x1f": " ",
               "\x85": "\n", "\u2028": "\n", "\u2029": "\n", "\r": "\n"}
# Invisible formatting characters that only confuse a tokenizer (zero-width space, byte-order mark,
# word joiner, soft hyphen, direction marks and overrides). ZWJ/ZWNJ are kept: emoji and scripts need them.
_INVISIBLE = set("\u200b\ufeff\u2060\u00ad\u200e\u200f\u061c") | {chr(c) for c in range(0x202A, 0x202F)} \
    | {chr(c) for c in range(0x2066, 0x206A)}


def clean_prompt(text: str) -> tuple[str, list[str]]:
    """``text`` without control or invisible characters and with tidy whitespace, plus warnings.

    Removed (and counted in the warnings): control characters such as NUL or ESC (a terminal colour
    code counts as one), invisible formatting characters (zero-width space, byte-order mark,
    direction marks) and broken surrogates. Kept: newlines (CR LF and CR become LF; at most one
    blank line in a row) and ordinary text, Unicode-normalised (NFC). Tabs and runs of spaces
    (including no-break and other Unicode spaces) become one space; each line and the whole text
    are stripped.
    """
    if not isinstance(text, str):
        return "", []
    text = text.replace("\r\n", "\n")
    # A terminal colour code pasted from a console ("\x1b[31m") goes whole, counted as one character.
    text, control = re.subn(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", text)
    kept: list[str] = []
    invisible = broken = 0
    for char in text:
        if char in _SEPARATORS:
            kept.append(_SEPARATORS[char])
        elif char == "\n":
            kept.append(char)
        elif char in _INVISIBLE:
            invisible += 1
        else:
            category = unicodedata.category(char)
            if category == "Cc":
                control += 1
            elif category == "Cs":
                broken += 1
            elif category == "Zs":
                kept.append(" ")
            else:
                kept.append(char)
    cleaned = unicodedata.normalize("NFC", "".join(kept))
    cleaned = re.sub(r" +", " ", cleaned)
    cleaned = "\n".join(line.strip() for line in cleaned.split("\n"))
    cleaned = re.sub(r"\n{3,}", "\n\n", cleaned).strip()
    warnings = []
    if control:
        warnings.append(f"removed {plural(control, 'control character')}")
    if invisible:
        warnings.append(f"removed {plural(invisible, 'invisible character')} "
                        "(zero-width space, byte-order mark or direction mark)")
    if broken:
        warnings.append(f"removed {plural(broken, 'broken character')} (unpaired surrogate)")
    return cleaned, warnings


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
    keep_latents: bool = False        # keep the denoised latents after a successful decode

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


def _show(number: int) -> str:
    """A whole number for a message: exact unless absurdly long (1e+30 rather than 31 digits)."""
    return f"{number:.3g}" if abs(number) >= 10**12 else str(number)


def _as_int(name: str, value, problems: list[str]) -> int | None:
    """``value`` as an int: ints, integral floats (64.0) and numeric strings ("64", " 64.0 ") pass.

    None or an empty string is missing; booleans, fractions, NaN and infinities are refused.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        problems.append(f"{name} is missing: give a whole number")
        return None
    if isinstance(value, bool):
        problems.append(f"{name} must be a whole number, got {value!r}")
        return None
    if isinstance(value, numbers.Integral):   # int and numpy integers
        return int(value)
    number = value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                number = float(value.strip())
            except ValueError:
                problems.append(f"{name} must be a whole number, got {value!r}")
                return None
    if isinstance(number, numbers.Real):      # float and numpy floats
        number = float(number)
        if not math.isfinite(number) or number != int(number):
            problems.append(f"{name} must be a whole number, got {value!r}")
            return None
        return int(number)
    problems.append(f"{name} must be a whole number, got {type(value).__name__}")
    return None


def _as_float(name: str, value, problems: list[str]) -> float | None:
    """``value`` as a finite float (numbers and numeric strings; -0.0 becomes 0.0)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        problems.append(f"{name} is missing: give a number")
        return None
    try:
        number = float(value.strip() if isinstance(value, str) else value) if not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or not math.isfinite(number):
        problems.append(f"{name} must be a number, got {value!r}")
        return None
    return number + 0.0   # turns -0.0 into 0.0


def _check_size(name: str, value: int, multiple: int, problems: list[str], limits: Limits | None = None) -> None:
    """Width or height: in range, within what the model can take (``limits``, when known), a multiple."""
    which = f", which {limits.name} needs" if limits else ""
    if value < MIN_SIDE or value > MAX_SIDE:
        problems.append(f"{name} {_show(value)} is out of range: use {MIN_SIDE} to {MAX_SIDE} pixels")
    elif limits and value > limits.max_side:
        problems.append(f"{name} {value} is more than {limits.name} can take (its position table has "
                        f"{limits.position_rows} rows across): use at most {limits.max_side}")
    elif value % multiple:
        lower = max(multiple, value // multiple * multiple)
        problems.append(f"{name} {value} is not a multiple of {multiple}{which}: try {lower} or {lower + multiple}")


def _check_frames(frames: int, mode: str, problems: list[str], limits: Limits | None = None) -> None:
    """The frame count: 1 for a still; else 4k+1, in range and within what the model can make."""
    if mode == "t2i":
        if frames != 1:
            problems.append(f"text-to-image makes 1 frame, got frames={_show(frames)}")
        return
    most = limits.max_frames if limits else MAX_FRAMES
    if frames < 1 or frames > MAX_FRAMES:
        problems.append(f"frames {_show(frames)} is out of range: use 1 to {most}")
    elif limits and frames > limits.max_frames:
        problems.append(f"frames {frames} is more than {limits.name} can make (its position table has "
                        f"{limits.position_rows} rows for the frames): use at most {limits.max_frames}")
    elif (frames - 1) % 4:
        lower = (frames - 1) // 4 * 4 + 1
        problems.append(f"frames must be 4k+1 (1, 5, 9, ... up to {most}): {frames} is not; "
                        f"try {lower} or {lower + 4}")


def _check_image(name: str, path, problems: list[str], notes: list[str] | None = None,
                 width: int | None = None, height: int | None = None) -> None:
    """Append why the image at ``path`` cannot be used, or its notes (animated, CMYK, ...) to ``notes``.

    Missing, empty, not an image, cut short, damaged or above images.MAX_IMAGE_PIXELS: refused,
    naming the file. The header is read before any decoding, so a decompression bomb is never decoded.
    """
    from engine.settings.images import check_image

    if not isinstance(path, (str, os.PathLike)):
        problems.append(f"{name} must be a file path, got {type(path).__name__}; upload the image again")
        return
    try:
        found = check_image(path, name, width, height)
    except InputError as exc:
        problems.append(str(exc))
        return
    if notes is not None:
        notes.extend(f"{name} {Path(path).name!r}: {note}" for note in found)


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


def _shape(request: GenerationRequest, problems: list[str], limits: Limits | None = None):
    """Width, height and frames as whole numbers, each checked (against the model's ``limits`` when known)."""
    multiple = limits.size_multiple if limits else (_as_int("size_multiple", request.size_multiple, problems) or 16)
    width = _as_int("width", request.width, problems)
    height = _as_int("height", request.height, problems)
    frames = _as_int("frames", request.frames, problems)
    if width is not None:
        _check_size("width", width, multiple, problems, limits)
    if height is not None:
        _check_size("height", height, multiple, problems, limits)
    if frames is not None:
        _check_frames(frames, request.mode, problems, limits)
    return width, height, frames, multiple


def check_shape(request: GenerationRequest, limits: Limits | None = None) -> GenerationRequest:
    """Only the size checks (what a memory plan depends on), with the same messages as a run."""
    problems: list[str] = []
    width, height, frames, _ = _shape(request, problems, limits)
    if problems:
        raise InputError(problems)
    return replace(request, width=width, height=height, frames=frames)


def _check_prompt(name: str, value, required: bool, problems: list[str], notes: list[str]) -> str:
    """``value`` cleaned (see clean_prompt); problems and notes name the field ("prompt", ...)."""
    if value is not None and not isinstance(value, str):
        problems.append(f"the {name} must be text, got {type(value).__name__}")
        return ""
    text, warnings = clean_prompt(value or "")
    if required and not text:
        removed = " once control characters are removed" if warnings else ""
        problems.append(f"the {name} is empty{removed}: describe what the video should show")
    elif len(text) > MAX_PROMPT_CHARS:
        problems.append(f"the {name} has {len(text)} characters; keep it under {MAX_PROMPT_CHARS}")
    notes.extend(f"{name}: {warning}" for warning in warnings)
    return text


def check_inputs(request: GenerationRequest, limits: Limits | None = None) -> GenerationRequest:
    """Validate ``request`` and return it with numbers normalised and prompts cleaned.

    ``limits``: what the request's model can make (engine/models/limits.py), when it is known.
    Raises InputError listing every problem, each saying what to change.
    """
    return check_inputs_with_notes(request, limits)[0]


def check_inputs_with_notes(request: GenerationRequest,
                            limits: Limits | None = None) -> tuple[GenerationRequest, list[str]]:
    """check_inputs, plus notes for the user about what was changed or will be.

    Notes are sentences such as "prompt: removed 3 control characters" or
    "image 'cat.gif': animated image: the first of 12 frames is used". Emit them as Info
    events before anything heavy; they are empty for a request that was already checked
    (its prompts are clean by then), except for the image notes.
    """
    problems: list[str] = []
    notes: list[str] = []
    if request.mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {request.mode!r}")
    prompt = _check_prompt("prompt", request.prompt, True, problems, notes)
    negative = _check_prompt("negative prompt", request.negative_prompt, False, problems, notes)
    if not isinstance(request.model, str) or not request.model.strip():
        problems.append("no model chosen: pick a preset or give a model (repo id, folder or selftest-t2v)")

    width, height, frames, multiple = _shape(request, problems, limits)
    steps = _as_int("steps", request.steps, problems)
    seed = -1 if request.seed is None else _as_int("seed", request.seed, problems)   # None: random
    fps = _as_int("fps", request.fps, problems)
    guidance = _as_float("guidance", request.guidance, problems)
    shift = _as_float("shift", request.shift, problems)

    if steps is not None and not 1 <= steps <= MAX_STEPS:
        problems.append(f"steps {_show(steps)} is out of range: use 1 to {MAX_STEPS}")
    if guidance is not None and not 0 <= guidance <= MAX_GUIDANCE:
        problems.append(f"guidance {guidance} is out of range: use 0 to {MAX_GUIDANCE} (1 or less turns guidance off)")
    if shift is not None and not 0 < shift <= MAX_SHIFT:
        problems.append(f"shift {shift} is out of range: use a value above 0 and at most {MAX_SHIFT}")
    if seed is not None and not -1 <= seed <= MAX_SEED:
        problems.append(f"seed {_show(seed)} is out of range: use -1 for random or 0 to {MAX_SEED}")
    if fps is not None and not 1 <= fps <= 120:
        problems.append(f"fps {_show(fps)} is out of range: use 1 to 120")

    if request.mode == "i2v":
        if not request.image:
            problems.append("image-to-video needs an image: upload one, or use the Text to Video tab")
        else:
            _check_image("image", request.image, problems, notes, width, height)
        if request.last_image:
            _check_image("last image", request.last_image, problems, notes, width, height)
    elif request.image or request.last_image:
        which = "an image" if request.image else "a last image"
        kind = "text-to-image" if request.mode == "t2i" else "text-to-video"
        problems.append(f"{which} was given but the mode is {kind}; use image-to-video")

    if request.strategy not in (None, *LADDER):
        problems.append(f"strategy {request.strategy!r} is unknown: use auto or one of {', '.join(LADDER)}")
    if request.text_encoder not in (None, *TEXT_ENCODER_PLACES):
        problems.append(f"text encoder place {request.text_encoder!r} is unknown: use {', '.join(TEXT_ENCODER_PLACES)}")
    vae_tiling = request.vae_tiling
    if vae_tiling is not None and not isinstance(vae_tiling, bool):
        problems.append(f"VAE tiling must be on, off or auto, got {vae_tiling!r}")
    if not isinstance(request.outputs_dir, (str, os.PathLike)) or not str(request.outputs_dir).strip():
        problems.append("no outputs folder given: choose one with --outputs")
    else:
        outputs_problem = check_outputs_dir(request.outputs_dir)
        if outputs_problem:
            problems.append(outputs_problem)

    if problems:
        raise InputError(problems)
    checked = replace(
        request, prompt=prompt, negative_prompt=negative, width=width, height=height, frames=frames,
        steps=steps, seed=seed, fps=fps, guidance=guidance, shift=shift, size_multiple=multiple,
    )
    return checked, notes
