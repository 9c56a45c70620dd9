"""Installing a program the tests need from the system's packages: Debian's, through apt-get, where this user may
(root, or sudo without a password). Used by tests/browser_setup.py (Chromium) and tests/prometheus_setup.py."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence


def read_os_release(path: str = "/etc/os-release") -> dict[str, str]:
    values = {}
    try:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip().strip('"')
    except OSError:
        pass
    return values


def apt_allowed(os_release: dict[str, str], is_root: bool, sudo_without_password: Callable[[], bool],
                which: Callable[[str], str | None] = shutil.which, ubuntu_says: str = "") -> tuple[bool, str]:
    """(whether apt-get may install packages here, why not when it may not); ``ubuntu_says``: why a package
    must not come from Ubuntu's apt-get, if it must not ("" when Ubuntu's package will do)."""
    family = f"{os_release.get('ID', '')} {os_release.get('ID_LIKE', '')}".lower().split()
    if not which("apt-get"):
        return False, "no apt-get on this system"
    if "debian" not in family:
        return False, "not a Debian-family system"
    if "ubuntu" in family and ubuntu_says:
        return False, ubuntu_says
    if not is_root and not sudo_without_password():
        return False, "installing packages needs root (sudo asks for a password)"
    return True, ""


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def sudo_without_password() -> bool:
    if not shutil.which("sudo"):
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


def install_with_apt(packages: Sequence[str], root: bool) -> None:
    """apt-get update and install ``packages`` (its output on stderr: stdout carries only the found path)."""
    prefix = [] if root else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
        subprocess.run([*prefix, *command], env=env, check=True, stdout=sys.stderr)


def say(text: str) -> None:
    print(f"[test] {text}", file=sys.stderr, flush=True)


def chosen_by(env: str, runnable: Callable[[str], bool], what: str, error: type[Exception]) -> tuple[str, str] | None:
    """(the path ``env`` names, how it was got), or None when it is unset; ``error`` when it names nothing that
    runs (``what``: "a browser", "a prometheus program")."""
    value = os.environ.get(env, "").strip()
    if not value:
        return None
    if not runnable(value):
        raise error(f"{env}={value} is not {what} that can run; point it to {what}, or unset it to let the tests "
                    f"find or install one")
    return value, f"set by {env}"


def already_here(env: str, runnable: Callable[[str], bool], what: str, error: type[Exception],
                 find: Callable[[], str | None]) -> tuple[str, str] | None:
    """(the program ``env`` names, else one ``find`` finds on this machine; how it was got), or None."""
    found = chosen_by(env, runnable, what, error)
    if found:
        return found
    path = find()
    return (path, "already on this machine") if path else None


def install_and_find(packages: Sequence[str], allowed: tuple[bool, str], find: Callable[[], str | None],
                     what: str, otherwise: str) -> str | None:
    """Install ``packages`` with apt-get where ``allowed`` (apt_allowed's answer) and find the program again; None
    (having said why) where apt-get may not be used or failed, before the tests try ``otherwise``."""
    may, why_not = allowed
    if not may:
        say(f"no {what} found, and apt-get is not used ({why_not})")
        return None
    say(f"no {what} found: installing {' '.join(packages)} with apt-get (once)")
    try:
        install_with_apt(packages, is_root())
    except (OSError, subprocess.CalledProcessError) as exc:
        say(f"apt-get could not install {' '.join(packages)} ({exc}); trying {otherwise} instead")
        return None
    return find()


def command(provide: Callable[[], tuple[str, str]], error: type[Exception], thing: str, purpose: str) -> int:
    """The setup modules' command: the program's path on stdout and one line on stderr saying how it was got; 1
    with what to do when there is none."""
    try:
        path, how = provide()
    except error as exc:
        say(f"ERROR: no {thing} for {purpose}: {exc}")
        return 1
    say(f"{thing} for {purpose}: {path} ({how})")
    print(path)
    return 0
