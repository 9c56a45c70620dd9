"""A second probe of the running app, finding by finding: every way of writing the same request gets one answer.

A real app with a password, two logins with that one password (as colleagues share it), raw HTTP as a probe
writes it. "Theirs" is the other login.
"""
from __future__ import annotations

import http.client
import json
import subprocess
import time
import urllib.parse
import uuid
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from gradio_client import Client

from tests.conftest import ROOT, app_command, app_env, running_app, selftest_app
from tests.helpers.api import I2V_TAIL, OVERRIDES
from ui.guard.holdings import SESSIONS_PER_LOGIN

pytestmark = pytest.mark.server

USER, PASSWORD = "alice", "secret1"
LONG_JOB = ["selftest-t2v", "a long one", "", "selftest-t2v", 128, 128, 17, 60, 5.0, 3.0, 1]


@pytest.fixture(scope="module")
def locked(tmp_path_factory, selftest_models_dir):
    with selftest_app(tmp_path_factory, selftest_models_dir, "probe", "--auth", f"{USER}:{PASSWORD}") as app:
        yield app


def logged_in(app) -> httpx.Client:
    http = httpx.Client(base_url=app["url"], timeout=60)
    assert http.post("login", data={"username": USER, "password": PASSWORD}).status_code == 200
    return http


def raw_get(app, path: str) -> tuple[int, dict, bytes]:
    """GET exactly this path (httpx and browsers fold '//' and '/./'; a probe does not), with the login's cookies."""
    connection = http.client.HTTPConnection("127.0.0.1", urllib.parse.urlsplit(app["url"]).port, timeout=20)
    try:
        connection.request("GET", path, headers={"Cookie": app["cookie"]} if "cookie" in app else {})
        reply = connection.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        connection.close()


def cookie_of(http: httpx.Client) -> str:
    return "; ".join(f"{name}={value}" for name, value in http.cookies.items())


def wait_for_step(job) -> None:
    deadline = time.time() + 60
    while not any("Denoising: step" in str(o[1]) for o in job.outputs()):
        assert time.time() < deadline and not job.done(), job.outputs()[-1:] if job.outputs() else "no output"
        time.sleep(0.1)


def test_another_login_cannot_read_or_end_a_job_however_it_writes_the_session_id(locked):
    """Finding 1: a session id given twice, or by another route, neither reads nor stops another login's job."""
    mine = Client(locked["url"], auth=(USER, PASSWORD), verbose=False)
    before = set(locked["outputs"].rglob("*.mp4"))
    job = mine.submit(*LONG_JOB, api_name="/text_to_video")
    wait_for_step(job)
    victim = mine.session_hash
    with closing(logged_in(locked)) as theirs:
        for query in (f"session_hash=own-{uuid.uuid4().hex}&session_hash={victim}",
                      f"session_hash={victim}&session_hash=own-{uuid.uuid4().hex}"):
            refused = theirs.get(f"gradio_api/queue/data?{query}")
            assert refused.status_code == 400 and "'session_hash' twice" in refused.text, refused.text
        assert theirs.get("gradio_api/queue/data", params={"session_hash": victim}).status_code == 403
        with theirs.stream("GET", f"gradio_api/heartbeat/{victim}") as beat:
            assert beat.status_code == 403         # a heartbeat that ends closes its session's jobs
        for route in ("gradio_api//queue/data", "gradio_api/./queue/data", "gradio_api/queue//data"):
            status, _, _ = raw_get({**locked, "cookie": cookie_of(theirs)}, f"/{route}?session_hash={victim}")
            assert status == 404, route
        cancel = {"session_hash": victim, "fn_index": 0, "event_id": "x"}
        for kind in ("application/JSON", "application/json; charset=UTF-8", None):
            headers = {"Content-Type": kind} if kind else {}
            refused = theirs.post("gradio_api/cancel", content=json.dumps(cancel), headers=headers)
            assert refused.status_code == 403, (kind, refused.status_code, refused.text)
        twice = '{"session_hash": "own", "fn_index": 0, "event_id": "x", "session_hash": "%s"}' % victim
        assert theirs.post("gradio_api/cancel", content=twice).status_code == 400
        refused = theirs.post("gradio_api/cancel", content=json.dumps(cancel), headers={"Content-Type": "text/plain"})
        assert refused.status_code == 415
    result = job.result(timeout=120)
    assert "Done in" in result[1], result[1]
    assert len(set(locked["outputs"].rglob("*.mp4")) - before) == 1


