"""A long video on the page: the window boxes, and the window counter inside each step."""
from __future__ import annotations

from tests.browser.test_pages import _open_tab, _set_number, _set_text, _start_long_job, _status
from tests.conftest import Screenshots


def test_a_long_video_shows_its_windows_inside_each_step(page, shot: Screenshots):
    _open_tab(page, "Text to Video")
    _set_text(page, "t2v-model", "selftest-t2v")
    page.wait_for_function("() => document.querySelector('#t2v-window').innerText.includes('125 frames')")
    _start_long_job(page, "a long walk along the beach", frames=241, width=128, height=128, window=0, overlap=16)
    page.wait_for_function("() => /window [123] of 3|step \\d+\\/200 in 3 windows/"
                           ".test(document.querySelector('#t2v-status').innerText)")
    assert "window" in _status(page)
    shot(page, "t2v-long-video-windows")
    page.locator("#t2v-cancel").click()
    page.wait_for_function("() => document.querySelector('#t2v-status').innerText.includes('Cancelled')",
                           timeout=60_000)
    _set_number(page, "t2v-frames", 9)
    _set_number(page, "t2v-steps", 4)
    _set_number(page, "t2v-width", 64)
    _set_number(page, "t2v-height", 64)
