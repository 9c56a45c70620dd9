"""Runs that start from a video, on one real server through its API: video to video (/video_to_video), an
extension (/image_to_video with a video to extend), and the refusals a caller gets before any work."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gradio_client import handle_file

from engine.outputs.export import read_video, write_mp4
from tests.helpers.api import I2V_TAIL, OVERRIDES, call_api

pytestmark = pytest.mark.server

SMALL = dict(width=64, height=64, frames=5, steps=2, seed=3)


@pytest.fixture(scope="module")
def server(shared_app):
    return shared_app


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    ramp = np.linspace(0, 255, 64 * 64 * 3).reshape(64, 64, 3)
    frames = np.stack([np.roll(ramp, 4 * i, axis=1) for i in range(9)]).astype(np.uint8)
    return write_mp4(frames, tmp_path_factory.mktemp("clips") / "clip.mp4", 16)


def _made(server, video: str) -> Path:
    """The output in the app's outputs folder of the file the client got (a copy of it)."""
    return next(server["outputs"].rglob(Path(video).name))


def _sidecar(server, video: str) -> dict:
    return json.loads(_made(server, video).with_suffix(".json").read_text())


def test_video_to_video_through_the_api(client, server, clip):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    names = [p["parameter_name"] for p in endpoints["/video_to_video"]["parameters"]]
    assert names[-2:] == ["video", "strength"] and "prompt" in names
    video, status, _, seed, *_ = client.predict(video=handle_file(str(clip)), prompt="the ramp, again",
                                                model="selftest-t2v", strength=0.5, api_name="/video_to_video",
                                                **SMALL)
    data = _sidecar(server, video)
    assert data["mode"] == "v2v" and data["parameters"]["strength"] == 0.5 and seed == 3
    assert data["step_seconds"] and len(data["step_seconds"]) == 1   # the last half of 2 steps
    assert read_video(video)[0].shape == (5, 64, 64, 3) and "Done" in status
    kept = _made(server, video).with_name(Path(video).stem + ".input.mp4")
    assert kept.read_bytes() == clip.read_bytes()


def test_an_extension_through_the_image_to_video_api(client, server, clip):
    video, status, *_ = client.predict(image=None, last_image=None, extend=handle_file(str(clip)), prompt="it goes on", model="selftest-i2v",
                                       preset="selftest-i2v", api_name="/image_to_video", **SMALL)
    frames = read_video(video)[0]
    assert frames.shape == (9 + 5 - 1, 64, 64, 3)
    assert np.array_equal(frames[:9], read_video(clip)[0])   # the video's own frames, bit for bit
    record = _sidecar(server, video)["extend"]
    assert record["source"] == "clip.mp4" and record["frames"] == 13 and "It extends clip.mp4" in status


def test_mistakes_are_refused_in_a_sentence_before_any_work(client, server, clip, image_file, tmp_path):
    with pytest.raises(Exception, match="fewer than the 13 asked for: make at most 9 frames"):
        client.predict(video=handle_file(str(clip)), prompt="x", model="selftest-t2v", api_name="/video_to_video",
                       **{**SMALL, "frames": 13})
    notes = tmp_path / "notes.mp4"
    notes.write_text("no video here")
    with pytest.raises(Exception, match="is not a readable video"):
        client.predict(video=handle_file(str(notes)), prompt="x", model="selftest-t2v",
                       api_name="/video_to_video", **SMALL)
    with pytest.raises(Exception, match="(?i)needs an input video"):
        client.predict(video=None, prompt="x", model="selftest-t2v", api_name="/video_to_video", **SMALL)
    with pytest.raises(Exception, match="(?i)a first frame and a video to extend were both given"):
        client.predict(image=handle_file(str(image_file)), last_image=None, extend=handle_file(str(clip)), prompt="x",
                       model="selftest-i2v", preset="selftest-i2v", api_name="/image_to_video", **SMALL)


@pytest.mark.parametrize("api_name", ["video_to_video", "image_to_video"])
def test_a_server_path_as_a_video_input_is_refused(server, secret_file, api_name):
    """A file of the server's named as the input video, or as the video to extend: the guard refuses
    it (not uploaded), and nothing runs."""
    path, marker = secret_file
    record = {"path": str(path), "meta": {"_type": "gradio.FileData"}, "orig_name": "clip.mp4"}
    before = sorted(server["outputs"].rglob("*"))
    if api_name == "video_to_video":
        data = ["selftest-t2v", "x", "", "selftest-t2v", 64, 64, 5, 2, 5.0, 3.0, 1, *OVERRIDES, record, 0.5]
    else:
        data = [None, None, *I2V_TAIL, *OVERRIDES, record]
    reply = call_api(server, api_name, data)
    assert marker not in reply and '"success":true' not in reply.replace(" ", "")
    assert "was not uploaded to this app, which takes only files uploaded to it" in reply, reply
    assert sorted(server["outputs"].rglob("*")) == before


def test_a_playlist_or_manifest_uploaded_as_a_video_is_refused_and_reads_nothing(client, server, tmp_path):
    """The probe's files: a DASH manifest uploaded as the video to remake, an HLS playlist (by its .m3u8 name) as
    the video to extend; each names a video outside every folder the app serves. Refused in a sentence, nothing made."""
    from tests.helpers.containers import dash, hls, video

    secret = video(tmp_path / "private" / "secret.mp4")
    (tmp_path / "video.mp4").write_text(dash(secret))
    (tmp_path / "clip.m3u8").write_text(hls(secret))
    before = sorted(server["outputs"].rglob("*.mp4"))
    with pytest.raises(Exception, match="is a DASH manifest .*names other files"):
        client.predict(video=handle_file(str(tmp_path / "video.mp4")), prompt="x", model="selftest-t2v",
                       api_name="/video_to_video", **SMALL)
    with pytest.raises(Exception, match="is an HLS playlist .*names other files"):
        client.predict(image=None, last_image=None, extend=handle_file(str(tmp_path / "clip.m3u8")), prompt="x",
                       model="selftest-i2v", preset="selftest-i2v", api_name="/image_to_video", **SMALL)
    assert sorted(server["outputs"].rglob("*.mp4")) == before
