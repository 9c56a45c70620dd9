"""Past outputs, read from the outputs folder: list them, turn one back into form values, delete one.

Every finished run leaves the files of a ``Bundle`` at ``<outputs>/<day>/<stem>``: its media
file (``.mp4`` or ``.png``) and its sidecar, perhaps with saved latents and the kept input images.
An entry is read from the sidecar alone (``sidecar.Sidecar``), so the history needs no database
and survives restarts. Nothing here raises for a bad file: a sidecar that another program wrote, or
whose media file is gone, is skipped; one that cannot be read (too large, too deep, not JSON, a
value of the wrong type) is named among the unreadable ones (``History.unreadable``), and the
others are listed all the same.

An output is named by its key, ``<day>/<media file name>`` (``2025-01-31/153000_t2v_a-fox_7.mp4``).
``delete_output`` accepts only the key of an output that ``scan_history`` would list: inside the
outputs folder, one folder deep, no ``..``, no absolute path, no symbolic link.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from engine.folders import inside
from engine.outputs.bundle import SIDECAR_SUFFIX, Bundle, RemovalError, listed, media_kind
from engine.outputs.sidecar import ForeignFile, Sidecar, SidecarError, read_sidecar
from engine.settings.values import Settings, as_int

DEFAULT_LIMIT = 100
# The most outputs one listing reads (each is a file to open): a larger limit lists this many.
MAX_LIMIT = 1000
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
    settings: Settings          # what it was made with
    prompt: str
    negative_prompt: str
    preset: str | None
    seed: int
    fps: int | None = None                    # of the file written (None for a still)
    strategy: str | None = None               # the memory plan's strategy, as it ran
    device: str | None = None                 # the plan's device ("cpu" on a machine without a GPU)
    speed: dict = field(default_factory=dict)  # the run's speed record (decoder, step cache, attention, ...)
    timings: dict[str, float] = field(default_factory=dict)   # phase -> seconds, in run order
    peak_vram_gb: float | None = None
    peak_ram_gb: float | None = None
    first_image: str | None = None            # the kept input images of an image-to-video run
    last_image: str | None = None
    note: str = ""
    # The file as written, when it differs from what the settings made (a step after the run: smoother, larger):
    # {"frames", "width", "height"}; and those steps as the sidecar records them.
    made: dict | None = None
    post: list = field(default_factory=list)
    # Video to video: its kept input video; an extension: the video it continued (its kept copy, or the output it
    # names, while that is there) and the sidecar's record of the join and the parts (engine/post/extend.py).
    input_video: str | None = None
    extends: str | None = None
    extend: dict | None = None

    def to_dict(self) -> dict:
        """What the history API returns: the entry's own fields and the settings the page shows."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "settings"}
        return {**{name: getattr(self.settings, name) for name in SHOWN_SETTINGS}, **own}

    def label(self, words: int = 8) -> str:
        """A short caption: the prompt's first words and the date and time."""
        shown = self.prompt.split()
        text = " ".join(shown[:words]) + (" ..." if len(shown) > words else "")
        return f"{text or '(no prompt)'} · {self.created[:16].replace('T', ' ')}"


# The settings an entry shows (the API's keys): the rest stay in the entry's Settings.
SHOWN_SETTINGS = ("mode", "model", "width", "height", "frames", "steps", "guidance", "shift")


@dataclass(frozen=True)
class ReuseValues:
    """What to put back in a generation form to run an output again."""
    tab: str                    # "t2v" (text-to-video and text-to-image), "i2v" or "v2v"
    settings: Settings
    preset: str | None
    prompt: str
    negative_prompt: str
    seed: int                   # the seed actually used, so the same output comes again
    image: str | None = None
    last_image: str | None = None
    video: str | None = None    # video to video: the input video
    extend: str | None = None   # an extension: the video it continued (its first frame is that video's last)
    extended: bool = False      # an extension's output (even when the video it continued is gone)

    @property
    def keep(self) -> tuple[str, ...]:
        """Settings the form keeps as they are: an image's frame count (1) is not the video form's."""
        return ("frames",) if self.settings.mode == "t2i" else ()


