"""Which Python runs the app: the project's own ``.venv``, where the launchers installed what it needs.

``python app.py ...`` typed in a terminal starts whatever ``python`` comes first on the PATH, usually one without
torch or gradio. app.py then starts itself again with the ``.venv``'s Python (the same arguments), or, where no
``.venv`` was set up and this Python lacks a package, says in one line to run the launcher first. Only the
standard library is imported here: it runs before anything else is known to be installed.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

# What app.py imports on its way to any command (the rest comes with these).
NEEDED = ("torch", "gradio", "diffusers", "transformers", "psutil")
# Set to 1 to run app.py with whatever Python started it (a Python set up by hand).
ANY_PYTHON = "WAN_ANY_PYTHON"


def venv_python(root: Path) -> Path:
    venv = root / ".venv"
    return venv / "Scripts" / "python.exe" if os.name == "nt" else venv / "bin" / "python"


def venv_ready(root: Path) -> bool:
    """The launcher finished setting up ``.venv`` (it writes its stamp last: launch.sh, launch.bat)."""
    venv = root / ".venv"
    return venv_python(root).is_file() and any((venv / name).is_file()
                                               for name in (".wan-install-stamp", "wan-install-stamp.txt"))


def in_venv(root: Path) -> bool:
    try:
        return Path(sys.prefix).resolve() == (root / ".venv").resolve()
    except OSError:
        return False


def missing_packages() -> list[str]:
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def run_in_own_python(root: Path, script: Path, argv: list[str]) -> int | None:
    """None: go on in this Python. Else the exit code of the same command run by the ``.venv``'s Python (on
    POSIX this process becomes it and never returns), or 2 after one line saying what to run first."""
    if in_venv(root) or os.environ.get(ANY_PYTHON) == "1":
        return None
    if venv_ready(root):
        command = [str(venv_python(root)), str(script), *argv]
        # Once only: should the .venv's Python not be recognised as it (a link resolved elsewhere), it goes on.
        os.environ[ANY_PYTHON] = "1"
        if os.name == "nt":   # Windows has no exec that keeps the console's Ctrl-C: wait for the child instead
            try:
                return subprocess.call(command)
            except KeyboardInterrupt:
                return 130
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(command[0], command)
    missing = missing_packages()
    if not missing:
        return None   # a Python with everything installed by hand
    launcher = "launch.bat" if os.name == "nt" else "./launch.sh"
    print(f"error: this Python ({sys.executable}) has no {', '.join(missing)}; run {launcher} once (it sets up "
          f".venv with what the app needs), then 'python app.py ...' works from any Python", file=sys.stderr)
    return 2
