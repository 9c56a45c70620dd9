"""The engine in its own process: cancel, and survival of a killed worker."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from engine.events import Info, JobCancelled, JobFailed, JobFinished, PhaseFinished, StepFinished
from engine.service.starts import START_VARIABLE
from engine.service.watchdog import Silence
from engine.service.worker import WorkerClient
from tests.conftest import tiny_request


pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def client(selftest_models_dir):
    """One engine process for the file's tests that need no fresh one (each ends with the engine serving: a killed
    one is replaced within its test)."""
    client = WorkerClient(selftest_models_dir)
    yield client
    client.close()


@pytest.fixture
def unstarted(selftest_models_dir):
    client = WorkerClient(selftest_models_dir)
    yield client
    client.close()


# The watchdog's limits for the frozen-engine tests: short, so that the tests wait seconds rather than the 15 s and
# 5 s an engine gets in the app; long enough that a running engine's status thread always answers in time.
SHORT_SILENCE = Silence(limit_s=4.0, after_cancel_s=2.0, ask_after_s=0.5)


@pytest.fixture(scope="module")
def watched(selftest_models_dir):
    client = WorkerClient(selftest_models_dir, silence=SHORT_SILENCE)
    yield client
    client.close()


def collect(events, on_step=None):
    seen = []
    for event in events:
        seen.append(event)
        if on_step and isinstance(event, StepFinished):
            on_step(event)
    return seen


def test_cancel_mid_run_then_the_next_run_succeeds_without_reloading(client, presets, outputs):
    def cancel_at_two(event):
        if event.step == 2:
            client.cancel()

    events = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=40)), cancel_at_two)
    result = events[-1]
    assert isinstance(result, JobCancelled) and 2 <= result.at_step < 40
    pid = client.pid
    events = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=3)))
    assert isinstance(events[-1], JobFinished)
    assert client.pid == pid, "cancel must not restart the worker"
    assert "load" not in [e.phase for e in events if isinstance(e, PhaseFinished)]


def test_a_listener_that_stops_early_cancels_its_job_and_frees_the_engine(client, presets, outputs):
    events = client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=200))
    for event in events:
        if isinstance(event, StepFinished) and event.step == 2:
            break
    events.close()   # what the page does when a visitor leaves or cancels a running request
    assert not client.busy, "closing the stream must wait for the job's end"
    assert not list(outputs.rglob("*.mp4")), "the abandoned job still wrote a video"
    job_id = client.new_job_id()
    after = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=3), job_id))
    assert isinstance(after[-1], JobFinished) and {e.job_id for e in after} == {job_id}


def test_kill_9_mid_run_is_reported_and_a_fresh_worker_runs_the_next_job(client, presets, outputs):
    before = client.restarts
    def kill_at_two(event):
        if event.step == 2:
            os.kill(client.pid, signal.SIGKILL)

    events = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=40)), kill_at_two)
    failure = events[-1]
    assert isinstance(failure, JobFailed) and failure.kind == "crash" and failure.phase == "denoise"
    assert "SIGKILL" in failure.message and "during denoise" in failure.message
    assert any(isinstance(e, Info) and "fresh engine process" in e.message for e in events)
    assert not list(outputs.rglob("*.mp4")), "a killed job left a video"
    restarts = client.restarts
    events = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=3)))
    assert isinstance(events[-1], JobFinished), events[-1]
    assert client.restarts == restarts == 1 + before


def test_bad_input_is_refused_without_starting_the_worker(unstarted, presets, outputs):
    client = unstarted
    events = list(client.submit(tiny_request(presets, "selftest-t2v", outputs, frames=10)))
    assert len(events) == 1 and isinstance(events[0], JobFailed) and events[0].kind == "input"
    assert "4k+1" in events[0].message
    assert client.pid is None


def test_missing_model_folder_is_refused_before_the_worker(unstarted, presets, outputs, tmp_path):
    client = unstarted
    (tmp_path / "empty-model").mkdir()
    events = list(client.submit(tiny_request(presets, str(tmp_path / "empty-model"), outputs)))
    assert isinstance(events[0], JobFailed) and events[0].kind == "model"
    assert "no model_index.json" in events[0].message and client.pid is None


def test_unload_frees_the_model_and_the_next_run_loads_it_again(client, presets, outputs):
    first = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)))
    assert isinstance(first[-1], JobFinished)
    client.unload()
    again = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)))
    assert isinstance(again[-1], JobFinished)
    assert "load" in [e.phase for e in again if isinstance(e, PhaseFinished)]


def test_notes_about_the_input_are_said_before_the_job(client, presets, outputs, tmp_path):
    from PIL import Image

    image = tmp_path / "transparent.png"
    rgba = Image.new("RGBA", (80, 64), (200, 30, 30, 255))
    rgba.paste((0, 0, 0, 0), (0, 0, 40, 64))
    rgba.save(image)
    request = tiny_request(presets, "selftest-i2v", outputs, mode="i2v", image=str(image), steps=2,
                           prompt="a red\x07 fox\x1b[31m in snow")
    events = collect(client.submit(request))
    notes = [e.message for e in events if isinstance(e, Info)]
    assert any("transparent areas filled with white" in n for n in notes), notes
    assert any("prompt: removed" in n and "control character" in n for n in notes), notes
    assert isinstance(events[-1], JobFinished), events[-1]


def test_memory_is_answered_while_a_job_runs(client, unstarted, presets, outputs):
    assert unstarted.memory() is None, "no engine process yet: nothing to report"
    during = []

    def ask(event):
        if event.step == 2:
            during.append(client.memory(timeout=10))
            # The hardware too, from another thread (as the page asks): never behind the running job.
            asker = threading.Thread(target=lambda: during.append(client.hardware()), daemon=True)
            asker.start()
            asker.join(timeout=10)
            during.append(client.busy)

    events = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=6)), ask)
    assert isinstance(events[-1], JobFinished)
    assert len(during) == 3 and during[1].backend == "cpu" and during[2] is True, during
    snapshot = during[0]
    assert snapshot is not None and client.busy is False
    assert snapshot.backend == "cpu" and snapshot.vram_total_gb is None
    assert snapshot.model == "selftest-t2v" and snapshot.strategy
    assert 0.05 < snapshot.engine_ram_gb < 8
    idle = client.memory()
    assert idle.model == "selftest-t2v" and idle.engine_ram_gb > 0
    client.unload()
    assert client.memory().model is None


def test_the_first_job_shows_and_times_the_engine_start_and_the_self_test_build(presets, outputs, tmp_path,
                                                                                  monkeypatch):
    """Loading torch and diffusers, and building the self-test model the first time, are phases of their own:
    shown while they run, counted in the job's total and its sidecar, and not hidden in the load. (An engine start
    that loads the libraries, as an app's first one does: spawned here, since this process's fork server has them
    loaded already; tests/test_cli.py runs a new app, whose first engine waits for its new fork server's load, and
    sees that start said first and timed.)"""
    import json
    from pathlib import Path

    from engine.events import PhaseStarted

    monkeypatch.setenv(START_VARIABLE, "spawn")
    client = WorkerClient(tmp_path / "empty-models")    # not started yet, and no self-test model built
    try:
        events = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)))
        result = events[-1]
        assert isinstance(result, JobFinished), result
        started = [e.phase for e in events if isinstance(e, PhaseStarted)]
        assert started[:3] == ["engine_start", "build_model", "load"], started
        seconds = {e.phase: e.seconds for e in events if isinstance(e, PhaseFinished)}
        assert seconds["engine_start"] > seconds["load"], seconds   # the libraries' import is not the load's
        sidecar = json.loads(Path(result.sidecar).read_text())
        assert {"engine_start", "build_model"} <= set(sidecar["timings"]) and sidecar["timings"] == result.timings
        assert abs(result.timings["engine_start"] - seconds["engine_start"]) < 1e-3
        # The next job finds the engine ready and the model built: neither phase again.
        again = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)))
        assert not {"engine_start", "build_model"} & {e.phase for e in again if isinstance(e, PhaseStarted)}
    finally:
        client.close()


def test_the_page_asking_the_hardware_while_the_first_job_starts_the_engine_takes_none_of_its_messages(
        presets, outputs, selftest_models_dir):
    """The page loads while the first job waits for the engine to start: both wait for its "ready", and the
    hardware question must neither take that message nor any of the job's events."""
    from engine.events import PhaseStarted

    client = WorkerClient(selftest_models_dir)
    answers = []
    asker = threading.Thread(target=lambda: answers.append(client.hardware()), daemon=True)

    def on_event(event):
        if isinstance(event, PhaseStarted) and event.phase == "engine_start":
            asker.start()
            time.sleep(0.2)   # the question waits beside the job's own wait for the engine

    try:
        events = []
        for event in client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)):
            events.append(event)
            on_event(event)
        asker.join(timeout=60)
        assert isinstance(events[-1], JobFinished), events[-1]
        assert answers and answers[0].backend == "cpu", answers
    finally:
        client.close()


