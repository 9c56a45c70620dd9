"""Several people on one app: every job runs, in order, each waiting one sees its place and an estimate in its
status, and each result goes only to whoever asked for it."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client

from tests.conftest import selftest_app
from tests.helpers.api import OVERRIDES
from tests.helpers.jobs import long_job, statuses_of, t2v, wait, wait_denoising

pytestmark = pytest.mark.server

USERS = 8
# The estimate is in seconds up to 90 s, then in minutes (a loaded machine makes the long job slower).
WAITING = re.compile(r"Waiting in the queue: (\d+) jobs? ahead of yours, "
                     r"(about (\d+(?:\.\d)?) (s|min) until it starts|no estimate)")


def _places(job) -> list[tuple[int, int | None]]:
    """(jobs ahead, estimated seconds or None) from each 'Waiting in the queue' status so far."""
    found = [WAITING.search(text) for text in statuses_of(job)]
    return [(int(m[1]), float(m[3]) * (60 if m[4] == "min" else 1) if m[3] else None) for m in found if m]


def _wait_place(job, place: int, timeout: float = 30):
    wait(lambda: any(ahead == place for ahead, _ in _places(job)), timeout, f"the job to wait with {place} ahead")


@pytest.fixture(scope="module")
def app(shared_app):
    return shared_app


def test_eight_users_all_get_their_own_result_in_turn(app):
    clients = [Client(app["url"], verbose=False) for _ in range(USERS)]
    assert len({c.session_hash for c in clients}) == USERS      # eight separate sessions
    owner = Client(app["url"], verbose=False)
    running = owner.submit(*long_job(800), api_name="/text_to_video")
    wait_denoising(running)
    seeds = [1000 + i for i in range(USERS)]
    prompts = [f"fox number {i}" for i in range(USERS)]
    jobs = []
    # Each user submits once the previous one waits in the queue, so the queue order is known;
    # all eight wait at the same time behind the long job.
    for place, (client, seed, prompt) in enumerate(zip(clients, seeds, prompts), start=1):
        job = client.submit(*t2v(seed, prompt), api_name="/text_to_video")
        _wait_place(job, place)
        jobs.append(job)
    assert "Cancelling" in owner.predict(api_name="/cancel")
    finished_at: dict[int, float] = {}

    def all_done():
        for i, job in enumerate(jobs):
            if job.done() and i not in finished_at:
                finished_at[i] = time.time()
        return len(finished_at) == USERS

    wait(all_done, 300, "all eight jobs")
    results = [job.result(timeout=5) for job in jobs]

    # None lost, none mixed up: eight distinct files, each with the seed and prompt its user asked for.
    videos = [Path(video) for video, *_ in results]
    assert [seed for _, _, _, seed, *_ in results] == seeds
    assert len({v.name for v in videos}) == USERS and all(v.exists() for v in videos)
    written = [p for p in app["outputs"].rglob("*.mp4")   # the shared app's outputs: other files' runs too
               if p.with_suffix(".json").is_file() and json.loads(p.with_suffix(".json").read_text())["seed"] in seeds]
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
    # Waiting users were told their place, and it only went down as the jobs ahead finished.
    for i, job in enumerate(jobs):
        places = [ahead for ahead, _ in _places(job)]
        assert places[0] == i + 1 and places == sorted(places, reverse=True), places
    # First come, first served.
    assert sorted(range(USERS), key=finished_at.get) == list(range(USERS)), finished_at


def test_two_users_the_second_sees_its_place_and_an_estimate_and_can_leave_the_queue(app):
    first, second, third = (Client(app["url"], verbose=False) for _ in range(3))
    first.predict(*t2v(300), api_name="/text_to_video")   # a finished job gives the queue a duration to estimate from
    running = first.submit(*long_job(301), api_name="/text_to_video")
    wait_denoising(running)
    waiting = second.submit(*t2v(302), api_name="/text_to_video")
    _wait_place(waiting, 1)
    # The running job's own estimate of its time left: a number of seconds, in the status.
    wait(lambda: any(eta is not None and eta > 0 for _, eta in _places(waiting)), 30, "an estimate")
    behind = third.submit(*t2v(303), api_name="/text_to_video")
    _wait_place(behind, 2)
    assert second.predict(api_name="/cancel") == "Your waiting job was taken out of the queue. It will not run."
    wait(lambda: waiting.done(), 30, "the withdrawn job to end")
    assert "Taken out of the queue: it did not run" in waiting.result(timeout=5)[1]
    _wait_place(behind, 1)            # it moved up
    assert "Cancelling your job at the end of its current step" in first.predict(api_name="/cancel")
    assert "Cancelled during the denoising, after step" in running.result(timeout=60)[1]
    video, status_text, _, seed, *_ = behind.result(timeout=120)
    assert seed == 303 and Path(video).exists()
    seeds = [json.loads(p.read_text())["seed"] for p in app["outputs"].rglob("*.json")]
    assert 302 not in seeds and 301 not in seeds, "a cancelled or withdrawn job left an output"


def test_a_waiting_job_whose_client_goes_away_leaves_the_queue(app):
    owner, leaving = Client(app["url"], verbose=False), Client(app["url"], verbose=False)
    running = owner.submit(*long_job(401), api_name="/text_to_video")
    wait_denoising(running)
    gone = leaving.submit(*t2v(402), api_name="/text_to_video")
    _wait_place(gone, 1)
    gone.cancel()    # the client stops listening, as a closed page does
    panel = lambda: owner.predict(api_name="/system")  # noqa: E731
    wait(lambda: "waiting" not in panel(), 30, "the abandoned job to leave the queue", poll=0.5)
    owner.predict(api_name="/cancel")
    running.result(timeout=60)
    time.sleep(2)
    seeds = [json.loads(p.read_text())["seed"] for p in app["outputs"].rglob("*.json")]
    assert 402 not in seeds


def test_a_hung_engine_does_not_block_the_next_user(app):
    """The engine freezes mid-job (SIGSTOP, as a hung driver): the panel says it does not answer, the job fails
    saying so within the documented limit, and the next user's waiting job runs in a fresh engine."""
    import os
    import signal

    from engine.service.watchdog import SILENCE_LIMIT_S
    from tests.conftest import engine_pid

    owner, next_user = Client(app["url"], verbose=False), Client(app["url"], verbose=False)
    running = owner.submit(*long_job(501), api_name="/text_to_video")
    wait_denoising(running)
    waiting = next_user.submit(*t2v(502), api_name="/text_to_video")
    _wait_place(waiting, 1)
    frozen = engine_pid(app)
    os.kill(frozen, signal.SIGSTOP)
    started = time.time()
    wait(lambda: "not answering" in owner.predict(api_name="/system"), 15, "the panel to say so", poll=0.5)
    with pytest.raises(Exception, match=r"The engine stopped answering during denoise \(it answered nothing"):
        running.result(timeout=60)
    assert time.time() - started < SILENCE_LIMIT_S + 10
    video, status, _, seed, *_ = waiting.result(timeout=120)
    assert seed == 502 and Path(video).exists() and engine_pid(app) != frozen


