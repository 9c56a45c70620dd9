"""One job split across two engine processes (context parallel over gloo on the CPU), against one process."""
from __future__ import annotations

import threading
import uuid

import pytest

from engine.events import Info, JobCancelled, JobFailed, JobFinished, LatentsSaved, PreviewReady, RankDone, StepFinished
from engine.outputs.latents import load_latents
from engine.run.engine import Engine
from engine.run.parallel import RankGroup
from engine.service.worker import WorkerClient
from tests.conftest import CPU, free_port, run_engine, tiny_request

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def pair(selftest_models_dir):
    """Two engine processes on the CPU, as the pool would hold them for one split job."""
    clients = [WorkerClient(selftest_models_dir, CPU, preview_seconds=0) for _ in range(2)]
    for client in clients:
        client.start()
    yield clients
    for client in clients:
        client.close()


def run_split(clients, request, on_event=lambda rank, event: None) -> list[list]:
    """Every rank's events of one split job, the ranks' engines driven at once (one thread each)."""
    address, key = f"127.0.0.1:{free_port()}", uuid.uuid4().hex
    seen = [[] for _ in clients]

    def drive(rank):
        group = RankGroup(rank, len(clients), address, key)
        for event in clients[rank].run(request, job_id=f"split-{rank}", group=group):
            seen[rank].append(event)
            on_event(rank, event)

    threads = [threading.Thread(target=drive, args=(rank,)) for rank in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return seen


def saved_latents(events):
    return load_latents(next(e.path for e in events if isinstance(e, LatentsSaved)))[0]


def test_two_ranks_over_gloo_give_the_latents_of_one_process_and_only_rank_0_writes(pair, presets, outputs, tmp_path,
                                                                                      selftest_models_dir):
    request = tiny_request(presets, "selftest-t2v", outputs, steps=3, seed=-1)   # random: drawn alike on each rank
    lead, other = run_split(pair, request)
    assert isinstance(lead[-1], JobFinished), lead[-1]
    assert isinstance(other[-1], RankDone) and other[-1].rank == 1 and other[-1].steps == 3, other[-1]
    assert not any(isinstance(e, (LatentsSaved, PreviewReady)) for e in other), "rank 1 wrote or previewed"
    assert any(isinstance(e, PreviewReady) for e in lead)
    assert len(list(outputs.rglob("*.mp4"))) == 1 and len(list(outputs.rglob("*.json"))) == 1
    assert any(isinstance(e, Info) and "ulysses" in e.message for e in lead)

    alone_dir = tmp_path / "alone"
    alone_dir.mkdir()
    engine = Engine(selftest_models_dir, CPU, preview_seconds=-1)
    alone, events = run_engine(engine, tiny_request(presets, "selftest-t2v", alone_dir, steps=3, seed=lead[-1].seed))
    assert isinstance(alone, JobFinished)
    split, single = saved_latents(lead), saved_latents(events)
    # Ulysses gives each rank whole sequences of one head: every attention sum runs over the same tokens in the
    # same order as in one process, and the other layers are per token; float32 on the CPU, so exactly equal.
    # (Had rank 1 drawn other noise, its half of the sequence would differ.)
    assert split.shape == single.shape and bool((split == single).all()), (split - single).abs().max()


def test_a_cancel_on_one_rank_stops_both_after_the_same_step_and_the_engines_serve_whole_jobs_after(pair, presets,
                                                                                                     outputs):
    def cancel_rank_1_at_two(rank, event):
        if rank == 1 and isinstance(event, StepFinished) and event.step == 2:
            pair[1].cancel()

    lead, other = run_split(pair, tiny_request(presets, "selftest-t2v", outputs, steps=40), cancel_rank_1_at_two)
    assert isinstance(lead[-1], JobCancelled) and isinstance(other[-1], JobCancelled), (lead[-1], other[-1])
    assert 2 <= lead[-1].at_step == other[-1].at_step < 40
    assert not list(outputs.rglob("*.mp4"))
    # The same engines, unsplit, run a whole job each: no hooks or process group left behind.
    for client in pair:
        events = list(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)))
        assert isinstance(events[-1], JobFinished), events[-1]


def test_ranks_that_no_degree_divides_the_heads_by_are_refused_before_any_work(selftest_models_dir, presets, outputs):
    engine = Engine(selftest_models_dir, CPU)
    group = RankGroup(0, 3, f"127.0.0.1:{free_port()}", "refused")   # no peer ever joins: it must not wait
    events = []
    result = engine.run(tiny_request(presets, "selftest-t2v", outputs), "job", events.append, group=group)
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert "cannot be split across 3 GPUs" in result.message and "2 attention heads" in result.message
    assert "use 2 GPUs" in result.message and "log-sum-exp" in result.message
    assert engine.loaded is None, "a refused split loaded the model"


def test_a_rank_that_fails_stops_the_other_before_the_denoise_and_one_that_dies_inside_it_too(selftest_models_dir,
                                                                                               presets, outputs):
    from tests.faults import InjectedFaults

    hardware = CPU
    faulty = InjectedFaults(out_of_memory={"text_encode": 1}, crash_in="denoise")
    clients = [WorkerClient(selftest_models_dir, hardware), WorkerClient(selftest_models_dir, hardware, faults=faulty)]
    try:
        request = tiny_request(presets, "selftest-t2v", outputs, steps=3)
        lead, other = run_split(clients, request)   # rank 1 out of memory while encoding: no stepping down alone
        assert isinstance(other[-1], JobFailed) and other[-1].phase == "text_encode", other[-1]
        assert isinstance(lead[-1], JobFailed) and lead[-1].kind == "peer", lead[-1]
        assert "GPU rank 1 of this split job stopped before the denoising" in lead[-1].message
        lead, other = run_split(clients, request)   # rank 1's process dies as the denoise starts
        assert isinstance(other[-1], JobFailed) and other[-1].kind == "crash", other[-1]
        assert isinstance(lead[-1], JobFailed) and lead[-1].phase == "denoise", lead[-1]
        assert not list(outputs.rglob("*.mp4"))
    finally:
        for client in clients:
            client.close()


def test_a_random_seed_is_the_same_on_every_rank_and_new_for_every_job():
    ranks = [RankGroup(rank, 2, "127.0.0.1:29500", "job-a") for rank in range(2)]
    assert ranks[0].shared_seed() == ranks[1].shared_seed() != RankGroup(0, 2, "127.0.0.1:29500", "job-b").shared_seed()
    assert 0 <= ranks[0].shared_seed() < 2**32
    with pytest.raises(ValueError, match="rank 2 of 2"):
        RankGroup(2, 2, "127.0.0.1:29500", "job-a")
    with pytest.raises(ValueError, match="HOST:PORT"):
        RankGroup(0, 2, "localhost", "job-a")
