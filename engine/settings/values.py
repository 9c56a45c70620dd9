"""Settings: what a job is made with, apart from its prompts, its images and its seed.

One frozen value that presets, requests and history entries embed, so the same settings are never copied
field by field between shapes. ``check_settings`` is the one check of them (the plan panel, preset saving,
``app.py plan`` and every run use it); ``request.check_request`` adds what only a run has (prompts, images,
seed, the outputs folder).

A new setting (a LoRA list, a single transformer file) is one field here, its check in ``check_settings``
and its control on the page: presets, requests, sidecars and history carry it from then on.
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import InputError
from engine.words import quoted, show
from engine.models.limits import MAX_FRAMES, MAX_SIDE, MAX_WINDOW_FRAMES, MIN_SIDE, SIDE_MULTIPLE
from engine.models.windows import OVERLAP_FRAMES, SHORTEST_WINDOW_FRAMES
from engine.post.steps import post_problems
from engine.models.loras import LORA_EXPERTS, Lora, as_lora, lora_file_problem
from engine.models.single_file import TRANSFORMER_FILE_NAMES, TRANSFORMER_FILE_SUFFIXES
from engine.settings.fields import DEFAULT_VIDEO_STRENGTH, SETTING_TYPES, Group, names_in
from engine.settings.choices import (ATTENTION_BACKENDS, COMPUTES, DECODERS, LADDER, STEP_CACHES, TEXT_ENCODER_PLACES,
                                     VAE_DTYPES)

if TYPE_CHECKING:
    from engine.models.limits import Limits

MODES = ("t2v", "i2v", "t2i", "v2v")
MODE_NAMES = {"t2v": "text to video", "i2v": "image to video", "t2i": "text to image", "v2v": "video to video"}
# A preset belongs to a generation tab: text to video (text to image is its 1-frame mode, and video to video
# re-makes a video with its model) or image to video.
PRESET_MODES = ("t2v", "i2v")
# The preset tab whose presets a mode uses.
PRESET_TAB = {"t2v": "t2v", "t2i": "t2v", "v2v": "t2v", "i2v": "i2v"}
SCHEDULERS = ("unipc", "flow_euler", "flow_dmd")   # engine/run/schedulers.py
MAX_STEPS = 200
MAX_GUIDANCE = 30.0
MAX_SHIFT = 50.0
MAX_FPS = 120
MAX_GPUS = 16   # one engine process per GPU; more than a machine of 16 is a typing error
# A LoRA's strength: 1 is the LoRA as trained, 0 turns it off, a negative one pushes away from what it learned.
MAX_LORA_STRENGTH = 4.0
# Outputs one request may make (more is a typing error; the queue takes more requests).
MAX_COUNT = 16



@dataclass(frozen=True)
class Settings:
    model: str
    mode: str                          # one of MODES
    width: int
    height: int
    frames: int
    steps: int
    guidance: float
    shift: float
    fps: int = 16
    scheduler: str = "unipc"           # one of SCHEDULERS
    sigmas: tuple[float, ...] | None = None   # a fixed schedule (distilled models): as many as steps
    # Memory-plan overrides; None leaves each choice to the planner.
    strategy: str | None = None
    text_encoder: str | None = None
    vae_tiling: bool | None = None
    # Speed choices: None leaves each to the planner; "fast" decoder and the step caches are approximate.
    decoder: str = "vae"                # one of DECODERS: the model's VAE (exact or faster), the light VAE, the fast one
    step_cache: str | None = None       # one of STEP_CACHES: reuse transformer work between steps
    compile: bool | None = None
    guidance_batch: bool | None = None  # a step's conditional and unconditional passes as one batch
    compute: str = "exact"              # one of COMPUTES: the block linears in float8 ("fp8") is approximate
    attention: str | None = None        # one of ATTENTION_BACKENDS
    vae_dtype: str | None = None        # one of VAE_DTYPES
    # Model sources and adapters: a single transformer file in place of the model's own (GGUF or safetensors;
    # A14B's low-noise expert in ``transformer_2``), LoRA files with a strength each (and the expert each goes
    # into, where it is published: engine/models/loras.py), and A14B's low-noise guidance (None: as ``guidance``).
    transformer: str | None = None
    transformer_2: str | None = None
    loras: tuple[Lora, ...] = ()
    guidance_2: float | None = None
    # How many GPUs the job's denoise is split across (context parallel, one engine each): 0 is automatic (one,
    # unless the model fits on the device only split: engine/planning/planner.py's gpus_for), N >= 1 that many.
    gpus: int = 0
    # A video longer than the model's window is denoised in overlapping windows (engine/models/windows.py):
    # ``window`` frames each (0: the model's own, 81 for most), neighbours sharing at least ``overlap`` frames.
    window: int = 0
    overlap: int = OVERLAP_FRAMES
    # How many outputs a request makes, one after the other: seeds seed, seed + 1, ... (each random with -1).
    count: int = 1
    # After the video is written (engine/post/): ``interpolate`` times the frames (smoother: 1 is off, 2 or 4) and
    # ``upscale`` times the width and height (larger: 1 is off, 2 or 4).
    interpolate: int = 1
    upscale: int = 1
    # Video to video: how much of the input video is made anew (0: the input back, 1: a new video from the prompt);
    # the denoise runs the last ``strength`` part of the steps (denoise_steps), from the input noised to their start.
    strength: float = DEFAULT_VIDEO_STRENGTH

    @property
    def denoise_steps(self) -> int:
        """The steps the denoise runs: all of them, or for video to video the last ``strength`` part of them
        (rounded down, as diffusers' video-to-video pipeline counts them: 0 gives the input back)."""
        if self.mode != "v2v":
            return self.steps
        return min(self.steps, int(self.steps * self.strength))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Settings":
        """The settings a flat dict holds (a preset file, a sidecar's parameters, saved latents): its setting
        keys only, a sigma list as a tuple (an empty one as none); what it lacks takes the defaults."""
        settings = {k: v for k, v in values.items() if k in _FIELD_NAMES}
        settings["sigmas"] = tuple(settings["sigmas"]) if settings.get("sigmas") else None
        if "loras" in settings:   # a JSON object each (or an older file's [file, strength] pairs)
            settings["loras"] = tuple(_read_lora(entry) for entry in settings["loras"] or ())
        return cls(**settings)

    def changed(self, **changes) -> "Settings":
        """These settings with ``changes`` (values that are None are left out); a fixed sigma schedule
        that no longer matches the step count is dropped: the same kind of step then samples its own evenly
        spaced schedule (a distilled model keeps its sampler)."""
        settings = replace(self, **{k: v for k, v in changes.items() if v is not None})
        if settings.sigmas is not None and settings.steps != len(settings.sigmas):
            settings = replace(settings, sigmas=None)
        return settings


def _read_lora(entry):
    """A Lora when ``entry`` reads as one, else ``entry`` as it is, for check_settings to say what is wrong."""
    try:
        return as_lora(entry)
    except (TypeError, ValueError):
        return entry


SETTING_NAMES = tuple(f.name for f in fields(Settings))
_FIELD_NAMES = frozenset(SETTING_NAMES)
MEMORY_CHOICES = names_in(Group.MEMORY)
SPEED_CHOICES = names_in(Group.SPEED)
# The model's sources and adapters: optional in a preset file, left out when at their defaults.
SOURCE_CHOICES = names_in(Group.SOURCE)
REQUIRED_SETTINGS = names_in(Group.REQUIRED)


def split_values(values: dict) -> tuple[dict, dict]:
    """(the setting fields of ``values``, the rest)."""
    return ({k: v for k, v in values.items() if k in SETTING_NAMES},
            {k: v for k, v in values.items() if k not in SETTING_NAMES})


# ----- checks ----------------------------------------------------------------


def as_int(name: str, value, problems: list[str]) -> int | None:
    """``value`` as an int: ints, integral floats (64.0) and numeric strings ("64", " 64.0 ") pass.

    None or an empty string is missing; booleans, fractions, NaN and infinities are refused.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        problems.append(f"{name} is missing: give a whole number")
        return None
    if isinstance(value, bool):
        problems.append(f"{name} must be a whole number, got {quoted(value)}")
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
                problems.append(f"{name} must be a whole number, got {quoted(value)}")
                return None
    if isinstance(number, numbers.Real):      # float and numpy floats
        number = float(number)
        if not math.isfinite(number) or number != int(number):
            problems.append(f"{name} must be a whole number, got {quoted(value)}")
            return None
        return int(number)
    problems.append(f"{name} must be a whole number, got {type(value).__name__}")
    return None


def as_float(name: str, value, problems: list[str]) -> float | None:
    """``value`` as a finite float (numbers and numeric strings; -0.0 becomes 0.0)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        problems.append(f"{name} is missing: give a number")
        return None
    try:
        number = float(value.strip() if isinstance(value, str) else value) if not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or not math.isfinite(number):
        problems.append(f"{name} must be a number, got {quoted(value)}")
        return None
    return number + 0.0   # turns -0.0 into 0.0


def check_strength(value, problems: list[str]) -> float | None:
    """Video to video's strength as a number from 0 to 1 (the API's, the command line's and the page's check); the
    problem said in ``problems`` otherwise."""
    strength = as_float("strength", value, problems)
    if strength is not None and not 0 <= strength <= 1:
        problems.append(f"strength {strength:g} is out of range: use 0 (the input video back) to 1 (a new video)")
    return strength


def check_side(name: str, value: int, multiple: int, problems: list[str], limits: Limits | None = None) -> None:
    """Width or height: in range, within what the model can take (``limits``, when known), a multiple."""
    which = f", which {limits.name} needs" if limits else ""
    if value < MIN_SIDE or value > MAX_SIDE:
        most = f"{limits.max_side} pixels for {limits.name}" if limits else f"{MAX_SIDE} pixels"
        problems.append(f"{name} {show(value)} is out of range: use {MIN_SIDE} to {most}")
    elif limits and value > limits.max_side:
        problems.append(f"{name} {value} is more than {limits.name} can take (its position table has "
                        f"{limits.position_rows} rows across): use at most {limits.max_side}")
    elif value % multiple:
        lower = max(multiple, value // multiple * multiple)
        problems.append(f"{name} {value} is not a multiple of {multiple}{which}: try {lower} or {lower + multiple}")


def check_frames(frames: int, mode: str, problems: list[str], limits: Limits | None = None) -> None:
    """The frame count: 1 for a still; else 4k+1, in range (what one window can take: window_choices)."""
    if mode == "t2i":
        if frames != 1:
            problems.append(f"text-to-image makes 1 frame, got frames={show(frames)}")
        return
    most = limits.max_frames if limits else MAX_FRAMES
    if frames < 1 or frames > MAX_FRAMES:
        problems.append(f"frames {show(frames)} is out of range: use 1 to {most}")
    elif (frames - 1) % 4:
        lower = (frames - 1) // 4 * 4 + 1
        problems.append(f"frames must be 4k+1 (1, 5, 9, ... up to {most}): {frames} is not; "
                        f"try {lower} or {lower + 4}")


def _shape(settings: Settings, problems: list[str], limits: Limits | None) -> dict:
    """Width, height and frames as whole numbers, each checked (against the model's ``limits`` when known)."""
    multiple = limits.size_multiple if limits else SIDE_MULTIPLE   # the model's own, once it is known
    shape = {}
    for name in ("width", "height"):
        shape[name] = as_int(name, getattr(settings, name), problems)
        if shape[name] is not None:
            check_side(name, shape[name], multiple, problems, limits)
    shape["frames"] = as_int("frames", settings.frames, problems)
    if shape["frames"] is not None:
        check_frames(shape["frames"], settings.mode, problems, limits)
    return shape


def _numbers(settings: Settings, problems: list[str]) -> dict:
    """Steps, fps, guidance and shift as numbers, each in its range."""
    steps = as_int("steps", settings.steps, problems)
    fps = as_int("fps", settings.fps, problems)
    guidance = as_float("guidance", settings.guidance, problems)
    shift = as_float("shift", settings.shift, problems)
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        problems.append(f"steps {show(steps)} is out of range: use 1 to {MAX_STEPS}")
    if guidance is not None and not 0 <= guidance <= MAX_GUIDANCE:
        problems.append(f"guidance {guidance} is out of range: use 0 to {MAX_GUIDANCE} (1 or less turns guidance off)")
    if shift is not None and not 0 < shift <= MAX_SHIFT:
        problems.append(f"shift {shift} is out of range: use a value above 0 and at most {MAX_SHIFT}")
    if fps is not None and not 1 <= fps <= MAX_FPS:
        problems.append(f"fps {show(fps)} is out of range: use 1 to {MAX_FPS}")
    count = as_int("count", settings.count, problems)
    if count is not None and not 1 <= count <= MAX_COUNT:
        problems.append(f"count {show(count)} is out of range: make 1 to {MAX_COUNT} videos at once (the queue "
                        "takes more requests)")
    guidance_2 = None
    if settings.guidance_2 is not None and not (isinstance(settings.guidance_2, str) and not settings.guidance_2.strip()):
        guidance_2 = as_float("low-noise guidance (guidance_2)", settings.guidance_2, problems)
        if guidance_2 is not None and not 0 <= guidance_2 <= MAX_GUIDANCE:
            problems.append(f"low-noise guidance {guidance_2} is out of range: use 0 to {MAX_GUIDANCE}, or leave it "
                            "empty to use the guidance")
        elif guidance_2 is not None and guidance is not None and guidance_2 > 1.0 >= guidance:
            problems.append(f"a low-noise guidance of {guidance_2} needs guidance above 1: guidance {guidance} turns "
                            "classifier-free guidance off for both experts; raise guidance, or leave the low-noise "
                            "guidance empty")
    strength = check_strength(settings.strength, problems)
    return {"steps": steps, "fps": fps, "guidance": guidance, "shift": shift, "guidance_2": guidance_2,
            "count": count, "strength": strength}


def check_experts(settings: Settings, limits: Limits | None) -> None:
    """InputError when ``settings`` ask what only a model with two experts (Wan2.2 A14B) can do (a low-noise
    guidance, swapping the experts) of a model with one; the engine asks it again once the model is resolved."""
    problems: list[str] = []
    _expert_choices(settings, problems, limits)
    if problems:
        raise InputError(problems)


def _expert_choices(settings: Settings, problems: list[str], limits: Limits | None) -> None:
    if limits is None or limits.experts > 1:
        return
    if settings.guidance_2 is not None:
        problems.append(f"{limits.name} has one transformer, no low-noise expert, so the low-noise guidance "
                        f"(guidance_2 = {settings.guidance_2}) has nothing to act on: leave it empty and set "
                        "guidance alone, or pick a two-expert model (Wan2.2 A14B)")
    if settings.strategy == "expert_swap":
        problems.append(f"strategy expert_swap swaps Wan2.2 A14B's two experts, but {limits.name} has one "
                        "transformer: choose auto or another strategy")


def window_choices(settings: Settings, frames: int | None, problems: list[str], limits: Limits | None) -> dict:
    """The window and overlap as whole numbers, each checked: a window 4k+1 the model can see at once, an
    overlap a multiple of 4 that leaves each window frames of its own; and no step cache on a video in windows
    (the caches decide per pass, and a window's pass is not the step's). Without ``limits`` (the model not known
    yet) the model's own window is not known, and what depends on it waits for the run's check."""
    window = as_int("window", settings.window, problems)
    overlap = as_int("overlap", settings.overlap, problems)
    most = limits.max_window if limits else MAX_WINDOW_FRAMES
    if window is not None and window:
        if not SHORTEST_WINDOW_FRAMES <= window <= MAX_WINDOW_FRAMES:
            problems.append(f"window {show(window)} is out of range: use 0 (the model's own) or "
                            f"{SHORTEST_WINDOW_FRAMES} to {most} frames")
            window = None
        elif limits and window > limits.max_window:
            problems.append(f"a window of {window} frames is more than {limits.name} can see at once (its position "
                            f"table has {limits.position_rows} rows for the frames): use at most {limits.max_window}")
            window = None
        elif (window - 1) % 4:
            lower = (window - 1) // 4 * 4 + 1
            problems.append(f"the window must be 4k+1 frames like the video: {window} is not; try {lower} or "
                            f"{lower + 4}")
            window = None
    used = (window or (limits.window if limits else 0)) if window is not None else 0
    if overlap is not None:
        if overlap < 4 or overlap % 4:
            problems.append(f"overlap {show(overlap)} must be a multiple of 4 frames (one latent frame each), at "
                            f"least 4: try {max(4, overlap // 4 * 4)}")
        elif used and overlap > (used - 1) // 2:
            problems.append(f"an overlap of {overlap} frames leaves a window of {used} too little of its own: use at "
                            f"most {(used - 1) // 2 // 4 * 4}, or a longer window")
    if used and frames and settings.mode != "t2i" and frames > used and settings.step_cache:
        problems.append(f"the step cache ({settings.step_cache}) decides once per pass over the whole video, but "
                        f"{frames} frames are denoised in windows of {used}: turn the step cache off, or make at "
                        f"most {used} frames")
    return {"window": window, "overlap": overlap}


def _post_choices(settings: Settings, shape: dict, fps: int | None, problems: list[str]) -> dict:
    """The smoother and larger factors as whole numbers, each 1, 2 or 4, and what they would make within what a
    video holds (engine/post/steps.py); what depends on the size waits until the size itself is right."""
    factors = {name: as_int(name, getattr(settings, name), problems) for name in ("interpolate", "upscale")}
    if None in factors.values():
        return factors
    frames, width, height = shape["frames"], shape["width"], shape["height"]
    if None in (frames, width, height):
        problems += [problem for problem in post_problems(factors["interpolate"], factors["upscale"], settings.mode,
                                                          2, 1, 1, None) if "is not a factor" in problem]
        return factors
    problems += post_problems(factors["interpolate"], factors["upscale"], settings.mode, frames, width, height,
                              fps if settings.mode != "t2i" else None)
    return factors


def _memory_choices(settings: Settings, problems: list[str]) -> None:
    if settings.strategy not in (None, *LADDER):
        problems.append(f"strategy {quoted(settings.strategy)} is unknown: use auto or one of {', '.join(LADDER)}")
    if settings.text_encoder not in (None, *TEXT_ENCODER_PLACES):
        problems.append(f"text encoder place {quoted(settings.text_encoder)} is unknown: use {', '.join(TEXT_ENCODER_PLACES)}")
    if settings.vae_tiling is not None and not isinstance(settings.vae_tiling, bool):
        problems.append(f"VAE tiling must be on, off or auto, got {quoted(settings.vae_tiling)}")
    if isinstance(settings.gpus, bool) or not isinstance(settings.gpus, int) or not 0 <= settings.gpus <= MAX_GPUS:
        problems.append(f"GPUs {quoted(settings.gpus)} is not a number of GPUs: use 0 (automatic) or 1 to {MAX_GPUS}")


def _speed_choices(settings: Settings, problems: list[str]) -> None:
    if settings.decoder not in DECODERS:
        problems.append(f"decoder {quoted(settings.decoder)} is unknown: use 'vae' (the model's own), 'vae_fast' (the "
                        "model's own, faster and approximate), 'vae_light' (a pruned VAE, approximate) or 'fast' "
                        "(approximate, needs a fast decoder file)")
    if settings.step_cache not in (None, *STEP_CACHES):
        problems.append(f"step cache {quoted(settings.step_cache)} is unknown: use none or one of {', '.join(STEP_CACHES)}")
    if settings.compile is not None and not isinstance(settings.compile, bool):
        problems.append(f"compile must be on, off or auto, got {quoted(settings.compile)}")
    if settings.compute not in COMPUTES:
        problems.append(f"compute {quoted(settings.compute)} is unknown: use 'exact' (the model's precision) or 'fp8' "
                        "(float8 linears, approximate, on GPUs with fp8 tensor cores)")
    if settings.guidance_batch is not None and not isinstance(settings.guidance_batch, bool):
        problems.append(f"guidance batch must be on, off or auto, got {quoted(settings.guidance_batch)}")
    if settings.attention not in (None, *ATTENTION_BACKENDS):
        problems.append(f"attention backend {quoted(settings.attention)} is unknown: use auto or one of "
                        f"{', '.join(ATTENTION_BACKENDS)}")
    if settings.vae_dtype not in (None, *VAE_DTYPES):
        problems.append(f"VAE precision {quoted(settings.vae_dtype)} is unknown: use auto or one of {', '.join(VAE_DTYPES)}")


def _transformer_files(settings: Settings, problems: list[str]) -> dict:
    """Each single transformer file: text naming a .gguf or .safetensors file that exists (a blank one is none).
    Whether it fits the model is known once the model is: engine/models/single_file.py checks that."""
    files = {}
    for name, words in TRANSFORMER_FILE_NAMES.items():
        value = getattr(settings, name)
        if value is not None and not isinstance(value, str):
            problems.append(f"the {words} must be a path (text), got {type(value).__name__}")
            continue
        value = (value or "").strip() or None
        files[name] = value
        if value is None:
            continue
        path = Path(value).expanduser()
        if path.suffix.lower() not in TRANSFORMER_FILE_SUFFIXES:
            problems.append(f"the {words} {value!r} is not a .gguf or .safetensors file: give a single transformer "
                            "file in one of those formats, or leave it empty to use the model's own")
        elif path.is_dir():
            problems.append(f"the {words} {value!r} is a folder: give the file itself")
        elif not path.is_file():
            problems.append(f"the {words} {value!r} does not exist: check the path")
        elif path.suffix.lower() == ".gguf" and (settings.strategy or "").startswith("fp8"):
            problems.append(f"strategy {settings.strategy} stores the transformer in fp8, but {path.name} is already "
                            "quantised (GGUF): choose auto or a strategy without fp8")
    return files
def _lora_choices(settings: Settings, problems: list[str]) -> tuple[Lora, ...]:
    """The LoRA list as Lora values with each strength a float: every file a LoRA for Wan that is there
    (engine/models/loras.py reads its header) or one the engine fetches from its ``repo``, the strength in range,
    the expert one of LORA_EXPERTS, no file twice for the same expert."""
    loras = () if settings.loras is None else settings.loras
    if isinstance(loras, (str, bytes)) or not isinstance(loras, (list, tuple)):
        problems.append(f"LoRAs must be a list of (file, strength) pairs, got {type(loras).__name__}")
        return ()
    checked, seen = [], set()
    for number, entry in enumerate(loras, 1):
        try:
            lora = as_lora(entry)
        except (TypeError, ValueError) as exc:
            problems.append(f"LoRA {number}: {exc}")
            continue
        file = lora.file
        if not isinstance(file, str) or not file.strip():
            problems.append(f"LoRA {number} has no file: give the path of a LoRA's .safetensors file")
            continue
        name = os.path.basename(file)
        strength = as_float(f"the strength of LoRA {name}", lora.strength, problems)
        if strength is not None and not -MAX_LORA_STRENGTH <= strength <= MAX_LORA_STRENGTH:
            problems.append(f"the strength of LoRA {name} is {strength}: use {-MAX_LORA_STRENGTH:g} to "
                            f"{MAX_LORA_STRENGTH:g} (1 is the LoRA as trained, 0 turns it off)")
        if lora.expert not in LORA_EXPERTS:
            problems.append(f"LoRA {name} is for expert {lora.expert!r}: use high (the high-noise expert), low (the "
                            "low-noise one) or both")
        sources = (lora.repo, lora.path)
        if not all(isinstance(v, (str, type(None))) for v in sources) or bool(lora.repo) != bool(lora.path):
            problems.append(f"LoRA {name} needs both a Hub repo and the file's path in it to be fetched, or neither")
        problem = lora_file_problem(file, lora.fetchable)
        if problem:
            problems.append(problem)
        same = (os.path.normcase(os.path.abspath(os.path.expanduser(file))), lora.expert)
        if same in seen:
            problems.append(f"LoRA {name} is listed twice: give it once, with the strength you want")
        seen.add(same)
        checked.append(Lora(file, strength if strength is not None else 0.0, lora.expert, lora.repo, lora.path))
    return tuple(checked)


def settings_problems(settings: Settings, limits: Limits | None = None) -> tuple[Settings | None, list[str]]:
    """(``settings`` with their numbers normalised, or None; every problem found, each saying what to change).
    ``limits``: what the settings' model can make (engine/models/limits.py), when it is known."""
    if settings.mode not in MODES:
        return None, [f"mode must be one of {', '.join(MODES)}, got {quoted(settings.mode)}"]
    problems: list[str] = []
    if not isinstance(settings.model, str) or not settings.model.strip():
        problems.append("no model chosen: pick a preset or give a model (repo id, folder or selftest-t2v)")
    shape = _shape(settings, problems, limits)
    numbers_ = _numbers(settings, problems)
    _memory_choices(settings, problems)
    _expert_choices(replace(settings, guidance_2=numbers_["guidance_2"]), problems, limits)
    _speed_choices(settings, problems)
    windows = window_choices(settings, shape["frames"], problems, limits)
    post = _post_choices(settings, shape, numbers_["fps"], problems)
    files = _transformer_files(settings, problems)
    loras = _lora_choices(settings, problems)
    if problems:
        return None, problems
    return replace(settings, **shape, **numbers_, **windows, **post, **files, loras=loras), []


def check_settings(settings: Settings, limits: Limits | None = None) -> Settings:
    """``settings`` with their numbers normalised (64.0 -> 64, "4" -> 4), or InputError listing every problem."""
    checked, problems = settings_problems(settings, limits)
    if problems:
        raise InputError(problems)
    return checked
