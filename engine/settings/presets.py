"""Presets: one JSON file each under presets/, loaded into frozen dataclasses.

Each file is validated once on load; an error names the file and the field.
The user's own presets live in another folder (user_presets/ by default) and
are read and written through UserPresets; built-in presets are never touched.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from engine.models.loras import Lora, as_lora

from engine.settings.values import (MEMORY_CHOICES, PRESET_MODES, REQUIRED_SETTINGS, SCHEDULERS, SETTING_TYPES,
                                    SOURCE_CHOICES, SPEED_CHOICES, InputError, Settings, check_settings, split_values)

BUILTIN_PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"
# A user preset's name is also its file name and its id on the page and in the API.
NAME_CHARS = re.compile(r"[A-Za-z0-9_-]+")
MAX_NAME_CHARS = 64
MAX_TITLE_CHARS = 100
MAX_DESCRIPTION_CHARS = 1000
# Names Windows gives to devices: no file may be called so (con.json included).
WINDOWS_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}
# How a preset name's refused characters are named in the message.
CHAR_NAMES = {" ": "a space", ".": "a dot", "/": "a slash", "\\": "a backslash", "\t": "a tab"}
# Enough for anyone; stops a page caller from filling the disk with presets.
MAX_USER_PRESETS = 200
# The defaults of the optional choices: a preset file leaves out a choice that is at its default.
_DEFAULTS = {f.name: f.default for f in fields(Settings)}
_LORA_DEFAULTS = {f.name: f.default for f in fields(Lora)}


class PresetError(ValueError):
    """A preset file is malformed or a preset name is unknown."""


@dataclass(frozen=True)
class Preset:
    """A named starting point: its settings, the negative prompt it suggests, and words for people."""
    name: str
    title: str
    description: str
    settings: Settings
    negative_prompt: str = ""
    selftest: bool = False


_REQUIRED = ["name", "title", "description", *REQUIRED_SETTINGS]
# Settings that presets once held and that are now the model's own (a saved preset may still hold them): read and
# left out, so that the user's older presets keep working.
RETIRED = frozenset({"size_multiple"})
_TYPES = {"name": str, "title": str, "description": str, **SETTING_TYPES, "negative_prompt": str, "selftest": bool}


def _type_name(expected) -> str:
    if isinstance(expected, tuple):
        return " or ".join("null" if t is type(None) else t.__name__ for t in expected)
    return expected.__name__


def parse_preset(data: object, source: str) -> Preset:
    """Validate one preset's JSON data; ``source`` names it in errors."""
    if not isinstance(data, dict):
        raise PresetError(f"{source}: a preset must be a JSON object, got {type(data).__name__}")
    data = {key: value for key, value in data.items() if key not in RETIRED}
    unknown = sorted(set(data) - set(_TYPES))
    if unknown:
        raise PresetError(f"{source}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(_TYPES)}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise PresetError(f"{source}: missing field(s) {', '.join(missing)}")
    for key, value in data.items():
        expected = _TYPES[key]
        # bool is an int subclass: refuse it where a number is expected.
        if isinstance(value, bool) and bool not in (expected if isinstance(expected, tuple) else (expected,)):
            raise PresetError(f"{source}: field '{key}' must be {_type_name(expected)}, got true/false")
        if not isinstance(value, expected):
            raise PresetError(f"{source}: field '{key}' must be {_type_name(expected)}, got {type(value).__name__}")
    values = dict(data)
    if values["mode"] not in PRESET_MODES:
        raise PresetError(f"{source}: field 'mode' must be one of {', '.join(PRESET_MODES)}, got {values['mode']!r}")
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
    if "loras" in values:
        values["loras"] = _preset_loras(values["loras"], source)
    settings, own = split_values(values)
    try:
        checked = check_settings(Settings.from_dict(settings))
    except InputError as exc:
        raise PresetError(f"{source}: {exc}") from None
    return Preset(settings=checked, **own)


def _preset_loras(loras: list, source: str) -> tuple[Lora, ...]:
    """A preset's LoRAs: a JSON object each, {"file", "strength", "expert", "repo", "path"} (or an older
    [file, strength] pair). A LoRA published on the Hub (``repo`` and ``path``) is named by its file name in the
    models folder's loras/, where the engine fetches it the first time."""
    read = []
    for number, entry in enumerate(loras, 1):
        try:
            lora = as_lora(entry)
        except (TypeError, ValueError) as exc:
            raise PresetError(f"{source}: LoRA {number}: {exc}") from None
        if lora.repo and (not isinstance(lora.file, str) or re.search(r"[\\/]", lora.file)):
            raise PresetError(f"{source}: LoRA {number} is fetched from {lora.repo}: give its 'file' as a bare name "
                              f"(it is kept in the models folder's loras/), got {lora.file!r}")
        read.append(lora)
    return tuple(read)


def _lora_json(lora: Lora) -> dict:
    """A LoRA as a preset file holds it: what is not at its default."""
    data = asdict(lora)
    return {key: value for key, value in data.items() if key in ("file", "strength") or value != _LORA_DEFAULTS[key]}


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


# ----- the user's own presets ------------------------------------------------
def preset_for_model(presets: dict[str, Preset], ref: str, mode: str) -> Preset | None:
    """The preset for a model the command line names without one: a preset of that model and mode, else, for a model
    folder distilled for its own steps (FastWan's ``WanDMDPipeline``), one made for that sampler; None for others."""
    for preset in presets.values():
        if preset.settings.model == ref and preset.settings.mode == mode:
            return preset
    from engine.models.refs import folder_pipeline_kind

    kind = folder_pipeline_kind(ref)
    sampler = kind.sampler if kind is not None else None
    for preset in presets.values() if sampler else ():
        if preset.settings.scheduler == sampler.scheduler and preset.settings.mode == mode:
            return preset
    return None


def check_user_preset_name(name: object, builtin_names=()) -> str:
    """``name`` if it may name a user preset, else PresetError saying what to change.

    Letters, digits, '-' and '_', 1 to 64 characters; not a built-in preset's name (in any case).
    """
    if not isinstance(name, str) or not name.strip():
        raise PresetError("give the preset a name: letters, digits, '-' and '_', up to 64 characters")
    name = name.strip()
    if name.lower() in {b.lower() for b in builtin_names}:
        raise PresetError(f"{name!r} is the name of a built-in preset, which cannot be replaced; pick another name")
    if name.split(".")[0].lower() in WINDOWS_RESERVED:
        raise PresetError(f"{name!r} is a name Windows keeps for a device, so its file could not be made there; "
                          "pick another name")
    if len(name) > MAX_NAME_CHARS:
        raise PresetError(f"the name has {len(name)} characters; use at most {MAX_NAME_CHARS}")
    if not NAME_CHARS.fullmatch(name):
        bad = sorted({c for c in name if not NAME_CHARS.fullmatch(c)})
        named = [CHAR_NAMES.get(c, repr(c)) for c in bad]
        shown = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
        raise PresetError(f"the name {name!r} has {shown} in it: use only letters, digits, '-' and '_' "
                          "(no spaces or dots)")
    return name


def _check_texts(preset: Preset) -> None:
    if not preset.title.strip() or "\n" in preset.title or len(preset.title) > MAX_TITLE_CHARS:
        raise PresetError(f"the title must be one line of 1 to {MAX_TITLE_CHARS} characters")
    if len(preset.description) > MAX_DESCRIPTION_CHARS:
        raise PresetError(f"the description has {len(preset.description)} characters; "
                          f"keep it under {MAX_DESCRIPTION_CHARS}")


def preset_json(preset: Preset) -> dict:
    """The preset as the JSON object its file holds (parse_preset reads it back unchanged)."""
    own = {f.name: getattr(preset, f.name) for f in fields(preset) if f.name != "settings"}
    data = {**own, **preset.settings.to_dict()}
    if data["sigmas"] is not None:
        data["sigmas"] = list(data["sigmas"])
    data["loras"] = [_lora_json(lora) for lora in preset.settings.loras]
    left_out = {key for key in (*MEMORY_CHOICES, *SPEED_CHOICES, *SOURCE_CHOICES)
                if data[key] == _DEFAULTS[key] or (key == "loras" and not data[key])}
    return {key: data[key] for key in _TYPES if key not in left_out}


@dataclass
class UserPresets:
    """The user's presets: one JSON file each in ``folder``, kept in step with the shared ``presets`` dict.

    The names in ``presets`` when this is made are the built-ins: they are never replaced or
    deleted, and a user file with one of their names is skipped. Saving and deleting change the
    folder and ``presets`` together, under one lock.
    """
    folder: Path
    presets: dict[str, Preset]
    limit: int = MAX_USER_PRESETS
    builtin: frozenset[str] = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self):
        self.folder = Path(self.folder)
        self.builtin = frozenset(self.presets)
        if self.folder.resolve() == BUILTIN_PRESETS_DIR.resolve():
            raise PresetError(f"{self.folder} holds the built-in presets; keep your own presets in another folder")

    def is_user(self, name: str) -> bool:
        return name in self.presets and name not in self.builtin

    def names(self) -> list[str]:
        return [name for name in list(self.presets) if name not in self.builtin]

    def load(self) -> list[str]:
        """Add every valid ``*.json`` of the folder to ``presets``; return why each other one was skipped."""
        return self._read(forget_missing=False)

    def reload(self) -> list[str]:
        """The folder read again (a preset file dropped in, changed or removed by hand while the app runs): the
        same as ``load``, and a user preset whose file is gone is gone from ``presets`` too."""
        return self._read(forget_missing=True)

    def _read(self, forget_missing: bool) -> list[str]:
        problems = []
        if not self.folder.exists():
            if forget_missing:
                with self._lock:
                    for name in self.names():
                        del self.presets[name]
            return problems
        if not self.folder.is_dir():
            return [f"user presets folder {self.folder} is not a folder; no user presets loaded"]
        with self._lock:
            if forget_missing:
                for name in self.names():
                    if not (self.folder / f"{name}.json").is_file():
                        del self.presets[name]
            for path in sorted(self.folder.glob("*.json")):
                if path.name.startswith("."):   # a write cut short by a crash
                    continue
                try:
                    check_user_preset_name(path.stem, self.builtin)
                    preset = load_preset_file(path)
                except (PresetError, OSError, UnicodeDecodeError) as exc:
                    problems.append(f"user preset {path} skipped: {exc}")
                    continue
                self.presets[preset.name] = preset
        return problems

    def save(self, data: dict) -> tuple[Preset, bool]:
        """Validate ``data`` (a preset's JSON object), write it as ``<name>.json``; (preset, True if replaced).

        Refused with PresetError: a bad name, a built-in's name, a name that differs from one of
        your presets only in case, a value parse_preset refuses, or one preset too many.
        """
        name = check_user_preset_name(data.get("name") if isinstance(data, dict) else None, self.builtin)
        preset = parse_preset({**data, "name": name}, f"{name}.json")
        _check_texts(preset)
        with self._lock:
            mine = self.names()
            twin = next((n for n in mine if n.lower() == name.lower() and n != name), None)
            if twin:
                raise PresetError(f"{name!r} differs from your preset {twin!r} only in case; "
                                  f"use {twin!r} to replace it, or pick another name")
            replaced = name in mine
            if not replaced and len(mine) >= self.limit:
                raise PresetError(f"you have {len(mine)} presets, the most kept; delete one first")
            self._write(name, preset)
            self.presets[name] = preset
        return preset, replaced

    def delete(self, name: str) -> Preset:
        """Remove one of the user's presets (its file and its entry); built-ins are refused."""
        with self._lock:
            if isinstance(name, str) and name in self.builtin:
                raise PresetError(f"{name!r} is a built-in preset; only your own presets can be deleted")
            if not isinstance(name, str) or not self.is_user(name):
                raise PresetError(f"there is no preset of yours named {name!r}")
            try:
                (self.folder / f"{name}.json").unlink(missing_ok=True)
            except OSError as exc:
                raise PresetError(f"could not delete {self.folder / (name + '.json')}: {exc.strerror or exc}") from exc
            return self.presets.pop(name)

    def _write(self, name: str, preset: Preset) -> None:
        """Write the file whole or not at all (engine/atomic.py write_json: a temporary file renamed over the old one)."""
        from engine.atomic import write_json

        path = self.folder / f"{name}.json"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_json(preset_json(preset), path)
        except OSError as exc:
            raise PresetError(f"could not write {path}: {exc.strerror or exc}; "
                              "start the app with --user-presets DIR to use another folder") from exc
