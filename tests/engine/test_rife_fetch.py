"""The smoother's RIFE file fetched once from the Hugging Face Hub into models/interpolators/, or put there by hand;
offline, or when the fetch fails, ffmpeg's minterpolate, said so in one sentence.

The Hub is tests/fake_hub.py's stand-in on 127.0.0.1, serving a file of random weights in the published v4.7-4.9
layout under the real repo and name (marduk191/rife, rife49.pth) through huggingface_hub's own download. The whole
step runs in a fresh process where the app's downloads go there (huggingface_hub reads HF_ENDPOINT once, when it is
imported); the fetch alone runs here, given the stand-in's address.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.errors import InputError
from engine.events import DownloadProgress, Info
from engine.outputs.export import read_video, write_mp4
from engine.post.apply import Media, StepRunner, check_step_files, run_steps
from engine.post.rife import (RIFE_HUB_FILE, RIFE_HUB_REPO, FetchedFileRefused, fetch_rife, find_rife,
                              write_random_rife)
from engine.post.steps import PostStep
from engine.run.job import Job
from tests.conftest import ROOT, one_torch_thread
from tests.fake_hub import FakeHub

SMOOTHER = (PostStep("interpolate", 2),)
# One run of the smoother in a fresh process, three times over the same models folder: what each did, as JSON lines.
SCRIPT = """
import json, sys, torch
from pathlib import Path
from engine.events import DownloadProgress, Info, PhaseFinished
from engine.errors import InputError
from engine.post.apply import Media, StepRunner, check_step_files, run_steps
from engine.post.steps import PostStep
from engine.run.job import Job

torch.set_num_threads(1)
models, video = Path(sys.argv[1]), Path(sys.argv[2])
for number in (1, 2, 3):
    events = []
    job = Job("fetch", events.append)
    made, records = run_steps(job, StepRunner(models, "cpu", job), (PostStep("interpolate", 2),), Media.read(video),
                              video.with_name(f"out{number}.mp4"))
    print(json.dumps({"method": records[0].method, "frames": made.frames, "path": str(made.path),
                      "phases": {e.phase: e.detail for e in events if isinstance(e, PhaseFinished)},
                      "notes": [e.message for e in events if isinstance(e, Info)],
                      "progress": [[e.done, e.total] for e in events if isinstance(e, DownloadProgress)]}))
"""


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a busy 2-core machine two make the CPU convolutions many times slower."""
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> bytes:
    """A RIFE file's bytes as the Hub would serve them: random weights, the published v4.7-4.9 layout."""
    return write_random_rife(tmp_path_factory.mktemp("published") / RIFE_HUB_FILE, seed=3).read_bytes()


@pytest.fixture
def hub(published):
    hub = FakeHub({RIFE_HUB_REPO: {RIFE_HUB_FILE: published}}).start()
    yield hub
    hub.stop()


class Stopped(Exception):
    """What a cancel raises from inside the download."""


def _video(path: Path, frames: int = 5) -> Media:
    ramp = np.linspace(0, 255, 48, dtype=np.float32)[None, :, None]
    clip = np.stack([np.broadcast_to(ramp * (0.5 + 0.1 * i), (32, 48, 3)) for i in range(frames)]).astype(np.uint8)
    write_mp4(clip, path, 16)
    return Media.read(path)


def _smoother(models: Path, media: Media, dest: Path):
    events: list = []
    job = Job("post", events.append)
    made, records = run_steps(job, StepRunner(models, "cpu", job), SMOOTHER, media, dest)
    return made, records[0], events


def _everything(folder: Path) -> list[str]:
    """Every name under ``folder``, hidden ones included."""
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def test_the_fetch_puts_the_published_file_in_place_whole_saying_its_bytes(tmp_path, hub, published):
    folder = tmp_path / "models" / "interpolators"
    said: list = []
    path = fetch_rife(folder, lambda done, total: said.append((done, total)), endpoint=hub.url)
    assert path == folder / RIFE_HUB_FILE and path.read_bytes() == published
    assert said[-1] == (len(published), len(published)) and len(said) >= 2     # 10 MB at a time
    assert _everything(folder) == [RIFE_HUB_FILE] and find_rife(folder) == path
    assert len(hub.gets(RIFE_HUB_FILE)) == 1


def test_a_cut_connection_resumes_and_the_file_still_arrives_whole(tmp_path, hub, published):
    hub.cut.add((RIFE_HUB_REPO, RIFE_HUB_FILE))
    path = fetch_rife(tmp_path / "interpolators", endpoint=hub.url)
    assert path.read_bytes() == published and _everything(path.parent) == [RIFE_HUB_FILE]
    assert [seen.range for seen in hub.gets(RIFE_HUB_FILE)][-1] is not None    # the second GET asked for the rest


