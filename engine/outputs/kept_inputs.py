"""The input images of an image-to-video run, kept beside its output so the run can be repeated.

An upload is a temporary file that is gone after the run. The first frame (and the optional
last frame) is saved next to the output as ``<stem>.first.png`` / ``<stem>.last.png``, written
atomically: the upright 8-bit RGB first frame at full size, exactly what the engine scales and
crops, so running again from the copy gives the same pixels as the upload did.
"""
from __future__ import annotations

from pathlib import Path

from engine.outputs.export import copy_file, write_png
from engine.settings.images import upright_rgb
from engine.settings.values import InputError

# The request field each kept image came from -> the suffix of its file beside the output.
INPUT_SUFFIXES = {"image": ".first.png", "last_image": ".last.png"}
INPUT_NAMES = {"image": "image", "last_image": "last image"}


def input_path(stem: Path, field: str) -> Path:
    """Where the input image of ``field`` ("image" or "last_image") is kept for the output ``stem``."""
    stem = Path(stem)
    return stem.with_name(stem.name + INPUT_SUFFIXES[field])


def keep_inputs(request, stem: Path) -> tuple[dict[str, str | None], list[str]]:
    """Save the request's input images beside the output ``stem``.

    Returns ({field: file name or None}, problems): a problem (the upload vanished, a full disk)
    is a sentence for the user; the output itself is already safe, so nothing is raised.
    """
    import numpy as np

    kept: dict[str, str | None] = {}
    problems: list[str] = []
    for field in INPUT_SUFFIXES:
        kept[field] = None
        source = getattr(request, field, None)
        if not source:
            continue
        try:
            path = write_png(np.asarray(upright_rgb(source, INPUT_NAMES[field])), input_path(stem, field))
        except (OSError, InputError) as exc:
            problems.append(f"The {INPUT_NAMES[field]} could not be kept beside the output ({exc}); "
                            "Reuse settings in the History tab will leave its slot empty.")
            continue
        kept[field] = path.name
    return kept, problems


def carry_inputs(kept: dict, folder: Path, stem: Path) -> dict[str, str | None]:
    """The input images a run kept in ``folder`` (``kept``: {field: file name or None}), for an output
    made later from its latents at ``stem``: the same files when the stem is the run's own, else copies.
    A file that has gone since (or cannot be copied) is left out."""
    carried: dict[str, str | None] = {}
    for field in INPUT_SUFFIXES:
        carried[field] = None
        name = kept.get(field)
        source = Path(folder) / name if isinstance(name, str) and Path(name).name == name else None
        if source is None or not source.is_file():
            continue
        target = input_path(stem, field)
        try:
            if target != source:
                copy_file(source, target)
        except OSError:
            continue
        carried[field] = target.name
    return carried