def reuse_values(entry: HistoryEntry) -> ReuseValues:
    """The form values that make ``entry`` again (its seed included)."""
    mode = entry.settings.mode
    extension = entry.extend is not None
    return ReuseValues(
        tab=mode if mode in ("i2v", "v2v") else "t2v", settings=entry.settings, preset=entry.preset,
        prompt=entry.prompt, negative_prompt=entry.negative_prompt, seed=entry.seed,
        image=None if extension else entry.first_image, last_image=entry.last_image, video=entry.input_video,
        extend=entry.extends, extended=extension)


@dataclass(frozen=True)
class Unreadable:
    """A sidecar of this app's that cannot be read: its key-like name (``<day>/<file>.json``) and why."""
    name: str
    why: str


@dataclass(frozen=True)
class History:
    """What a listing found: the outputs, newest first, and the sidecars it could not read."""
    entries: list[HistoryEntry]
    unreadable: list[Unreadable]


# ----- reading ----------------------------------------------------------------
def _plain(path: Path) -> bool:
    """A regular file or folder, not a link and not hidden (partial files start with a dot)."""
    return not path.name.startswith(".") and not path.is_symlink()


def _kept_input(bundle: Bundle, field: str, inputs: dict | None) -> str | None:
    """The kept input image the sidecar names, if it is the expected file beside it."""
    path = bundle.input(field)
    if (inputs or {}).get(field) != path.name:
        return None
    return str(path) if path.is_file() and not path.is_symlink() else None


def read_entry(sidecar: Path) -> HistoryEntry | None:
    """The entry a sidecar describes, or None when it is not a readable sidecar of an existing output."""
    found = _read(Path(sidecar))
    return found if isinstance(found, HistoryEntry) else None


def _read(sidecar: Path) -> HistoryEntry | Unreadable | None:
    """The entry a sidecar describes; Unreadable when it is this app's (or may be) but cannot be read; None when
    it is no output's sidecar (another program's file, a link, a sidecar whose media file is gone)."""
    try:
        if not (_plain(sidecar) and _plain(sidecar.parent) and sidecar.is_file()):
            return None
        bundle = Bundle.from_sidecar(sidecar)
        record = read_sidecar(sidecar)
        media = bundle.media_named(record.file)
        if media is None or not media.is_file() or media.is_symlink():
            return None
        return _entry(sidecar, bundle, media, record)
    except (ForeignFile, FileNotFoundError):   # another program's JSON; a file deleted meanwhile
        return None
    except SidecarError as exc:
        return Unreadable(f"{sidecar.parent.name}/{sidecar.name}", str(exc))
    except (OSError, ValueError) as exc:   # no permission to read it; a name that is no output's
        return Unreadable(f"{sidecar.parent.name}/{sidecar.name}", getattr(exc, "strerror", None) or str(exc))


def _entry(sidecar: Path, bundle: Bundle, media: Path, record: Sidecar) -> HistoryEntry:
    """The entry of an output whose sidecar and media file were found and read."""
    created = record.created or time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(media.stat().st_mtime))
    note = record.note
    if record.decoded is not None:
        note = f"Decoded again ({record.decoded.how}) from saved latents. {note}".strip()
    return HistoryEntry(
        key=f"{sidecar.parent.name}/{media.name}", kind=media_kind(media), media=str(media), sidecar=str(sidecar),
        created=created, settings=record.settings(), prompt=record.prompt, negative_prompt=record.negative_prompt,
        preset=record.preset or None, seed=record.seed, fps=record.fps, strategy=record.strategy,
        device=record.device, speed=dict(record.speed or {}), timings=dict(record.timings),
        peak_vram_gb=record.peak_vram_gb, peak_ram_gb=record.peak_ram_gb,
        first_image=_kept_input(bundle, "image", record.inputs),
        last_image=_kept_input(bundle, "last_image", record.inputs), note=note,
        made=_made(record) if record.post or record.extend else None, post=list(record.post),
        input_video=_kept_input(bundle, "video", record.inputs), extends=_extended(bundle, record),
        extend=record.extend)


def _extended(bundle: Bundle, record: Sidecar) -> str | None:
    """The video an extension continued: its copy kept beside the output, else the output its record names by key
    (in the same outputs folder, while it is there); None for any other output."""
    if record.extend is None:
        return None
    kept = _kept_input(bundle, "extend", record.inputs)
    if kept is not None:
        return kept
    try:
        media = _media_path(bundle.stem.parent.parent, record.extend.get("source"))
    except HistoryError:
        return None
    return str(media) if media.is_file() else None


