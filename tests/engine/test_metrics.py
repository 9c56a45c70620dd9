"""The service's Prometheus metrics, read back as Prometheus reads them: the job counters and histograms, and the
gauges a scrape reads from a real job queue and a real engine process (starting, idle, running, not answering)."""
from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.device.hardware import GIB
from engine.device.usage import EngineMemory, EngineSilent, EngineStarting
from engine.device.utilization import GpuUtilization, driver_ids, rocm_smi_ratios
from engine.events import Ending, FailureKind, JobEnding, StepFinished
from engine.service.jobqueue import JobQueue
from engine.service.metrics import (ENGINE_ANSWER_S, STATES, EngineReading, JobRecord, ServiceMetrics,
                                    engine_families, model_label, outcome_of)
from engine.service.worker import WorkerClient
from tests.conftest import tiny_request


def scrape(metrics: ServiceMetrics) -> dict[tuple, float]:
    """Every sample of the exposition, as Prometheus' own parser reads it: (name, sorted labels) -> value."""
    body, kind = metrics.exposition()
    assert kind.startswith("text/plain; version=")   # Prometheus' text format
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body.decode()) for sample in family.samples}


def named(samples: dict, name: str) -> dict[tuple, float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def state(samples: dict, engine: str = "0") -> str:
    """The one state engine ``engine`` is in (engine_state is one-hot)."""
    ones = [dict(labels)["state"] for labels, value in named(samples, "wan_studio_engine_state").items()
            if dict(labels)["engine"] == engine and value == 1]
    assert len(ones) == 1, samples
    return ones[0]


# ----- jobs: counters and histograms -------------------------------------------------------------------------------
def _counted(samples: dict, name: str) -> dict:
    """The series of a counter that are not 0 (the bounded ones are all there from the start, at 0)."""
    return {labels: value for labels, value in named(samples, name).items() if value}


def test_each_ended_job_moves_its_counter_once_and_its_histograms():
    metrics = ServiceMetrics(JobQueue(), presets=[("i2v", "/home/someone/models/my-wan")])
    metrics.job_ended(JobRecord("t2v", "selftest-t2v", "done", 12.5, {"load": 1.5, "denoise": 9.0}, waited=4.0))
    metrics.job_ended(JobRecord("t2v", "", "refused", failure="input"))
    metrics.job_ended(JobRecord("i2v", "/home/someone/models/my-wan", "failed", 3.0, failure="model", waited=0.5))
    samples = scrape(metrics)
    assert _counted(samples, "wan_studio_jobs_total") == {
        (("mode", "t2v"), ("model", "selftest-t2v"), ("outcome", "done")): 1,
        (("mode", "t2v"), ("model", ""), ("outcome", "refused")): 1,
        (("mode", "i2v"), ("model", "my-wan"), ("outcome", "failed")): 1}   # a folder by its name only
    errors = {dict(labels)["kind"]: value for labels, value in named(samples, "wan_studio_errors_total").items()}
    refusals = {dict(labels)["kind"]: value for labels, value in named(samples, "wan_studio_refusals_total").items()}
    assert {kind: value for kind, value in errors.items() if value} == {"model": 1}       # a failure while it ran
    assert {kind: value for kind, value in refusals.items() if value} == {"input": 1}     # apart from the failures
    assert set(errors) == set(refusals) == {str(kind) for kind in FailureKind}   # every kind from the start, at 0
    t2v = (("mode", "t2v"), ("model", "selftest-t2v"))
    assert samples[("wan_studio_job_seconds_count", t2v)] == 1      # the refused job never ran
    assert samples[("wan_studio_job_seconds_sum", t2v)] == 12.5
    assert samples[("wan_studio_job_seconds_bucket", (("le", "10.0"), *t2v))] == 0
    assert samples[("wan_studio_job_seconds_bucket", (("le", "20.0"), *t2v))] == 1
    assert samples[("wan_studio_phase_seconds_sum", (("model", "selftest-t2v"), ("phase", "denoise")))] == 9.0
    assert samples[("wan_studio_phase_seconds_count", (("model", "selftest-t2v"), ("phase", "load")))] == 1
    assert samples[("wan_studio_queue_wait_seconds_count", ())] == 2 and samples[
        ("wan_studio_queue_wait_seconds_sum", ())] == 4.5
    assert samples[("wan_studio_queue_waiting", ())] == 0


def test_what_users_type_as_a_model_adds_no_series_and_shows_nowhere():
    """40 jobs naming random models (the probe's): every one counted under "other", none of their names in /metrics;
    the presets' models and the "other" of every mode are there from the first scrape, at 0."""
    metrics = ServiceMetrics(JobQueue(), presets=[("t2v", "selftest-t2v"), ("i2v", "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers")])
    before = named(scrape(metrics), "wan_studio_jobs_total")
    assert before[(("mode", "t2v"), ("model", "selftest-t2v"), ("outcome", "done"))] == 0
    assert before[(("mode", "v2v"), ("model", "other"), ("outcome", "refused"))] == 0
    for number in range(40):
        metrics.job_ended(JobRecord("t2v", f"someone/made-up-{number}", "refused" if number % 2 else "failed",
                                    failure="model"))
    after = named(scrape(metrics), "wan_studio_jobs_total")
    assert set(after) == set(before)
    assert after[(("mode", "t2v"), ("model", "other"), ("outcome", "refused"))] == 20
    assert "made-up" not in metrics.exposition()[0].decode()
    metrics.job_ended(JobRecord("t2v", "/models/my-own-wan", "done", 2.0))   # a model that made a video is named
    assert named(scrape(metrics), "wan_studio_jobs_total")[(("mode", "t2v"), ("model", "my-own-wan"),
                                                            ("outcome", "done"))] == 1


def test_a_job_ends_as_one_outcome_of_the_counter():
    assert outcome_of(JobEnding(Ending.DONE)) == "done"
    assert outcome_of(JobEnding(Ending.REFUSED, cause="input")) == "refused"
    assert outcome_of(JobEnding(Ending.FAILED, cause="runtime")) == "failed"
    assert outcome_of(JobEnding(Ending.FAILED, cause="hung")) == "hung"
    assert outcome_of(JobEnding(Ending.FAILED, cause="disk")) == "disk"
    for ending in (JobEnding(Ending.CANCELLED), JobEnding(Ending.WITHDRAWN), JobEnding(Ending.STOPPED), None):
        assert outcome_of(ending) == "cancelled"


def test_models_are_named_as_every_visitor_sees_them(tmp_path):
    assert model_label("selftest-t2v") == "selftest-t2v"
    assert model_label("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    assert model_label(str(tmp_path / "wan-folder")) == "wan-folder"
    assert model_label(None) == model_label("") == ""


# ----- the live gauges ---------------------------------------------------------------------------------------------
def _gpu_memory(model: str | None = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers") -> EngineMemory:
    return EngineMemory("cuda", "NVIDIA H200", 139.8, 41.25, 30.0, 32.0, 6.5, model, "gpu")


def test_each_engine_is_in_exactly_one_state_with_its_memory_in_bytes():
    readings = [EngineReading(0, _gpu_memory(), running=True, utilization=0.97),
                EngineReading(1, _gpu_memory(), running=False, utilization=0.0),
                EngineReading(2, EngineStarting(4.0)), EngineReading(3, EngineSilent()), EngineReading(4, None)]
    families = {family.name: family for family in engine_families(readings)}

    def values(name: str) -> dict:
        return {tuple(sample.labels.values()): sample.value for sample in families[f"wan_studio_{name}"].samples}

    ones = {engine: state for (engine, state), value in values("engine_state").items() if value == 1}
    assert ones == {"0": "running", "1": "idle", "2": "starting", "3": "silent", "4": "stopped"}
    assert len(values("engine_state")) == 5 * len(STATES)
    assert values("vram_used_bytes") == {("0",): 41.25 * GIB, ("1",): 41.25 * GIB}
    assert values("vram_total_bytes")[("0",)] == 139.8 * GIB
    assert values("engine_ram_bytes") == {("0",): 6.5 * GIB, ("1",): 6.5 * GIB}
    assert values("gpu_utilization_ratio") == {("0",): 0.97, ("1",): 0.0}
    assert values("model_loaded") == {("Wan-AI/Wan2.1-T2V-1.3B-Diffusers",): 2}


def test_without_a_separate_device_memory_or_a_gpu_reading_those_gauges_are_absent():
    cpu = EngineMemory("cpu", "x86_64", None, None, None, None, 2.0, None, None)
    families = {family.name: family.samples for family in engine_families([EngineReading(0, cpu)])}
    assert families["wan_studio_vram_used_bytes"] == families["wan_studio_vram_total_bytes"] == []
    assert families["wan_studio_gpu_utilization_ratio"] == families["wan_studio_model_loaded"] == []
    assert [sample.value for sample in families["wan_studio_engine_ram_bytes"]] == [2.0 * GIB]


def test_the_driver_s_gpu_numbers_follow_the_visible_devices():
    assert driver_ids([0, 1], "cuda", {}) == {0: "0", 1: "1"}
    assert driver_ids([0, 1], "cuda", {"CUDA_VISIBLE_DEVICES": "3,1"}) == {0: "3", 1: "1"}
    assert driver_ids([0, 2], "cuda", {"CUDA_VISIBLE_DEVICES": "GPU-8a1c, 2"}) == {0: "GPU-8a1c"}
    assert driver_ids([1], "rocm", {"HIP_VISIBLE_DEVICES": "4,5", "CUDA_VISIBLE_DEVICES": "0"}) == {1: "5"}


def test_rocm_smi_s_answer_is_read_per_card():
    output = ('WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status\n'
              '{"card0": {"GPU use (%)": "37"}, "card1": {"GPU use (%)": "N/A"}, "card2": {"GPU use (%)": "100"}}')
    assert rocm_smi_ratios(output) == {0: 0.37, 2: 1.0}
    assert rocm_smi_ratios("rocm-smi: command failed") == {}


def test_the_gpu_utilisation_is_read_where_a_driver_says_it_and_absent_elsewhere():
    """On a CPU-only machine (this one in CI) NVML and the AMD tools find nothing, and the reading is empty; on a
    machine with an NVIDIA driver it is a share between 0 and 1."""
    reader = GpuUtilization()
    try:
        assert reader.read("cpu", [0]) == reader.read("mps", [0]) == {}
        nvidia = reader.read("cuda", [0])
        assert set(nvidia) <= {0} and all(0 <= ratio <= 1 for ratio in nvidia.values())
        if not os.path.exists("/dev/nvidiactl"):
            assert nvidia == {}
        if not os.path.exists("/dev/kfd"):
            assert reader.read("rocm", [0]) == {}
    finally:
        reader.close()


# ----- a real engine process ---------------------------------------------------------------------------------------
@pytest.fixture
def engine(selftest_models_dir):
    client = WorkerClient(selftest_models_dir)
    yield client
    if client.pid:
        os.kill(client.pid, signal.SIGCONT)
    client.close()


def _wait_for(metrics: ServiceMetrics, wanted: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        samples = scrape(metrics)
        if state(samples) == wanted:
            return samples
        time.sleep(0.2)
    raise AssertionError(f"the engine never was {wanted}: {samples}")


@pytest.mark.process
def test_a_real_engine_is_stopped_starting_idle_running_and_silent_as_it_is(engine, presets, outputs):
    jobs = JobQueue()
    metrics = ServiceMetrics(jobs, engine)
    assert state(scrape(metrics)) == "stopped"                        # no engine process yet
    engine.start()
    assert state(_wait_for(metrics, "starting")) == "starting"       # loading torch and diffusers
    idle = _wait_for(metrics, "idle")
    assert named(idle, "wan_studio_engine_ram_bytes")[(("engine", "0"),)] > 50 * 2 ** 20
    assert not named(idle, "wan_studio_vram_used_bytes") and not named(idle, "wan_studio_gpu_utilization_ratio")

    ticket = jobs.join("someone", "text to video", model="selftest-t2v")
    assert scrape(metrics)[("wan_studio_queue_waiting", ())] == 1
    assert jobs.wait_turn(ticket, 1.0)
    stepping, seen = threading.Event(), []

    def follow():
        for event in engine.submit(tiny_request(presets, "selftest-t2v", outputs, steps=200)):
            seen.append(event)
            if isinstance(event, StepFinished):
                stepping.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert stepping.wait(120), seen
    during = scrape(metrics)                                          # the status channel answers during a job
    assert state(during) == "running" and during[("wan_studio_queue_waiting", ())] == 0
    assert named(during, "wan_studio_model_loaded") == {(("model", "selftest-t2v"),): 1}

    os.kill(engine.pid, signal.SIGSTOP)                               # hung: it answers nothing
    while psutil.Process(engine.pid).status() != psutil.STATUS_STOPPED:   # once the signal has taken effect
        time.sleep(0.01)
    started = time.monotonic()
    assert state(scrape(metrics)) == "silent"
    assert time.monotonic() - started < ENGINE_ANSWER_S + 1.0          # the scrape did not wait for it
    os.kill(engine.pid, signal.SIGCONT)
    engine.cancel()
    reader.join(60)
    jobs.leave(ticket, JobEnding(Ending.CANCELLED))
    assert state(_wait_for(metrics, "idle")) == "idle"
