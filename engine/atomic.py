"""Writing a file whole or not at all: the one way every output file is written.

The content goes to a hidden temporary file in the same folder (``.<name>.partial<suffix>``:
the history and the listings skip names that start with a dot, and the suffix stays last so
tools that pick a format by it still do), which is renamed over the final name only once it is
complete. A crash, an error or a full disk never leaves a half-written file under the final
name, and the temporary file is removed on every failure.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Callable


def temporary_path(final: Path) -> Path:
    """The hidden name ``final`` is written under before it is renamed into place."""
    final = Path(final)
    return final.with_name(f".{final.stem}.partial{final.suffix}")


def write_atomically(path: Path | str, write: Callable[[Path], object]) -> Path:
    """Make ``path`` with ``write(temporary path)``, then rename the result into place; ``path``.

    Whatever is at the temporary name beforehand is removed first (a link placed there would have the
    writer write through it, outside the folder). Whatever fails (the writing, the rename, an interrupt),
    the temporary file is removed and the error is raised as it came: callers decide what it means (``export.write_mp4`` turns a full disk
    into DiskFull).
    """
    path = Path(path)
    temporary = temporary_path(path)
    try:
        temporary.unlink(missing_ok=True)   # what a dead writer left there, or a link: nothing is written through it
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):   # the first error is the one worth reporting
            temporary.unlink(missing_ok=True)
        raise
    return path


def discard_temporary(final: Path | str) -> None:
    """Remove what a writer that died with its process left under ``final``'s temporary name.

    Why: a streamed video's encoder (ffmpeg) outlives an engine process that is killed mid-export and
    finishes the file it was given; the process that sees the crash removes it (ffmpeg, still running,
    cannot bring it back: it reopens its file only to read it). Nothing under the final name is touched.
    """
    with contextlib.suppress(OSError):
        temporary_path(Path(final)).unlink(missing_ok=True)


def write_json(data: dict, path: Path) -> Path:
    """``data`` as indented JSON at ``path``, written whole or not at all."""
    text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    return write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
