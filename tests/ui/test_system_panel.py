"""The system panel's text: what it says while idle, while running, and of the last job."""
from __future__ import annotations

from engine.sysinfo import GIB, EngineMemory
from ui.context import RunningJob
from ui.system_panel import system_markdown

MEMORY = EngineMemory(backend="cuda", device_name="RTX 3060", vram_total_gb=12.0, vram_used_gb=9.1,
                      vram_engine_gb=8.6, vram_cached_gb=9.0, engine_ram_gb=13.2,
                      model="Wan-AI/Wan2.1-T2V-1.3B-Diffusers", strategy="text_encoder_offload")


def test_idle_it_tells_how_the_last_job_ended_and_running_it_tells_what_runs():
    idle = system_markdown(MEMORY, 32 * GIB, 20 * GIB, None, ("Done in 3.2 s", 4.2))
    assert "VRAM 9.1 GB / 12.0 GB in use (engine 8.6 GB, cached 9.0 GB)" in idle
    assert "RAM 12.0 / 32.0 GB in use, engine process 13.2 GB" in idle
    assert idle.endswith("**Engine:** idle · last job: Done in 3.2 s (ended 4 s ago) · "
                         "`Wan-AI/Wan2.1-T2V-1.3B-Diffusers` loaded (text_encoder_offload)")
    running = system_markdown(MEMORY, 32 * GIB, 20 * GIB, "Denoising: step 3/30", ("Done in 3.2 s", 4.2))
    assert "**Engine:** running: Denoising: step 3/30 · " in running and "last job" not in running
    assert "last job" not in system_markdown(MEMORY, 32 * GIB, 20 * GIB, None, None)
    later = system_markdown(MEMORY, 32 * GIB, 20 * GIB, None, ("Cancelled after step 4 of 30", 600))
    assert "last job: Cancelled after step 4 of 30 (ended 10 min ago)" in later


def test_the_last_job_is_its_final_word_once_it_has_ended():
    running = RunningJob()
    assert running.last_ended() is None
    running.start("alice")
    running.update("Denoising: step 2/4")
    assert running.last_ended() is None
    running.update("Done in 1.1 s. Seed used: 3. Noise from a self-test model.\nSaved to outputs/x.mp4")
    running.finish()
    said, seconds = running.last_ended()
    assert said == "Done in 1.1 s" and 0 <= seconds < 5       # its first sentence

    running.start("bob")
    running.update("Denoising: step 57/200, 0.04 s/step (23.1 steps/s), about 6 s left")
    running.finish()          # its stream was closed before the job could say how it ended
    assert running.last_ended()[0] == "stopped during Denoising: step 57/200"
