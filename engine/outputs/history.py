"""Past outputs, read from the outputs folder: list them, turn one back into form values, delete one.

Every finished run leaves ``<outputs>/<day>/<stem>.mp4`` (or ``.png``) and its sidecar
``<stem>.json``, perhaps with ``<stem>.latents.safetensors`` and the kept input images
``<stem>.first.png`` / ``<stem>.last.png``. An entry is read from the sidecar alone, so the
history needs no database and survives restarts. A sidecar that cannot be read, whose media file
is gone, or that another program wrote is skipped; nothing here raises for a bad file.

An output is named by its key, ``<day>/<media file name>`` (``2025-01-31/153000_t2v_a-fox_7.mp4``).
``delete_output`` accepts only the key of an output that ``scan_history`` would list: inside the
outputs folder, one folder deep, no ``..``, no absolute path, no symbolic link.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine import APP_ID
from engine.outputs.kept_inputs import INPUT_SUFFIXES
from engine.outputs.latents import SUFFIX as LATENTS_SUFFIX

MEDIA_KINDS = {".mp4": "video", ".png": "image"}
# Files that belong to an output besides its media file, by suffix after the stem.
COMPANION_SUFFIXES = (".json", LATENTS_SUFFIX, *INPUT_SUFFIXES.values())
DEFAULT_LIMIT = 100
KEY_EXAMPLE = "2025-01-31/153000_t2v_a-red-fox_7.mp4"


class HistoryError(ValueError):
    """An output cannot be found, read or deleted; the message says which and why."""


@dataclass(frozen=True)
class HistoryEntry:
    """One past output, as its sidecar describes it (paths are absolute)."""
    key: str                    # "<day>/<media file name>"
    kind: str                   # "video" or "image"
    media: str
    sidecar: str
    created: str                # local time, ISO 8601
    mode: str                   # "t2v", "i2v" or "t2i"
    prompt: str
    negative_prompt: str
    model: str
    preset: str | None
    width: int
    height: int
    frames: int
    steps: int
    guidance: float
    shift: float
    seed: int
    fps: int | None = None
    strategy: str | None = None               # the memory plan's strategy
    timings: dict[str, float] = field(default_factory=dict)   # phase -> seconds, in run order
    peak_vram_gb: float | None = None
    peak_ram_gb: float | None = None
    first_image: str | None = None            # the kept input images of an image-to-video run
    last_image: str | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def label(self, words: int = 8) -> str:
        """A short caption: the prompt's first words and the date and time."""
        shown = self.prompt.split()
        text = " ".join(shown[:words]) + (" ..." if len(shown) > words else "")
        return f"{text or '(no prompt)'} · {self.created[:16].replace('T', ' ')}"


@dataclass(frozen=True)
class ReuseValues:
    """What to put back in a generation form to run an output again."""
    tab: str                    # "t2v" (text-to-video and text-to-image) or "i2v"
    mode: str
    preset: str | None
    prompt: str
    negative_prompt: str
    model: str
    width: int
    height: int
    frames: int | None          # None for an image: leave the form's frame count alone
    steps: int
    guidance: float
    shift: float
    seed: int                   # the seed actually used, so the same output comes again
    image: str | None = None
    last_image: str | None = None


def reuse_values(entry: HistoryEntry) -> ReuseValues:
    """The form values that make ``entry`` again (its seed included)."""
    return ReuseValues(
        tab="i2v" if entry.mode == "i2v" else "t2v", mode=entry.mode, preset=entry.preset, prompt=entry.prompt,
        negative_prompt=entry.negative_prompt, model=entry.model, width=entry.width, height=entry.height,
        frames=None if entry.mode == "t2i" else entry.frames, steps=entry.steps, guidance=entry.guidance,
        shift=entry.shift, seed=entry.seed, image=entry.first_image, last_image=entry.last_image)


