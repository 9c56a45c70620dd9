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
        while time.time() < deadline and "Running on" not in printed:
            line = proc.stdout.readline()
            if not line:
                break
            printed += line
            found = re.search(r"user: (\S+)\s+password: (\S+)", line)
            if found:
                user, password = found.groups()
        assert password, printed
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
