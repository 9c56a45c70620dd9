"""Two engine processes behind one page (``serve --gpus 2``; on this CPU-only machine two CPU engines): the
queue runs two jobs side by side, each result goes to whoever asked for it, and a crashed engine leaves the
other serving."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from gradio_client import Client

from tests.conftest import selftest_app
from tests.helpers.jobs import long_job, t2v, wait, wait_denoising
from tests.helpers.processes import engine_processes

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def app(tmp_path_factory, selftest_models_dir):
    with selftest_app(tmp_path_factory, selftest_models_dir, "engines", "--gpus", "2") as app:
        yield app


def _engines(app) -> list[int]:
    """The app's engine processes, in start order."""
    return [process.pid for process in engine_processes(app["proc"].pid)]


def _written(app, video) -> Path:
    """The app's own copy of a result (the client gets a download)."""
    [written] = [p for p in app["outputs"].rglob("*.mp4") if p.name == Path(video).name]
    return written


def _sidecar(app, video) -> dict:
    return json.loads(_written(app, video).with_suffix(".json").read_text())


def _panel(client) -> str:
    return client.predict(api_name="/system")


def test_two_jobs_run_side_by_side_and_each_user_gets_their_own(app):
    users = [Client(app["url"], verbose=False) for _ in range(2)]
    wait(lambda: "2 engines" in _panel(users[0]), 120, "both engines", poll=0.5)
    first = users[0].submit(*long_job(601), api_name="/text_to_video")
    wait_denoising(first)
    # The second user's job does not wait: it runs on the other engine while the first still denoises.
    second = users[1].submit(*t2v(602, "the second user's fox"), api_name="/text_to_video")
    wait(lambda: "2 busy" in _panel(users[1]), 60, "both engines busy", poll=0.2)
    assert not first.done()
    video, status, _, seed, *_ = second.result(timeout=180)
    assert seed == 602 and Path(video).exists() and not first.done()
    sidecar = _sidecar(app, video)
    assert sidecar["prompt"] == "the second user's fox" and sidecar["seed"] == 602
    assert all("Seed used: 602" not in str(output[1]) for output in first.outputs())
    assert "Cancelling your job" in users[0].predict(api_name="/cancel")
    assert "Cancelled during the denoising" in first.result(timeout=60)[1]
    assert 601 not in [json.loads(p.read_text())["seed"] for p in app["outputs"].rglob("*.json")]


def test_one_users_jobs_start_in_the_order_they_asked_and_none_is_mixed_up(app):
    user = Client(app["url"], verbose=False)
    # A long job of the same user holds one engine (and keeps the user's event stream open: gradio_client drops
    # a job it submits just as the stream of a finished one closes, which a loaded machine can hit); the four
    # short ones run in turn on the other engine.
    holder = user.submit(*long_job(700), api_name="/text_to_video")
    wait_denoising(holder)
    seeds = [701, 702, 703, 704]
    jobs = []
    for seed in seeds:
        jobs.append(user.submit(*t2v(seed, f"fox {seed}"), api_name="/text_to_video"))
        time.sleep(0.3)     # asked one after the other
    results = [job.result(timeout=300) for job in jobs]
    assert [seed for _, _, _, seed, *_ in results] == seeds
    for video, _, _, seed, *_ in results:
        sidecar = _sidecar(app, video)
        assert sidecar["seed"] == seed and sidecar["prompt"] == f"fox {seed}"
    assert len({Path(video).name for video, *_ in results}) == len(seeds)
    assert not holder.done()
    assert "Cancelling your job" in user.predict(api_name="/cancel")
    assert "Cancelled during the denoising" in holder.result(timeout=60)[1]


def test_a_crashed_engine_leaves_the_other_serving(app):
    owner, other = Client(app["url"], verbose=False), Client(app["url"], verbose=False)
    wait(lambda: len(_engines(app)) == 2, 60, "two engine processes")
    running = owner.submit(*long_job(801), api_name="/text_to_video")
    wait_denoising(running)
    side = other.submit(*long_job(802), api_name="/text_to_video")
    wait_denoising(side)
    before = _engines(app)
    # The engine of the first job is the one whose CPU time grows; kill one of the two: its job fails, the other
    # job keeps running to its end (cancelled here), and the next jobs run on both engines again.
    os.kill(before[0], signal.SIGKILL)
    wait(lambda: running.done() or side.done(), 60, "the killed engine's job to end")
    crashed, survivor, survivor_client = (running, side, other) if running.done() else (side, running, owner)
    with pytest.raises(Exception, match="stopped unexpectedly"):
        crashed.result(timeout=5)
    assert not survivor.done()
    assert "Cancelling your job" in survivor_client.predict(api_name="/cancel")
    assert "Cancelled during the denoising" in survivor.result(timeout=60)[1]
    wait(lambda: len(_engines(app)) == 2 and before[0] not in _engines(app), 60, "a fresh engine process")
    again = [Client(app["url"], verbose=False).submit(*t2v(810 + i), api_name="/text_to_video") for i in range(2)]
    assert sorted(job.result(timeout=240)[3] for job in again) == [810, 811]


def test_a_job_split_across_both_engines_makes_the_video_one_engine_makes(app):
    """The page's GPUs choice 2: both engines denoise (the panel says both are busy), the first writes the one
    video, and its frames equal those of the same job on one engine (float32 on the CPU: the split is exact)."""
    import imageio.v3 as iio
    import numpy as np

    from tests.helpers.api import GPUS_AT, OVERRIDES

    user = Client(app["url"], verbose=False)
    job = t2v(901, "one fox, two engines", (64, 64, 9), 30)
    split = user.submit(*job, *OVERRIDES[:GPUS_AT], "2", api_name="/text_to_video")
    wait(lambda: "2 busy" in _panel(user) or split.done(), 120, "both engines busy with the split job", poll=0.1)
    assert not split.done(), "the split job ended before both engines were seen working on it"
    video, status, _, seed, *_ = split.result(timeout=300)
    assert seed == 901
    whole_video, *_ = user.predict(*job, *OVERRIDES[:GPUS_AT], "1", api_name="/text_to_video")
    split_frames, whole_frames = iio.imread(_written(app, video)), iio.imread(_written(app, whole_video))
    assert split_frames.shape == whole_frames.shape and np.array_equal(split_frames, whole_frames)
    assert len([p for p in app["outputs"].rglob("*.json") if json.loads(p.read_text())["seed"] == 901]) == 2


def test_the_page_shows_each_engine_and_offers_to_split_a_job(app, browser, shot):
    """In a real browser: the system panel has a line per engine, and the memory plan's GPUs choice offers Auto, 1
    and 2 (the app runs two engines); choosing 2 shows the split in the plan."""
    from tests.conftest import open_page

    with open_page(browser, app["url"]) as page:
        page.wait_for_function("() => /2 engines/.test((document.querySelector('#system-panel') || {}).innerText)")
        panel = page.locator("#system-panel").inner_text()
        assert "Engine 0:" in panel and "Engine 1:" in panel, panel
        gpus = page.locator("#t2v-gpus")
        gpus.wait_for(state="visible")
        gpus.locator("input").click()
        options = [o.replace("✓", "").strip() for o in page.locator("ul[role=listbox] li").all_inner_texts()]
        assert options == ["Auto", "1", "2"], options
        page.locator("ul[role=listbox] li").nth(2).click()
        page.wait_for_function("() => /GPUs: 2 GPUs, as the settings ask/.test("
                               "document.querySelector('#t2v-plan').innerText)")
        assert "GPUs: 2 (context parallel, ulysses)" in page.locator("#t2v-plan").inner_text()
        shot(page, "two-engines")