# ----- reading ----------------------------------------------------------------
def _plain(path: Path) -> bool:
    """A regular file or folder, not a link and not hidden (partial files start with a dot)."""
    return not path.name.startswith(".") and not path.is_symlink()


def _kept_input(sidecar: Path, stem: str, name, suffix: str) -> str | None:
    """The kept input image the sidecar names, if it is the expected file beside it."""
    if name != stem + suffix:
        return None
    path = sidecar.with_name(name)
    return str(path) if path.is_file() and not path.is_symlink() else None


def _number(value, kind):
    if isinstance(value, bool) or value is None:
        raise ValueError("not a number")
    return kind(value)


def read_entry(sidecar: Path) -> HistoryEntry | None:
    """The entry a sidecar describes, or None when it is not a readable sidecar of an existing output."""
    sidecar = Path(sidecar)
    try:
        if not (_plain(sidecar) and _plain(sidecar.parent) and sidecar.is_file()):
            return None
        data = json.loads(sidecar.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("app"), dict) or data["app"].get("name") != APP_ID:
            return None
        file = data.get("file")
        stem = sidecar.name[: -len(".json")]
        if not isinstance(file, str) or Path(file).suffix not in MEDIA_KINDS or file != stem + Path(file).suffix:
            return None
        media = sidecar.with_name(file)
        if not media.is_file() or media.is_symlink():
            return None
        params = data.get("parameters") if isinstance(data.get("parameters"), dict) else {}
        model = data.get("model")
        model_ref = model.get("ref") if isinstance(model, dict) else None
        output = data.get("output") if isinstance(data.get("output"), dict) else {}
        plan = data.get("plan") if isinstance(data.get("plan"), dict) else {}
        inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
        timings = data.get("timings") if isinstance(data.get("timings"), dict) else {}
        created = data.get("created")
        if not isinstance(created, str) or not created:
            created = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(media.stat().st_mtime))
        note = data.get("note") or ""
        if data.get("decoded"):
            note = f"Decoded again ({data['decoded']}) from saved latents. {note}".strip()
        mode = data.get("mode") or params.get("mode")
        prompt = data["prompt"] if "prompt" in data else params.get("prompt")
        negative = data["negative_prompt"] if "negative_prompt" in data else params.get("negative_prompt")
        if mode not in ("t2v", "i2v", "t2i") or not isinstance(prompt, str):
            return None
        fps = output.get("fps", params.get("fps"))
        return HistoryEntry(
            key=f"{sidecar.parent.name}/{file}", kind=MEDIA_KINDS[media.suffix], media=str(media),
            sidecar=str(sidecar), created=created, mode=mode, prompt=prompt,
            negative_prompt=negative if isinstance(negative, str) else "",
            model=str(model_ref or params.get("model") or ""),
            preset=data.get("preset", params.get("preset")) or None,
            width=_number(params["width"], int), height=_number(params["height"], int),
            frames=_number(output.get("frames", params["frames"]), int), steps=_number(params["steps"], int),
            guidance=_number(params["guidance"], float), shift=_number(params["shift"], float),
            seed=_number(data.get("seed", params.get("seed")), int),
            fps=None if fps is None else _number(fps, int),
            strategy=plan.get("strategy"),
            timings={str(k): float(v) for k, v in timings.items() if isinstance(v, (int, float))},
            peak_vram_gb=_optional_float(data.get("peak_vram_gb")),
            peak_ram_gb=_optional_float(data.get("peak_ram_gb")),
            first_image=_kept_input(sidecar, stem, inputs.get("image"), INPUT_SUFFIXES["image"]),
            last_image=_kept_input(sidecar, stem, inputs.get("last_image"), INPUT_SUFFIXES["last_image"]),
            note=str(note))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _optional_float(value) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def _sidecars(outputs_dir: Path) -> list[Path]:
    """Every ``<day>/<name>.json`` under the outputs folder, newest first (by the time it was written)."""
    found = []
    try:
        days = [d for d in outputs_dir.iterdir() if _plain(d) and d.is_dir()]
    except OSError:
        return []
    for day in days:
        try:
            with os.scandir(day) as listing:
                for item in listing:
                    if item.name.endswith(".json") and not item.name.startswith(".") and item.is_file(follow_symlinks=False):
                        found.append((item.stat(follow_symlinks=False).st_mtime, item.path))
        except OSError:
            continue
    return [Path(path) for _, path in sorted(found, reverse=True)]


