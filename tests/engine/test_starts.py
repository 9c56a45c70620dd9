"""Where engine processes come from (engine/service/starts.py): forked, with the libraries loaded, from a fork server
while the variables the libraries read as they load are as the server started with; spawned otherwise; and in
either case running with the app's environment as it is when the engine starts."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from engine.events import JobFailed, JobFinished, StepFinished
from engine.service.starts import PRELOAD, START_VARIABLE, cpu_only_torch, engine_context, environment, loaded_with
from engine.service.worker import WorkerClient
from tests.conftest import tiny_request
from tests.faults import NoteVariable

LINUX = sys.platform.startswith("linux")
FORKED_HERE = LINUX and cpu_only_torch()   # the suite's torch: the CPU build requirements-test pins


def test_linux_forks_engines_of_a_cpu_only_torch_unless_told_to_spawn_and_other_systems_and_gpu_builds_spawn():
    here = dict(os.environ)
    assert engine_context(here, "2.13.0+cpu").get_start_method() == ("forkserver" if LINUX else "spawn")
    assert engine_context({**here, START_VARIABLE: "spawn"}, "2.13.0+cpu").get_start_method() == "spawn"
    assert engine_context({**here, START_VARIABLE: " Spawn "}, "2.13.0+cpu").get_start_method() == "spawn"
    # CUDA and ROCm builds: the libraries' load would keep a forked engine from its GPU.
    for version in ("2.11.0+cu130", "2.9.1+rocm6.4", "2.13.0"):
        assert engine_context(here, version).get_start_method() == "spawn", version
    assert cpu_only_torch("2.13.0+cpu") and cpu_only_torch("2.5.1+cpu.cxx11.abi") and not cpu_only_torch("2.11.0")


def test_the_variables_read_as_the_libraries_load_are_their_families_and_the_engine_s_own_go_over_the_app_s():
    environ = {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "0", "OMP_WAIT_POLICY": "PASSIVE", "PATH": "/bin",
               "PYTEST_CURRENT_TEST": "x", "FORWARDED_ALLOW_IPS": "*", "hip_visible_devices": "1"}
    assert loaded_with(environ) == {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "0", "OMP_WAIT_POLICY": "PASSIVE",
                                    "hip_visible_devices": "1"}
    assert environment({"CUDA_VISIBLE_DEVICES": "1"}, environ) == {**environ, "CUDA_VISIBLE_DEVICES": "1"}
    assert environment(None, environ) == environ


def _parent(pid: int) -> psutil.Process:
    return psutil.Process(pid).parent()


def _job(client, presets, outputs, **overrides):
    events = list(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2, **overrides)))
    assert isinstance(events[-1], JobFinished), events[-1]
    return events


def _crash_during_a_job(client, presets, outputs) -> None:
    pid = client.pid
    for event in client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=40)):
        if isinstance(event, StepFinished):
            os.kill(pid, signal.SIGKILL)
    assert isinstance(event, JobFailed) and "SIGKILL" in event.message, event


def _noted(path: Path) -> tuple[int, str]:
    pid, value = path.read_text().split(" ", 1)
    return int(pid), value


@pytest.fixture
def noting(selftest_models_dir, tmp_path):
    """``noting(NAME)``: (a client whose every engine notes its value of NAME, the file it notes it in)."""
    clients = []

    def make(name: str):
        noted = tmp_path / "noted.txt"
        clients.append(WorkerClient(selftest_models_dir, faults=NoteVariable(name, str(noted))))
        return clients[-1], noted
    yield make
    for client in clients:
        client.close()


@pytest.mark.process
@pytest.mark.skipif(not FORKED_HERE, reason="engines are forked on Linux with a CPU-only torch only")
def test_a_restarted_engine_is_forked_with_the_libraries_loaded_and_sees_the_environment_as_it_is_now(
        noting, presets, outputs, monkeypatch):
    client, noted = noting("STUDIO_TEST_NOTE")
    monkeypatch.setenv("STUDIO_TEST_NOTE", "first")
    _job(client, presets, outputs)
    server = _parent(client.pid)
    assert server.pid != os.getpid() and server.parent().pid == os.getpid()
    assert PRELOAD in " ".join(server.cmdline()), server.cmdline()
    assert _noted(noted) == (client.pid, "first")

    # A crash: the next engine comes from the same server, and has the variable as it is now.
    monkeypatch.setenv("STUDIO_TEST_NOTE", "second")
    first_pid = client.pid
    _crash_during_a_job(client, presets, outputs)
    events = _job(client, presets, outputs)
    assert client.pid != first_pid and _parent(client.pid).pid == server.pid
    assert "engine_start" in {getattr(e, "phase", None) for e in events}   # a start, said and timed, as before
    assert _noted(noted) == (client.pid, "second")


@pytest.mark.process
@pytest.mark.skipif(not FORKED_HERE, reason="engines are forked on Linux with a CPU-only torch only")
def test_once_a_variable_the_libraries_read_as_they_load_has_changed_the_engine_is_spawned_and_sees_it(
        noting, presets, outputs, monkeypatch):
    client, noted = noting("HF_HUB_OFFLINE")
    _job(client, presets, outputs)   # the fork server runs now (it may have run before)
    changed = "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", changed)
    _crash_during_a_job(client, presets, outputs)
    _job(client, presets, outputs)
    assert _parent(client.pid).pid == os.getpid(), "an engine forked from a server whose Hub setting is stale"
    assert "spawn_main" in " ".join(psutil.Process(client.pid).cmdline())
    assert _noted(noted) == (client.pid, changed)


@pytest.mark.process
def test_told_to_spawn_the_engine_is_spawned(selftest_models_dir, presets, outputs, monkeypatch):
    monkeypatch.setenv(START_VARIABLE, "spawn")
    client = WorkerClient(selftest_models_dir)
    try:
        _job(client, presets, outputs)
        assert _parent(client.pid).pid == os.getpid()
    finally:
        client.close()
