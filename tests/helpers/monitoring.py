"""Prometheus run for the tests: the README's monitoring files, a real Prometheus started on them, its queries."""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT, free_port

MONITORING = ROOT / "docs" / "monitoring"


def prometheus_path() -> str:
    """WAN_TEST_PROMETHEUS (./launch.sh test sets it), else one on this machine; the test fails without one."""
    from tests.prometheus_setup import ENV, find_installed

    path = os.environ.get(ENV, "").strip() or find_installed()
    if not path:
        pytest.fail(f"no Prometheus for the monitoring test: run the tests with ./launch.sh test (launch.bat test on "
                    f"Windows), which finds or installs one, or set {ENV} to a prometheus program")
    return path


@contextlib.contextmanager
def started_prometheus(folder: Path, config: dict):
    """A real Prometheus run with ``config`` (written to ``folder``), once it says it is ready: {"url", "log"}."""
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(folder / "prometheus.log", "w+") as log:
        proc = subprocess.Popen([prometheus_path(), f"--config.file={folder / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=folder)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _ready(url), 60, lambda: Path(log.name).read_text())
            yield {"url": url, "log": Path(log.name)}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(check, timeout_s: float, explain=lambda: ""):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"gave up after {timeout_s} s\n{explain()}")


def query(prometheus: dict, expr: str) -> list[dict]:
    """The answer of Prometheus' HTTP API to an instant query: its result vector."""
    answer = httpx.get(f"{prometheus['url']}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]