def test_a_user_sees_only_their_own_session(app):
    """Another session's stream carries nothing of a running job: gradio answers "session not found"."""
    first = Client(app["url"], verbose=False)
    job = first.submit(*t2v(77, "private prompt 77"), api_name="/text_to_video")
    wait(lambda: bool(job.outputs()) or job.done(), 30, "the job to start")
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
    wait_denoising(running)
    waiting = []
    for place, seed in enumerate((201, 202), start=1):     # fill the queue: two may wait
        job = Client(url, verbose=False).submit(*t2v(seed), api_name="/text_to_video")
        _wait_place(job, place)
        waiting.append(job)
    # The third waiting job is refused, through gradio_client and through the raw API route, with the sentence.
    late = Client(url, verbose=False)
    with pytest.raises(Exception, match="The queue is full: 2 jobs are waiting for the engine. Try again when"):
        late.predict(*t2v(203), api_name="/text_to_video")
    posted = httpx.post(url + "gradio_api/call/text_to_video", json={"data": [*t2v(204), *OVERRIDES]}, timeout=10)
    answer = httpx.get(url + "gradio_api/call/text_to_video/" + posted.json()["event_id"], timeout=60).text
    assert "event: error" in answer and "The queue is full" in answer, answer
    # The panel and the history are no jobs either: they answer while the queue is full.
    watcher = Client(url, verbose=False)
    assert "2 waiting" in watcher.predict(api_name="/system")
    assert isinstance(watcher.predict(api_name="/history"), list)
    # The owner's cancel is no job: it is answered at once, full queue or not.
    started = time.time()
    assert "Cancelling" in owner.predict(api_name="/cancel")
    assert time.time() - started < 10
    _, status, _, _, *_ = running.result(timeout=60)
    assert "Cancelled during the denoising" in status
    assert [job.result(timeout=120)[3] for job in waiting] == [201, 202]
    video, _, _, seed, *_ = late.predict(*t2v(205), api_name="/text_to_video")
    assert seed == 205 and Path(video).exists()


def test_max_queue_must_be_at_least_one():
    import app

    with pytest.raises(SystemExit, match="--max-queue must be at least 1"):
        app.main(["--max-queue", "0", "--no-browser"])
    with pytest.raises(SystemExit, match="--queue-share must be at least 1"):
        app.main(["--queue-share", "0", "--no-browser"])
    for minutes in ("-1", "nan", "inf"):
        with pytest.raises(SystemExit, match=r"--max-job-minutes must be a number of minutes \(0: no limit\)"):
            app.main(["--max-job-minutes", minutes, "--no-browser"])


def test_the_ceiling_on_a_job_is_an_hour_where_others_log_in_and_none_on_one_s_own_machine():
    from ui.startup import job_ceiling

    assert job_ceiling(None, shared=True).seconds == 3600.0 and job_ceiling(None, shared=False).seconds is None
    assert job_ceiling(0, shared=True).seconds is None and job_ceiling(5, shared=False).seconds == 300.0
