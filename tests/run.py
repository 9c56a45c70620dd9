"""The test suite as the README's test command runs it (launch.sh and launch.bat call this): every test but the timed
ones in the worker processes pytest.ini asks for, then the timed ones alone in one process, so that no other test's
work slows what they time. Timed tests (marker ``timed``) compare the wall-clock seconds of runs with the time plan's
predictions. Arguments go to pytest both times; with ``-m`` given, pytest runs once, as asked.

    python -m tests.run [pytest arguments...]
"""
from __future__ import annotations

import subprocess
import sys

NO_TESTS = 5   # pytest's exit code when it collected nothing


def _marks_given(args: list[str]) -> bool:
    return any(arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")) for arg in args)


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", *args]
    if _marks_given(args):
        return subprocess.call(pytest)
    rest = subprocess.call([*pytest, "-m", "not timed"])
    print("\n[test] the timed tests, alone in one process", flush=True)
    timed = subprocess.call([*pytest, "-m", "timed", "-n", "0"])
    if rest == timed == NO_TESTS:
        return NO_TESTS
    return next((rc for rc in (rest, timed) if rc not in (0, NO_TESTS)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
