"""The time plan in a run: the machine measured once (kept beside the outputs), each run's phases predicted
before it starts, the prediction kept in the sidecar beside what it took, and corrected by the runs seen."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.device.calibrate import CALIBRATION_FILE
from engine.events import JobFinished, PhaseStarted, PlanReady
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request
from ui.views.job_view import JobView


def _predicted(events) -> PlanReady:
    return [e for e in events if isinstance(e, PlanReady)][-1]


def test_the_machine_is_measured_once_and_every_run_is_predicted(model_dirs, presets, tmp_path):
    outputs = tmp_path / "out"
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1, calibrate=True)
    first, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs))
    assert isinstance(first, JobFinished), first
    assert [e.phase for e in events if isinstance(e, PhaseStarted)][0] == "calibrate"
    assert "calibrate" in first.timings and (outputs / CALIBRATION_FILE).is_file()
    plan = _predicted(events)
    assert plan.predicted_total > 0 and {"load", "denoise", "vae_decode", "export"} <= set(plan.predicted_seconds)
    sidecar = json.loads(Path(first.sidecar).read_text())
    assert sidecar["speed"]["predicted_seconds"] == plan.predicted_seconds

    second, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, seed=7))
    assert "calibrate" not in second.timings and "load" not in _predicted(events).predicted_seconds

    again = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1, calibrate=True)   # a new process
    third, _ = run_engine(again, tiny_request(presets, model_dirs["tiny-t2v"], outputs, seed=8))
    assert "calibrate" not in third.timings   # read back from beside the outputs


def test_a_prediction_learns_from_the_runs_of_the_same_model_and_plan(model_dirs, presets, tmp_path):
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1, calibrate=True)
    first, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", steps=4))
    measured, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", steps=4,
                                                       seed=5))
    learned, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", steps=8,
                                                      seed=6))
    predicted = _predicted(events).predicted_seconds
    # The decode and the export of the same size are predicted from a measured run's own figures.
    for phase in ("vae_decode", "export"):
        assert any(abs(predicted[phase] - run.timings[phase]) < 1e-3 for run in (first, measured)), phase


def test_turned_off_nothing_is_measured_or_predicted(model_dirs, presets, tmp_path):
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1, calibrate=False)
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out"))
    assert "calibrate" not in result.timings and _predicted(events).predicted_seconds is None
    assert json.loads(Path(result.sidecar).read_text())["speed"]["predicted_seconds"] is None


def test_the_fastest_attention_measured_here_is_the_one_the_plan_picks(model_dirs, presets, tmp_path):
    from dataclasses import replace

    from engine.device.calibrate import calibrate
    from engine.outputs.export_rates import export_rates

    outputs = tmp_path / "out"
    measured = replace(calibrate("cpu", "float32", quick=True, export_rates=export_rates),
                       device_name=CPU.device_name, backend="cpu",
                       torch_version=CPU.torch_version, attention_seconds={"native": 0.02, "_native_math": 0.01})
    measured.save(outputs)
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1, calibrate=True)
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs))
    assert isinstance(result, JobFinished), result
    assert _predicted(events).plan.attention_backend == "_native_math" and engine.hardware.attention == "_native_math"
    assert json.loads(Path(result.sidecar).read_text())["speed"]["attention"] == "_native_math"


def test_the_page_s_plan_the_status_and_the_chart_predict_the_same(model_dirs, presets, tmp_path):
    """One prediction everywhere: the engine's (its PlanReady, which the status and the chart show) and the plan
    panel's (from the runs the engine kept beside the outputs) agree, phase by phase, and the chart says it. (How
    near it comes to what the job takes on this machine: bench/time_plan_ways.py, docs/speed.md.)"""
    from engine.device.calibrate import Calibration
    from engine.models.catalog import ModelCatalog
    from engine.run.time_plan import RUNS_FILE, kept_runs, predict_job
    from engine.service.ahead import plan_settings

    outputs = tmp_path / "out"
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1, calibrate=True)
    first, _ = run_engine(engine, tiny_request(presets, "selftest-t2v", outputs))
    assert isinstance(first, JobFinished) and (outputs / RUNS_FILE).is_file()
    request = tiny_request(presets, "selftest-t2v", outputs, seed=7)
    calibration = Calibration.load(outputs, CPU)
    catalog = ModelCatalog()
    page = predict_job(catalog.spec("selftest-t2v"), "selftest-t2v", request.settings,
                       plan_settings(request.settings, CPU, catalog), calibration, kept_runs(outputs, calibration),
                       loaded=True)
    second, events = run_engine(engine, request)
    said = _predicted(events)
    assert said.predicted_total == page.total and said.predicted_seconds == page.seconds
    view = JobView()
    for event in events:
        view.apply(event)
    assert view.predicted_so_far() == pytest.approx(said.predicted_seconds, abs=1e-3)
    assert set(said.predicted_seconds) == set(second.timings) - {"calibrate", "build_model"}


def test_the_steps_after_the_video_are_predicted_by_the_files_found_and_learned_from_the_runs(
        model_dirs, presets, tmp_path, monkeypatch):
    """Smoother and larger are predicted phases of the run: by their fallbacks with the folders empty, from the last
    run of the same method once one ran, and by the upscaler file once one is dropped in."""
    from dataclasses import replace

    import pytest

    from engine.device.calibrate import Calibration
    from engine.models.catalog import ModelCatalog
    from engine.planning.post_time import PostFiles
    from engine.post.upscale import write_random_esrgan
    from engine.run.time_plan import kept_runs, post_files, predict_job
    from engine.service.ahead import plan_settings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")        # no RIFE file fetched: the smoother's fallback runs
    models, outputs = tmp_path / "models", tmp_path / "out"
    engine = Engine(models, hardware=CPU, preview_seconds=-1, calibrate=True)
    request = tiny_request(presets, "selftest-t2v", outputs, interpolate=2, upscale=2)
    first, events = run_engine(engine, request)
    assert isinstance(first, JobFinished), first
    assert {"interpolate", "upscale"} <= set(_predicted(events).predicted_seconds) & set(first.timings)
    calibration = Calibration.load(outputs, CPU)
    kept = [run for runs in kept_runs(outputs, calibration).values() for run in runs]
    assert [run.post["interpolate"]["method"] for run in kept] == ["minterpolate"]
    assert kept[0].post["upscale"]["method"] == "lanczos"

    second, events = run_engine(engine, replace(request, seed=7))
    said = _predicted(events).predicted_seconds
    for phase in ("interpolate", "upscale"):   # the same work as the first run's: what that one took
        assert said[phase] == pytest.approx(first.timings[phase], abs=2e-3), phase

    (models / "upscalers").mkdir(parents=True, exist_ok=True)
    upscaler = write_random_esrgan(models / "upscalers" / "small.pth", scale=2)
    assert post_files(models) == PostFiles(False, upscaler.stat().st_size)
    catalog = ModelCatalog()
    page = predict_job(catalog.spec("selftest-t2v"), "selftest-t2v", request.settings,
                       plan_settings(request.settings, CPU, catalog), calibration, kept_runs(outputs, calibration),
                       loaded=True, files=post_files(models))
    assert page.post["upscale"]["method"] == f"upscaler/cpu/{upscaler.stat().st_size}"
    assert "upscaler file" in page.how["upscale"] and "learned" in page.how["interpolate"]


def test_a_long_video_s_decode_is_not_its_short_run_s_fixed_costs_scaled_up_as_work(selftest_models_dir, presets,
                                                                                    tmp_path):
    """After one short run (its decode paying the first decode's one-off costs and the encoder's start), a 1025-frame
    video is predicted by the time model's shape of the work, k x the model's figure + the rest: not the short run's
    seconds times the pixels (a 9-frame run's 0.12 s became 186 s of decoding for 1025 frames, which take about 6)."""
    from engine.device.calibrate import Calibration
    from engine.models.catalog import ModelCatalog
    from engine.run.time_plan import kept_runs, predict_job
    from engine.service.ahead import plan_settings

    outputs = tmp_path / "out"
    engine = Engine(selftest_models_dir, hardware=CPU, preview_seconds=-1, calibrate=True)
    short, _ = run_engine(engine, tiny_request(presets, "selftest-t2v", outputs))
    assert isinstance(short, JobFinished), short
    calibration, catalog = Calibration.load(outputs, CPU), ModelCatalog()
    long = tiny_request(presets, "selftest-t2v", outputs, frames=1025).settings
    plan = plan_settings(long, CPU, catalog)
    predict = lambda runs: predict_job(catalog.spec("selftest-t2v"), "selftest-t2v", long, plan, calibration, runs,  # noqa: E731
                                       loaded=False)
    model, learned = predict({}), predict(kept_runs(outputs, calibration))
    by_pixels = short.timings["vae_decode"] * 1025 / 9
    assert "learned" in learned.how["vae_decode"] and "model's" in learned.how["vae_decode"]
    # k at most 3 (a loaded machine may have slowed the short run), the rest the short run's own seconds at most
    assert model.seconds["vae_decode"] / 3 <= learned.seconds["vae_decode"] <= \
        3 * model.seconds["vae_decode"] + short.timings["vae_decode"]
    assert learned.seconds["vae_decode"] < by_pixels / 1.5, (learned.how["vae_decode"], by_pixels)
