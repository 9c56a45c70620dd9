"""pip's settings on this machine as uv's arguments (launch.sh installs with uv, pip's faster stand-in, and uv does
not read pip's configuration files or ``PIP_*`` variables). Standard library only: the launcher runs it before
anything is installed.

    python -m engine.pip_settings    # one argument a line, from ``pip config list``
"""
from __future__ import annotations

import ast
import subprocess
import sys

# pip's setting -> uv's flag. A setting may hold several values (``extra-index-url = URL1 URL2``); uv takes each.
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}
TRUE = ("1", "true", "yes", "on")


def uv_arguments(config_lines) -> list[str]:
    """uv's arguments for the lines of ``pip config list`` (``global.find-links='/opt/wheels'``,
    ``:env:.extra-index-url='URL'``), in order, each once."""
    pairs: list[tuple[str, ...]] = []
    for line in config_lines:
        key, _, value = line.strip().partition("=")
        key = key.rpartition(".")[2]
        try:
            value = str(ast.literal_eval(value))
        except (ValueError, SyntaxError):
            continue
        if key == "no-index" and value.lower() in TRUE:
            pairs.append(("--no-index",))
        for word in value.split() if key in FLAGS else ():
            pairs.append((FLAGS[key], word))
    return [word for pair in dict.fromkeys(pairs) for word in pair]


def main() -> int:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    if listed.returncode != 0:
        return 1
    print(*uv_arguments(listed.stdout.splitlines()), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