def test_while_the_engine_loads_its_libraries_it_says_so(tmp_path, monkeypatch):
    from engine.device.usage import EngineMemory, EngineStarting

    monkeypatch.setenv(START_VARIABLE, "spawn")   # one that loads them (see the test above)
    client = WorkerClient(tmp_path / "models")
    try:
        client.start()
        answers = []
        deadline = time.time() + 120
        while time.time() < deadline:
            answers.append(client.memory(timeout=1.0))
            if isinstance(answers[-1], EngineMemory):
                break
            time.sleep(0.05)
        assert any(isinstance(a, EngineStarting) for a in answers), answers
        assert isinstance(answers[-1], EngineMemory) and answers[-1].model is None
    finally:
        client.close()


@pytest.mark.parametrize("cancel", [False, True])
def test_a_stopped_engine_is_declared_hung_replaced_and_the_next_job_runs(watched, presets, outputs, cancel):
    """SIGSTOP freezes the engine mid-job: within the documented limit the job fails saying so, the frozen
    process is killed, and the next job runs in a fresh one. A cancel shortens the wait."""
    from engine.device.usage import EngineSilent

    client = watched
    frozen = []

    def stop_then(event):
        if event.step == 2 and not frozen:
            os.kill(client.pid, signal.SIGSTOP)
            frozen.append((client.pid, time.monotonic()))
            _wait_until_stopped(client.pid)   # the signal takes effect when the kernel next schedules it
            assert isinstance(client.memory(timeout=1.0), EngineSilent)   # what the system panel sees
            if cancel:
                client.cancel()

    events = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=200)), stop_then)
    took = time.monotonic() - frozen[0][1]
    failure = events[-1]
    assert isinstance(failure, JobFailed) and failure.kind == "hung" and failure.phase == "denoise"
    assert failure.message.startswith("The engine stopped answering during denoise (it answered nothing for ")
    limit = SHORT_SILENCE.after_cancel_s if cancel else SHORT_SILENCE.limit_s
    assert limit <= took <= limit + SHORT_SILENCE.ask_after_s + 4, took
    assert not psutil_alive(frozen[0][0]), "the frozen engine process is still there"
    after = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)))
    assert isinstance(after[-1], JobFinished) and client.pid != frozen[0][0]


