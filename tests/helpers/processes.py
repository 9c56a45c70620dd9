"""A running app's engine processes, however they started (engine/service/starts.py): spawned children of the app,
or children of its fork server."""
from __future__ import annotations


def engine_processes(app_pid: int) -> list:
    """The app's engine processes (psutil.Process), oldest first."""
    import psutil

    engines = []
    for child in psutil.Process(app_pid).children():
        try:
            command = " ".join(child.cmdline())
            if "spawn_main" in command:
                engines.append(child)
            elif "multiprocessing.forkserver import main" in command:
                engines.extend(child.children())
        except psutil.Error:
            continue
    return sorted(engines, key=lambda process: process.create_time())
