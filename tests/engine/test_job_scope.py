"""JobScope's two kinds on their own: a whole job (WholeJob) and one rank of a job split across GPUs (SplitJob).

What needs no other rank (the seed, the title, the lead, the outcome, a refused plan) runs in this process. What
the ranks do together (joining, the gate, agreeing on a cancel, leaving the group) runs in two spawned processes,
one per rank as the pool's engines are, each with a real RankGroup, its TCP store and a gloo process group on
the CPU; the scope's work stands in for the model's phases (no model is loaded).
"""
from __future__ import annotations

import multiprocessing
import time
import traceback
import uuid
from pathlib import Path

import pytest

from engine.events import Info, JobCancelled, JobFailed, JobFinished, JobStarted, RankDone
from engine.models.spec import SELFTEST_SPECS
from engine.planning.planner import PlanRequest, plan_memory
from engine.run.job import Cancelled, Job
from engine.run.job_scope import SplitJob, WholeJob
from engine.run.parallel import RankGroup
from engine.settings.values import InputError
from tests.conftest import CPU, free_port

SCENARIO_TIMEOUT_S = 60.0   # far above what any scenario takes (well under a second once the processes run)
TITLE = "Text to video with selftest-t2v"


def plan_for(ranks: int):
    """The self-test model's plan on the CPU for ``ranks`` engines: 2 divide its 2 heads (Ulysses), 3 do not."""
    return plan_memory(SELFTEST_SPECS["selftest-t2v"], PlanRequest(64, 64, 9, ranks=ranks), CPU)


def collecting_job(job_id: str = "job", should_cancel=lambda: False, steps: int = 0) -> tuple[Job, list]:
    events: list = []
    return Job(job_id, events.append, should_cancel, steps=steps), events


def finished(job_id: str) -> JobFinished:
    """What a lead's finish makes here (the decode and the export stand in)."""
    return JobFinished(job_id, ("video.mp4",), "video.json", 7)


def raising(failure: BaseException):
    def work():
        raise failure
    return work


# ----- a whole job ---------------------------------------------------------------

def test_a_whole_job_is_one_rank_that_leads_and_may_step_down():
    scope = WholeJob()
    assert (scope.ranks, scope.leads, scope.steps_down) == (1, True, True)


def test_a_whole_job_s_title_is_the_base_title():
    assert WholeJob().title(TITLE) == TITLE


def test_a_whole_job_s_random_seed_is_32_bit_and_drawn_anew_each_time():
    seeds = [WholeJob().seed() for _ in range(64)]
    assert all(0 <= seed < 2**32 for seed in seeds)
    assert len(set(seeds)) > 1, seeds   # 64 equal draws of 2**32: never, unless the seed is fixed


def test_a_whole_job_asked_for_several_gpus_says_it_runs_on_one_and_goes_on():
    job, events = collecting_job()
    WholeJob().join(plan_for(1), 3, job)
    assert events == [Info("job", "The settings ask for 3 GPUs, but this engine was given the whole job: it runs "
                                  "on one GPU.")]


def test_a_whole_job_asked_for_one_gpu_joins_silently():
    job, events = collecting_job()
    for gpus in (0, 1):
        WholeJob().join(plan_for(1), gpus, job)
    assert events == []


def test_a_whole_job_stops_whenever_its_job_is_cancelled_even_after_the_last_step():
    cancel = [False]
    job, _ = collecting_job(should_cancel=lambda: cancel[0])
    scope = WholeJob()
    assert not scope.stops(job) and not scope.stops(job, last=True)
    cancel[0] = True
    assert scope.stops(job) and scope.stops(job, last=True)
    cancel[0] = False   # nothing agreed to remember: it asks the job again
    assert not scope.stops(job)


def test_a_whole_job_denoises_inside_nothing_that_touches_the_models_or_the_job():
    job, events = collecting_job()
    model = {"untouched": True}
    ran = []
    with WholeJob().denoising([model], plan_for(1), job):
        ran.append(True)
    assert ran == [True] and model == {"untouched": True} and events == []
    with pytest.raises(ValueError, match="inside"):
        with WholeJob().denoising([model], plan_for(1), job):
            raise ValueError("inside")


