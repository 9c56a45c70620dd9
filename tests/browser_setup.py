"""The browser the page tests drive: one already on this machine, or one installed for them.

``./launch.sh test`` and ``launch.bat test`` run ``python -m tests.browser_setup`` before pytest.
It says in one line (on stderr) which browser the tests will use and how it was found, and prints
its path (on stdout), which the launchers hand to pytest as WAN_TEST_BROWSER. In order:

1. WAN_TEST_BROWSER, when set: a Chromium-family browser of your choice;
2. a Chromium-family browser already installed (Chromium, Chrome or Edge);
3. Debian's ``chromium`` package through apt-get, where this user may install packages (root, or
   sudo without a password) and the system is Debian (Ubuntu's package only installs a snap);
4. Playwright's own Chromium (``python -m playwright install chromium``, a download of ~150 MB).

Exit code 1, with what to do, when none of them works: the page tests never skip silently.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

# Names on PATH, in order of preference.
PATH_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "msedge",
              "microsoft-edge")
# Where installers put them when they are not on PATH.
KNOWN_PATHS = {
    "linux": ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome",
              "/snap/bin/chromium", "/usr/bin/microsoft-edge"),
    "darwin": ("/Applications/Chromium.app/Contents/MacOS/Chromium",
               "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
               "/Applications/Microsoft Edge.app/Contents/MacOS/Microsoft Edge"),
    "windows": (r"%ProgramFiles%\Google\Chrome\Application\chrome.exe",
                r"%ProgramFiles(x86)%\Google\Chrome\Application\chrome.exe",
                r"%LocalAppData%\Google\Chrome\Application\chrome.exe",
                r"%ProgramFiles(x86)%\Microsoft\Edge\Application\msedge.exe",
                r"%ProgramFiles%\Microsoft\Edge\Application\msedge.exe"),
}
APT_PACKAGES = ("chromium", "fonts-dejavu-core")   # a font, so that screenshots show text
ENV = "WAN_TEST_BROWSER"


class NoBrowser(RuntimeError):
    """No browser could be found or installed; the message says what to do."""


def _expand(path: str) -> str:
    """%NAME% replaced by the environment's value (Windows' notation, on any system, for the tests)."""
    return re.sub(r"%([^%]+)%", lambda m: os.environ.get(m.group(1), m.group(0)), path)


def _system() -> str:
    return platform.system().lower()


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_installed(system: str | None = None, which: Callable[[str], str | None] = shutil.which,
                   runnable: Callable[[str], bool] = _runnable) -> str | None:
    """The path of a Chromium-family browser already on this machine, or None."""
    system = system or _system()
    for name in PATH_NAMES:
        found = which(name)
        if found and runnable(found):
            return found
    for path in KNOWN_PATHS.get(system, ()):
        path = _expand(path)
        if runnable(path):
            return path
    return None


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
                which: Callable[[str], str | None] = shutil.which) -> tuple[bool, str]:
    """(whether apt-get may install Debian's chromium here, why not when it may not)."""
    family = f"{os_release.get('ID', '')} {os_release.get('ID_LIKE', '')}".lower().split()
    if not which("apt-get"):
        return False, "no apt-get on this system"
    if "debian" not in family:
        return False, "not a Debian-family system"
    if "ubuntu" in family:
        return False, "Ubuntu's chromium package only installs a snap"
    if not is_root and not sudo_without_password():
        return False, "installing packages needs root (sudo asks for a password)"
    return True, ""


def _sudo_without_password() -> bool:
    if not shutil.which("sudo"):
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


def _say(text: str) -> None:
    print(f"[test] {text}", file=sys.stderr, flush=True)


def _install_with_apt(is_root: bool) -> None:
    prefix = [] if is_root else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *APT_PACKAGES]):
        # apt's own output goes to stderr, so that stdout carries only the browser's path.
        subprocess.run([*prefix, *command], env=env, check=True, stdout=sys.stderr)


def playwright_browser() -> str | None:
    """The path of Playwright's own Chromium when it has been downloaded, else None."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        path = playwright.chromium.executable_path
    return path if path and os.path.isfile(path) else None


def _install_with_playwright() -> None:
    subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"], check=True, stdout=sys.stderr)


def provide() -> tuple[str, str]:
    """(the browser's path, how it was got); installs one when there is none. Raises NoBrowser."""
    chosen = os.environ.get(ENV, "").strip()
    if chosen:
        if not _runnable(chosen):
            raise NoBrowser(f"{ENV}={chosen} is not a browser that can run; point it to a Chromium, Chrome or "
                            f"Edge executable, or unset it to let the tests find or install one")
        return chosen, f"set by {ENV}"
    found = find_installed()
    if found:
        return found, "already on this machine"
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    allowed, why_not = (apt_allowed(read_os_release(), is_root, _sudo_without_password)
                        if _system() == "linux" else (False, "not Linux"))
    if allowed:
        _say("no browser found: installing Debian's chromium package with apt-get (once)")
        try:
            _install_with_apt(is_root)
        except (OSError, subprocess.CalledProcessError) as exc:
            _say(f"apt-get could not install chromium ({exc}); trying Playwright's own Chromium instead")
        else:
            found = find_installed()
            if found:
                return found, "Debian's chromium package, installed now with apt-get"
    else:
        _say(f"no browser found, and apt-get is not used ({why_not})")
    found = playwright_browser()
    if found:
        return found, "Playwright's own Chromium, downloaded earlier"
    _say("downloading Playwright's own Chromium (python -m playwright install chromium, once)")
    try:
        _install_with_playwright()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NoBrowser(f"the download of Playwright's Chromium failed ({exc}). Install Chromium, Chrome or "
                        f"Edge, or set {ENV} to one, and run the tests again") from None
    found = playwright_browser()
    if not found:
        raise NoBrowser(f"Playwright's Chromium is not where Playwright says it would be. Install Chromium, "
                        f"Chrome or Edge, or set {ENV} to one, and run the tests again")
    return found, "Playwright's own Chromium, downloaded now"


def main() -> int:
    try:
        path, how = provide()
    except NoBrowser as exc:
        _say(f"ERROR: no browser for the page tests: {exc}")
        return 1
    _say(f"browser for the page tests: {path} ({how})")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
