"""Several videos from one Generate (the Videos box, the settings' count): the status says which one runs, the end
names every output, and History lists each."""
from __future__ import annotations

import re

from tests.conftest import Screenshots
from tests.helpers.page import choose, frames_asked_per_second, generate, open_tab, set_number, status

PROMPT = "two paper boats on a pond"
# Every status text the page shows, kept in the page as it changes (a short video may pass in less than a poll).
WATCH_STATUS = """() => { window.__statuses = [];
    const box = document.querySelector('#t2v-status');
    new MutationObserver(() => window.__statuses.push(box.innerText))
        .observe(box, {subtree: true, childList: true, characterData: true}); }"""


def test_the_videos_box_makes_two_videos_that_the_status_and_history_name(page, shot: Screenshots):
    from playwright.sync_api import expect

    open_tab(page, "Text to Video")
    choose(page, "t2v-preset", "Self-test T2V - tiny offline model")
    page.locator("#t2v-prompt textarea").fill(PROMPT)
    for name, value in (("width", 64), ("height", 64), ("frames", 9), ("steps", 4), ("seed", 5), ("count", 2)):
        set_number(page, f"t2v-{name}", value)
    expect(page.locator("#t2v-count input")).to_have_value("2")
    page.evaluate(WATCH_STATUS)
    generate(page)
    status_box = page.locator("#t2v-status")
    expect(status_box).to_contain_text("Done in", timeout=180_000)
    final = status(page)
    assert "2 outputs, seeds 5, 6" in final, final
    # The seed box holds the seed of the video the player shows (the first), so copying it makes that video again.
    expect(page.locator("#t2v-seed input")).to_have_value("5")
    seen = page.evaluate("() => window.__statuses")
    assert any("Video 2 of 2" in text for text in seen), seen[-5:]
    assert not any("Video 2 of 2: Video 2 of 2" in text for text in seen), seen
    shot(page, "t2v-two-videos-done")
    open_tab(page, "History")
    page.locator("#history-refresh").click()
    items = page.locator("#history-gallery .thumbnail-item", has_text=PROMPT)
    expect(items).to_have_count(2, timeout=30_000)
    shot(page, "history-two-videos")
    open_tab(page, "Text to Video")
    set_number(page, "t2v-count", 1)


# The bytes the page keeps in the browser's storage (gradio's run history kept ~1.7 MB a key of every run's outputs).
STORED_BYTES = """() => { let n = 0;
    for (let i = 0; i < localStorage.length; i++) { const k = localStorage.key(i); n += k.length + localStorage.getItem(k).length; }
    return n; }"""


def test_a_page_open_through_twenty_jobs_stays_light(page, shot: Screenshots):
    """The tab's JavaScript heap (after a garbage collection) and its stored bytes stay where they were after the
    first few jobs, however many more it runs; and at rest it asks for no frames."""
    from playwright.sync_api import expect

    cdp = page.context.new_cdp_session(page)

    def weight() -> tuple[int, int]:
        cdp.send("HeapProfiler.collectGarbage")
        return cdp.send("Runtime.getHeapUsage")["usedSize"], page.evaluate(STORED_BYTES)

    open_tab(page, "Text to Video")
    choose(page, "t2v-preset", "Self-test T2V - tiny offline model")
    page.locator("#t2v-prompt textarea").fill("a light page")
    for name, value in (("width", 64), ("height", 64), ("frames", 5), ("steps", 1), ("count", 1)):
        set_number(page, f"t2v-{name}", value)
    weights = {}
    for run in range(1, 21):
        set_number(page, "t2v-seed", 1000 + run)
        generate(page)
        expect(page.locator("#t2v-status")).to_contain_text(f"Seed used: {1000 + run}.", timeout=120_000)
        if run in (5, 20):
            weights[run] = weight()
    shot(page, "t2v-after-twenty-jobs")
    (heap_5, stored_5), (heap_20, stored_20) = weights[5], weights[20]
    assert stored_20 < 20_000 and stored_20 <= stored_5 + 1_000, weights
    assert heap_20 < heap_5 * 1.2 + 2_000_000, weights
    # At rest the page asks for no frames: each status tracker of a component hidden mid-event (the CPU-only rows, a
    # still's box) asked for 60 a second, and gradio's loading overlay's tracker 60 more for as long as the page was
    # open (ui/status_clock.py puts those counts on a timer).
    # (The result video, while it plays, asks for its own: it is paused first.)
    page.evaluate("() => document.querySelectorAll('video').forEach((video) => video.pause())")
    asked = frames_asked_per_second(page)
    assert asked < 10, asked


def test_history_captions_tell_outputs_apart_and_its_choice_stays_through_smoother(page, shot: Screenshots):
    """Each thumbnail says how it was made, its frames and size, its steps after the video and its time; a stale
    "pick an output" goes when one is picked; after Smoother the new output is listed and the chosen one is still
    chosen."""
    from playwright.sync_api import expect

    open_tab(page, "History")
    page.locator("#history-refresh").click()
    items = page.locator("#history-gallery .thumbnail-item")
    expect(items.first).to_be_visible(timeout=30_000)
    captions = page.evaluate("() => [...document.querySelectorAll('#history-gallery .thumbnail-item')]"
                             ".map(item => item.innerText.trim())")
    assert all(re.match(r"T2V · \d+ fr \d+x\d+ · seed \d+ · \d\d-\d\d \d\d:\d\d:\d\d · ", text) for text in captions), captions
    assert len(set(captions)) == len(captions), captions
    page.locator("#history-smoother").click()
    status_box = page.locator("#history-post-status")
    expect(status_box).to_contain_text("ick an output in the gallery first", timeout=30_000)
    boats = page.locator("#history-gallery .thumbnail-item", has_text=PROMPT).first
    chosen = boats.inner_text().strip()
    boats.click()
    expect(status_box).to_have_text("", timeout=10_000)
    page.locator("#history-smoother").click()
    expect(status_box).to_contain_text("Done", timeout=120_000)
    expect(page.locator("#history-gallery .thumbnail-item", has_text="smoother 2x")).to_have_count(1, timeout=30_000)
    selected = page.locator("#history-gallery .thumbnail-item.selected")
    expect(selected).to_have_count(1)
    assert selected.inner_text().strip() == chosen
    shot(page, "history-captions-and-choice-after-smoother")
