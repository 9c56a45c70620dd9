"""Presets: one JSON file each under presets/, loaded into frozen dataclasses.

Each file is validated once on load; an error names the file and the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BUILTIN_PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"
MODES = ("t2v", "i2v")
SCHEDULERS = ("unipc", "flow_euler")


class PresetError(ValueError):
    """A preset file is malformed or a preset name is unknown."""


@dataclass(frozen=True)
class Preset:
    name: str
    title: str
    description: str
    model: str
    mode: str
    width: int
    height: int
    frames: int
    steps: int
    guidance: float
    shift: float
    fps: int
    negative_prompt: str = ""
    size_multiple: int = 16
    scheduler: str = "unipc"
    sigmas: tuple[float, ...] | None = None
    selftest: bool = False


_REQUIRED = ["name", "title", "description", "model", "mode", "width", "height",
             "frames", "steps", "guidance", "shift", "fps"]
_TYPES = {
    "name": str, "title": str, "description": str, "model": str, "mode": str,
    "width": int, "height": int, "frames": int, "steps": int,
    "guidance": (int, float), "shift": (int, float), "fps": int,
    "negative_prompt": str, "size_multiple": int, "scheduler": str,
    "sigmas": (list, type(None)), "selftest": bool,
}


def _type_name(expected) -> str:
    if isinstance(expected, tuple):
        return " or ".join("null" if t is type(None) else t.__name__ for t in expected)
    return expected.__name__


def parse_preset(data: object, source: str) -> Preset:
    """Validate one preset's JSON data; ``source`` names it in errors."""
    if not isinstance(data, dict):
        raise PresetError(f"{source}: a preset must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_TYPES))
    if unknown:
        raise PresetError(f"{source}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(_TYPES)}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise PresetError(f"{source}: missing field(s) {', '.join(missing)}")
    for key, value in data.items():
        expected = _TYPES[key]
        # bool is an int subclass: refuse it where a number is expected.
        if isinstance(value, bool) and expected is not bool:
            raise PresetError(f"{source}: field '{key}' must be {_type_name(expected)}, got true/false")
        if not isinstance(value, expected):
            raise PresetError(f"{source}: field '{key}' must be {_type_name(expected)}, got {type(value).__name__}")
    values = dict(data)
    if values["mode"] not in MODES:
        raise PresetError(f"{source}: field 'mode' must be one of {', '.join(MODES)}, got {values['mode']!r}")
    if values.get("scheduler", "unipc") not in SCHEDULERS:
        raise PresetError(f"{source}: field 'scheduler' must be one of {', '.join(SCHEDULERS)}")
    for key in ("width", "height", "frames", "steps", "fps"):
        if values[key] <= 0:
            raise PresetError(f"{source}: field '{key}' must be positive, got {values[key]}")
    if values.get("sigmas") is not None:
        sigmas = values["sigmas"]
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and 0 <= s <= 1 for s in sigmas):
            raise PresetError(f"{source}: field 'sigmas' must be a list of numbers between 0 and 1")
        if len(sigmas) != values["steps"]:
            raise PresetError(f"{source}: field 'sigmas' has {len(sigmas)} values but 'steps' is {values['steps']}")
        values["sigmas"] = tuple(float(s) for s in sigmas)
    values["guidance"] = float(values["guidance"])
    values["shift"] = float(values["shift"])
    return Preset(**values)


def load_preset_file(path: Path) -> Preset:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PresetError(f"{path.name}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    preset = parse_preset(data, path.name)
    if preset.name != path.stem:
        raise PresetError(f"{path.name}: field 'name' is {preset.name!r} but the file is named {path.stem!r}; make them match")
    return preset


def load_presets(folder: Path = BUILTIN_PRESETS_DIR) -> dict[str, Preset]:
    """Load every ``*.json`` preset in ``folder``, keyed by name, in file order."""
    return {p.stem: load_preset_file(p) for p in sorted(Path(folder).glob("*.json"))}


def get_preset(presets: dict[str, Preset], name: str) -> Preset:
    try:
        return presets[name]
    except KeyError:
        raise PresetError(f"unknown preset {name!r}; choose one of: {', '.join(presets)}") from None
