"""Imported once by the fork server that engine processes start from (engine/service/starts.py): the libraries
every engine needs, loaded before any engine exists, with the platform's variables in place as a fresh engine
process has them. Nothing here touches a device. Should a library fail to load here, the server still starts and
each engine loads the libraries itself, reporting what failed as a spawned engine does."""
from __future__ import annotations

import os

from engine.service.engine_process import PLATFORM_ENV


def _load() -> None:
    for name, value in PLATFORM_ENV.items():
        os.environ.setdefault(name, value)
    try:
        from engine.device.runtime import load_libraries

        load_libraries()
        import engine.run.engine  # noqa: F401
    except Exception:   # the engine says what failed when it loads them itself
        pass


_load()
