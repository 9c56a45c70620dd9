"""Whether a path stays inside a folder: the one check made before the app reads, writes or deletes under its
own folders (the outputs folder, the models folder, the folder the page's files are served from).

Links are followed: ``outputs/leakdir -> /elsewhere`` leads outside the outputs folder whatever its name says,
so nothing under it is inside. The folder itself may be a link (an outputs folder on another disk): it is
compared as it resolves too. Touches nothing but the file system's links (no file is opened).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from engine.errors import InputError


def inside(path: Path | str, folder: Path | str, *, below: bool = False, follow_links: bool = True) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (``below``: strictly under it, never the folder itself).

    ``follow_links``: compare where both lead once every link is followed (the check before reading, writing or
    deleting); False: compare them as written, ``..`` taken lexically, without touching the disk (a name
    someone typed, checked before anything is looked up). A link loop is never inside.
    """
    try:
        if follow_links:
            target, root = Path(path).resolve(), Path(folder).resolve()
        else:
            target, root = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    except (OSError, RuntimeError):   # a loop of links (RuntimeError before Python 3.13)
        return False
    return root in target.parents or (target == root and not below)


def day_folder(outputs_dir: Path, now: float) -> Path:
    """The day's folder of the outputs at ``now``; InputError when it is a link (nothing is written through one,
    wherever it points)."""
    day = Path(outputs_dir) / time.strftime("%Y-%m-%d", time.localtime(now))
    if day.is_symlink() or not inside(day, outputs_dir, below=True):
        raise InputError(f"the outputs folder's {day.name} is a link, and the app writes nothing through links: "
                         f"make {day.name} a plain folder (or remove the link) and run again")
    return day
