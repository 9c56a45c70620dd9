"""How the test command finds or installs the Prometheus server the monitoring test starts (tests/prometheus_setup.py):
the release archive for each system, its unpacking (from a local archive: no network here), and the one line it
says."""
from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.conftest import ROOT
from tests.prometheus_setup import ENV, NoPrometheus, download, find_installed, release_asset
from tests.system_packages import install_and_find

SCRIPT = b"#!/bin/sh\necho prometheus, version 0.0.0\n"


def test_each_system_gets_its_own_release_archive():
    url, folder = release_asset("Linux", "x86_64", "2.53.4")
    assert url.endswith("/v2.53.4/prometheus-2.53.4.linux-amd64.tar.gz") and folder == "prometheus-2.53.4.linux-amd64"
    assert release_asset("Darwin", "arm64", "2.53.4")[1] == "prometheus-2.53.4.darwin-arm64"
    assert release_asset("Windows", "AMD64", "2.53.4")[0].endswith(".windows-amd64.zip")
    with pytest.raises(NoPrometheus, match="makes no release for Linux on riscv64"):
        release_asset("Linux", "riscv64")


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_release_archive_is_unpacked_into_the_environment_and_found_there(tmp_path, kind):
    folder = "prometheus-9.9.9.linux-amd64"
    archive = tmp_path / f"{folder}.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(archive, "w") as packed:
            packed.writestr(f"{folder}/prometheus", SCRIPT)
    else:
        with tarfile.open(archive, "w:gz") as packed:
            entry = tarfile.TarInfo(f"{folder}/prometheus")
            entry.size, entry.mode = len(SCRIPT), 0o644
            packed.addfile(entry, io.BytesIO(SCRIPT))
    prefix = tmp_path / "venv"
    program = download(archive.as_uri(), folder, prefix / "prometheus")
    assert subprocess.run([program], capture_output=True, text=True).stdout.startswith("prometheus, version")
    assert find_installed(which=lambda name: None, prefix=str(prefix)) == program
    assert find_installed(which=lambda name: None, prefix=str(tmp_path / "elsewhere")) is None


def test_apt_get_is_left_alone_where_it_may_not_be_used(capsys):
    assert install_and_find(("prometheus",), (False, "not a Debian-family system"), lambda: "/x", "Prometheus",
                            "Prometheus' own release") is None
    assert "no Prometheus found, and apt-get is not used (not a Debian-family system)" in capsys.readouterr().err


def test_the_command_prints_the_path_it_chose_or_says_what_to_do(tmp_path):
    program = tmp_path / "prometheus"
    program.write_bytes(SCRIPT)
    program.chmod(0o755)
    chosen = subprocess.run([sys.executable, "-m", "tests.prometheus_setup"], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", ENV: str(program)}, timeout=60)
    assert chosen.returncode == 0 and chosen.stdout.strip() == str(program)
    assert chosen.stderr.count("\n") == 1 and f"(set by {ENV})" in chosen.stderr
    wrong = subprocess.run([sys.executable, "-m", "tests.prometheus_setup"], cwd=ROOT, capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", ENV: str(tmp_path / "nothing")}, timeout=60)
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert "is not a prometheus program that can run" in wrong.stderr and "unset it" in wrong.stderr
