"""Several people on one app: every job runs, in order, and each result goes only to whoever asked for it."""
from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client
from gradio_client.utils import QueueError, Status

from tests.conftest import selftest_app
from tests.ui.test_security import OVERRIDES

USERS = 8
JOINED = {Status.IN_QUEUE, Status.PROCESSING, Status.PROGRESS, Status.ITERATING, Status.FINISHED}


def t2v(seed: int, prompt: str = "a red fox", size=(64, 64, 9), steps: int = 4) -> list:
    width, height, frames = size
    return ["selftest-t2v", prompt, "", "selftest-t2v", width, height, frames, steps, 5.0, 3.0, seed]


def long_job(seed: int = 1) -> list:
    return t2v(seed, "a long one", (256, 256, 33), 200)   # minutes on this CPU; every test cancels it


def _wait(predicate, timeout: float, what: str, poll: float = 0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def _wait_denoising(job, timeout: float = 60):
    def denoising():
        assert not job.done() or not job.exception(), job.exception()
        return any("Denoising: step" in str(output[1]) for output in job.outputs())
    _wait(denoising, timeout, "the long job to reach the denoising steps")


@pytest.fixture(scope="module")
def app(tmp_path_factory, selftest_models_dir):
    with selftest_app(tmp_path_factory, selftest_models_dir, "conc") as app:
        yield app


def test_eight_users_all_get_their_own_result_in_turn(app):
    clients = [Client(app["url"], verbose=False) for _ in range(USERS)]
    assert len({c.session_hash for c in clients}) == USERS      # eight separate sessions
    seeds = [1000 + i for i in range(USERS)]
    prompts = [f"fox number {i}" for i in range(USERS)]
    jobs, ranks = [], {}
    # Each user submits once the previous one is in the queue, so the queue order is known;
    # all eight are queued or running at the same time.
    for client, seed, prompt in zip(clients, seeds, prompts):
        job = client.submit(*t2v(seed, prompt), api_name="/text_to_video")
        _wait(lambda: job.status().code in JOINED, 30, f"job {seed} to join the queue")
        jobs.append(job)
    finished_at: dict[int, float] = {}

    def all_done():
        for i, job in enumerate(jobs):
            status = job.status()
            if status.code == Status.IN_QUEUE and status.rank is not None:
                ranks.setdefault(i, []).append(status.rank)
            if job.done() and i not in finished_at:
                finished_at[i] = time.time()
        return len(finished_at) == USERS

    _wait(all_done, 300, "all eight jobs")
    results = [job.result(timeout=5) for job in jobs]

    # None lost, none mixed up: eight distinct files, each with the seed and prompt its user asked for.
    videos = [Path(video) for video, *_ in results]
    assert [seed for _, _, _, seed, *_ in results] == seeds
    assert len({v.name for v in videos}) == USERS and all(v.exists() for v in videos)
    written = sorted(app["outputs"].rglob("*.mp4"))
    assert len(written) == USERS
    for (video, status, _, seed, *_), prompt in zip(results, prompts):
        assert f"Seed used: {seed}" in status
        [match] = [w for w in written if w.name == Path(video).name]
        sidecar = json.loads(match.with_suffix(".json").read_text())
        assert sidecar["seed"] == seed and sidecar["prompt"] == prompt
    # Nothing of another user's job reached this user's client: not its result, not its seed.
    for i, job in enumerate(jobs):
        for output in job.outputs():
            for j, seed in enumerate(seeds):
                if j != i:
                    assert f"Seed used: {seed}" not in str(output[1]) and output[3] != seed
                    assert Path(str(output[0])).name != videos[j].name
    # Waiting users were told their place in the queue.
    assert any(rank >= 1 for seen in ranks.values() for rank in seen), ranks
    # First come, first served.
    assert sorted(range(USERS), key=finished_at.get) == list(range(USERS)), finished_at


def test_two_users_the_second_sees_its_place_and_an_estimate_and_can_leave_the_queue(app):
    first, second, third = (Client(app["url"], verbose=False) for _ in range(3))
    first.predict(*t2v(300), api_name="/text_to_video")   # a finished job gives gradio a duration to estimate from
    running = first.submit(*long_job(301), api_name="/text_to_video")
    _wait_denoising(running)
    waiting = second.submit(*t2v(302), api_name="/text_to_video")
    _wait(lambda: waiting.status().code == Status.IN_QUEUE and waiting.status().rank is not None, 30,
          "the second job's place in the queue")
    status = waiting.status()
    assert status.rank == 0 and status.queue_size >= 1   # next in line
    # Earlier jobs on this endpoint give gradio an average duration, shown as an estimate.
    assert status.eta is not None and status.eta > 0, status
    behind = third.submit(*t2v(303), api_name="/text_to_video")
    _wait(lambda: behind.status().code == Status.IN_QUEUE and behind.status().rank == 1, 30,
          "the third job behind the second")
    assert waiting.cancel(), "a waiting job could not leave the queue"
    _wait(lambda: waiting.done(), 30, "the withdrawn job to end")
    assert "Cancelling" in first.predict(api_name="/cancel")
    assert "Cancelled after step" in running.result(timeout=60)[1]
    video, status_text, _, seed, *_ = behind.result(timeout=120)
    assert seed == 303 and Path(video).exists()
    seeds = [json.loads(p.read_text())["seed"] for p in app["outputs"].rglob("*.json")]
    assert 302 not in seeds and 301 not in seeds, "a cancelled or withdrawn job left an output"


def test_a_user_sees_only_their_own_session(app):
    """Another session's stream carries nothing of a running job: gradio answers "session not found"."""
    first = Client(app["url"], verbose=False)
    job = first.submit(*t2v(77, "private prompt 77"), api_name="/text_to_video")
    _wait(lambda: job.status().code in JOINED, 30, "the job to join the queue")
    received = b""
    with httpx.Client(timeout=10) as http:
        try:
            with http.stream("GET", app["url"] + "gradio_api/queue/data",
                             params={"session_hash": "a-stranger"}) as stream:
                for chunk in stream.iter_bytes():
                    received += chunk
        except httpx.RemoteProtocolError:   # the server drops a stream for an unknown session
            pass
    messages = [json.loads(line[5:]) for line in received.decode().splitlines() if line.startswith("data:")]
    assert all(m.get("session_not_found") for m in messages), messages
    video, status, _, seed, *_ = job.result(timeout=120)
    assert seed == 77 and Path(video).exists() and "private prompt 77" not in received.decode()


@pytest.fixture(scope="module")
def small_queue_app(tmp_path_factory, selftest_models_dir):
    with selftest_app(tmp_path_factory, selftest_models_dir, "queue", "--max-queue", "2") as app:
        yield app


def test_a_full_queue_refuses_new_jobs_and_keeps_the_queued_ones(small_queue_app):
    url = small_queue_app["url"]
    owner = Client(url, verbose=False)
    running = owner.submit(*long_job(), api_name="/text_to_video")
    _wait_denoising(running)
    waiting = []
    for seed in (201, 202):     # fill the queue: two may wait
        job = Client(url, verbose=False).submit(*t2v(seed), api_name="/text_to_video")
        _wait(lambda: job.status().code == Status.IN_QUEUE, 30, f"job {seed} to wait in the queue")
        waiting.append(job)
    # The third waiting job is refused, through gradio_client and through the raw queue route.
    late = Client(url, verbose=False)
    with pytest.raises(QueueError, match="Queue is full"):
        late.predict(*t2v(203), api_name="/text_to_video")
    config = httpx.get(url + "config", timeout=10).json()
    fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "text_to_video")
    refused = httpx.post(url + "gradio_api/queue/join", timeout=10, json={
        "data": [*t2v(204), *OVERRIDES], "fn_index": fn_index, "session_hash": "latecomer",
        "event_data": None, "trigger_id": None})
    assert refused.status_code == 503 and "Queue is full. Max size is 2" in refused.text, refused.text
    # Cancel the long job the way the page does (POST /run/cancel: queue=False events skip the queue,
    # so a full queue cannot block it): the two that waited run, and the queue takes new jobs again.
    cancelled = httpx.post(url + "gradio_api/run/cancel", timeout=10,
                           json={"data": [], "session_hash": owner.session_hash})
    assert cancelled.status_code == 200, cancelled.text
    _, status, _, _, *_ = running.result(timeout=60)
    assert "Cancelled after step" in status
    assert [job.result(timeout=120)[3] for job in waiting] == [201, 202]
    video, _, _, seed, *_ = late.predict(*t2v(205), api_name="/text_to_video")
    assert seed == 205 and Path(video).exists()


def test_max_queue_must_be_at_least_one():
    import app

    with pytest.raises(SystemExit, match="--max-queue must be at least 1"):
        app.main(["--max-queue", "0", "--no-browser"])