def _made(record: Sidecar) -> dict | None:
    """The frames and size of the file written (a run's "output"), when the sidecar holds them as numbers."""
    output = record.output or {}
    numbers = {name: output.get(name) for name in ("frames", "width", "height")}
    return numbers if all(isinstance(v, int) and not isinstance(v, bool) for v in numbers.values()) else None


def read_history(outputs_dir: Path | str, limit: int | None = DEFAULT_LIMIT) -> History:
    """The outputs in ``outputs_dir``, newest first, at most ``limit`` (None: all), and the sidecars met on the
    way that could not be read (they never hide the others)."""
    entries, unreadable = [], []
    for sidecar in listed(outputs_dir, SIDECAR_SUFFIX):
        if limit is not None and len(entries) >= limit:
            break
        found = _read(sidecar)
        if isinstance(found, HistoryEntry):
            entries.append(found)
        elif found is not None:
            unreadable.append(found)
    return History(entries, unreadable)


def scan_history(outputs_dir: Path | str, limit: int | None = DEFAULT_LIMIT) -> list[HistoryEntry]:
    """The outputs in ``outputs_dir``, newest first, at most ``limit`` (None: all); bad sidecars are skipped."""
    return read_history(outputs_dir, limit).entries


def history_limit(value) -> int:
    """How many outputs a caller of the history asks for: a whole number from 1 (nothing given: DEFAULT_LIMIT; more
    than MAX_LIMIT: MAX_LIMIT); HistoryError saying what to give otherwise."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return DEFAULT_LIMIT
    problems: list[str] = []
    limit = as_int("limit", value, problems)
    if limit is None or limit < 1:
        raise HistoryError(f"limit {value!r:.40} is not a number of outputs: give a whole number from 1 to "
                           f"{MAX_LIMIT} (how many to list, newest first), or leave it out for the newest "
                           f"{DEFAULT_LIMIT}")
    return min(limit, MAX_LIMIT)


# ----- finding one by its key, and deleting it ------------------------------
def _media_path(outputs_dir: Path, key) -> Path:
    """The media file a key names, refusing anything that could point outside the outputs folder."""
    if not isinstance(key, str) or not key.strip():
        raise HistoryError(f"no output given: pass the key of an output, such as {KEY_EXAMPLE!r} (see /history)")
    parts = key.split("/")
    bad = (len(parts) != 2 or os.path.isabs(key)
           or any(not p or p.startswith(".") or any(c in p for c in "\\:\0") for p in parts)
           or media_kind(parts[1]) is None)
    if bad:
        raise HistoryError(f"{key!r} is not an output key: a key is '<day>/<file>.mp4' or '.png', "
                           f"such as {KEY_EXAMPLE!r}, as /history lists them")
    day, media = outputs_dir / parts[0], outputs_dir / parts[0] / parts[1]
    if day.is_symlink() or media.is_symlink() or not inside(media, outputs_dir, below=True):
        raise HistoryError(f"{key!r} is not an output of this app: its outputs are files inside the outputs "
                           "folder, never links, so it is neither used nor deleted")
    return media


def find_entry(outputs_dir: Path | str, key) -> HistoryEntry:
    """The output with this key, or HistoryError saying why there is none."""
    outputs_dir = Path(outputs_dir)
    media = _media_path(outputs_dir, key)
    sidecar = Bundle.from_media(media).sidecar
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
    return Bundle.from_media(entry.media).existing()


def delete_output(outputs_dir: Path | str, key) -> list[str]:
    """Delete the output ``key`` and every file that belongs to it; the names removed.

    Refuses (HistoryError) a key that is not an output listed under ``outputs_dir``; other
    outputs are never touched. A link among the companions is removed, never what it points to.
    """
    entry = find_entry(outputs_dir, key)
    try:
        return Bundle.from_media(entry.media).remove()
    except RemovalError as exc:
        done = f"; removed so far: {', '.join(exc.removed)}" if exc.removed else ""
        raise HistoryError(f"could not delete {exc.path.name} ({exc.error.strerror or exc.error}){done}") from None