def test_many_sessions_of_one_login_never_free_another_login_s_session(locked):
    """Finding 2: one login opening more sessions than it may keep pushes out only its own."""
    mine = Client(locked["url"], auth=(USER, PASSWORD), verbose=False)
    assert "Done in" in mine.predict("selftest-t2v", "first", "", "selftest-t2v", 64, 64, 9, 1, 5.0, 3.0, 2,
                                     api_name="/text_to_video")[1]
    with closing(logged_in(locked)) as theirs:
        for _ in range(SESSIONS_PER_LOGIN + 50):
            with theirs.stream("GET", f"gradio_api/heartbeat/{uuid.uuid4().hex}") as beat:
                assert beat.status_code == 200
        assert theirs.get("gradio_api/queue/data", params={"session_hash": mine.session_hash}).status_code == 403
    assert "Done in" in mine.predict("selftest-t2v", "second", "", "selftest-t2v", 64, 64, 9, 1, 5.0, 3.0, 3,
                                     api_name="/text_to_video")[1]


def test_another_login_s_upload_is_theirs_under_every_spelling(locked, image_file):
    """Finding 3: '//', '/./', '..', a link, gradio's other file route, a content type in capitals."""
    with closing(logged_in(locked)) as mine, closing(logged_in(locked)) as theirs, open(image_file, "rb") as f:
        [path] = mine.post("gradio_api/upload", files={"files": ("secret.png", f, "image/png")}).json()
        head, name = path.rsplit("/", 1)
        spellings = [path, f"{head}//{name}", f"{head}/./{name}", f"{head}/../{Path(head).name}/{name}",
                     head.replace("/", "//", 2) + "/" + name]
        assert raw_get({**locked, "cookie": cookie_of(mine)}, f"/gradio_api/file={path}")[0] == 200
        for spelling in spellings:
            for url in (f"/gradio_api/file={spelling}", f"/gradio_api/file={urllib.parse.quote(spelling)}",
                        f"/gradio_api/file/{spelling}", f"/gradio_api/file/{spelling.lstrip('/')}"):
                status, _, body = raw_get({**locked, "cookie": cookie_of(theirs)}, url)
                assert status in (403, 404) and body != image_file.read_bytes(), (url, status)
        for spelling in spellings:
            record = {"path": spelling, "meta": {"_type": "gradio.FileData"}}
            body = json.dumps({"data": [record, None, *I2V_TAIL, *OVERRIDES]})
            for kind in ("application/JSON", "application/json", None):
                headers = {"Content-Type": kind} if kind else {}
                refused = theirs.post("gradio_api/call/image_to_video", content=body, headers=headers)
                assert refused.status_code == 403 and "uploaded by another login" in refused.text, (spelling, kind)
        # Nothing of theirs was kept in the shared outputs.
        assert not list(locked["outputs"].rglob("secret.first.png"))


@pytest.mark.parametrize("suffix", [".html", ".htm", ".shtml", ".xhtml", ".svg", ".xml", ".js", ".mjs", ".xsl",
                                    ".json", ".txt"])
def test_every_file_that_is_not_media_is_served_as_a_text_download(locked, suffix):
    """Finding 4: a page or a script among the outputs never runs as one, on any route."""
    trap = locked["outputs"] / f"trap{suffix}"
    trap.write_text("<html><script>alert(1)</script></html>")
    with closing(logged_in(locked)) as http:
        answer = http.get(f"gradio_api/file={trap.resolve()}")
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"
        assert answer.headers["content-disposition"].startswith("attachment")
        assert answer.headers["x-content-type-options"] == "nosniff"
        status, _, _ = raw_get({**locked, "cookie": cookie_of(http)}, f"/gradio_api/file/{trap.resolve()}")
        assert status == 404
    trap.unlink()


def test_media_is_served_inline_with_its_own_type(locked):
    mine = Client(locked["url"], auth=(USER, PASSWORD), verbose=False)
    mine.predict("selftest-t2v", "served", "", "selftest-t2v", 64, 64, 9, 1, 5.0, 3.0, 4, api_name="/text_to_video")
    video = max(locked["outputs"].rglob("*.mp4"), key=lambda p: p.stat().st_mtime)
    with closing(logged_in(locked)) as http:
        for headers in ({}, {"Range": "bytes=0-99"}):
            answer = http.get(f"gradio_api/file={video.resolve()}", headers=headers)
            assert answer.status_code in (200, 206) and answer.headers["content-type"] == "video/mp4"
            assert answer.headers["content-disposition"].startswith("inline")
            assert answer.headers["x-content-type-options"] == "nosniff"


