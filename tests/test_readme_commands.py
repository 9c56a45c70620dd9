"""Every `python app.py` command line the README gives, run as written on this machine (the self-test models, no
network): from a folder holding the files it names, with an output of the ones before it as its OUTPUT.mp4."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from tests.conftest import ROOT

# The README's command lines that are no command to run as they stand, and why.
NOT_RUN = {
    "python app.py ...": "the start of any command",
    "python app.py plan --preset NAME": "a pattern: NAME is the preset the reader picks",
}
# Exit codes the README documents beside 0: `plan` exits 1 when the plan does not fit (a 14B model on this CPU).
DOCUMENTED_EXITS = {"plan": (0, 1)}


def readme_commands() -> list[str]:
    """The README's command lines, in order: inline ones in backticks and the lines of its bash blocks."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = [(m.start(), " ".join(m.group(1).split())) for m in re.finditer(r"`(python app\.py [^`]+)`", text)]
    for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
        found += [(block.start() + n, line.split("  #")[0].strip())
                  for n, line in enumerate(block.group(1).splitlines()) if line.startswith("python app.py")]
    return list(dict.fromkeys(command for _, command in sorted(found)))


def test_every_command_line_of_the_readme_runs_as_written(selftest_models_dir, tmp_path, outputs):
    from engine.outputs.export import write_mp4
    import numpy as np

    env = {**os.environ, "WAN_MODELS_DIR": str(selftest_models_dir), "WAN_OUTPUTS_DIR": str(outputs),
           "WAN_ANY_PYTHON": "1"}
    write_mp4(np.full((9, 64, 96, 3), 90, np.uint8), tmp_path / "INPUT.mp4", 16)
    # Those given an output run last, on the smallest output made before them (as quick as any would be).
    commands = sorted((command for command in readme_commands() if command not in NOT_RUN),
                      key=lambda command: "OUTPUT.mp4" in command)
    assert len(commands) >= 10, commands
    ran = []
    for command in commands:
        made = sorted((path for path in outputs.rglob("*.mp4") if path.with_suffix(".json").is_file()),
                      key=lambda path: path.stat().st_size)    # outputs (a kept input has no sidecar of its own)
        words = shlex.split(command.replace("OUTPUT.mp4", str(made[0]) if made else "OUTPUT.mp4"))
        line = [sys.executable, str(ROOT / "app.py"), *words[2:]]
        script = ["bash", "-c", " ".join(word if word == ">" else shlex.quote(word) for word in line)]
        done = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        allowed = DOCUMENTED_EXITS.get(words[2], (0,))
        assert done.returncode in allowed, f"{command}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"
        assert "Traceback" not in done.stderr, f"{command}\n{done.stderr[-2000:]}"
        ran.append(words[2])
    assert {"generate", "post", "plan", "doctor"} <= set(ran), ran
    assert (tmp_path / "my-gpu.json").is_file()
