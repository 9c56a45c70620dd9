"""The time plan of every way of making a video that the self-test models run here, the very first run on a fresh
machine included, in what does not depend on this machine's pace: every phase that runs is predicted and nothing
else is, a way's first run predicts each phase at more than nothing, the page's chart says the sum of the engine's
plans of the job's videos, and a run of the same work as the one before it is predicted at what that one took, phase
by phase (the prediction learned from the run kept beside the outputs).

How near the predictions come to the seconds taken on this machine is measured by bench/time_plan_ways.py (the same
ways, the same runs) and kept in docs/speed.md: a ratio of wall-clock seconds is a measurement, not a test.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.time_plan_ways import WAYS, run_way
from engine.events import PlanReady
from engine.planning.learning import MeasuredRun
from engine.run.engine import Engine
from engine.run.time_plan import RUNS_FILE
from tests.conftest import CPU

pytestmark = pytest.mark.slow   # eight ways, three runs each, in process: about half a minute

ROUNDED = 1.5e-3   # the plan's seconds are kept to the millisecond


def _kept(outputs: Path) -> list[MeasuredRun]:
    """The runs the engine kept beside the outputs, of the way's own model and plan, oldest first."""
    families = json.loads((outputs / RUNS_FILE).read_text(encoding="utf-8"))["runs"]
    return [MeasuredRun.from_dict(run) for run in max(families.values(), key=len)]


def _learned(before: MeasuredRun, phase: str) -> float:
    """What a run of the same work as ``before`` is predicted at for ``phase``: what ``before`` took; a denoise at
    its steady steps at least (the first step of a run can be the quickest)."""
    seconds = before.seconds[phase]
    return max(seconds, before.step * before.steps) if phase == "denoise" else seconds


@pytest.mark.parametrize("way", list(WAYS))
def test_every_phase_of_each_way_is_predicted_and_a_repeated_run_from_the_run_before_it(way, selftest_models_dir,
                                                                                     presets, tmp_path, image_file,
                                                                                     monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")        # the smoother's file is not fetched: its fallback runs
    outputs = tmp_path / "outputs"
    engine = Engine(selftest_models_dir, hardware=CPU, preview_seconds=-1, calibrate=True)
    runs = run_way(way, engine, outputs, str(image_file), presets, runs=3, with_events=True)

    for number, run in enumerate(runs):
        assert set(run["predicted"]) == set(run["took"]), (number, run)
        plans = [event.predicted_seconds for event in run["events"] if isinstance(event, PlanReady)]
        summed = {phase: sum(plan.get(phase, 0.0) for plan in plans) for phase in run["predicted"]}
        assert run["predicted"] == pytest.approx(summed, abs=ROUNDED), (number, run["predicted"], plans)
    # The way's first run predicts each phase at more than nothing; but a prompt that the run before it encoded is
    # kept (engine/run/prompt_cache.py): its encode is nothing.
    first = {phase: seconds for phase, seconds in runs[0]["predicted"].items()
             if not (phase == "text_encode" and WAYS[way][0])}
    assert all(seconds > 0 for seconds in first.values()), first

    last_plans = [event.predicted_seconds for event in runs[-1]["events"] if isinstance(event, PlanReady)]
    kept = _kept(outputs)
    for plan, before in zip(last_plans, kept[-len(last_plans) - 1:-1]):
        assert plan == pytest.approx({phase: _learned(before, phase) for phase in plan}, abs=ROUNDED), \
            (plan, before.seconds)


def test_the_bench_says_how_far_off_each_phase_and_run_is_and_leaves_out_a_cache_hit():
    from bench.time_plan_ways import summary, within

    measured = {"ways": {"a": [dict(predicted={"denoise": 3.0, "export": 1.0, "text_encode": 0.0},
                                    took={"denoise": 1.0, "export": 1.0, "text_encode": 0.0001})]}}
    ratios = summary(measured)
    assert ratios == {"a": [{"denoise": 3.0, "export": 1.0, "total": 2.0}]}
    assert within(ratios) == {"phases_within": 1, "phases": 2, "totals_within": 1, "totals": 1, "farthest": 3.0}