def test_a_request_from_another_web_page_is_refused(locked, image_file):
    """Finding 6 over raw HTTP (tests/browser/test_guard_in_browser.py sends it from a real page)."""
    with closing(logged_in(locked)) as http, open(image_file, "rb") as f:
        content = f.read()
        for headers in ({"Origin": "http://localhost:7997"}, {"Origin": "null"},
                        {"Referer": "http://127.0.0.1:7997/page.html"}):
            refused = http.post("gradio_api/upload", files={"files": ("x.png", content, "image/png")}, headers=headers)
            assert refused.status_code == 403 and "another web page" in refused.text, headers
        own = http.post("gradio_api/upload", files={"files": ("x.png", content, "image/png")},
                        headers={"Origin": locked["url"].rstrip("/")})
        assert own.status_code == 200


def test_a_web_address_is_not_taken_for_a_file(locked):
    """gradio would fetch it from the server: the app takes uploads only."""
    with closing(logged_in(locked)) as http:
        for address in ("http://169.254.169.254/latest/meta-data", "https://example.com/x.png", "file:///etc/passwd"):
            record = {"path": address, "meta": {"_type": "gradio.FileData"}}
            refused = http.post("gradio_api/call/image_to_video", json={"data": [record, None, *I2V_TAIL, *OVERRIDES]})
            assert refused.status_code == 400 and "upload the file instead" in refused.text, address
            assert http.get(f"gradio_api/file={address}").status_code == 404


def test_routes_the_page_does_not_use_are_not_answered(locked):
    with closing(logged_in(locked)) as http:
        for method, path in (("GET", "gradio_api/file/etc/passwd"), ("POST", "gradio_api/component_server"),
                             ("GET", "monitoring"), ("POST", "gradio_api/stream/x"), ("GET", "gradio_api/queue/status"),
                             ("GET", "gradio_api/proxy=http://127.0.0.1/"), ("POST", "gradio_api/vibe-edit")):
            assert http.request(method, path).status_code == 404, path
        # The page's own routes still answer.
        assert http.get("config").status_code == 200 and http.get("gradio_api/info").status_code == 200
    # Before the login, only the login page and what it loads.
    with httpx.Client(base_url=locked["url"], timeout=20) as stranger:
        assert stranger.get("").status_code == 200
        with stranger.stream("GET", f"gradio_api/heartbeat/{uuid.uuid4().hex}") as beat:
            assert beat.status_code == 401


def test_a_second_app_on_the_same_outputs_keeps_the_first_app_s_files(locked, tmp_path, selftest_models_dir):
    """Finding 8: another app on the outputs folder leaves the first one's served files; one on its port says so."""
    with closing(logged_in(locked)) as http:
        result = call(http, "text_to_video", ["selftest-t2v", "kept", "", "selftest-t2v", 64, 64, 9, 1, 5.0, 3.0, 5,
                                              *OVERRIDES])
        url = result[0]["video"]["url"] if "video" in result[0] else result[0]["url"]
        assert "/.served/" in url and http.get(url).status_code == 200
        with running_app(tmp_path / "second.log", "--auth", f"{USER}:{PASSWORD}", "--outputs",
                         str(locked["outputs"]), "--models-dir", str(selftest_models_dir)):
            assert http.get(url).status_code == 200
        port = urllib.parse.urlsplit(locked["url"]).port
        third = subprocess.run(app_command("--no-browser", "--port", str(port), "--outputs", str(locked["outputs"]),
                                           "--models-dir", str(selftest_models_dir)),
                               capture_output=True, text=True, env=app_env(), cwd=ROOT, timeout=120)
        assert third.returncode == 2, third.stderr
        assert third.stderr.strip() == f"Port {port} is in use (another Wan Studio?): start with --port {port + 1}" \
            or f"Port {port} is in use (another Wan Studio?): start with --port " in third.stderr, third.stderr
        assert "Traceback" not in third.stderr + third.stdout
        assert http.get(url).status_code == 200


def call(http: httpx.Client, api: str, data: list) -> list:
    """A raw API call and its result, as the README's curl lines make it."""
    event = http.post(f"gradio_api/call/{api}", json={"data": data}).json()["event_id"]
    reply = http.get(f"gradio_api/call/{api}/{event}").text
    assert "event: complete" in reply, reply[-600:]
    return json.loads(reply.split("event: complete", 1)[1].split("data:", 1)[1].strip())


# Finding 9 (the throttle: forty wrong passwords at once are forty tries): tests/ui/test_requests_in_process.py, on
# a clock of the test's own.

