"""The page's view of a job, folded from events."""
from __future__ import annotations

import base64
import io
import re

import pytest
from PIL import Image

from engine.events import (PHASES, JobCancelled, JobFailed, JobFinished, JobStarted, PhaseFinished, PhaseStarted,
    PreviewReady, StepFinished)
from tests.conftest import shown
from ui.views.job_view import PHASE_LABELS, JobView
from ui.views.timing_chart import PHASE_COLOURS


def test_view_tracks_phases_steps_and_result():
    view = JobView()
    for event in (JobStarted("j", "t2v"), PhaseStarted("j", "load"), PhaseFinished("j", "load", 2.0),
                  PhaseStarted("j", "denoise"), StepFinished("j", 1, 4, 0.5, 1.5)):
        view.apply(event)
    assert view.progress == 0.9 * 1 / 4
    assert view.timing_rows() == [["Load (disk to RAM)", 2.0, ""], ["Denoise", None, "step 1/4, 0.50 s/step (2.00 steps/s), ETA 2 s"]]
    assert "step 1/4" in view.status and "about 2 s left" in view.status
    view.apply(PhaseFinished("j", "denoise", 2.0))
    view.apply(JobFinished("j", ("a.mp4",), "a.json", 5, {"load": 2.0, "denoise": 2.0}, None, 1.5))
    assert view.progress == 1.0 and "Seed used: 5" in view.status
    assert view.timing_rows()[-1] == ["Total", 4.0, "peak RAM 1.50 GB"]


def test_failure_is_shown_once_with_what_to_do():
    view = JobView().apply(PhaseStarted("j", "denoise"))
    view.apply(StepFinished("j", 3, 10, 0.5, 3.5))
    view.apply(JobFailed("j", "Out of device memory during denoise.", "Lower the size.", "denoise"))
    assert view.status == "Failed during Denoise."
    assert shown(view.markdown()) == "**Failed during Denoise.**\n\nOut of device memory during denoise. Lower the size."
    # The phase table says where it failed, not that it still runs.
    assert view.timing_rows() == [["Denoise", None, "failed at step 3/10"]]


def test_settings_mistakes_are_a_list_of_sentences_under_one_headline():
    problems = ("The prompt is empty: describe what the video should show.", "Width 70 is not a multiple of 16: "
                "try 64 or 80.")
    view = JobView().apply(JobFailed("j", " ".join(problems), "", None, "input", problems=problems))
    assert view.status == "Not started: the settings need a change."
    assert shown(view.markdown()).splitlines() == ["**Not started: the settings need a change.**", "",
                                            f"- {problems[0]}", f"- {problems[1]}"]
    one = JobView().apply(JobFailed("j", problems[0], "", None, "input", problems=problems[:1]))
    assert shown(one.markdown()) == f"**Not started: the settings need a change.**\n\n{problems[0]}"
    assert "Failed" not in one.markdown() and "Change the settings named above" not in one.markdown()


def test_a_cancel_says_where_it_stopped_and_only_then_that_the_model_stays_loaded():
    view = JobView().apply(PhaseStarted("j", "denoise")).apply(StepFinished("j", 22, 60, 0.5, 19.0))
    view.apply(JobCancelled("j", 22, 60, "denoise", True))
    assert view.status == ("Cancelled during the denoising, after step 22 of 60: nothing new was saved, and the "
                           "earlier result is kept. The model stays loaded, so the next run starts without loading it.")
    assert view.timing_rows() == [["Denoise", None, "cancelled at step 22/60"]]   # no ETA any more
    view.apply(PhaseFinished("j", "denoise", 11.0))    # the engine ends the phase, then says it was cancelled
    assert view.timing_rows() == [["Denoise", 11.0, "cancelled after step 22/60, 0.50 s/step (2.00 steps/s)"]]
    during_load = JobView().apply(PhaseStarted("j", "load")).apply(JobCancelled("j", 0, 60, "load", False))
    assert during_load.status == ("Cancelled after Load (disk to RAM): nothing new was saved, and the earlier "
                                  "result is kept.")
    assert during_load.timing_rows() == [["Load (disk to RAM)", None, "cancelled"]]


def _steps(view, seconds):
    for i, s in enumerate(seconds, start=1):
        view.apply(StepFinished("j", i, 10, s, 1.0))


