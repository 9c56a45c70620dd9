"""How the test command finds or installs the browser the page tests drive (tests/browser_setup.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.browser_setup import ENV, apt_allowed, find_installed
from tests.conftest import ROOT


def _executable(folder, name: str):
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def _which_in(folder):
    def which(name):
        path = folder / name
        return str(path) if path.exists() else None
    return which


def test_a_browser_on_path_is_found_in_order_of_preference(tmp_path):
    _executable(tmp_path, "google-chrome")
    chromium = _executable(tmp_path, "chromium")
    assert find_installed("linux", which=_which_in(tmp_path)) == str(chromium)


def test_a_browser_file_that_cannot_run_is_not_taken(tmp_path):
    (tmp_path / "chromium").write_text("not executable")
    assert find_installed("linux", which=_which_in(tmp_path), runnable=lambda p: os.access(p, os.X_OK)
                          and str(tmp_path) in p) is None


def test_windows_and_mac_install_folders_are_looked_in(monkeypatch):
    monkeypatch.setenv("ProgramFiles(x86)", r"C:\Program Files (x86)")
    edge = r"C:\Program Files (x86)\Microsoft\Edge\Application\msedge.exe"
    assert find_installed("windows", which=lambda name: None, runnable=lambda p: p == edge) == edge
    assert find_installed("darwin", which=lambda name: None,
                          runnable=lambda p: p.endswith("Google Chrome")).endswith("Google Chrome")


def test_apt_is_used_only_on_debian_by_someone_who_may_install_packages():
    debian = {"ID": "debian"}
    which = {"apt-get": "/usr/bin/apt-get"}.get
    assert apt_allowed(debian, True, lambda: False, which) == (True, "")
    assert apt_allowed(debian, False, lambda: True, which) == (True, "")
    assert apt_allowed(debian, False, lambda: False, which) == (
        False, "installing packages needs root (sudo asks for a password)")
    assert apt_allowed({"ID": "ubuntu", "ID_LIKE": "debian"}, True, lambda: True, which)[1] == (
        "Ubuntu's chromium package only installs a snap")
    assert apt_allowed({"ID": "fedora"}, True, lambda: True, which)[1] == "not a Debian-family system"
    assert apt_allowed(debian, True, lambda: True, lambda name: None)[1] == "no apt-get on this system"


def test_the_command_says_which_browser_in_one_line_and_prints_its_path(tmp_path):
    chosen = _executable(tmp_path, "my-chromium")
    done = subprocess.run([sys.executable, "-m", "tests.browser_setup"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, ENV: str(chosen)})
    assert done.returncode == 0
    assert done.stdout == f"{chosen}\n"
    assert done.stderr == f"[test] browser for the page tests: {chosen} (set by {ENV})\n"


def test_a_browser_named_that_does_not_exist_is_refused_with_what_to_do(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tests.browser_setup"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, ENV: str(tmp_path / "nothing")})
    assert done.returncode == 1 and done.stdout == ""
    assert "is not a browser that can run" in done.stderr and "unset it" in done.stderr
