"""The inputs of a run, kept beside its output so the run can be repeated.

An upload is a temporary file that is gone after the run. The first frame (and the optional
last frame) is saved next to the output as ``<stem>.first.png`` / ``<stem>.last.png``, written
atomically: the upright 8-bit RGB first frame at full size, exactly what the engine scales and
crops, so running again from the copy gives the same pixels as the upload did. A video-to-video
input is copied as it came (``<stem>.input.mp4``), and so is the video an extension continued
(``<stem>.source.mp4``), unless it is an output in the outputs folder, which the extension names instead.
"""
from __future__ import annotations

from pathlib import Path

from engine.folders import inside
from engine.outputs.bundle import INPUT_SUFFIXES, VIDEO_INPUT_SUFFIXES, Bundle
from engine.outputs.export import copy_file, write_png
from engine.settings.images import upright_rgb
from engine.settings.values import InputError

# The request fields whose images are kept (bundle.INPUT_SUFFIXES names their files), as the user reads them.
INPUT_NAMES = {"image": "image", "last_image": "last image", "video": "input video", "extend": "video extended"}


def keep_inputs(request, stem: Path) -> tuple[dict[str, str | None], list[str]]:
    """Save the request's input images beside the output ``stem``.

    Returns ({field: file name or None}, problems): a problem (the upload vanished, a full disk)
    is a sentence for the user; the output itself is already safe, so nothing is raised.
    """
    import numpy as np

    bundle = Bundle(Path(stem))
    kept: dict[str, str | None] = {}
    problems: list[str] = []
    for field in INPUT_SUFFIXES:
        kept[field] = None
        source = getattr(request, field, None)
        if not source:
            continue
        try:
            path = write_png(np.asarray(upright_rgb(source, INPUT_NAMES[field])), bundle.input(field))
        except (OSError, InputError) as exc:
            problems.append(f"The {INPUT_NAMES[field]} could not be kept beside the output ({exc}); "
                            "Reuse settings in the History tab will leave its slot empty.")
            continue
        kept[field] = path.name
    for field in VIDEO_INPUT_SUFFIXES:
        source = getattr(request, field, None)
        if not source or (field == "extend" and in_outputs(source, request.outputs_dir)):
            continue
        kept[field] = None
        try:
            kept[field] = copy_file(Path(source), bundle.input(field)).name
        except OSError as exc:
            problems.append(f"The {INPUT_NAMES[field]} could not be kept beside the output ({exc}); "
                            "Reuse settings in the History tab will leave its slot empty.")
    return kept, problems


def in_outputs(path, outputs_dir) -> bool:
    """Whether ``path`` is a plain file of the outputs folder (an output, which keeps itself)."""
    path = Path(path)
    return not path.is_symlink() and inside(path, Path(outputs_dir), below=True)


def carry_inputs(kept: dict, folder: Path, stem: Path) -> dict[str, str | None]:
    """The input images a run kept in ``folder`` (``kept``: {field: file name or None}), for an output
    made later from its latents at ``stem``: the same files when the stem is the run's own, else copies.
    A file that has gone since (or cannot be copied), or a link, is left out: nothing is read through one."""
    bundle = Bundle(Path(stem))
    carried: dict[str, str | None] = {}
    for field in INPUT_SUFFIXES:
        carried[field] = None
        name = kept.get(field)
        source = Path(folder) / name if isinstance(name, str) and Path(name).name == name else None
        if source is None or source.is_symlink() or not source.is_file() or not inside(source, folder, below=True):
            continue
        target = bundle.input(field)
        try:
            if target != source:
                copy_file(source, target)
        except OSError:
            continue
        carried[field] = target.name
    return carried
