"""Uploads no job has used: bounded per login, removed after their time, and said so when named again.

A real gradio server on localhost with the app's Guard in front, driven over raw HTTP. The app's limits are an hour
and 500 MB; here they are half a second and 100 kB, so the test runs in seconds.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from ui.guard import Guard, Holdings, HostAllowList, LoginThrottle


@pytest.fixture
def server(tmp_path, monkeypatch):
    import gradio as gr
    from starlette.middleware import Middleware

    served = tmp_path / "served"
    served.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(served))
    holdings = Holdings(folder=served, unused_bytes=100_000, unused_s=0.5)
    with gr.Blocks() as demo:
        image, size = gr.File(), gr.Number()
        gr.Button().click(lambda f: Path(f).stat().st_size, image, size, api_name="size")
    demo.launch(prevent_thread_lock=True, quiet=True, app_kwargs={"middleware": [Middleware(
        Guard, hosts=HostAllowList.for_server("127.0.0.1", False, False), throttle=LoginThrottle(),
        holdings=holdings, sweep_every_s=0)]})
    try:
        yield demo.local_url, served
    finally:
        demo.close()


def _upload(http: httpx.Client, url: str, name: str, size: int) -> httpx.Response:
    return http.post(url + "gradio_api/upload", files={"files": (name, b"\1" * size, "application/octet-stream")})


def _size_of(http: httpx.Client, url: str, path: str) -> httpx.Response:
    return http.post(url + "gradio_api/call/size", json={"data": [{"path": path, "meta": {"_type": "gradio.FileData"}}]})


def test_unused_uploads_are_bounded_removed_and_said_so(server):
    url, served = server
    with httpx.Client(timeout=30) as http:
        first = _upload(http, url, "first.bin", 60_000)
        assert first.status_code == 200
        [path] = first.json()
        refused = _upload(http, url, "second.bin", 60_000)
        assert refused.status_code == 413 and "uploads that no job has used yet take 60.0 kB, and this one" in refused.text
        time.sleep(0.7)
        # The next request removes it: an hour (here half a second) unused.
        assert http.get(url + "config").status_code == 200
        assert not Path(path).exists()
        gone = _size_of(http, url, path)
        assert gone.status_code == 410 and "'first.bin' was removed" in gone.json()["detail"]
        assert "Upload it again" in gone.json()["detail"]
        # Its room is free again; an upload a job used stays.
        again = _upload(http, url, "again.bin", 60_000)
        assert again.status_code == 200
        [kept] = again.json()
        event = _size_of(http, url, kept).json()["event_id"]
        reply = http.get(url + f"gradio_api/call/size/{event}").text
        assert json.loads(reply.split("data:", 1)[1].strip()) == [60_000]
        time.sleep(0.7)
        http.get(url + "config")
        assert Path(kept).exists()


def test_an_upload_needs_its_length(server):
    url, _ = server

    def chunks():
        yield b"--x\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.bin\"\r\n\r\nabc\r\n--x--\r\n"
    with httpx.Client(timeout=30) as http:
        answer = http.post(url + "gradio_api/upload", content=chunks(),
                           headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert answer.status_code == 411 and "Content-Length" in answer.text
