"""Listening on the network always needs a password."""
from __future__ import annotations

import re
import subprocess
import time

import pytest
from gradio_client import Client

from tests.conftest import ROOT, app_command, app_env, free_port

pytestmark = pytest.mark.server


def test_listen_without_auth_generates_a_password_and_refuses_strangers(tmp_path, selftest_models_dir):
    port = free_port()
    proc = subprocess.Popen(
        app_command("--listen", "--no-browser", "--port", str(port), "--outputs", str(tmp_path / "out"),
                    "--models-dir", str(selftest_models_dir)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=app_env(), cwd=ROOT)
    try:
        printed, password = "", None
        deadline = time.time() + 120
        while time.time() < deadline and "is running at" not in printed:
            line = proc.stdout.readline()
            if not line:
                break
            printed += line
            found = re.search(r"user: (\S+)\s+password: (\S+)", line)
            if found:
                user, password = found.groups()
        assert password, printed
        # The app's own start-up line, not gradio's (nor its tip about share=True).
        assert f"Wan Studio is running at http://localhost:{port}/ (Ctrl+C stops it)" in printed, printed
        assert "share=True" not in printed and "Running on" not in printed
        url = f"http://127.0.0.1:{port}/"
        with pytest.raises(Exception):
            Client(url, verbose=False)
        with pytest.raises(Exception):
            Client(url, auth=(user, "wrong-password"), verbose=False)
        client = Client(url, auth=(user, password), verbose=False)
        assert "/text_to_video" in client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_auth_refuses_a_wrong_password_and_accepts_the_right_one(locked):
    """As gradio_client logs in. (What a request without the login cookie gets, and the throttle of wrong passwords:
    tests/ui/test_requests_in_process.py.)"""
    url = locked["url"]
    for auth in (None, ("alice", "wrong"), ("bob", "s3cret-pass"), ("alice", "")):
        with pytest.raises(Exception):
            Client(url, auth=auth, verbose=False)
    client = Client(url, auth=("alice", "s3cret-pass"), verbose=False)
    video, _, _, seed, *_ = client.predict("selftest-t2v", "a fox", "", "selftest-t2v", 64, 64, 9, 2, 5.0, 3.0, 3,
                                           api_name="/text_to_video")
    assert seed == 3 and video


def _auth_for(*argv: str):
    """resolve_auth for these serve arguments (nothing is started: --share needs no network here)."""
    import app
    from ui.startup import resolve_auth

    return resolve_auth(app.parse_args(list(argv)))


@pytest.mark.parametrize("argv", [["--share"], ["--listen"], ["--host", "0.0.0.0"], ["--host", "192.168.1.20"],
                                  ["--share", "--listen"]])
def test_reachable_from_other_machines_always_needs_a_password(argv, capsys):
    user, password = _auth_for(*argv)
    assert user == "wan" and len(password) >= 12
    assert f"password: {password}" in capsys.readouterr().out
    # Each start makes a new one.
    assert _auth_for(*argv)[1] != password


@pytest.mark.parametrize("argv", [["--share"], ["--listen"], ["--host", "0.0.0.0"], []])
def test_a_given_password_is_used_as_is(argv, capsys):
    assert _auth_for(*argv, "--auth", "alice:pa:ss") == ("alice", "pa:ss")
    assert "password" not in capsys.readouterr().out


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_this_machine_only_needs_no_password(host):
    assert _auth_for("--host", host) is None


@pytest.mark.parametrize("auth", ["alice", "alice:", ":pass"])
def test_a_malformed_auth_is_refused(auth):
    with pytest.raises(SystemExit, match="--auth must look like user:password"):
        _auth_for("--share", "--auth", auth)


# ----- what every request passes first (ui/guard.py) ---------------------------------------------------
@pytest.fixture(scope="module")
def locked(tmp_path_factory, selftest_models_dir):
    """An app with a password, as colleagues on a network use it."""
    from tests.conftest import selftest_app

    with selftest_app(tmp_path_factory, selftest_models_dir, "locked", "--auth", "alice:s3cret-pass") as app:
        yield app


# A request for another host name, and wrong passwords from one address: tests/ui/test_requests_in_process.py.


def test_gradio_s_own_cancel_route_needs_a_login(locked):
    import httpx

    answer = httpx.post(locked["url"] + "gradio_api/cancel", timeout=10,
                        json={"session_hash": "someone", "fn_index": 0, "event_id": "x"})
    assert answer.status_code == 401


def test_a_cancel_is_bound_to_the_login_not_to_a_session_id_someone_sent(locked):
    """Two colleagues with the one password: the second, knowing the first's session id, still cannot cancel."""
    import httpx

    first = Client(locked["url"], auth=("alice", "s3cret-pass"), verbose=False)
    job = first.submit("selftest-t2v", "a long one", "", "selftest-t2v", 256, 256, 33, 200, 5.0, 3.0, 1,
                       api_name="/text_to_video")
    deadline = time.time() + 60
    while not any("Denoising: step" in str(o[1]) for o in job.outputs()):
        assert time.time() < deadline and not job.done()
        time.sleep(0.1)
    with httpx.Client(timeout=10) as other:
        assert other.post(locked["url"] + "login", data={"username": "alice", "password": "s3cret-pass"}).status_code == 200
        for route, body in (("gradio_api/call/cancel", {"data": [], "session_hash": first.session_hash}),
                            ("gradio_api/cancel", {"session_hash": first.session_hash, "fn_index": 0,
                                                   "event_id": "x"})):
            refused = other.post(locked["url"] + route, json=body)
            assert refused.status_code == 403 and "belongs to another login" in refused.text, (route, refused.text)
        # Nor can it read that session's events.
        stream = other.get(locked["url"] + "gradio_api/queue/data", params={"session_hash": first.session_hash})
        assert stream.status_code == 403
        # Its own session is its own.
        posted = other.post(locked["url"] + "gradio_api/call/cancel", json={"data": [], "session_hash": "its-own"})
        answer = other.get(locked["url"] + "gradio_api/call/cancel/" + posted.json()["event_id"]).text
    assert "Nothing of yours is running or waiting" in answer, answer
    time.sleep(1.0)
    assert not job.done(), "another login's cancel stopped the job"
    assert "Cancelling your job" in first.predict(api_name="/cancel")
    assert "Cancelled during the denoising" in job.result(timeout=60)[1]


def test_a_raw_api_client_cancels_its_own_job_with_its_session_id(shared_app):
    import httpx

    from tests.helpers.api import OVERRIDES

    url = shared_app["url"]   # no password
    with httpx.Client(timeout=60) as http:
        mine = {"session_hash": "my-own-session"}
        data = ["selftest-t2v", "a long one", "", "selftest-t2v", 256, 256, 33, 200, 5.0, 3.0, 1, *OVERRIDES]
        event = http.post(url + "gradio_api/call/text_to_video", json={"data": data, **mine}).json()["event_id"]
        with http.stream("GET", url + f"gradio_api/call/text_to_video/{event}") as stream:
            lines = stream.iter_lines()
            for line in lines:
                if "Denoising: step" in line:
                    break
            # The cancel runs once posted (its own answer shares the session's stream: read the job's instead).
            assert http.post(url + "gradio_api/call/cancel", json={"data": [], **mine}).status_code == 200
            assert any("Cancelled during the denoising" in line for line in lines)


def test_an_upload_belongs_to_the_login_that_uploaded_it(locked, image_file):
    """A colleague who learns the path of another's upload can neither download it nor animate it."""
    import httpx

    from tests.helpers.api import I2V_TAIL, OVERRIDES

    def logged_in_client():
        http = httpx.Client(timeout=60)
        assert http.post(locked["url"] + "login", data={"username": "alice", "password": "s3cret-pass"}).status_code == 200
        return http

    from contextlib import closing

    with closing(logged_in_client()) as mine, closing(logged_in_client()) as theirs, open(image_file, "rb") as f:
        [path] = mine.post(locked["url"] + "gradio_api/upload", files={"files": ("photo.png", f, "image/png")}).json()
        assert mine.get(locked["url"] + f"gradio_api/file={path}").content == image_file.read_bytes()
        assert theirs.get(locked["url"] + f"gradio_api/file={path}").status_code == 403
        record = {"path": path, "meta": {"_type": "gradio.FileData"}}
        data = [record, None, *I2V_TAIL, *OVERRIDES]
        refused = theirs.post(locked["url"] + "gradio_api/call/image_to_video", json={"data": data})
        assert refused.status_code == 403 and "uploaded by another login" in refused.text
        posted = mine.post(locked["url"] + "gradio_api/call/image_to_video", json={"data": data})
        assert posted.status_code == 200
        answer = mine.get(locked["url"] + "gradio_api/call/image_to_video/" + posted.json()["event_id"]).text
    assert "Done in" in answer, answer[-800:]
