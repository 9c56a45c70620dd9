"""The system panel's text: what it says while the engine starts, idle, running, and of the last job."""
from __future__ import annotations

from engine.device.hardware import GIB
from engine.device.usage import EngineMemory, EngineStarting
from engine.events import Ending, JobCancelled, JobEnding, JobFailed, JobFinished, PhaseStarted, PlanReady
from engine.models.spec import SELFTEST_SPECS
from engine.planning.planner import PlanRequest, plan_memory
from tests.conftest import CPU
from ui.parts.system_panel import system_markdown
from ui.views.job_view import JobView, ending_words

MEMORY = EngineMemory(backend="cuda", device_name="RTX 3060", vram_total_gb=12.0, vram_used_gb=9.1,
                      vram_engine_gb=8.6, vram_cached_gb=9.0, engine_ram_gb=13.2,
                      model="Wan-AI/Wan2.1-T2V-1.3B-Diffusers", strategy="text_encoder_offload")


def test_idle_it_tells_how_the_last_job_ended_and_running_it_tells_what_runs():
    done = JobEnding(Ending.DONE, seconds=3.2)
    idle = system_markdown(MEMORY, 32 * GIB, 20 * GIB, None, (done, 4.2))
    assert "VRAM 9.1 GB / 12.0 GB in use (engine 8.6 GB, cached 9.0 GB)" in idle
    assert "RAM 12.0 / 32.0 GB in use, engine process 13.2 GB" in idle
    assert idle.endswith("**Engine:** idle · last job: done in 3.2 s (ended 4 s ago) · "
                         "`Wan-AI/Wan2.1-T2V-1.3B-Diffusers` loaded (text_encoder_offload)")
    running = system_markdown(MEMORY, 32 * GIB, 20 * GIB, "Denoising: step 3/30", (done, 4.2), waiting=2)
    assert "**Engine:** running: Denoising: step 3/30 · 2 waiting · " in running and "last job" not in running
    assert "last job" not in system_markdown(MEMORY, 32 * GIB, 20 * GIB, None, None)
    later = system_markdown(MEMORY, 32 * GIB, 20 * GIB, None, (JobEnding(Ending.CANCELLED, "denoise", 4, 30), 600))
    assert "last job: cancelled during the denoising, after step 4 of 30 (ended 10 min ago)" in later
    assert len(later.splitlines()) == 2     # two lines, whatever happened: the tabs never move down


def test_while_the_engine_loads_its_libraries_it_says_so():
    starting = system_markdown(EngineStarting(4.4), 32 * GIB, 20 * GIB, "Engine start (libraries)...")
    assert "**Engine:** starting: loading torch and diffusers (4 s so far) · Engine start (libraries)..." in starting
    assert "not started" not in starting


def test_the_last_job_is_named_without_anyone_s_text():
    """Every visitor sees the panel: a job's ending there is a few public words, never its messages."""
    done = JobView().apply(JobFinished("j", ("a.mp4",), "a.json", 5, {"load": 1.0, "denoise": 2.25}))
    assert done.ending == JobEnding(Ending.DONE, seconds=3.25) and ending_words(done.ending) == "done in 3.2 s"
    cancelled = JobView().apply(PhaseStarted("j", "denoise")).apply(JobCancelled("j", 3, 40, "denoise", True))
    assert cancelled.ending == JobEnding(Ending.CANCELLED, "denoise", 3, 40)
    assert ending_words(cancelled.ending) == "cancelled during the denoising, after step 3 of 40"
    crash = JobView().apply(JobFailed("j", "The engine process stopped unexpectedly during load (SIGKILL) in "
                                      "/home/alice/secret-prompt.txt.", "Try again.", "load", "crash"))
    assert crash.ending == JobEnding(Ending.FAILED, "load", cause="crash")
    assert ending_words(crash.ending) == "failed during Load (disk to RAM)"
    assert "alice" not in repr(crash.ending) and "secret" not in repr(crash.ending)
    settings = JobView().apply(JobFailed("j", "The prompt 'my secret' is too long.", "", None, "input"))
    assert settings.ending.kind is Ending.REFUSED and ending_words(settings.ending) == "not started (settings)"
    assert "secret" not in repr(settings.ending)
    cpu_plan = plan_memory(SELFTEST_SPECS["selftest-t2v"], PlanRequest(64, 64, 9), CPU)
    on_cpu = JobView().apply(PlanReady("j", cpu_plan)).apply(PhaseStarted("j", "transfer"))
    assert on_cpu.ending == JobEnding(Ending.STOPPED, "transfer", device="cpu")
    assert ending_words(on_cpu.ending) == "stopped during Apply the plan (its page was closed or reloaded)"
    assert JobView().ending is None and JobView().withdrawn().ending.kind is Ending.WITHDRAWN


def test_every_ending_has_its_words():
    """The panel's words come from the ending's fields alone (nothing is parsed back from a status)."""
    queue_full = JobView().apply(JobFailed("refused", "The queue is full.", "", None, "queue")).ending
    assert ending_words(queue_full) == "not started: the queue is full"
    model = JobView().apply(JobFailed("refused", "The model cannot be used.", "", None, "model")).ending
    assert ending_words(model) == "not started (model)"
    assert ending_words(JobEnding(Ending.DONE, what="unload")) == "unload done"
    assert ending_words(JobEnding(Ending.STOPPED)) == "stopped"
    assert ending_words(JobEnding(Ending.FAILED)) == "failed"
    assert ending_words(JobEnding(Ending.CANCELLED, "load")) == "cancelled after Load (disk to RAM)"
    assert ending_words(JobEnding(Ending.CANCELLED)) == "cancelled before it started"
    assert ending_words(JobEnding(Ending.WITHDRAWN)) == "taken out of the queue"


def test_with_several_engines_every_gpu_says_what_it_does():
    from dataclasses import replace

    from engine.device.usage import EngineSilent
    from ui.parts.system_panel import engines_markdown

    other = replace(MEMORY, device_name="RTX 3090", model=None)
    text = engines_markdown([MEMORY, other, EngineSilent()], (0, 1, 3), 64 * GIB, 40 * GIB,
                            {0: "Denoising: step 3/30", 3: "Decoding"}, waiting=1)
    system, first, second, third = text.split("  \n")
    assert system == "**System:** RAM 24.0 / 64.0 GB in use · 3 engines, 1 busy · 1 waiting"
    assert first.startswith("**GPU 0** (RTX 3060): running: Denoising: step 3/30 · VRAM 9.1 GB / 12.0 GB")
    assert first.endswith("`Wan-AI/Wan2.1-T2V-1.3B-Diffusers` loaded (text_encoder_offload)")
    assert second.startswith("**GPU 1** (RTX 3090): idle · VRAM") and second.endswith("no model loaded")
    assert third.startswith("**GPU 3**: not answering")
    # A job split across two GPUs is on both; CPU engines are numbered, not called GPUs.
    cpu = replace(MEMORY, backend="cpu", device_name="x86", vram_total_gb=None, vram_engine_gb=None)
    split = engines_markdown([cpu, EngineStarting(5.0)], (0, 1), 64 * GIB, 40 * GIB, {0: "Denoising", 1: "Denoising"},
                             cpu=True)
    assert "2 engines, 2 busy" in split and "**Engine 0**: running: Denoising" in split
    assert "**Engine 1**: starting: loading torch and diffusers (5 s so far) · Denoising" in split
