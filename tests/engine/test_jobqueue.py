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


def test_two_engines_run_two_jobs_at_once_and_a_split_job_waits_for_both():
    clock = Clock()
    queue = JobQueue(clock=clock, engines=2)
    a, b, c = (queue.join(name, "text to video", model="m1") for name in "abc")
    assert queue.wait_turn(a, 0) and queue.wait_turn(b, 0)       # side by side
    assert {a.slots, b.slots} == {(0,), (1,)} and len(queue.running_jobs) == 2
    assert not queue.wait_turn(c, 0) and queue.place(c) == 2      # both running jobs are ahead of it
    split = queue.join("d", "text to video", engines=2, model="m1")
    queue.leave(a, DONE)
    assert queue.wait_turn(c, 0) and c.slots == a.slots           # the engine a left
    assert not queue.wait_turn(split, 0)                          # one engine is free: not enough
    queue.leave(b, DONE)
    assert not queue.wait_turn(split, 0)
    queue.leave(c, DONE)
    assert queue.wait_turn(split, 0) and split.slots == (0, 1)
    queue.leave(split, DONE)
    big = queue.join("e", "text to video", engines=8)             # more than there are: all of them
    assert queue.wait_turn(big, 0) and big.slots == (0, 1)


def test_a_free_engine_that_holds_the_model_is_preferred():
    queue = JobQueue(engines=3)
    first, second = queue.join("a", "t2v", model="wan-1.3b"), queue.join("b", "t2v", model="wan-14b")
    assert queue.wait_turn(first, 0) and queue.wait_turn(second, 0)
    assert (first.slots, second.slots) == ((0,), (1,))
    queue.leave(first, DONE)
    queue.leave(second, DONE)
    again = queue.join("c", "t2v", model="wan-14b")
    assert queue.wait_turn(again, 0) and again.slots == (1,)      # engine 1 holds it: no second load
    new = queue.join("d", "t2v", model="wan-5b")
    assert queue.wait_turn(new, 0) and new.slots == (2,)          # an engine that holds nothing, before evicting
    queue.forget(1)
    queue.leave(again, DONE)
    other = queue.join("e", "t2v", model="wan-14b")
    assert queue.wait_turn(other, 0) and other.slots == (0,)      # engine 1 was restarted: nobody holds it


def test_with_two_engines_the_estimate_counts_the_engine_that_frees_up_first():
    clock = Clock()
    queue = JobQueue(clock=clock, engines=2)
    first, second = queue.join("a", "t2v"), queue.join("b", "t2v")
    assert queue.wait_turn(first, 0) and queue.wait_turn(second, 0)
    queue.report(first, "step", seconds_left=30.0)
    queue.report(second, "step", seconds_left=10.0)
    third, fourth = queue.join("c", "t2v"), queue.join("d", "t2v")
    assert queue.estimate(third) == pytest.approx(10.0)           # the second job's engine is free first
    assert queue.estimate(fourth) is None                         # a whole job's length is not known yet
    queue.leave(second, JobEnding(Ending.DONE, seconds=12.0))     # took 12 s
    assert queue.wait_turn(third, 0)
    queue.report(third, "step", seconds_left=12.0)
    split = queue.join("e", "t2v", engines=2)
    assert queue.estimate(fourth) == pytest.approx(12.0)          # third's engine frees up before first's 30 s
    # The split job needs both engines: the fourth job's (free at 12 + 12 s) and the first job's (30 s).
    assert queue.estimate(split) == pytest.approx(30.0)


def _one_running_one_waiting():
    """(clock, queue, the running ticket, the waiting one): "a" runs a text-to-video job, "b" waits."""
    clock = Clock()
    queue = JobQueue(clock=clock)
    running = queue.join("a", "text to video")
    assert queue.wait_turn(running, 0)
    return clock, queue, running, queue.join("b", "image to video")


def test_a_job_past_its_own_estimate_never_leaves_the_next_one_waiting_for_0_s():
    clock, queue, first, second = _one_running_one_waiting()
    queue.report(first, "Denoising: step 1/10", seconds_left=9.0)
    clock.now += 2
    assert queue.estimate(second) == pytest.approx(7.0)
    clock.now += 10      # 3 s past what it said: still running, so still some time to wait
    assert queue.estimate(second) == pytest.approx(0.25 * 12)
    clock.now += 100
    assert queue.estimate(second) == pytest.approx(0.25 * 112)
    queue.report(first, "Decoding", seconds_left=0.0)
    assert queue.estimate(second) >= 1.0


def test_a_job_an_owner_holds_is_found_once_it_joined_a_moment_ago():
    clock, queue, running, waiting = _one_running_one_waiting()
    assert queue.held_for("a", joined_before=1.5) is None      # the click that started it
    clock.now += 2
    assert queue.held_for("a", joined_before=1.5) is running and queue.held_for("b", 1.5) is waiting
    assert queue.held_for("c") is None and queue.held_for(None) is None
    assert queue.held_for("a", what="text to image") is None and queue.held_for("a", what="text to video") is running
    queue.leave(running, JobEnding(Ending.DONE, seconds=2.0))
    assert queue.held_for("a") is None


