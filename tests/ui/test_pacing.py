"""A fast job's events reach the page in a few batches, in order, without losing one; a page that goes away
stops the job and waits for its end."""
from __future__ import annotations

import threading
import time

from engine.events import Info, JobFinished, PhaseStarted, StepFinished
from ui.pacing import paced


def _steps(n: int, pause: float = 0.0):
    yield PhaseStarted("j", "denoise")
    for step in range(1, n + 1):
        time.sleep(pause)
        yield StepFinished("j", step, n, 0.01, 0.0)
    yield Info("j", "decoded")
    yield JobFinished("j", ("a.mp4",), "a.json", 1, {})


def test_fast_steps_come_in_a_few_batches_in_order_and_the_others_at_once():
    batches = list(paced(_steps(200, pause=0.002), 0.2, stop=lambda: None))
    events = [event for batch in batches for event in batch]
    assert [e.step for e in events if isinstance(e, StepFinished)] == list(range(1, 201))   # none lost
    assert isinstance(events[0], PhaseStarted) and isinstance(events[-1], JobFinished)
    assert len(batches) < 20          # about 0.5 s of steps: a few updates, not 200
    # A phase or a message is never held back behind the interval: each batch ends with its first one.
    for batch in batches:
        assert all(isinstance(e, StepFinished) for e in batch[:-1])


def test_slow_steps_are_each_shown_when_they_come():
    batches = list(paced(_steps(3, pause=0.15), 0.1, stop=lambda: None))
    steps = [batch for batch in batches if isinstance(batch[0], StepFinished)]
    assert [batch[0].step for batch in steps] == [1, 2, 3]      # each step in its own update, none held back


def test_a_page_that_goes_away_stops_the_job_and_waits_for_its_end():
    stopped = threading.Event()
    drained = []

    def job():
        yield PhaseStarted("j", "denoise")
        step = 0
        while not stopped.is_set():
            step += 1
            time.sleep(0.01)
            yield StepFinished("j", step, 10_000, 0.01, 0.0)
        drained.append("cancelled")
        yield JobFinished("j", (), "", 1, {})

    batches = paced(job(), 0.05, stop=stopped.set)
    next(batches)
    next(batches)
    batches.close()                   # the page closed
    assert stopped.is_set() and drained == ["cancelled"]


def test_an_error_of_the_events_reaches_the_page():
    def broken():
        yield PhaseStarted("j", "load")
        raise OSError("pipe closed")

    batches = paced(broken(), 0.05, stop=lambda: None)
    assert isinstance(next(batches)[0], PhaseStarted)
    try:
        next(batches)
    except OSError as exc:
        assert "pipe closed" in str(exc)
    else:
        raise AssertionError("the error was lost")
