"""The test suite as the README's test command runs it (launch.sh and launch.bat call this): pytest with the
arguments given, in the worker processes pytest.ini asks for. No test compares wall-clock seconds (how near the time
plan comes to a run's seconds is bench/time_plan_ways.py's measurement), so nothing needs the machine alone.

    python -m tests.run [pytest arguments...]
"""
from __future__ import annotations

import subprocess
import sys


def main(args: list[str]) -> int:
    return subprocess.call([sys.executable, "-m", "pytest", *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
