"""A long video on the page (the window boxes, the window counter inside each step), and the steps after a run
(Smoother, Larger) chosen in the form."""
from __future__ import annotations

from tests.conftest import Screenshots
from tests.helpers.page import choose, generate, long_job, open_tab, set_number, set_text, status


def test_a_long_video_shows_its_windows_inside_each_step(page, shot: Screenshots):
    open_tab(page, "Text to Video")
    set_text(page, "t2v-model", "selftest-t2v")
    page.wait_for_function("() => document.querySelector('#t2v-window').innerText.includes('125 frames')")
    with long_job(page, "a long walk along the beach", frames=241, width=128, height=128, window=0, overlap=16):
        page.wait_for_function("() => /window [123] of 3|step \\d+\\/200 in 3 windows/"
                               ".test(document.querySelector('#t2v-status').innerText)")
        assert "window" in status(page)
        shot(page, "t2v-long-video-windows")
        page.locator("#t2v-cancel").click()
        page.wait_for_function("() => document.querySelector('#t2v-status').innerText.includes('Cancelled')",
                               timeout=60_000)


def test_smoother_and_larger_chosen_in_the_form_run_after_the_video_as_their_own_phases(page, shot: Screenshots):
    from playwright.sync_api import expect

    open_tab(page, "Text to Video")
    set_text(page, "t2v-model", "selftest-t2v")
    page.locator("#t2v-prompt textarea").fill("a kite over a hill")
    for name, value in (("frames", 9), ("steps", 4), ("width", 64), ("height", 64)):
        set_number(page, f"t2v-{name}", value)
    choose(page, "t2v-interpolate", "2x frames")
    choose(page, "t2v-upscale", "2x size")
    generate(page)
    timings = page.locator("#t2v-timings")
    expect(timings).to_contain_text("Larger (upscale)", timeout=120_000)
    expect(timings).to_contain_text("Smoother (frames between)")
    expect(page.locator("#t2v-status")).to_contain_text("Done")
    expect(page.locator("#t2v-status")).to_contain_text("minterpolate")   # no RIFE file: the fallback, said so
    shot(page, "t2v-smoother-larger-run")
    choose(page, "t2v-interpolate", "Off")
    choose(page, "t2v-upscale", "Off")

