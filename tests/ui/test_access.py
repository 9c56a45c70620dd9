"""Listening on the network always needs a password."""
from __future__ import annotations

import re
import subprocess
import time

import pytest
from gradio_client import Client

from tests.conftest import ROOT, app_command, app_env, free_port


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


def test_auth_refuses_a_wrong_password_and_accepts_the_right_one(tmp_path, selftest_models_dir):
    import httpx

    from tests.ui.test_security import OVERRIDES, running_app

    with running_app(tmp_path / "app.log", "--auth", "alice:s3cret-pass", "--outputs", str(tmp_path / "out"),
                     "--models-dir", str(selftest_models_dir)) as (url, _):
        for auth in (None, ("alice", "wrong"), ("bob", "s3cret-pass"), ("alice", "")):
            with pytest.raises(Exception):
                Client(url, auth=auth, verbose=False)
        # Without the login cookie the API, the uploads and the files are closed.
        with httpx.Client(timeout=10) as http:
            assert http.get(url + "config").status_code == 401
            assert http.post(url + "gradio_api/queue/join", json={
                "data": ["selftest-t2v", "x", "", "selftest-t2v", 64, 64, 9, 1, 5.0, 3.0, 1, *OVERRIDES],
                "fn_index": 0, "session_hash": "stranger"}).status_code == 401
            assert http.post(url + "gradio_api/run/cancel", json={"data": []}).status_code == 401
            assert http.post(url + "gradio_api/upload", files={"files": ("a.png", b"x")}).status_code == 401
            wrong = http.post(url + "login", data={"username": "alice", "password": "wrong"})
            assert wrong.status_code == 400 and "Incorrect credentials" in wrong.text
        client = Client(url, auth=("alice", "s3cret-pass"), verbose=False)
        video, _, _, seed, *_ = client.predict("selftest-t2v", "a fox", "", "selftest-t2v", 64, 64, 9, 2, 5.0, 3.0, 3,
                                           api_name="/text_to_video")
        assert seed == 3 and video


def _auth_for(*argv: str):
    """resolve_auth for these serve arguments (nothing is started: --share needs no network here)."""
    import app

    return app.resolve_auth(app.parse_args(list(argv)))


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
