"""The Prometheus server the monitoring tests start against the app: one already on this machine, or one installed
for them, as a user would run it.

``./launch.sh test`` and ``launch.bat test`` run ``python -m tests.prometheus_setup`` before pytest. It says in one
line (on stderr) which Prometheus the tests will use and how it was found, and prints its path (on stdout), which
the launchers hand to pytest as WAN_TEST_PROMETHEUS. In order:

1. WAN_TEST_PROMETHEUS, when set: a ``prometheus`` program of your choice;
2. ``prometheus`` on PATH, or the release downloaded earlier into the test environment (``.venv/prometheus/``);
3. the distribution's ``prometheus`` package through apt-get (Debian, Ubuntu), where this user may install packages;
4. Prometheus' own release for this system, downloaded from its GitHub releases (about 100 MB) into ``.venv/``.

Exit code 1, with what to do, when none of them works: the monitoring tests never skip silently.
"""
from __future__ import annotations

import os
import platform
import shutil
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from tests.system_packages import (already_here, apt_allowed, command, install_and_find, is_root, read_os_release,
                                   say, sudo_without_password)

ENV = "WAN_TEST_PROMETHEUS"
APT_PACKAGES = ("prometheus",)
# The long-term-support release downloaded where no package manager gives one (its classic graph page, which the
# screenshot test shows, is in every 2.x release).
RELEASE = "2.53.4"
RELEASES_URL = "https://github.com/prometheus/prometheus/releases/download"
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class NoPrometheus(RuntimeError):
    """No Prometheus could be found or installed; the message says what to do."""


def _program() -> str:
    return "prometheus.exe" if platform.system() == "Windows" else "prometheus"


def _runnable(path: str | Path) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def downloaded_folder(prefix: str | None = None) -> Path:
    """Where a downloaded release lives: in the test environment (``.venv``), removed with it."""
    return Path(prefix or sys.prefix) / "prometheus"


def find_installed(which=shutil.which, prefix: str | None = None) -> str | None:
    """The path of a Prometheus server already here: on PATH, or downloaded earlier; else None."""
    found = which("prometheus")
    if found and _runnable(found):
        return found
    for path in sorted(downloaded_folder(prefix).glob(f"*/{_program()}")):
        if _runnable(path):
            return str(path)
    return None


def release_asset(system: str, machine: str, release: str = RELEASE) -> tuple[str, str]:
    """(the release archive's URL, its top folder) for ``system`` (platform.system()) on ``machine``
    (platform.machine()); NoPrometheus on a system Prometheus makes no release for."""
    arch = ARCHES.get(machine.lower())
    name = system.lower()
    if arch is None or name not in ("linux", "darwin", "windows"):
        raise NoPrometheus(f"Prometheus makes no release for {system} on {machine}: install it yourself and set "
                           f"{ENV} to its prometheus program")
    folder = f"prometheus-{release}.{name}-{arch}"
    suffix = "zip" if name == "windows" else "tar.gz"
    return f"{RELEASES_URL}/v{release}/{folder}.{suffix}", folder


def download(url: str, folder: str, into: Path) -> str:
    """Fetch the release archive at ``url`` and unpack its ``folder`` under ``into``; the program's path."""
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into) as scratch:
        archive = Path(scratch) / url.rsplit("/", 1)[-1]
        with urllib.request.urlopen(url, timeout=60) as answer, open(archive, "wb") as out:
            shutil.copyfileobj(answer, out)
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as packed:
                packed.extractall(scratch)
        else:
            with tarfile.open(archive) as packed:
                packed.extractall(scratch, filter="data")
        shutil.rmtree(into / folder, ignore_errors=True)
        shutil.move(str(Path(scratch) / folder), str(into / folder))
    program = into / folder / _program()
    program.chmod(0o755)
    return str(program)


def provide() -> tuple[str, str]:
    """(the Prometheus program's path, how it was got); installs one when there is none. Raises NoPrometheus."""
    here = already_here(ENV, _runnable, "a prometheus program", NoPrometheus, find_installed)
    if here:
        return here
    allowed = (apt_allowed(read_os_release(), is_root(), sudo_without_password) if platform.system() == "Linux"
               else (False, "not Linux"))
    if install_and_find(APT_PACKAGES, allowed, find_installed, "Prometheus", "Prometheus' own release"):
        return find_installed(), "the prometheus package, installed now with apt-get"
    url, folder = release_asset(platform.system(), platform.machine())
    say(f"downloading Prometheus {RELEASE} ({url}, once)")
    try:
        return download(url, folder, downloaded_folder()), f"Prometheus {RELEASE}, downloaded now"
    except (OSError, tarfile.TarError, zipfile.BadZipFile, shutil.Error) as exc:
        raise NoPrometheus(f"the download of Prometheus failed ({exc}). Install Prometheus, or set {ENV} to its "
                           f"prometheus program, and run the tests again") from None


def main() -> int:
    return command(provide, NoPrometheus, "Prometheus", "the monitoring tests")


if __name__ == "__main__":
    sys.exit(main())