def test_a_long_job_within_its_estimate_counts_what_it_said_is_left_not_a_share_of_its_time():
    clock, queue, running, waiting = _one_running_one_waiting()
    clock.now += 400
    queue.report(running, "Denoising", seconds_left=20.0)
    assert queue.estimate(waiting) == pytest.approx(20.0)
    clock.now += 30   # 10 s past what it said: still running, a share of its time is what it may still take
    assert queue.estimate(waiting) == pytest.approx(0.25 * 430)


def test_a_job_of_several_videos_counts_each_of_them_in_the_wait_behind_it():
    clock = Clock()
    queue = JobQueue(clock=clock)
    single = queue.join("a", "text to video")
    assert queue.wait_turn(single, 0)
    clock.now += 10
    queue.leave(single, DONE)                                  # a video takes 10 s here
    four = queue.join("b", "text to video", videos=4)
    assert queue.wait_turn(four, 0) and four.videos == 4
    behind = queue.join("c", "text to video")
    clock.now += 5
    assert queue.estimate(behind) == pytest.approx(4 * 10 - 5)     # not 10 - 5: four videos, not one
    three = queue.join("d", "text to video", videos=3)
    last = queue.join("e", "text to video")
    assert queue.estimate(last) == pytest.approx(35 + 10 + 3 * 10)  # the four-video job, then one, then three
    # Once it says what is left (of all its videos), that counts: here 50 s, in video 2 of 4.
    queue.report(four, "Video 2 of 4: Denoising", seconds_left=50.0, video=2)
    assert queue.estimate(behind) == pytest.approx(50.0) and four.video == 2
    assert queue.estimate(three) == pytest.approx(50.0 + 10)


def test_the_typical_length_is_kept_per_video_whatever_the_count_of_the_jobs_that_made_it():
    clock = Clock()
    queue = JobQueue(clock=clock)
    four = queue.join("a", "text to video", videos=4)
    assert queue.wait_turn(four, 0)
    queue.report(four, "Video 4 of 4", video=4)
    clock.now += 40
    queue.leave(four, DONE)                                    # 4 videos in 40 s: 10 s a video
    running, waiting = queue.join("b", "text to video"), queue.join("c", "text to video", videos=2)
    assert queue.wait_turn(running, 0)
    after = queue.join("d", "text to video")
    assert queue.estimate(waiting) == pytest.approx(10.0)      # a one-video job ahead: 10 s, not 40
    assert queue.estimate(after) == pytest.approx(10.0 + 2 * 10.0)
    clock.now += 10
    queue.report(running, "Video 1 of 1", video=1)
    queue.leave(running, JobEnding(Ending.CANCELLED, "denoise", 2, 4))
    # A job cancelled in its first video: its 10 s count as one video's (the mean of 10 and 10).
    assert queue.wait_turn(waiting, 0)
    assert queue.estimate(after) == pytest.approx(2 * 10.0)


def test_one_login_holds_at_most_its_share_and_the_rest_stays_open_to_the_others():
    queue = JobQueue(max_waiting=6)
    assert queue.share == 3                       # half the queue
    running = queue.join("alice:tab", "x", login="alice")
    assert queue.wait_turn(running, 0)            # a running job is not waiting: it takes no place
    for _ in range(3):
        queue.join("alice:tab", "x", login="alice")
    with pytest.raises(QueueFull, match=r"The queue is full for your login: 3 of your jobs are waiting, the most one "
                                        r"login may have waiting \(3 of the queue's 6 places; the rest stay open to "
                                        r"other logins\)\. Generate again when one of yours has started, or cancel"):
        queue.join("alice:other-tab", "x", login="alice")    # another tab of the same login: the same share
    for _ in range(3):
        queue.join("bob:tab", "x", login="bob")            # the places left are the others'
    with pytest.raises(QueueFull, match="The queue is full: 6 jobs are waiting"):
        queue.join("carol:tab", "x", login="carol")
    queue.leave(running)
    assert queue.wait_turn(queue._waiting[0], 0)            # one of alice's starts: she may queue one more
    queue.join("alice:tab", "x", login="alice")
    # No login (a server without a password: this machine's one user) has the whole queue; short engine work too.
    alone = JobQueue(max_waiting=4)
    for _ in range(4):
        alone.join("tab", "x")
    assert alone.waiting == 4


def test_the_share_is_half_the_queue_at_least_two_and_never_more_than_the_queue():
    from engine.service.jobqueue import default_share

    assert [default_share(n) for n in (1, 2, 3, 4, 5, 16, 17)] == [1, 2, 2, 2, 2, 8, 8]
    assert JobQueue(max_waiting=16, share=1).share == 1 and JobQueue(max_waiting=4, share=99).share == 4
