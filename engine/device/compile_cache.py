"""torch.compile's caches kept in a folder of the app's own, beside this machine's calibration in the outputs
folder, so a size compiled once costs seconds in every later engine process instead of the first compile's tens
(measured on an H100, 1.3B at 832x480x81: 17.3 s compiling in a fresh process, 4.2 s with the caches of an
earlier one: bench/compile_cache.py, docs/data/compile-cache-h100.json).

Inductor's and Triton's own caches hold the kernels (they key them by the graph, its shapes, the torch version and
the GPU); the index here lists the sizes compiled so far (engine/planning/speed.py ``compile_key``), so the plan
knows before a job which ones are cheap to compile again.
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.atomic import write_json

COMPILE_CACHE_FOLDER = ".compile-cache"
INDEX_FILE = "compiled-sizes.json"
# The most sizes the index keeps (the newest): the kernels themselves are inductor's to prune.
KEPT_SIZES = 200


def cache_folder(outputs_dir: Path | str) -> Path:
    return Path(outputs_dir) / COMPILE_CACHE_FOLDER


def cache_env(outputs_dir: Path | str) -> dict[str, str]:
    """The variables that put inductor's and Triton's caches in the app's folder (set before torch loads; a
    folder the user set already is left alone by the engine process)."""
    folder = cache_folder(outputs_dir)
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton")}


def compiled_sizes(outputs_dir: Path | str | None) -> tuple[str, ...]:
    """The sizes compiled before on this machine (none when there is no index or it cannot be read)."""
    if outputs_dir is None:
        return ()
    try:
        keys = json.loads((cache_folder(outputs_dir) / INDEX_FILE).read_text(encoding="utf-8")).get("compiled", [])
    except (OSError, ValueError, AttributeError):
        return ()
    return tuple(str(key) for key in keys if isinstance(key, str))


def remember_compiled(outputs_dir: Path | str, key: str) -> tuple[str, ...]:
    """Add ``key`` to the index (written whole or not at all); the sizes now known. A read-only or full folder
    leaves the index as it was: the next process compiles that size in full again."""
    known = [k for k in compiled_sizes(outputs_dir) if k != key] + [key]
    known = known[-KEPT_SIZES:]
    try:
        cache_folder(outputs_dir).mkdir(parents=True, exist_ok=True)
        write_json({"compiled": known}, cache_folder(outputs_dir) / INDEX_FILE)
    except OSError:
        pass
    return tuple(known)
