"""Where a disk plan keeps its copy of the transformer: one folder per engine process in the models folder.

diffusers' group offloading writes each block's weights to a file in the folder it is given and reads them back
as the block is about to run; it reuses a file it finds under the same name, so each load starts from an empty
folder. An engine holds one model, so the folder is named after its process: removed at every unload, and the
folders of engine processes that ended without an unload (killed) are removed when the next one is made.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from engine.device.hardware import GIB

OFFLOAD_FOLDER = ".offload"


def _folder(models_dir: Path | str, pid: int | None = None) -> Path:
    return Path(models_dir) / OFFLOAD_FOLDER / str(os.getpid() if pid is None else pid)


def disk_offload_folder(models_dir: Path | str, fresh: bool = False) -> Path:
    """This engine process's folder for a disk plan's files (emptied when ``fresh``); those of processes that
    no longer run are removed."""
    import psutil

    root = Path(models_dir) / OFFLOAD_FOLDER
    if root.is_dir():
        for other in root.iterdir():
            if other.name.isdigit() and int(other.name) != os.getpid() and not psutil.pid_exists(int(other.name)):
                shutil.rmtree(other, ignore_errors=True)
    folder = _folder(models_dir)
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def remove_disk_offload(models_dir: Path | str) -> None:
    """This engine process's disk plan files, removed (nothing when there are none)."""
    shutil.rmtree(_folder(models_dir), ignore_errors=True)


def disk_room_gb(models_dir: Path | str) -> float:
    """GiB a disk plan could write where its folder goes: the disk's free space plus what this process's folder
    holds now (a loaded disk plan's own files make room again when it is loaded anew); -1 when not known."""
    place = Path(models_dir).resolve()
    while not place.exists() and place != place.parent:
        place = place.parent
    try:
        free = shutil.disk_usage(place).free
    except OSError:
        return -1.0
    mine = _folder(models_dir)
    held = sum(f.stat().st_size for f in mine.rglob("*") if f.is_file()) if mine.is_dir() else 0
    return round((free + held) / GIB, 2)
