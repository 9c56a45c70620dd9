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
from typing import Callable

from tests.system_packages import (already_here, apt_allowed as _apt_allowed, command, install_and_find, is_root,
                                   read_os_release, say, sudo_without_password)

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


def apt_allowed(os_release: dict[str, str], root: bool, sudo: Callable[[], bool],
                which: Callable[[str], str | None] = shutil.which) -> tuple[bool, str]:
    """(whether apt-get may install Debian's chromium here, why not when it may not)."""
    return _apt_allowed(os_release, root, sudo, which, "Ubuntu's chromium package only installs a snap")


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
    here = already_here(ENV, _runnable, "a browser", NoBrowser, find_installed)
    if here:
        return here
    allowed = (apt_allowed(read_os_release(), is_root(), sudo_without_password) if _system() == "linux"
               else (False, "not Linux"))
    if install_and_find(APT_PACKAGES, allowed, find_installed, "browser", "Playwright's own Chromium"):
        return find_installed(), "Debian's chromium package, installed now with apt-get"
    found = playwright_browser()
    if found:
        return found, "Playwright's own Chromium, downloaded earlier"
    say("downloading Playwright's own Chromium (python -m playwright install chromium, once)")
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
    return command(provide, NoBrowser, "browser", "the page tests")


if __name__ == "__main__":
    sys.exit(main())