def _wait_until_stopped(pid: int, limit_s: float = 5.0) -> None:
    import psutil

    deadline = time.monotonic() + limit_s
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
        time.sleep(0.01)


def psutil_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_closing_stops_the_running_job_at_its_next_step_and_starts_no_engine_after(selftest_models_dir, presets,
                                                                                 outputs):
    """What Ctrl+C on the app does to its engines: the job running is asked to stop at its next step, the engine
    process ends by itself (it is stopped only past CLOSE_WAIT_S), and nothing starts a fresh one afterwards (a job
    thread that finds its engine gone while the app stops gets an OSError, not a new process)."""
    client = WorkerClient(selftest_models_dir)
    closing = []

    def close_at_two(event):
        if event.step == 2 and not closing:
            process = client._worker.process
            closing.append((process, threading.Thread(target=client.close)))
            closing[0][1].start()

    # The most steps there are, at a size whose steps take tens of milliseconds: seconds of work after step 2.
    events = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=200, width=256, height=256,
                                                frames=33)), close_at_two)
    process, thread = closing[0]
    thread.join(timeout=30)
    assert isinstance(events[-1], (JobCancelled, JobFailed)), events[-1]
    assert not any(isinstance(event, StepFinished) and event.step == 200 for event in events)
    assert not process.is_alive() and process.exitcode == 0, process.exitcode   # it ended by itself
    with pytest.raises(OSError, match="the app is stopping"):
        client.start()
    assert client.pid is None


def test_the_engine_process_sends_one_message_at_a_time_whatever_thread_sends_it():
    """The job's thread and the live preview's thread both send on the engine's pipe: interleaved, their bytes reached
    the app as garbage ("invalid load key") and the job's page froze at its step. Two threads at once: one waits."""
    from engine.service.engine_process import one_at_a_time

    inside, overlapped, both_waiting = [], [], threading.Barrier(2)

    def slow_send(message):
        if inside:
            overlapped.append(message)
        inside.append(message)
        time.sleep(0.05)
        inside.pop()

    send = one_at_a_time(slow_send)

    def sender(message):
        both_waiting.wait()
        for _ in range(5):
            send(message)

    threads = [threading.Thread(target=sender, args=(name,)) for name in ("step", "preview")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not overlapped and not inside
