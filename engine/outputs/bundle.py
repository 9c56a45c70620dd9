"""The files of one output, known from its stem: the one place that names them.

A run that starts at ``<outputs>/<day>/<stem>`` (``export.output_stem``) may leave:

- ``<stem>.mp4`` (a video) or ``<stem>.png`` (a still): the media file;
- ``<stem>.json``: the sidecar that describes it (``sidecar.Sidecar``);
- ``<stem>.latents.safetensors``: the denoised latents, kept so a failed decode can be done again;
- ``<stem>.first.png`` / ``<stem>.last.png``: the input images of an image-to-video run;
- ``<stem>.input.mp4``: the input video of a video-to-video run; ``<stem>.source.mp4``: the video an extension
  continued, when it was no output of the outputs folder (an upload).

Every module that needs one of these paths asks a ``Bundle`` for it, so a suffix is written
down here and nowhere else; ``listed`` is the one walk of the outputs folder that finds them.

Links inside the outputs folder are never followed, wherever they point (inside or out): a linked day
folder or file is neither listed, read, written through nor deleted (a link among an output's own files is
removed itself, never what it points to). The outputs folder itself may be a link.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.folders import inside

# The media file of an output, by its kind.
MEDIA_SUFFIXES = {"video": ".mp4", "image": ".png"}
SIDECAR_SUFFIX = ".json"
LATENTS_SUFFIX = ".latents.safetensors"
# The request field each kept input image came from -> the suffix of its file.
INPUT_SUFFIXES = {"image": ".first.png", "last_image": ".last.png"}
# The same for the kept input videos (copies of the files as they came).
VIDEO_INPUT_SUFFIXES = {"video": ".input.mp4", "extend": ".source.mp4"}


def media_kind(path: Path | str) -> str | None:
    """"video" or "image" for a file name that ends like a media file, else None."""
    suffix = Path(path).suffix
    return next((kind for kind, known in MEDIA_SUFFIXES.items() if known == suffix), None)


def _stem_of(path: Path | str, suffix: str) -> Path:
    """``path`` without ``suffix``; ValueError when it does not end with it (or is nothing but it)."""
    path = Path(path)
    if not path.name.endswith(suffix) or path.name == suffix:
        raise ValueError(f"{path.name!r} is not a file of an output (*{suffix})")
    return path.with_name(path.name[: -len(suffix)])


def listed(outputs_dir: Path | str, suffix: str) -> list[Path]:
    """Every ``<day>/<name><suffix>`` in the outputs folder, newest first (by when it was written): plain files in
    plain day folders, inside the folder once links are followed; hidden names (partial writes) are left out."""
    outputs_dir = Path(outputs_dir)
    found = []
    for day in _entries(outputs_dir):
        if day.is_dir(follow_symlinks=False):
            found += [(_written(item), Path(item.path)) for item in _entries(Path(day.path))
                      if item.name.endswith(suffix) and item.name != suffix and item.is_file(follow_symlinks=False)]
    found.sort(reverse=True)
    return [path for _, path in found if inside(path, outputs_dir, below=True)]


def _written(item: os.DirEntry) -> float:
    try:
        return item.stat(follow_symlinks=False).st_mtime
    except OSError:   # removed meanwhile: listed last, and skipped by whoever reads it
        return 0.0


def _entries(folder: Path) -> list[os.DirEntry]:
    """The folder's entries that are neither links nor hidden; none when it cannot be read."""
    try:
        with os.scandir(folder) as listing:
            return [item for item in listing if not item.name.startswith(".") and not item.is_symlink()]
    except OSError:
        return []


class RemovalError(OSError):
    """A file of an output could not be removed: which one, why, and the names removed before it."""

    def __init__(self, path: Path, error: OSError, removed: list[str]):
        super().__init__(error.errno, error.strerror or str(error))
        self.path = path
        self.error = error
        self.removed = list(removed)


@dataclass(frozen=True)
class Bundle:
    """Every file of the output at ``stem`` (the path without any suffix): where each one is, and which exist."""
    stem: Path

    @classmethod
    def from_media(cls, path: Path | str) -> "Bundle":
        """The output a media file (``.mp4`` or ``.png``) belongs to."""
        if media_kind(path) is None:
            raise ValueError(f"{Path(path).name!r} is not a media file ({' or '.join(MEDIA_SUFFIXES.values())})")
        return cls(_stem_of(path, Path(path).suffix))

    @classmethod
    def from_sidecar(cls, path: Path | str) -> "Bundle":
        return cls(_stem_of(path, SIDECAR_SUFFIX))

    @classmethod
    def from_latents(cls, path: Path | str) -> "Bundle":
        return cls(_stem_of(path, LATENTS_SUFFIX))

    def _file(self, suffix: str) -> Path:
        return self.stem.with_name(self.stem.name + suffix)

    # ----- where each file is -----------------------------------------------------
    @property
    def video(self) -> Path:
        return self._file(MEDIA_SUFFIXES["video"])

    @property
    def image(self) -> Path:
        return self._file(MEDIA_SUFFIXES["image"])

    @property
    def sidecar(self) -> Path:
        return self._file(SIDECAR_SUFFIX)

    @property
    def latents(self) -> Path:
        return self._file(LATENTS_SUFFIX)

    def input(self, field: str) -> Path:
        """The kept input of the request field ``field`` ("image", "last_image", "video" or "extend")."""
        return self._file({**INPUT_SUFFIXES, **VIDEO_INPUT_SUFFIXES}[field])

    def media_named(self, name) -> Path | None:
        """The media file called ``name``, when that is this output's video or image name; else None."""
        return next((path for path in (self.video, self.image) if path.name == name), None)

    def paths(self) -> tuple[Path, ...]:
        """Every file this output may have, the media first."""
        return (self.video, self.image, self.sidecar, self.latents,
                *(self.input(f) for f in (*INPUT_SUFFIXES, *VIDEO_INPUT_SUFFIXES)))

    # ----- which exist ------------------------------------------------------------
    def existing(self) -> list[Path]:
        """The files of this output that are there (a link counts, whatever it points to), the media first."""
        return [path for path in self.paths() if path.exists() or path.is_symlink()]

    @property
    def media(self) -> Path | None:
        """The media file that exists (the video before the image), or None."""
        return next((path for path in (self.video, self.image) if path.exists()), None)

    def has_media(self) -> bool:
        return self.media is not None

    def is_complete(self) -> bool:
        """A finished output: its media file and its sidecar are both there."""
        return self.has_media() and self.sidecar.exists()

    def has_output(self) -> bool:
        """A media file or a sidecar is there: writing another output at this stem would replace it."""
        return self.has_media() or self.sidecar.exists()

    def in_use(self) -> bool:
        """A run has this stem already (media, sidecar or latents): a new run takes another one."""
        return self.has_output() or self.latents.exists()

    # ----- removing ---------------------------------------------------------------
    def remove(self) -> list[str]:
        """Remove every file of this output (a link itself, never what it points to); the names removed.

        Stops at the first file that cannot be removed with RemovalError, which names it and those
        removed before it.
        """
        removed: list[str] = []
        for path in self.existing():
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise RemovalError(path, exc, removed) from None
            removed.append(path.name)
        return removed
