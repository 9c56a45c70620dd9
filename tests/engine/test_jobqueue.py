"""The queue in front of the engine: first come first served, places and estimates, leaving it, a full queue."""
from __future__ import annotations

import threading

import pytest

from engine.events import Ending, JobEnding
from engine.service.jobqueue import JobQueue, QueueFull

DONE = JobEnding(Ending.DONE, seconds=1.0)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_jobs_run_one_at_a_time_in_the_order_they_came():
    queue = JobQueue(max_waiting=8)
    order, running, overlap = [], [0], []

    def job(name, ticket):
        while not queue.wait_turn(ticket, 0.05):
            pass
        running[0] += 1
        overlap.append(running[0])
        order.append(name)
        running[0] -= 1
        queue.leave(ticket, DONE)

    tickets = [queue.join(f"user{i}", "text to video") for i in range(6)]
    threads = [threading.Thread(target=job, args=(f"user{i}", t)) for i, t in reversed(list(enumerate(tickets)))]
    for thread in threads:      # started in the reverse order: the queue order still wins
        thread.start()
    for thread in threads:
        thread.join(10)
    assert order == [f"user{i}" for i in range(6)]
    assert max(overlap) == 1


def test_a_waiting_job_knows_its_place_and_an_estimate_from_recent_jobs():
    clock = Clock()
    queue = JobQueue(clock=clock)
    first = queue.join("a", "text to video")
    assert queue.wait_turn(first, 0) and queue.place(first) == 0
    second, third = queue.join("b", "text to video"), queue.join("c", "text to video")
    assert (queue.place(second), queue.place(third)) == (1, 2)
    assert queue.estimate(second) is None          # nothing has finished yet to estimate from
    queue.report(first, "Denoising: step 1/10", seconds_left=30.0)
    clock.now += 10
    assert queue.estimate(second) == pytest.approx(20.0)   # the running job's own estimate, 10 s later
    assert queue.estimate(third) is None                  # a whole job's length is not known yet
    queue.leave(first, JobEnding(Ending.DONE, seconds=10.0))
    clock.now += 1
    assert queue.wait_turn(second, 0) and queue.running is second
    assert queue.place(third) == 1
    clock.now += 4
    assert queue.estimate(third) == pytest.approx(10.0 - 4.0)   # the last job took 10 s; this one ran for 4
    fourth = queue.join("d", "text to video")
    assert queue.estimate(fourth) == pytest.approx(6.0 + 10.0)  # and one more of 10 s ahead of it
    assert queue.last_ending() == (JobEnding(Ending.DONE, seconds=10.0), 5.0)


def test_the_owner_takes_waiting_jobs_out_and_the_next_one_moves_up():
    queue = JobQueue()
    running = queue.join("a", "text to video")
    assert queue.wait_turn(running, 0)
    mine, theirs = queue.join("b", "text to video"), queue.join("c", "text to video")
    assert queue.withdraw("b") == 1 and mine.withdrawn
    assert not queue.wait_turn(mine, 5)             # at once: it will never run
    assert queue.place(theirs) == 1 and queue.waiting == 1
    assert queue.withdraw("a") == 0 and queue.runs_for("a")   # a running job is not taken out
    queue.leave(running, JobEnding(Ending.CANCELLED, "denoise", 3, 10))
    assert queue.wait_turn(theirs, 0) and queue.runs_for("c")
    assert queue.ended_recently_for("a") and not queue.ended_recently_for("b")


def test_a_full_queue_refuses_with_what_to_do():
    queue = JobQueue(max_waiting=2)
    running = queue.join("a", "x")
    assert queue.wait_turn(running, 0)
    next_one = queue.join("b", "x")
    queue.join("c", "x")
    with pytest.raises(QueueFull, match="The queue is full: 2 jobs are waiting.*Try again when one"):
        queue.join("d", "x")
    queue.leave(running)
    assert queue.last_ending()[0] == JobEnding(Ending.STOPPED)   # it ran, and said nothing of how it ended
    assert queue.wait_turn(next_one, 0)
    queue.join("d", "x")      # a waiting job moved up to run: a place is free


def test_a_short_turn_waits_for_the_running_job():
    queue = JobQueue()
    running = queue.join("a", "text to video")
    assert queue.wait_turn(running, 0)
    entered = threading.Event()

    def unload():
        with queue.turn("b", "unload"):
            entered.set()

    thread = threading.Thread(target=unload)
    thread.start()
    assert not entered.wait(0.3)
    queue.leave(running, DONE)
    assert entered.wait(5)
    thread.join(5)
    assert queue.running is None and queue.last_ending()[0] == JobEnding(Ending.DONE, what="unload")