def test_a_failed_stopped_or_refused_fetch_leaves_nothing_find_rife_would_pick_up(tmp_path, hub):
    folder = tmp_path / "interpolators"
    hub.broken.add((RIFE_HUB_REPO, RIFE_HUB_FILE))
    with pytest.raises(Exception, match="500"):
        fetch_rife(folder, endpoint=hub.url)
    assert _everything(folder) == []

    def stop(done, total):   # part-way: the first 10 MB are written, the rest never comes (a cancel, a kill)
        raise Stopped

    with pytest.raises(Stopped):
        fetch_rife(folder, stop, endpoint=hub.url)
    assert _everything(folder) == []

    hub.repos[RIFE_HUB_REPO][RIFE_HUB_FILE] = b"<html>not a model</html>"
    with pytest.raises(FetchedFileRefused, match="is not a RIFE 4.x file this app reads; it was not kept"):
        fetch_rife(folder, endpoint=hub.url)
    assert _everything(folder) == [] and find_rife(folder) is None


def test_offline_the_smoother_uses_minterpolate_says_why_in_one_sentence_and_makes_every_frame(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    made, record, events = _smoother(tmp_path / "models", _video(tmp_path / "in.mp4"), tmp_path / "out.mp4")
    assert record.method == "ffmpeg minterpolate" and made.frames == len(read_video(made.path)[0]) == 9
    notes = [e.message for e in events if isinstance(e, Info)]
    assert notes == ["Smoother with ffmpeg's minterpolate: there is no RIFE file in models/interpolators/ and the app "
                     "is offline (HF_HUB_OFFLINE=1), so rife49.pth was not fetched from marduk191/rife; put a RIFE 4.x "
                     "file, such as rife49.pth, there by hand for sharper frames between."]
    assert not any(isinstance(e, DownloadProgress) or getattr(e, "phase", None) == "download" for e in events)
    assert not (tmp_path / "models").exists()


def test_a_file_put_there_by_hand_is_used_online_without_asking_the_hub(tmp_path, monkeypatch):
    """Online, with the real Hub's address (which this machine does not reach): no download phase, no wait."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    models = tmp_path / "models"
    write_random_rife(models / "interpolators" / "my-rife47.pkl", seed=1)
    made, record, events = _smoother(models, _video(tmp_path / "in.mp4"), tmp_path / "out.mp4")
    assert record.method == "RIFE 4.7-4.9 (my-rife47.pkl)" and len(read_video(made.path)[0]) == 9
    assert not any(isinstance(e, DownloadProgress) or getattr(e, "phase", None) == "download" for e in events)
    assert not any(isinstance(e, Info) and "minterpolate" in e.message for e in events)
    assert _everything(models / "interpolators") == ["my-rife47.pkl"]


def test_a_broken_file_put_there_by_hand_is_refused_before_the_run_and_not_fetched_over(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    models = tmp_path / "models"
    (models / "interpolators").mkdir(parents=True)
    (models / "interpolators" / "rife49.pth").write_bytes(b"half a download")
    with pytest.raises(InputError, match=r"interpolators/rife49.pth could not be read as RIFE weights: .*\. Take it out"):
        check_step_files(models, SMOOTHER)
    assert _everything(models / "interpolators") == ["rife49.pth"]


def test_the_step_fetches_once_from_the_hub_falls_back_when_that_fails_and_reads_the_file_after(tmp_path, hub,
                                                                                                 published):
    """In a fresh process whose downloads go to the stand-in: the first run's GET fails (minterpolate, said why), the
    second fetches the file (a download phase before the smoother's, its bytes said) and runs RIFE, the third reads
    it from the folder without asking the Hub anything."""
    hub.broken.add((RIFE_HUB_REPO, RIFE_HUB_FILE))
    models, video = tmp_path / "models", tmp_path / "in.mp4"
    _video(video)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "hub")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(models), str(video)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    failed, fetched, found = (json.loads(line) for line in done.stdout.strip().splitlines()[-3:])

    assert failed["method"] == "ffmpeg minterpolate" and failed["phases"]["download"] == "rife49.pth not fetched"
    assert failed["notes"] == ["Smoother with ffmpeg's minterpolate: there is no RIFE file in models/interpolators/ "
                               "and rife49.pth could not be fetched from marduk191/rife on the Hugging Face Hub (it "
                               "answered 500); put a RIFE 4.x file, such as rife49.pth, there by hand for sharper "
                               "frames between."]

    assert fetched["method"] == found["method"] == "RIFE 4.7-4.9 (rife49.pth)"
    assert list(fetched["phases"]) == ["download", "interpolate"]
    assert fetched["phases"]["download"].startswith("rife49.pth, ") and "MB from marduk191/rife" in \
        fetched["phases"]["download"]
    assert fetched["progress"][-1] == [len(published)] * 2
    assert any("rife49.pth was fetched from marduk191/rife into models/interpolators/" in n for n in fetched["notes"])
    assert (models / "interpolators" / RIFE_HUB_FILE).read_bytes() == published
    assert _everything(models / "interpolators") == [RIFE_HUB_FILE]     # nothing hidden left beside it

    assert list(found["phases"]) == ["interpolate"] and found["progress"] == [] and found["notes"] == []
    assert len(hub.gets(RIFE_HUB_FILE)) == 2                          # the failed GET and the fetch; none after
    for run in (failed, fetched, found):
        assert run["frames"] == len(read_video(Path(run["path"]))[0]) == 9
