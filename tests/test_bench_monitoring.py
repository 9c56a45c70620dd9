"""bench/monitoring_feed.py on the CPU with the self-test model: the run's metrics sampled, written as OpenMetrics,
put into a real Prometheus data folder by promtool and graphed by a real Prometheus, so the code that makes the
README's dashboard picture from a GPU run cannot rot between GPU runs."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.events import FailureKind
from engine.service.metrics import OUTCOMES
from tests.conftest import ROOT, app_env

pytestmark = pytest.mark.bench


def test_the_feed_of_a_tiny_run_is_graphed_by_prometheus(tmp_path):
    feed = tmp_path / "feed.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "monitoring_feed.py"), str(feed), "--tiny",
                           "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=600,
                          env=app_env(WAN_STUDIO_CALIBRATE="0"), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(feed.read_text())
    outcomes = [job["outcome"] for job in run["jobs"]]
    assert outcomes.count("refused") == 1 and outcomes.count("failed") == 1 and outcomes.count("done") >= 7
    names = {name for _, name, _, _ in run["samples"]}
    assert {"wan_studio_jobs_total", "wan_studio_engine_state", "wan_studio_engine_ram_bytes"} <= names

    picture = tmp_path / "picture.png"
    drawn = subprocess.run([sys.executable, str(ROOT / "bench" / "monitoring_feed.py"), str(feed), str(picture),
                            "--picture"], capture_output=True, text=True, timeout=300, env=app_env(), cwd=ROOT)
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    answered = json.loads(drawn.stdout.strip().splitlines()[-1])   # series each dashboard query had at the end
    assert answered["Jobs by outcome"] == len(OUTCOMES)          # each outcome counted from 0
    assert answered["Failures by kind"] == answered["Refusals by kind"] == len(FailureKind)   # each kind from 0
    assert answered["Queue wait"] == 1                           # one series: the jobs' waits
    assert answered["Loaded model"] == answered["Engine RAM"] == answered["Waiting in the queue"] == 1
    assert answered["VRAM"] == answered["GPU utilization"] == 0                   # no GPU here
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 50_000