def test_chart_has_a_bar_per_phase_scaled_to_the_longest_and_a_bar_per_step():
    view = JobView()
    for event in (PhaseStarted("j", "load"), PhaseFinished("j", "load", 4.0), PhaseStarted("j", "text_encode"),
                  PhaseFinished("j", "text_encode", 1.0), PhaseStarted("j", "denoise")):
        view.apply(event)
    _steps(view, [0.5, 1.0, 0.5])
    chart = view.chart_html()
    widths = [float(w) for w in re.findall(r"width:([0-9.]+)%", chart)]
    assert widths == [100.0, 25.0, 50.0]        # load 4 s, text encode 1 s, denoise 2 s so far
    assert "Denoise" in chart and "Seconds per denoising step (3 of 10)" in chart
    steps = re.findall(r'title="step (\d+): ([0-9.]+) s" style="[^"]*height:([0-9.]+)px', chart)
    assert [(int(n), float(h)) for n, _, h in steps] == [(1, 20.0), (2, 40.0), (3, 20.0)]
    assert view.rate_text() == "0.67 s/step (1.50 steps/s)"
    assert JobView().chart_html() == ""


def _webp(frames: int) -> bytes:
    images = [Image.new("RGB", (8, 8), (i * 40, 0, 0)) for i in range(frames)]
    out = io.BytesIO()
    images[0].save(out, "WEBP", save_all=True, append_images=images[1:], duration=100, loop=0)
    return out.getvalue()


def test_preview_is_an_inline_animation_until_the_result_replaces_it():
    view = JobView()
    data = _webp(3)
    view.apply(PreviewReady("j", 4, 10, data, "image/webp", 8, 8, 3, "derived"))
    html = view.preview_html()
    src = re.search(r'src="data:image/webp;base64,([^"]+)"', html).group(1)
    assert base64.b64decode(src) == data
    assert "after step 4 of 10" in html and "3 latent frames" in html and "derived" in html
    view.apply(JobFinished("j", ("a.mp4",), "a.json", 5, {}))
    assert view.preview_html() == "" and view.previews == 1


def test_peaks_so_far_are_shown_while_it_runs_and_the_final_ones_at_the_end():
    view = JobView().apply(StepFinished("j", 1, 4, 0.5, 1.5, 3.25, 1.5))
    assert "Peak so far: VRAM 3.25 GB, RAM 1.50 GB" in view.markdown()
    assert "Peak so far: RAM 2.00 GB" in JobView().apply(StepFinished("j", 1, 4, 0.5, 1.5, None, 2.0)).markdown()
    view.apply(JobFinished("j", ("a.mp4",), "a.json", 5, {"denoise": 2.0}, 3.5, 1.75))
    assert "Peak so far" not in view.markdown()
    assert view.timing_rows()[-1][2] == "peak VRAM 3.50 GB, peak RAM 1.75 GB"


def test_every_phase_has_a_label_and_runs_in_the_engine_s_order():
    """The phases and their order come from engine.events.PHASES alone; the page only names and colours them."""
    assert set(PHASE_LABELS) == set(PHASES) and set(PHASE_COLOURS) <= set(PHASES)
    view = JobView()
    for phase in reversed(PHASES):   # whatever order the events came in, rows and bars follow the run's
        view.apply(PhaseFinished("j", phase, 1.0))
    assert [row[0] for row in view.timing_rows()] == [PHASE_LABELS[p] for p in PHASES]
    assert [phase for phase, _, _ in view.chart_phases()] == list(PHASES)


