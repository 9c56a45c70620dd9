"""The sidecar: the JSON file beside every output that says what it is and how it was made.

One schema for both sides: ``record`` builds a ``Sidecar`` and writes it, the history reads one
back. The file is meant for people and other programs too, so its keys stay where they have
always been; ``"schema"`` says which version of this layout a file follows:

- no ``"schema"`` key (version 0): written before the number existed;
- ``"schema": 1``: the same keys, with the number first.

A newer number is read as far as its keys are understood.

A sidecar has one of two shapes. A generation run's holds the request's values at the top level
(mode, prompt, negative prompt, seed, preset) and in ``"parameters"`` (the rest of the request),
what was written in ``"output"``, the memory plan and how the run went. A decode again from saved
latents holds the prompt and seed at the top level, the whole request in ``"parameters"``, and
``"decoded"`` / ``"decoded_from"`` instead of the plan.

Reading is defensive, because a sidecar is a file anyone may edit: a file larger than
MAX_SIDECAR_BYTES or nested deeper than MAX_DEPTH is not read further; a value is looked for at the
top level and then in ``"parameters"``; a part that is missing or of the wrong type counts as
absent where the output can be understood without it, and makes the file unreadable
(SidecarError) where it cannot (no media file name, mode, prompt, seed, size, frame count, steps,
guidance or shift). Every number read is finite and at most MAX_NUMBER in size, so an entry goes back
out as JSON to any reader; each setting has the type a preset file gives it (``SETTING_TYPES``).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine import APP_ID
from engine.models.loras import as_lora
from engine.settings.values import MODES, SETTING_TYPES, Settings
from engine.atomic import write_json

SCHEMA = 1
# The numbers every readable sidecar has besides its seed (Sidecar reads them from "parameters" and "output").
NUMBERS = ("width", "height", "frames", "steps", "guidance", "shift", "fps")
# A sidecar this app writes is a few kB (one with 200 steps' seconds about 20 kB) and nested 5 levels deep:
# a file past either limit is no sidecar of ours, and reading it whole would cost the history its speed.
MAX_SIDECAR_BYTES = 1_000_000
MAX_DEPTH = 32
# The largest whole number every JSON reader holds exactly (a browser's included): no size, count or seed is near.
MAX_NUMBER = 2**53


class SidecarError(ValueError):
    """A file that is not a readable sidecar of this app; the message says why."""


class ForeignFile(SidecarError):
    """A JSON file that another program wrote (no ``"app": {"name": "wan-studio"}``): not a sidecar at all."""


class _Parameter:
    """A number of the request, read from a sidecar's ``parameters`` (ValueError, KeyError or TypeError when
    it is missing or not a number): the value is kept in one place only, where the file keeps it."""

    def __init__(self, kind: type):
        self.kind = kind

    def __set_name__(self, owner, name: str):
        self.name = name

    def __get__(self, sidecar, owner=None):
        return self if sidecar is None else _number(sidecar.parameters[self.name], self.kind, self.name)


@dataclass(frozen=True)
class RunDetails:
    """What only a generation run records: how the run went (as recorded: an old file may lack a part, None)."""
    step_downs: list            # each {"phase", "from", "to"}: a step down the memory plan after out-of-memory
    latents: str | None         # the saved latents, while they are kept
    decode_fallback: str | None  # how the decode finally worked, when not as planned
    model_reused: bool          # the model was loaded already
    step_seconds: list          # seconds of each denoising step
    # Wan2.2 A14B: the steps each expert ran ({"transformer": high-noise, "transformer_2": low-noise}), the first
    # low-noise step's index ("switch_step", None when it ran none), and whether the run swapped them on the device.
    experts: dict | None = None
    # A long video: the windows each step ran the transformer on (engine/models/windows.py's to_dict).
    windows: dict | None = None


@dataclass(frozen=True)
class DecodeDetails:
    """What a decode again from saved latents records instead."""
    how: str                    # "tiled", "untiled" or "on the CPU"
    latents: str | None         # the latents file it decoded


@dataclass(frozen=True)
class Sidecar:
    """One output's sidecar, as written and as read back.

    ``mode`` to ``preset`` are the request's values wherever the file holds them (the top level,
    else ``parameters``); the size, steps, guidance and shift are read from ``parameters``, the
    frame count and rate from ``output`` first. Free-form parts (``parameters``, ``plan``,
    ``hardware``...) hold what the JSON holds (lists, not tuples), so a sidecar read back equals the
    one written. Exactly one of ``run`` and ``decoded`` is set.
    """
    file: str                   # the media file's name, beside the sidecar
    mode: str                   # "t2v", "i2v" or "t2i"
    prompt: str
    negative_prompt: str
    seed: int
    model: str                  # the model reference
    preset: str | None          # as recorded
    parameters: dict            # the request's values (a run's: without the prompts and the outputs folder)
    output: dict | None = None  # a run's {"frames", "height", "width", "fps"} of the file written
    run: RunDetails | None = None
    decoded: DecodeDetails | None = None
    model_details: dict | None = None   # "model": a run's {"ref", "source", "revision", "pipeline"}
    created: str | None = None          # local time, ISO 8601 (a decode again records none)
    plan: dict | None = None            # the memory plan of a run
    timings: dict[str, float] = field(default_factory=dict)   # phase -> seconds, in run order
    peak_vram_gb: float | None = None
    peak_ram_gb: float | None = None
    versions: dict | None = None
    hardware: dict | None = None
    inputs: dict | None = None          # kept input images: {"image": name or None, "last_image": ...}
    speed: dict | None = None           # a run's speed: {"decoder", "approximate", "step_cache", "predicted_seconds"...}
    # The steps after the video was written (smoother, larger), in order: engine/post/steps.py's PostRecord.to_dict.
    post: list = field(default_factory=list)
    # An extension: the video it continued, how the parts were joined, and every part (engine/post/extend.py).
    extend: dict | None = None
    note: str = ""
    app_version: str | None = None
    schema: int = SCHEMA

    width = _Parameter(int)
    height = _Parameter(int)
    steps = _Parameter(int)
    guidance = _Parameter(float)
    shift = _Parameter(float)

    def __post_init__(self):
        if (self.run is None) == (self.decoded is None):
            raise ValueError("a sidecar is a run's (run=RunDetails) or a decode again's (decoded=DecodeDetails)")

    @property
    def made_frames(self) -> tuple[int, int | None]:
        """(frames, fps) as the run made them, before any step after it (smoother, an extension's join) changed them:
        what Reuse settings asks for again, the steps coming back with the settings."""
        if not self.post and not self.extend:
            return self.frames, self.fps
        fps = self.parameters.get("fps")
        return (_number(self.parameters["frames"], int, "frames"),
                None if fps is None or self.mode == "t2i" else _number(fps, int, "fps"))

    @property
    def frames(self) -> int:
        """The frame count of the file written (a run's ``output``), else the request's."""
        return _number((self.output or {}).get("frames", self.parameters["frames"]), int, "frames")

    @property
    def fps(self) -> int | None:
        """Frames a second (None for a still that a run wrote)."""
        fps = (self.output or {}).get("fps", self.parameters.get("fps"))
        return None if fps is None else _number(fps, int, "fps")

    @property
    def strategy(self):
        """The memory plan's strategy, as recorded (None without a plan)."""
        return _text_or_none(self.plan.get("strategy")) if self.plan else None

    @property
    def device(self):
        """Where the plan ran the model ("cuda", "cpu", ...), as recorded (None without a plan)."""
        return _text_or_none(self.plan.get("device")) if self.plan else None

    def settings(self) -> Settings:
        """The settings the output was made with: the numbers as read above, the rest from ``parameters``
        (what an older sidecar lacks takes Settings' defaults)."""
        numbers = {name: getattr(self, name) for name in ("width", "height", "steps", "guidance", "shift")}
        frames, fps = self.made_frames
        values = _setting_values(self.parameters)
        fps = fps or values.get("fps") or Settings.fps   # a still's file has no frame rate
        return Settings.from_dict({**values, **numbers, "frames": frames, "model": self.model, "mode": self.mode,
                                   "fps": fps})

    # ----- writing ----------------------------------------------------------------
    def to_json(self) -> dict:
        """The JSON object of this sidecar, its keys in the order of the layout."""
        head = {"schema": self.schema, "app": {"name": APP_ID, "version": self.app_version}}
        body = self._run_json() if self.run is not None else self._decoded_json()
        tail = {"peak_vram_gb": self.peak_vram_gb, "peak_ram_gb": self.peak_ram_gb, "versions": self.versions,
                "hardware": self.hardware}
        if self.inputs is not None:
            tail["inputs"] = self.inputs
        if self.speed is not None:
            tail["speed"] = self.speed
        if self.post:
            tail["post"] = self.post
        if self.extend is not None:
            tail["extend"] = self.extend
        if self.note:
            tail["note"] = self.note
        return head | body | tail

    def _run_json(self) -> dict:
        run = self.run
        return {
            "created": self.created, "file": self.file, "mode": self.mode, "prompt": self.prompt,
            "negative_prompt": self.negative_prompt, "seed": self.seed, "model": self.model_details,
            "preset": self.preset, "parameters": self.parameters, "output": self.output, "plan": self.plan,
            "step_downs": run.step_downs, "latents": run.latents, "decode_fallback": run.decode_fallback,
            "model_reused": run.model_reused, "timings": self.timings, "step_seconds": run.step_seconds,
        } | ({"experts": run.experts} if run.experts is not None else {}) \
            | ({"windows": run.windows} if run.windows is not None else {})

    def _decoded_json(self) -> dict:
        return {"file": self.file, "decoded_from": self.decoded.latents, "decoded": self.decoded.how,
                "prompt": self.prompt, "seed": self.seed, "model": self.model_details,
                "parameters": self.parameters, "timings": self.timings} \
            | ({"output": self.output} if self.output is not None else {})   # made smoother or larger since

    # ----- reading ----------------------------------------------------------------
    @classmethod
    def from_json(cls, data) -> "Sidecar":
        """The sidecar a parsed JSON value describes (any version), or SidecarError saying why it is none."""
        if not isinstance(data, dict) or not isinstance(data.get("app"), dict) or data["app"].get("name") != APP_ID:
            raise ForeignFile("not a sidecar of this app (no \"app\": {\"name\": \"wan-studio\"})")
        try:
            decoded = data.get("decoded")
            sidecar = cls(
                **_request_values(data), model_details=_dict_or_none(data.get("model")),
                created=_created(data.get("created")), plan=_dict_or_none(data.get("plan")),
                timings=_timings(data.get("timings")),
                peak_vram_gb=_optional_float(data.get("peak_vram_gb")),
                peak_ram_gb=_optional_float(data.get("peak_ram_gb")),
                versions=data.get("versions"), hardware=data.get("hardware"),
                inputs=_dict_or_none(data.get("inputs")), speed=_dict_or_none(data.get("speed")),
                post=_post(data.get("post")), extend=_dict_or_none(data.get("extend")),
                note=data["note"] if isinstance(data.get("note"), str) else "",
                run=None if decoded else _run_details(data),
                decoded=DecodeDetails(str(decoded), data.get("decoded_from")) if decoded else None,
                app_version=_text_or_none(data["app"].get("version")), schema=_schema(data.get("schema", 0)))
            for name in NUMBERS:   # each must read now: a sidecar without them is no output's
                getattr(sidecar, name)
            return sidecar
        except SidecarError:
            raise
        except KeyError as exc:
            raise SidecarError(f"it has no {exc.args[0]}") from None
        except (TypeError, AttributeError, ValueError) as exc:
            raise SidecarError(str(exc)) from None


def model_name(details, parameters: dict) -> str:
    """The model reference a sidecar names: its ``"model"`` object's ref, else the request's model."""
    ref = details.get("ref") if isinstance(details, dict) else None
    return next((name for name in (ref, parameters.get("model")) if isinstance(name, str) and name), "")


def _request_values(data: dict) -> dict:
    """``Sidecar``'s request values from a parsed sidecar: the top level first, then ``"parameters"``."""
    params = data["parameters"] if isinstance(data.get("parameters"), dict) else {}
    file = data.get("file")
    mode = data.get("mode") or params.get("mode")
    prompt = data["prompt"] if "prompt" in data else params.get("prompt")
    negative = data["negative_prompt"] if "negative_prompt" in data else params.get("negative_prompt")
    if not isinstance(file, str) or mode not in MODES or not isinstance(prompt, str):
        raise SidecarError("a sidecar needs the file name, the mode and the prompt")
    return dict(
        file=file, mode=mode, prompt=prompt, negative_prompt=negative if isinstance(negative, str) else "",
        seed=_number(data.get("seed", params.get("seed")), int, "seed"), model=model_name(data.get("model"), params),
        preset=_text_or_none(data["preset"] if "preset" in data else params.get("preset")), parameters=params,
        output=_dict_or_none(data.get("output")))


def _run_details(data: dict) -> RunDetails:
    return RunDetails(
        step_downs=data.get("step_downs"), latents=data.get("latents"), decode_fallback=data.get("decode_fallback"),
        model_reused=data.get("model_reused"), step_seconds=data.get("step_seconds"),
        experts=_dict_or_none(data.get("experts")), windows=_dict_or_none(data.get("windows")))


def _number(value, kind: type, name: str):
    """``value`` as ``kind`` (int or float): a JSON number, finite, at most MAX_NUMBER in size, and whole for an
    int; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} {_shown(value)} is not a number")
    if not _real(value):
        raise ValueError(f"{name} {_shown(value)} is out of range")
    if kind is int and value != int(value):
        raise ValueError(f"{name} {_shown(value)} is not a whole number")
    return kind(value)


def _real(value) -> bool:
    """A JSON number (not true or false), finite and at most MAX_NUMBER in size."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= MAX_NUMBER and (isinstance(value, int) or math.isfinite(value))


def _shown(value) -> str:
    """A value as the file holds it, cut short for a message."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 24 else text[:24] + "..."


def _optional_float(value) -> float | None:
    return float(value) if _real(value) else None


def _text_or_none(value) -> str | None:
    return value if isinstance(value, str) else None


def _setting_values(parameters: dict) -> dict:
    """The settings in a sidecar's ``parameters`` that have the type a preset file gives them (SETTING_TYPES),
    numbers in range; any other counts as absent (Settings' default)."""
    return {name: value for name, value in parameters.items() if name in SETTING_TYPES and _fits(name, value)}


def _fits(name: str, value) -> bool:
    kinds = SETTING_TYPES[name] if isinstance(SETTING_TYPES[name], tuple) else (SETTING_TYPES[name],)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _real(value)
    if name == "sigmas" and value is not None:
        return all(_real(sigma) for sigma in value)
    if name == "loras":
        return all(_lora_fits(entry) for entry in value)
    return True


def _lora_fits(entry) -> bool:
    """A LoRA as a sidecar records it: a file name, a strength, an expert, and where it is published (or None)."""
    try:
        lora = as_lora(entry)
    except (TypeError, ValueError):
        return False
    return (isinstance(lora.file, str) and _real(lora.strength) and isinstance(lora.expert, str)
            and all(part is None or isinstance(part, str) for part in (lora.repo, lora.path)))


def _post(value) -> list:
    """The steps after the run as recorded: each an object with a step name and a factor (others left out)."""
    items = value if isinstance(value, list) else []
    return [item for item in items if isinstance(item, dict) and item.get("step") in ("interpolate", "upscale")
            and item.get("factor") in (2, 4)]


def _dict_or_none(value) -> dict | None:
    return value if isinstance(value, dict) else None


def _created(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _timings(value) -> dict[str, float]:
    """Phase -> seconds; anything that is not a number is left out."""
    items = value.items() if isinstance(value, dict) else ()
    return {str(k): float(v) for k, v in items if _real(v)}


def _schema(value) -> int:
    """The layout version a sidecar says it follows (0: before the number existed)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SidecarError(f"the sidecar's schema {value!r} is not a version number")
    return value


# ----- the file -------------------------------------------------------------------
def read_sidecar(path: Path | str) -> Sidecar:
    """The sidecar in the file ``path``; OSError when it cannot be read, SidecarError when it is not one (larger
    than MAX_SIDECAR_BYTES, not JSON text, nested deeper than MAX_DEPTH, or not a sidecar's layout)."""
    return Sidecar.from_json(_parsed(_text(Path(path))))


def _text(path: Path) -> str:
    """The file's text, read only when it is small enough to be a sidecar."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        raw = file.read(MAX_SIDECAR_BYTES + 1) if size <= MAX_SIDECAR_BYTES else b""
    if size > MAX_SIDECAR_BYTES or len(raw) > MAX_SIDECAR_BYTES:
        raise SidecarError(f"it is {max(size, len(raw)) / 1e6:.1f} MB, larger than any sidecar "
                           f"({MAX_SIDECAR_BYTES / 1e6:g} MB at most)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SidecarError("it is not text (UTF-8)") from None


def _parsed(text: str):
    """The JSON value of a sidecar's text; SidecarError when it is not JSON or is nested deeper than MAX_DEPTH."""
    try:
        data = json.loads(text)
    except RecursionError:   # the parser itself gives up on a deep nesting
        raise SidecarError(f"it is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise SidecarError(f"it is not JSON ({exc})") from None
    if _depth(data) > MAX_DEPTH:
        raise SidecarError(f"it is nested more than {MAX_DEPTH} levels deep")
    return data


def _depth(value) -> int:
    """How deeply arrays and objects nest in ``value`` (walked without recursion; stops past MAX_DEPTH)."""
    deepest, waiting = 0, [(value, 1)]
    while waiting and deepest <= MAX_DEPTH:
        item, depth = waiting.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            waiting.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def write_sidecar(sidecar: Sidecar, path: Path | str) -> Path:
    """Write ``sidecar`` to ``path``, whole or not at all."""
    return write_json(sidecar.to_json(), Path(path))
