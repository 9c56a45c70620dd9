"""The app as users start it, opened in the real headless Chromium of tests/conftest.py."""
from __future__ import annotations

import pytest

from tests.conftest import open_page, selftest_app


@pytest.fixture(scope="module")
def app_server(tmp_path_factory, selftest_models_dir):
    """The app as users start it, on the self-test model, with a preview after every step (one per file: the page
    tests count the queue, the history and the jobs running, which other files' runs would change)."""
    with selftest_app(tmp_path_factory, selftest_models_dir, "browser", "--preview-every", "0",
                      "--latents-hours", "0") as app:
        yield app


@pytest.fixture(scope="module")
def page(browser, app_server):
    with open_page(browser, app_server["url"]) as page:
        yield page