def test_a_whole_job_runs_its_work_as_it_is_and_lets_its_failures_through():
    job, _ = collecting_job()
    event = finished(job.id)
    assert WholeJob().running(lambda: event) is event
    for failure in (Cancelled(), RuntimeError("out of memory")):
        with pytest.raises(type(failure)) as raised:
            WholeJob().running(raising(failure))
        assert raised.value is failure


def test_a_whole_job_s_outcome_is_what_its_finish_makes():
    job, _ = collecting_job()
    calls = []
    event = finished(job.id)
    assert WholeJob().outcome(job, lambda: calls.append(1) or event) is event
    assert calls == [1]


# ----- a split job, one rank on its own -------------------------------------------

def split_scope(rank: int, size: int = 2, key: str = "job-a", address: str = "127.0.0.1:29500") -> SplitJob:
    return SplitJob(RankGroup(rank, size, address, key), "cpu")


def test_a_split_job_s_ranks_are_its_group_s_and_only_rank_0_leads():
    scopes = [split_scope(rank, 3) for rank in range(3)]
    assert [scope.ranks for scope in scopes] == [3, 3, 3]
    assert [scope.leads for scope in scopes] == [True, False, False]


def test_no_rank_of_a_split_job_steps_down_alone():
    assert [split_scope(rank).steps_down for rank in range(2)] == [False, False]


def test_a_split_job_s_title_names_its_part_counting_from_1():
    assert split_scope(0).title(TITLE) == f"{TITLE}, part 1 of 2 (split across GPUs)"
    assert split_scope(1).title(TITLE) == f"{TITLE}, part 2 of 2 (split across GPUs)"


def test_a_split_job_s_random_seed_is_the_same_on_every_rank_every_time_and_another_for_another_job():
    ranks = [split_scope(rank, key="job-a") for rank in range(2)]
    seeds = {scope.seed() for scope in ranks for _ in range(3)}
    assert seeds == {RankGroup(0, 2, "127.0.0.1:29500", "job-a").shared_seed()}
    assert split_scope(0, key="job-b").seed() not in seeds
    assert 0 <= seeds.pop() < 2**32


def test_a_split_job_s_lead_ends_with_what_its_finish_makes():
    job, _ = collecting_job()
    calls = []
    event = finished(job.id)
    assert split_scope(0).outcome(job, lambda: calls.append(1) or event) is event
    assert calls == [1]


def test_a_split_job_s_rank_1_does_not_decode_and_ends_with_rank_done_counting_its_steps():
    job, _ = collecting_job("job-rank1", steps=5)
    for step in range(3):   # the steps done count, not the steps asked for
        job.step_finished(step, 5, 0.01)
    with job.in_phase("denoise"):
        pass
    decoded = []
    done = split_scope(1).outcome(job, lambda: decoded.append(1) or finished(job.id))
    assert decoded == [], "rank 1 decoded"
    assert isinstance(done, RankDone), done
    assert (done.job_id, done.rank, done.size, done.steps) == ("job-rank1", 1, 2, 3)
    assert set(done.timings) == {"denoise"} and done.timings == job.timings
    job.timings["vae_decode"] = 1.0   # what the job records later is not the event's
    assert "vae_decode" not in done.timings


@pytest.mark.parametrize("rank", [0, 2])
def test_every_rank_refuses_a_plan_that_cannot_be_split_before_waiting_for_the_others(rank):
    plan = plan_for(3)
    assert not plan.split.possible   # 3 do not divide the self-test model's 2 heads
    job, events = collecting_job()
    scope = SplitJob(RankGroup(rank, 3, f"127.0.0.1:{free_port()}", uuid.uuid4().hex), "cpu")   # no peer there
    start = time.monotonic()
    with pytest.raises(InputError) as refused:
        scope.running(lambda: scope.join(plan, 3, job))   # as the engine runs it: through running
    assert time.monotonic() - start < 5, "it waited for ranks that never came"
    assert str(refused.value) == str(InputError(f"this job cannot be split across 3 GPUs: {plan.split.reason}"))
    assert events == [] and scope.session.store is None