def scan_history(outputs_dir: Path | str, limit: int | None = DEFAULT_LIMIT) -> list[HistoryEntry]:
    """The outputs in ``outputs_dir``, newest first, at most ``limit`` (None: all); bad sidecars are skipped."""
    entries = []
    for sidecar in _sidecars(Path(outputs_dir)):
        if limit is not None and len(entries) >= limit:
            break
        entry = read_entry(sidecar)
        if entry is not None:
            entries.append(entry)
    return entries


# ----- finding one by its key, and deleting it ------------------------------
def _media_path(outputs_dir: Path, key) -> Path:
    """The media file a key names, refusing anything that could point outside the outputs folder."""
    if not isinstance(key, str) or not key.strip():
        raise HistoryError(f"no output given: pass the key of an output, such as {KEY_EXAMPLE!r} (see /history)")
    parts = key.split("/")
    bad = (len(parts) != 2 or os.path.isabs(key)
           or any(not p or p.startswith(".") or any(c in p for c in "\\:\0") for p in parts)
           or Path(parts[1]).suffix not in MEDIA_KINDS)
    if bad:
        raise HistoryError(f"{key!r} is not an output key: a key is '<day>/<file>.mp4' or '.png', "
                           f"such as {KEY_EXAMPLE!r}, as /history lists them")
    day, media = outputs_dir / parts[0], outputs_dir / parts[0] / parts[1]
    if day.is_symlink() or media.is_symlink() or outputs_dir.resolve() not in media.resolve().parents:
        raise HistoryError(f"{key!r} is not an output of this app: only files inside the outputs folder, "
                           "and no links, can be deleted")
    return media


def find_entry(outputs_dir: Path | str, key) -> HistoryEntry:
    """The output with this key, or HistoryError saying why there is none."""
    outputs_dir = Path(outputs_dir)
    media = _media_path(outputs_dir, key)
    sidecar = media.with_suffix(".json")
    if not media.exists() and not sidecar.exists():
        raise HistoryError(f"there is no output {key!r}: it was deleted already, or the key is wrong "
                           "(/history lists the outputs)")
    entry = read_entry(sidecar)
    if entry is None or entry.key != key:
        raise HistoryError(f"{key!r} is not an output of this app: its media file or its sidecar "
                           f"({sidecar.name}) is missing or unreadable, so it is left alone")
    return entry


def output_files(entry: HistoryEntry) -> list[Path]:
    """The files that exist for an output: the media file, then the sidecar and the companions."""
    media = Path(entry.media)
    stem = media.name[: -len(media.suffix)]
    candidates = [media, *(media.with_name(stem + suffix) for suffix in COMPANION_SUFFIXES)]
    return [path for path in candidates if path.exists() or path.is_symlink()]


def delete_output(outputs_dir: Path | str, key) -> list[str]:
    """Delete the output ``key`` and every file that belongs to it; the names removed.

    Refuses (HistoryError) a key that is not an output listed under ``outputs_dir``; other
    outputs are never touched. A link among the companions is removed, never what it points to.
    """
    entry = find_entry(outputs_dir, key)
    removed = []
    for path in output_files(entry):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            done = f"; removed so far: {', '.join(removed)}" if removed else ""
            raise HistoryError(f"could not delete {path.name} ({exc.strerror or exc}){done}") from None
        removed.append(path.name)
    return removed
