"""One job's work has a ceiling on a shared server, and a Cancel stops every phase within a frame.

The ceiling: the whole job (its videos, its windows, its steps after the video) is predicted, and a job past the
operator's limit is refused with the numbers before anything loads, by the engine too (the first job on a machine
measured at its start). The cancel: the VAE decode (streamed, whole, or decoding again) stops before its next
latent frame, and the job is said to have stopped in the phase it was in, not "after step 4 of 4"."""
from __future__ import annotations

from dataclasses import replace

import pytest

from engine.events import JobCancelled, JobFailed, JobFinished, PhaseStarted, StepFinished
from engine.planning.job_time import JobCeiling, JobTime
from engine.planning.timing import PhaseTimes
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request
from tests.helpers.machines import slow_calibration
from ui.views.job_view import JobView


def _times(seconds: dict, passes: int = 2) -> PhaseTimes:
    return PhaseTimes(seconds, {}, 1.0, 4, passes, 1560, 36864, round(sum(seconds.values()), 2), prompts=2)


def test_a_job_past_the_ceiling_is_refused_with_its_numbers_and_what_to_change():
    after = {"denoise": 40.0, "vae_decode": 10.0, "export": 1.0, "interpolate": 20.0, "upscale": 15.0}
    job = JobTime(_times({"load": 30.0, "text_encode": 5.0, **after}, 6), _times({"text_encode": 5.0, **after}, 6), 16)
    assert job.total == 121.0 + 15 * 86.0     # the prompt is encoded once for all 16
    assert JobCeiling.minutes(20).refusal(job) == (
        "This job is predicted to take about 24 min: 16 videos of about 2 min each (denoising 40 s in 3 windows, "
        "decoding 10 s, smoother 20 s, larger 15 s). One job may take at most 20 min on this server (its "
        "--max-job-minutes): ask for fewer videos (count), fewer frames, steps or pixels, or leave out the smoother "
        "and the larger.")
    one = JobTime(_times({"load": 30.0, "denoise": 400.0}), _times({"denoise": 400.0}))
    assert JobCeiling.minutes(5).refusal(one) == (
        "This job is predicted to take about 7 min: one video (loading 30 s, denoising 7 min). One job may take at "
        "most 5 min on this server (its --max-job-minutes): ask for fewer frames, steps or pixels.")
    assert JobCeiling.minutes(30).refusal(job) is None     # under it
    assert JobCeiling().refusal(job) is None and JobCeiling.minutes(0).refusal(job) is None   # no ceiling
    assert JobCeiling.minutes(1).refusal(None) is None      # a machine not measured yet: the engine checks it


def test_the_engine_holds_a_job_to_the_server_s_ceiling_before_anything_loads(tmp_path, presets, outputs):
    slow_calibration(outputs)
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1, calibrate=True)
    request = replace(tiny_request(presets, "selftest-t2v", outputs, steps=2, count=3), max_seconds=2.0)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert result.message.startswith("This job is predicted to take about ") and "3 videos of about" in result.message
    assert "at most 2 s on this server" in result.message
    assert not [e for e in events if isinstance(e, PhaseStarted) and e.phase in ("load", "denoise")]
    assert not list(outputs.rglob("*.mp4"))
    # The ceiling is the server's: it is never recorded, and a job under it runs.
    under, _ = run_engine(engine, replace(tiny_request(presets, "selftest-t2v", outputs, steps=2), max_seconds=1e12))
    assert isinstance(under, JobFinished), under
    assert "max_seconds" not in tiny_request(presets, "selftest-t2v", outputs).to_dict()


@pytest.fixture
def decoder_calls():
    """Counts the calls of a loaded model's VAE decoder from the moment ``watch(engine)`` is called."""
    calls, handles = [], []

    def watch(engine):
        handles.append(engine.loaded.pipe.vae.decoder.register_forward_hook(lambda *args: calls.append(1)))
    yield calls, watch
    for handle in handles:
        handle.remove()


def test_a_cancel_in_the_decode_stops_it_before_its_next_frame_and_says_so(tmp_path, presets, outputs, decoder_calls):
    calls, watch = decoder_calls
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    events: list = []

    def emit(event):
        events.append(event)
        if isinstance(event, PhaseStarted) and event.phase == "vae_decode":
            watch(engine)

    def decoding() -> bool:
        return any(isinstance(e, PhaseStarted) and e.phase == "vae_decode" for e in events)

    request = tiny_request(presets, "selftest-t2v", outputs, frames=33, steps=2, keep_latents=True)
    result = engine.run(request, "job", emit, decoding)
    assert isinstance(result, JobCancelled) and result.phase == "vae_decode", result
    assert calls == []            # not one of its 9 latent frames decoded after the cancel
    assert not list(outputs.rglob("*.mp4")) and len(list(outputs.rglob("*.latents.*"))) == 1
    view = JobView()
    for event in events:
        view.apply(event)
    assert view.status.startswith("Cancelled during VAE decode, after all 2 denoising steps: nothing new was saved")
    # Decoding the kept latents again (the whole clip at once, on the CPU) stops the same way.
    latents = next(outputs.rglob("*.latents.*"))
    again = engine.decode_saved(str(latents), "again", lambda e: None, on_cpu=True, should_cancel=lambda: True)
    assert isinstance(again, JobCancelled) and again.phase == "vae_decode" and calls == [], again
    assert not list(outputs.rglob("*.mp4"))


def test_a_cancel_in_a_step_after_the_video_names_that_step():
    for phase, said in (("interpolate", "Smoother (frames between)"), ("upscale", "Larger (upscale)"),
                        ("join", "Join (the new part after the video)")):
        view = JobView().apply(PhaseStarted("j", "denoise"))
        for step in range(1, 5):
            view.apply(StepFinished("j", step, 4, 0.1, 0.0))
        view.apply(PhaseStarted("j", phase)).apply(JobCancelled("j", 4, 4, phase, True))
        assert view.status.startswith(f"Cancelled during {said}, after all 4 denoising steps:"), view.status
