"""The page's view of a job, folded from events."""
from __future__ import annotations

from engine.events import JobFailed, JobFinished, JobStarted, PhaseFinished, PhaseStarted, StepFinished
from ui.job_view import JobView


def test_view_tracks_phases_steps_and_result():
    view = JobView()
    for event in (JobStarted("j", "t2v"), PhaseStarted("j", "load"), PhaseFinished("j", "load", 2.0),
                  PhaseStarted("j", "denoise"), StepFinished("j", 1, 4, 0.5, 1.5)):
        view.apply(event)
    assert view.progress == 0.9 * 1 / 4
    assert view.timing_rows() == [["Load (disk to RAM)", 2.0, ""], ["Denoise", None, "step 1/4, ETA 2 s"]]
    assert "step 1/4" in view.status and "about 2 s left" in view.status
    view.apply(PhaseFinished("j", "denoise", 2.0))
    view.apply(JobFinished("j", ("a.mp4",), "a.json", 5, {"load": 2.0, "denoise": 2.0}, None, 1.5))
    assert view.progress == 1.0 and "Seed used: 5" in view.status
    assert view.timing_rows()[-1] == ["Total", 4.0, "peak RAM 1.50 GB"]


def test_failure_is_shown_with_what_to_do():
    view = JobView().apply(JobFailed("j", "Out of device memory.", "Lower the size.", "denoise"))
    assert view.status == "Failed: Out of device memory. Lower the size."