def test_the_chart_draws_the_predicted_time_beside_each_phase_and_ahead_of_those_to_come():
    from engine.events import PlanReady
    from engine.models.spec import KNOWN_MODELS
    from engine.planning.planner import PlanRequest, plan_memory
    from tests.helpers.machines import RTX_3060

    view = JobView()
    plan = plan_memory(KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"], PlanRequest(832, 480, 81), RTX_3060)
    planned = PlanReady("j", plan, {"load": 3.0, "denoise": 12.0, "vae_decode": 2.0, "export": 0.3}, 17.3)
    for event in (JobStarted("j", "t2v"), planned, PhaseStarted("j", "load"),
                  PhaseFinished("j", "load", 2.5, "14.0 GB read at 5.6 GB/s")):
        view.apply(event)
    chart = view.chart_html()
    assert "2.50 s · predicted 3.0" in chart and "about 12.0 s" in chart and "about 0.30 s" in chart
    assert chart.count("wan-predicted") == 4
    assert "about 17 s in all" in view.markdown()
    assert view.timing_rows()[0] == ["Load (disk to RAM)", 2.5, "14.0 GB read at 5.6 GB/s"]
    view.apply(JobFinished("j", ("v.mp4",), "v.json", 1, {"load": 2.5}))
    assert "about 12.0 s" not in view.chart_html()    # nothing is to come once the job has ended


def test_the_denoise_goes_on_after_the_expert_swap_inside_it():
    view = JobView()
    for event in (PhaseStarted("j", "denoise"), StepFinished("j", 1, 4, 0.5, 1.5), PhaseStarted("j", "expert_swap")):
        view.apply(event)
    assert view.status == "Expert swap (high to low noise)..."
    view.apply(PhaseFinished("j", "expert_swap", 1.25, "the low-noise expert on the device"))
    assert view.running_phase == "denoise"
    rows = view.timing_rows()
    assert ["Expert swap (high to low noise)", 1.25, "the low-noise expert on the device"] in rows
    assert rows[0][0] == "Denoise" and rows[0][1] is None   # still running, listed before the swap


def test_every_phase_has_its_words_and_a_name_that_is_no_phase_is_refused_by_the_job(tmp_path):
    from engine.events import PHASES, Phase
    from engine.run.job import Job
    from ui.views.job_view import PHASE_LABELS

    assert set(PHASE_LABELS) == set(PHASES) and Phase.DENOISE == "denoise" and f"{Phase.DENOISE}" == "denoise"
    job = Job("j", lambda event: None)
    with pytest.raises(ValueError, match="saving latents"):
        with job.in_phase("saving latents", timed=False):
            pass


def test_a_phase_the_job_failed_in_reads_failed_in_the_chart_as_in_the_table():
    from engine.events import JobFailed, PhaseStarted

    view = JobView()
    for event in (PhaseStarted("j", "download"),
                  JobFailed("j", "x is not downloaded and the Hub cannot be reached.", "", "download", "model")):
        view.apply(event)
    assert view.timing_rows()[0] == ["Download", None, "failed"]
    assert ">failed<" in view.chart_html() and ">running<" not in view.chart_html()


def test_the_status_says_plan_once_with_its_reasons_under_it(presets):
    from engine.events import Info, PlanReady
    from engine.models.catalog import ModelCatalog
    from engine.service.ahead import plan_settings
    from tests.conftest import CPU

    plan = plan_settings(presets["selftest-t2v"].settings, CPU, ModelCatalog())
    view = JobView()
    for event in (JobStarted("j", "t2v"), PlanReady("j", plan, None, None),
                  Info("j", "Plan: No GPU found: everything runs on the CPU."), Info("j", "Cleaned the prompt.")):
        view.apply(event)
    text = view.markdown()
    assert text.count("Plan:") == 1 and "- No GPU found: everything runs on the CPU." in text, text
    assert text.index("Plan:") < text.index("No GPU found") < text.index("Cleaned the prompt"), text


def _planned(seconds: dict):
    from engine.events import PlanReady
    from engine.models.spec import KNOWN_MODELS
    from engine.planning.planner import PlanRequest, plan_memory
    from tests.helpers.machines import RTX_3060

    plan = plan_memory(KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"], PlanRequest(832, 480, 81), RTX_3060)
    return PlanReady("j", plan, seconds, sum(seconds.values()))


def test_the_time_left_of_a_job_of_several_videos_counts_the_ones_still_to_come():
    """What the queue is told (ui/generate.py): the video under way, then each other one without the load and the
    prompt's encoding, as planned until one has finished, then as the last one took."""
    from engine.events import VideoStarted

    view = JobView(videos=3)
    assert view.seconds_left() is None                           # nothing says yet
    first = {"load": 5.0, "text_encode": 1.0, "denoise": 10.0, "vae_decode": 2.0, "export": 0.5, "interpolate": 3.0}
    for event in (JobStarted("j", "t2v"), _planned(first), PhaseStarted("j", "load"), PhaseFinished("j", "load", 4.0),
                  PhaseStarted("j", "text_encode"), PhaseFinished("j", "text_encode", 1.0),
                  PhaseStarted("j", "denoise"), StepFinished("j", 1, 4, 2.0, 6.0)):
        view.apply(event)
    each = 10.0 + 2.0 + 0.5 + 3.0
    assert view.seconds_left() == pytest.approx(6.0 + 2.0 + 0.5 + 3.0 + 2 * each)
    for event in (PhaseFinished("j", "denoise", 8.0), PhaseStarted("j", "vae_decode"),
                  PhaseFinished("j", "vae_decode", 3.0), PhaseStarted("j", "export"), PhaseFinished("j", "export", 1.0), PhaseStarted("j", "interpolate"),
                  PhaseFinished("j", "interpolate", 4.0), VideoStarted("j", 2, 3)):
        view.apply(event)
    took = 8.0 + 3.0 + 1.0 + 4.0                                 # the first video, less its load and encoding
    loaded = {"text_encode": 0.1, "denoise": 10.0, "vae_decode": 2.0, "export": 0.5, "interpolate": 3.0}
    view.apply(_planned(loaded))
    assert view.seconds_left() == pytest.approx(10.0 + 2.0 + 0.5 + 3.0 + took)   # the prompt's kept: no encoding
    view.apply(PhaseStarted("j", "denoise"))
    view.apply(StepFinished("j", 3, 4, 2.0, 2.0))
    assert view.seconds_left() == pytest.approx(2.0 + 2.0 + 0.5 + 3.0 + took)
    assert view.status.startswith("Video 2 of 3")
    view.apply(JobFinished("j", ("a.mp4", "b.mp4", "c.mp4"), "c.json", 3, {"denoise": 24.0}))
    assert view.seconds_left() == 0.0


def test_a_single_video_s_time_left_is_its_steps_then_the_phases_still_to_come():
    view = JobView()
    for event in (_planned({"denoise": 10.0, "vae_decode": 2.0, "export": 0.5, "upscale": 30.0}),
                  PhaseStarted("j", "denoise"), StepFinished("j", 1, 4, 2.0, 6.0)):
        view.apply(event)
    assert view.seconds_left() == pytest.approx(6.0 + 2.0 + 0.5 + 30.0)   # the upscale counted, not the eta alone
    unplanned = JobView().apply(PhaseStarted("j", "denoise")).apply(StepFinished("j", 1, 4, 2.0, 6.0))
    assert unplanned.seconds_left() == 6.0                                # no prediction: the steps' own pace


def test_a_job_of_several_videos_is_charted_against_the_sum_of_their_plans():
    """The chart's bars are the job's seconds, summed over its videos: what each bar is set against is the sum of
    each video's plan, not the last one's (a 2-video job read as 2x slower than predicted)."""
    from types import SimpleNamespace

    from engine.events import PlanReady, VideoStarted

    plan = SimpleNamespace(device="cpu", predicted_peak_ram_gb=1.0, predicted_peak_vram_gb=0.0, fits=True,
                           strategy="cpu")
    view = JobView()
    events = [JobStarted("j", "t2v"), PlanReady("j", plan, {"load": 1.0, "denoise": 2.0, "vae_decode": 0.5}, 3.5),
              PhaseFinished("j", "load", 1.1), PhaseFinished("j", "denoise", 2.1), PhaseFinished("j", "vae_decode", 0.4),
              VideoStarted("j", 2, 2), PlanReady("j", plan, {"denoise": 1.8, "vae_decode": 0.5}, 2.3),
              PhaseFinished("j", "denoise", 1.9), PhaseFinished("j", "vae_decode", 0.6)]
    for event in events:
        view.apply(event)
    assert view.predicted_so_far() == {"load": 1.0, "denoise": 3.8, "vae_decode": 1.0}
    assert view.phase_seconds["denoise"] == pytest.approx(4.0)
    assert "4.00 s · predicted 3.8" in view.chart_html() and "1.00 s · predicted 1.0" in view.chart_html()


def test_a_phase_predicted_at_less_than_a_millisecond_does_not_read_as_zero():
    from ui.views.timing_chart import timing_chart_html

    chart = timing_chart_html([("text_encode", "Text encode", 0.0001)], [], 0, {"text_encode": 0.0002})
    assert "predicted &lt;0.001" in chart and "0.000" not in chart
