"""Several videos from one Generate (the Videos box, the settings' count): the status says which one runs, the end
names every output, and History lists each."""
from __future__ import annotations

from tests.browser.test_long_videos import _choose
from tests.browser.test_pages import _open_tab, _set_number, _status
from tests.conftest import Screenshots

PROMPT = "two paper boats on a pond"
# Every status text the page shows, kept in the page as it changes (a short video may pass in less than a poll).
WATCH_STATUS = """() => { window.__statuses = [];
    const box = document.querySelector('#t2v-status');
    new MutationObserver(() => window.__statuses.push(box.innerText))
        .observe(box, {subtree: true, childList: true, characterData: true}); }"""


def test_the_videos_box_makes_two_videos_that_the_status_and_history_name(page, shot: Screenshots):
    from playwright.sync_api import expect

    _open_tab(page, "Text to Video")
    _choose(page, "t2v-preset", "Self-test T2V - tiny offline model")
    page.locator("#t2v-prompt textarea").fill(PROMPT)
    for name, value in (("width", 64), ("height", 64), ("frames", 9), ("steps", 4), ("seed", 5), ("count", 2)):
        _set_number(page, f"t2v-{name}", value)
    expect(page.locator("#t2v-count input")).to_have_value("2")
    page.evaluate(WATCH_STATUS)
    page.locator("#t2v-generate").click()
    status = page.locator("#t2v-status")
    expect(status).to_contain_text("Done in", timeout=180_000)
    final = _status(page)
    assert "2 outputs, seeds 5, 6" in final, final
    seen = page.evaluate("() => window.__statuses")
    assert any("Video 2 of 2" in text for text in seen), seen[-5:]
    shot(page, "t2v-two-videos-done")
    _open_tab(page, "History")
    page.locator("#history-refresh").click()
    items = page.locator("#history-gallery .thumbnail-item", has_text=PROMPT)
    expect(items).to_have_count(2, timeout=30_000)
    shot(page, "history-two-videos")
    _open_tab(page, "Text to Video")
    _set_number(page, "t2v-count", 1)
