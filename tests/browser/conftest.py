"""The app as users start it, opened in the real headless Chromium of tests/conftest.py."""
from __future__ import annotations

import pytest

from tests.conftest import open_page, selftest_app


@pytest.fixture(scope="session")
def app_server(tmp_path_factory, selftest_models_dir):
    """The app as users start it, on the self-test model, with a preview after every step and no latents kept: one
    per worker process, shared by the browser files it runs one after the other (each opens its own page). Its
    outputs, history and log hold the earlier files' runs: a test looks for its own (a prompt of its own), and
    a job a test leaves running is cancelled before the test ends."""
    with selftest_app(tmp_path_factory, selftest_models_dir, "browser", "--preview-every", "0",
                      "--latents-hours", "0") as app:
        yield app


@pytest.fixture(scope="module")
def page(browser, app_server):
    with open_page(browser, app_server["url"]) as page:
        yield page
