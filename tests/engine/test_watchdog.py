"""When an engine that stopped answering is declared hung: silence, and a phase that goes on too long."""
from __future__ import annotations

from dataclasses import replace

from engine.events import JobCancelled, PhaseStarted, PlanReady, StepFinished
from engine.models.spec import SELFTEST_SPECS
from engine.planning.plan import PhasePlan
from engine.planning.planner import PlanRequest, plan_memory
from tests.conftest import CPU
from engine.service.watchdog import (
    CANCEL_SILENCE_S,
    QUIET_BEFORE_ASKING_S,
    SILENCE_LIMIT_S,
    STEP_FACTOR,
    STEP_FLOOR_S,
    Watchdog,
)


def test_an_engine_that_answers_nothing_is_hung_after_the_silence_limit():
    watch = Watchdog(0.0)
    watch.saw(PhaseStarted("j", "denoise"), 1.0)
    assert not watch.should_ask(1.0 + QUIET_BEFORE_ASKING_S - 0.1) and watch.should_ask(1.0 + QUIET_BEFORE_ASKING_S)
    watch.answered(False, 4.0)
    assert watch.hung(4.0 + SILENCE_LIMIT_S - 0.5) is None
    assert watch.hung(4.0 + SILENCE_LIMIT_S) == f"it answered nothing for {SILENCE_LIMIT_S:.0f} s"
    # One answer, or one event, and the silence starts over.
    watch.answered(True, 10.0)
    assert watch.hung(4.0 + SILENCE_LIMIT_S) is None
    watch.answered(False, 11.0)
    watch.saw(StepFinished("j", 1, 10, 3.0, 27.0), 12.0)
    assert watch.hung(11.0 + SILENCE_LIMIT_S) is None


def test_after_a_cancel_silence_is_hung_sooner():
    watch = Watchdog(0.0)
    watch.saw(PhaseStarted("j", "denoise"), 0.0)
    watch.cancel_asked(5.0)
    watch.answered(False, 6.0)
    assert watch.hung(6.0 + CANCEL_SILENCE_S) == f"it answered nothing for {CANCEL_SILENCE_S:.0f} s"
    watch.saw(JobCancelled("j", 3, 10, "denoise", True), 7.0)
    assert watch.cancelled_at is None


def test_a_phase_gets_its_time_from_the_plan_and_the_steps_seen():
    watch = Watchdog(0.0)
    plan = plan_memory(SELFTEST_SPECS["selftest-t2v"], PlanRequest(64, 64, 9), CPU)
    watch.saw(PlanReady("j", replace(plan, phases=[PhasePlan("load", {"transformer": "cpu"}, 0.0, 40.0)])), 0.0)
    watch.saw(PhaseStarted("j", "load"), 0.0)
    assert watch.allowance() == 300.0 + 30.0 * 40.0           # 28 GB of weights on a slow disk get their time
    assert watch.hung(1400.0) is None and watch.hung(1500.0) == "it answered but made no progress for 1500 s"
    watch.saw(PhaseStarted("j", "denoise"), 1500.0)
    assert watch.allowance() == STEP_FLOOR_S
    watch.saw(StepFinished("j", 1, 40, 90.0, 3510.0), 1590.0)
    assert watch.allowance() == STEP_FACTOR * 90.0            # slow steps (a 14B model on a CPU) get theirs
    assert watch.hung(1590.0 + STEP_FACTOR * 90.0 - 1) is None
