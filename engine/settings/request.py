"""A generation request and the checks it must pass before anything heavy runs."""
from __future__ import annotations

import os
import re
import tempfile
import time
import unicodedata
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.settings.presets import Preset
from engine.settings.values import MAX_FPS, MODE_NAMES, MODES, InputError, Settings, as_int, settings_problems, show, split_values
from engine.words import plural

if TYPE_CHECKING:
    from engine.models.limits import Limits

MAX_SEED = 2**32 - 1
MAX_PROMPT_CHARS = 4000


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


# The request's fields that are the server's, not the job's: never in a sidecar or saved latents, never read back.
_NOT_RECORDED = frozenset({"settings", "checked", "max_seconds"})


@dataclass(frozen=True)
class GenerationRequest:
    """One job: its settings, and what only a run has (prompts, seed, images, where the output goes)."""
    settings: Settings
    prompt: str
    negative_prompt: str = ""
    seed: int = -1
    image: str | None = None          # path of the first-frame image (i2v)
    last_image: str | None = None     # optional last frame (i2v)
    preset: str | None = None
    outputs_dir: str = "outputs"
    keep_latents: bool = False        # keep the denoised latents after a successful decode
    video: str | None = None          # path of the video to make again (v2v)
    extend: str | None = None         # path of a video this run continues from its last frame (i2v)
    # Set by check_request: the engine process runs a checked request without checking it again.
    checked: bool = field(default=False, compare=False, repr=False)
    # Set by the server that admitted it (serve --max-job-minutes), never by a user: the engine refuses the job
    # before loading anything when its whole predicted time is longer (a machine measured at its start).
    max_seconds: float | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict:
        """One flat dict, settings first (the form sidecars and saved latents keep)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_RECORDED}
        return {**self.settings.to_dict(), **own}

    @classmethod
    def from_dict(cls, data: dict) -> "GenerationRequest":
        """The request a flat dict (``to_dict``'s form, as sidecars and latents files hold it) describes."""
        return cls(Settings.from_dict(data), **{k: v for k, v in data.items() if k in _OWN_NAMES})

    def with_values(self, **changes) -> "GenerationRequest":
        """This request with ``changes``, settings and its own fields alike (None is a value here)."""
        settings, own = split_values(changes)
        return replace(self, settings=replace(self.settings, **settings), **own, checked=False)

    @classmethod
    def from_preset(cls, preset: Preset, prompt: str, **overrides) -> "GenerationRequest":
        """A request filled from ``preset``; keyword arguments that are not None override it."""
        settings, own = split_values(overrides)
        base = {"negative_prompt": preset.negative_prompt, "preset": preset.name}
        base.update({k: v for k, v in own.items() if v is not None})
        return cls(preset.settings.changed(**settings), prompt, **base)


_OWN_NAMES = {f.name for f in fields(GenerationRequest)} - _NOT_RECORDED


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
    from engine.folders import day_folder

    try:
        day_folder(folder, time.time())     # today's folder a link: said before the run, not after its denoise
    except InputError as exc:
        return str(exc)
    return None


def check_prompt(name: str, value, required: bool, problems: list[str], notes: list[str]) -> str:
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


def check_request(request: GenerationRequest, limits: Limits | None = None) -> GenerationRequest:
    """Validate ``request`` and return it with numbers normalised and prompts cleaned.

    ``limits``: what the request's model can make (engine/models/limits.py), when it is known.
    Raises InputError listing every problem, each saying what to change.
    """
    return check_request_with_notes(request, limits)[0]


def check_request_with_notes(request: GenerationRequest,
                             limits: Limits | None = None) -> tuple[GenerationRequest, list[str]]:
    """check_request, plus notes for the user about what was changed or will be.

    Notes are sentences such as "prompt: removed 3 control characters" or
    "image 'cat.gif': animated image: the first of 12 frames is used". Emit them as Info
    events before anything heavy; they are empty for a request that was already checked
    (its prompts are clean by then), except for the image notes.
    """
    problems: list[str] = []
    notes: list[str] = []
    mode = request.settings.mode
    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    prompt = check_prompt("prompt", request.prompt, True, problems, notes)
    negative = check_prompt("negative prompt", request.negative_prompt, False, problems, notes)
    settings, found = settings_problems(request.settings, limits)
    problems.extend(found)
    seed = -1 if request.seed is None else as_int("seed", request.seed, problems)   # None: random
    if seed is not None and not -1 <= seed <= MAX_SEED:
        problems.append(f"seed {show(seed)} is out of range: use -1 for random or 0 to {MAX_SEED}")
    size = (settings.width, settings.height) if settings else (None, None)
    _check_images(request, size, problems, notes)
    settings = _check_videos(request, settings, problems, notes)
    if not isinstance(request.outputs_dir, (str, os.PathLike)) or not str(request.outputs_dir).strip():
        problems.append("no outputs folder given: choose one with --outputs")
    else:
        outputs_problem = check_outputs_dir(request.outputs_dir)
        if outputs_problem:
            problems.append(outputs_problem)
    if problems:
        raise InputError(problems)
    return replace(request, settings=settings, prompt=prompt, negative_prompt=negative, seed=seed, checked=True), notes


def _check_images(request: GenerationRequest, size: tuple, problems: list[str], notes: list[str]) -> None:
    """An image-to-video run needs its first frame (the last is optional), or a video to extend, which gives it;
    the other modes take none."""
    if request.settings.mode == "i2v":
        if request.extend:
            if request.image:
                problems.append("a first frame and a video to extend were both given: an extension starts from the "
                                "video's last frame; remove the image, or the video")
            if request.last_image:
                _check_image("last image", request.last_image, problems, notes, *size)
        elif not request.image:
            problems.append("image-to-video needs an image: upload one, or use the Text to Video tab")
        else:
            _check_image("image", request.image, problems, notes, *size)
        if request.last_image:
            _check_image("last image", request.last_image, problems, notes, *size)
    elif request.image or request.last_image:
        which = "an image" if request.image else "a last image"
        kind = MODE_NAMES[request.settings.mode].replace(" ", "-")
        problems.append(f"{which} was given but the mode is {kind}; use image-to-video")


def _check_videos(request: GenerationRequest, settings: Settings | None, problems: list[str],
                  notes: list[str]) -> Settings | None:
    """A video-to-video run needs its input video, holding the frames asked for; an extension's video must be one
    the new part can follow (check_extension); no other run takes a video. The settings as the run makes them
    (an extension written at its video's frame rate)."""
    mode = request.settings.mode
    if mode == "v2v" and not request.video:
        problems.append("video to video needs an input video: upload one (or pick an output in the History tab)")
    for name, given, wanted in (("video", request.video, "v2v"), ("extend", request.extend, "i2v")):
        if given and mode != wanted:
            kind = MODE_NAMES[mode].replace(" ", "-")
            use = "the Video to Video tab (--video)" if name == "video" else "the Image to Video tab (--extend)"
            problems.append(f"a {'video to make again' if name == 'video' else 'video to extend'} was given but the "
                            f"mode is {kind}; use {use}")
            return settings
    path = request.video if mode == "v2v" else request.extend if mode == "i2v" else None
    if not path:
        return settings
    if not isinstance(path, (str, os.PathLike)):
        problems.append(f"the video must be a file path, got {type(path).__name__}; upload the video again")
        return settings
    from engine.settings.videos import check_video, read_video

    try:
        if mode == "v2v":
            shape = (settings.width, settings.height, settings.fps, settings.frames) if settings else ()
            found = check_video(path, "video", *shape)[1]
            notes.extend(f"video {Path(path).name!r}: {note}" for note in found)
            return settings
        return check_extension(read_video(path, "video to extend"), settings, problems, notes)
    except InputError as exc:
        problems.append(str(exc))
        return settings


# How far an extension's shape may be from its video's before the new part would be cropped out of shape.
EXTEND_ASPECT_TOLERANCE = 0.1


def check_extension(video, settings: Settings | None, problems: list[str], notes: list[str]) -> Settings | None:
    """The settings of an extension's new part, which joins ``video`` as more frames of it: written at the video's
    frame rate (its fps divided by the smoother factor); of about its shape (the part is scaled to the video's size
    when they are joined). Problems for a rate the factor cannot make, or a shape far from the video's."""
    if settings is None:
        return None
    name = Path(video.path).name
    rate = round(video.fps)
    if rate % settings.interpolate or not 1 <= rate // settings.interpolate <= MAX_FPS:
        problems.append(f"the video to extend ({name}) runs at {video.fps:g} fps, which the new part cannot match "
                        f"made {settings.interpolate}x smoother: set Smoother to Off, or 2x for an even rate")
        return settings
    fps = rate // settings.interpolate
    if fps != settings.fps:
        notes.append(f"the new part is made at {fps} fps{' before it is made smoother' if settings.interpolate > 1 else ''}"
                     f", so that it runs at the video's {video.fps:g} fps")
    made_w, made_h = settings.width * settings.upscale, settings.height * settings.upscale
    aspect, wanted = made_w / made_h, video.width / video.height
    if abs(aspect / wanted - 1) > EXTEND_ASPECT_TOLERANCE:
        from engine.settings.images import size_for_aspect

        width, height = size_for_aspect((video.width, video.height), settings.width, settings.height)
        problems.append(f"the video to extend ({name}) is {video.width}x{video.height}, another shape than the new "
                        f"part's {settings.width}x{settings.height}: set the size to {width}x{height} (its shape), "
                        "so the parts join without cropping")
    elif (made_w, made_h) != (video.width, video.height):
        notes.append(f"the new part is made at {made_w}x{made_h} and scaled to the video's {video.width}x"
                     f"{video.height} to join it")
    return replace(settings, fps=fps)