# ----- a split job, two ranks in their own processes --------------------------------

def _serve(conn) -> None:
    """A rank's process: runs the scenarios it is sent, one at a time, and sends back what they return."""
    while True:
        task = conn.recv()
        if task is None:
            return
        scenario, args = task
        try:
            conn.send((True, scenario(*args)))
        except BaseException as exc:   # the parent's assertion says what broke
            conn.send((False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class RankProcess:
    def __init__(self, context):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True, name="job-scope-rank")
        self.process.start()
        child.close()

    def start(self, scenario, *args) -> None:
        self.conn.send((scenario, args))

    def result(self):
        if not self.conn.poll(SCENARIO_TIMEOUT_S):
            raise TimeoutError(f"a rank gave no result within {SCENARIO_TIMEOUT_S:.0f} s (waiting forever?)")
        ok, value = self.conn.recv()
        assert ok, value
        return value

    def ask_to_end(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass

    def end(self) -> None:
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


@pytest.fixture(scope="module")
def ranks():
    """Two processes, rank 0 and rank 1 of every split job below (each job its own port and key); each scenario
    leaves its process group, so the next one in the same processes also checks that nothing was left behind."""
    context = multiprocessing.get_context("spawn")
    processes = [RankProcess(context) for _ in range(2)]
    yield processes
    for process in processes:
        process.ask_to_end()
    for process in processes:
        process.end()


def run_split(ranks, scenario, *args) -> list[dict]:
    """What ``scenario(rank, address, key, *args)`` returned on each rank, both started at once."""
    address, key = f"127.0.0.1:{free_port()}", uuid.uuid4().hex
    for rank, process in enumerate(ranks):
        process.start(scenario, rank, address, key, *args)
    return [process.result() for process in ranks]


def _rank(rank: int, address: str, key: str, should_cancel=lambda: False, steps: int = 0):
    job, events = collecting_job(f"split-{rank}", should_cancel, steps)
    return SplitJob(RankGroup(rank, 2, address, key), "cpu"), job, events


def _ended(scope: SplitJob, job: Job, events: list, work) -> dict:
    """The job run to its end as the engine runs it, and what it left behind."""
    import torch.distributed as dist

    end = job.run_to_end(scope.title(TITLE), lambda: scope.running(work), lambda: True)
    return {"end": end, "events": events, "left_group": not dist.is_initialized() and scope.session.store is None}


def _denoise_steps(rank, address, key, steps, rank_1_cancels_at=None, rank_1_cancels_after_last=False) -> dict:
    """Both ranks join, pass the gate and run ``steps`` step boundaries as the denoise's callbacks do (the step
    recorded, then whether to stop), then ask once more after the last, as the denoise does; rank 1 alone is
    cancelled at step ``rank_1_cancels_at`` or right after the last step."""
    at = {"step": -1, "after_last": False}

    def should_cancel():
        return rank == 1 and ((rank_1_cancels_at is not None and at["step"] >= rank_1_cancels_at)
                              or at["after_last"])

    scope, job, events = _rank(rank, address, key, should_cancel, steps)
    seen = {}

    def work():
        plan = plan_for(2)
        scope.join(plan, 2, job)
        with scope.denoising([], plan, job):
            for step in range(steps):
                at["step"] = step
                job.step_finished(step, steps, 0.0)
                if scope.stops(job):
                    break
            at["after_last"] = rank_1_cancels_after_last
            seen["wanted_after_last"] = job.should_cancel()
            seen["stops_after_last"] = scope.stops(job, last=True)
            if len(job.step_seconds) < steps or seen["stops_after_last"]:
                raise Cancelled()
        return scope.outcome(job, lambda: finished(job.id))

    return {**_ended(scope, job, events, work), **seen}


def _stops_before_the_gate(rank, address, key, how: str) -> dict:
    """Rank 1 fails (``how`` "fail") or is cancelled ("cancel") after joining, before the denoise; rank 0 goes
    on to the gate."""
    scope, job, events = _rank(rank, address, key, should_cancel=lambda: rank == 1 and how == "cancel")

    def work():
        plan = plan_for(2)
        scope.join(plan, 2, job)
        if rank == 1:
            if how == "fail":
                raise InputError("no LoRA file named style.safetensors")
            job.check_cancel()
        with scope.denoising([], plan, job):
            raise AssertionError(f"rank {rank} passed the gate")

    return _ended(scope, job, events, work)


def _cancelled_at_the_gate(rank, address, key) -> dict:
    """Rank 1, cancelled all along, reaches the gate first (rank 0 waits in a barrier until rank 1 is through)."""
    import torch.distributed as dist

    scope, job, events = _rank(rank, address, key, should_cancel=lambda: rank == 1)

    def work():
        plan = plan_for(2)
        scope.join(plan, 2, job)
        if rank == 0:
            dist.barrier()
        try:
            with scope.denoising([], plan, job):
                raise AssertionError(f"rank {rank} passed the gate")
        finally:
            if rank == 1:
                dist.barrier()

    return _ended(scope, job, events, work)


def _fails_inside_the_denoise(rank, address, key) -> dict:
    """Past the gate, rank 1 fails in its first step; rank 0 asks at its step boundaries as usual."""
    scope, job, events = _rank(rank, address, key, steps=50)
    seen = {}

    def work():
        plan = plan_for(2)
        scope.join(plan, 2, job)
        with scope.denoising([], plan, job):
            seen["past_gate"] = time.monotonic()
            if rank == 1:
                raise RuntimeError("a kernel failed")
            for step in range(50):
                job.step_finished(step, 50, 0.0)
                scope.stops(job)
        return scope.outcome(job, lambda: finished(job.id))

    ended = _ended(scope, job, events, work)
    return {**ended, "seconds_after_gate": time.monotonic() - seen.get("past_gate", float("inf"))}


def _lead_fails_before_the_gate(rank, address, key, flag: str) -> dict:
    """Rank 0 fails after joining; rank 1 reaches the gate only once rank 0 has ended (``flag`` exists)."""
    scope, job, events = _rank(rank, address, key)

    def work():
        plan = plan_for(2)
        scope.join(plan, 2, job)
        if rank == 0:
            raise InputError("no LoRA file named style.safetensors")
        deadline = time.monotonic() + SCENARIO_TIMEOUT_S
        while not Path(flag).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with scope.denoising([], plan, job):
            raise AssertionError("rank 1 passed the gate alone")

    return _ended(scope, job, events, work)


@pytest.fixture(scope="module")
def finishing(ranks):
    """A split job of 3 steps that no one cancels in time: rank 1 is cancelled only after the last step."""
    return run_split(ranks, _denoise_steps, 3, None, True)


@pytest.fixture(scope="module")
def cancelling(ranks):
    """A split job of 6 steps whose rank 1 alone is cancelled at its third step boundary."""
    return run_split(ranks, _denoise_steps, 6, 2, False)


def test_both_ranks_of_a_split_job_join_over_gloo_and_say_which_part_they_are(finishing):
    for rank, seen in enumerate(finishing):
        events = seen["events"]
        assert events[0] == JobStarted(f"split-{rank}", f"{TITLE}, part {rank + 1} of 2 (split across GPUs)")
        joined = [e.message for e in events if isinstance(e, Info) and "joined the split job" in e.message]
        assert len(joined) == 1 and joined[0].startswith(f"GPU rank {rank} of 2 joined the split job (ulysses, "
                                                         "over gloo) in "), joined


def test_a_split_job_s_lead_ends_with_its_finish_and_rank_1_with_rank_done_after_denoising_together(finishing):
    lead, other = finishing
    assert lead["end"] == finished("split-0"), lead["end"]
    assert isinstance(other["end"], RankDone), other["end"]
    assert (other["end"].rank, other["end"].size, other["end"].steps) == (1, 2, 3)


def test_a_cancel_after_the_last_step_does_not_stop_a_split_job(finishing):
    lead, other = finishing
    assert other["wanted_after_last"] and not lead["wanted_after_last"]
    assert [seen["stops_after_last"] for seen in finishing] == [False, False]


def test_a_split_job_leaves_its_process_group_when_it_finishes(finishing):
    assert [seen["left_group"] for seen in finishing] == [True, True]


def test_a_cancel_on_rank_1_alone_stops_both_ranks_after_the_same_step(cancelling):
    ends = [seen["end"] for seen in cancelling]
    assert all(isinstance(end, JobCancelled) for end in ends), ends
    assert [end.at_step for end in ends] == [3, 3] and [end.total for end in ends] == [6, 6]
    assert not cancelling[0]["wanted_after_last"], "rank 0 was cancelled itself"


def test_a_cancel_agreed_during_the_steps_still_holds_after_the_last(cancelling):
    assert [seen["stops_after_last"] for seen in cancelling] == [True, True]


def test_a_split_job_leaves_its_process_group_when_it_is_cancelled(cancelling):
    assert [seen["left_group"] for seen in cancelling] == [True, True]


def test_a_rank_that_fails_before_the_gate_stops_the_lead_there_saying_why(ranks):
    lead, other = run_split(ranks, _stops_before_the_gate, "fail")
    assert isinstance(other["end"], JobFailed) and other["end"].kind == "input", other["end"]
    assert isinstance(lead["end"], JobFailed) and lead["end"].kind == "peer", lead["end"]
    assert lead["end"].message == ("GPU rank 1 of this split job stopped before the denoising (No LoRA file named "
                                   "style.safetensors.), so this one stopped too.")
    assert [seen["left_group"] for seen in (lead, other)] == [True, True]


def test_a_rank_cancelled_before_the_gate_cancels_the_lead_there(ranks):
    lead, other = run_split(ranks, _stops_before_the_gate, "cancel")
    assert isinstance(other["end"], JobCancelled) and other["end"].at_step == 0, other["end"]
    assert isinstance(lead["end"], JobCancelled) and lead["end"].at_step == 0, lead["end"]
    assert [seen["left_group"] for seen in (lead, other)] == [True, True]


def test_a_rank_cancelled_at_the_gate_before_the_others_arrive_cancels_them_all(ranks):
    lead, other = run_split(ranks, _cancelled_at_the_gate)
    assert [type(seen["end"]) for seen in (lead, other)] == [JobCancelled, JobCancelled], (lead["end"], other["end"])
    assert [seen["left_group"] for seen in (lead, other)] == [True, True]


def test_a_rank_that_fails_inside_the_denoise_leaves_the_group_so_the_lead_stops_at_once(ranks):
    lead, other = run_split(ranks, _fails_inside_the_denoise)
    assert isinstance(other["end"], JobFailed) and "a kernel failed" in other["end"].message, other["end"]
    assert isinstance(lead["end"], JobFailed), lead["end"]   # not finished alone, nor waiting the 300 s timeout
    assert lead["seconds_after_gate"] < 10, lead["seconds_after_gate"]
    assert [seen["left_group"] for seen in (lead, other)] == [True, True]


def test_a_lead_that_fails_before_the_gate_stops_rank_1_there_as_a_peer(ranks, tmp_path):
    """Rank 0 serves the job's store and takes it along when it leaves: rank 1, arriving later, reads that as the
    lead having stopped (a peer failure), not as a network error of its own."""
    flag = tmp_path / "lead-ended"
    address, key = f"127.0.0.1:{free_port()}", uuid.uuid4().hex
    for rank, process in enumerate(ranks):
        process.start(_lead_fails_before_the_gate, rank, address, key, str(flag))
    lead = ranks[0].result()
    flag.touch()
    other = ranks[1].result()
    assert isinstance(lead["end"], JobFailed) and lead["end"].kind == "input", lead["end"]
    assert isinstance(other["end"], JobFailed) and other["end"].kind == "peer", other["end"]
    assert "GPU rank 0 of this split job stopped before the denoising" in other["end"].message
