"""A new user's first hour on the page: mistakes said once with what to change, the model's limits in the form,
nothing stale after a job ends, and the layout on a laptop screen. Real Chromium, with screenshots."""
from __future__ import annotations

import os
import signal


from tests.conftest import Screenshots, engine_pid
from tests.helpers.page import (generate, long_job, no_error_badge, open_tab, set_number, set_text, status, table_text,
                                toasts)


def _log(app_server) -> str:
    return app_server["log"].read_text()


def test_generate_is_in_sight_on_a_1280x720_screen(browser, app_server, shot: Screenshots):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    try:
        page = context.new_page()
        page.goto(app_server["url"])
        page.locator("#t2v-generate").wait_for()
        for tab, button in (("Text to Video", "#t2v-generate"), ("Image to Video", "#i2v-generate")):
            open_tab(page, tab)
            box = page.locator(button).bounding_box()
            assert box and box["y"] + box["height"] <= 720, f"{button} is below the fold: {box}"
        open_tab(page, "Text to Video")
        # The preset's whole title fits its box.
        assert page.evaluate("() => { const i = document.querySelector('#t2v-preset input');"
                             " return i.scrollWidth <= i.clientWidth; }")
        shot(page, "t2v-1280x720", full_page=False)   # what the screen shows, without scrolling
    finally:
        context.close()


def test_a_settings_mistake_is_said_once_and_the_next_run_clears_it(page, app_server, shot: Screenshots):
    open_tab(page, "Text to Video")
    set_text(page, "t2v-model", "selftest-t2v")
    page.locator("#t2v-prompt textarea").fill("")
    set_number(page, "t2v-width", 70)
    set_number(page, "t2v-frames", 241)
    set_number(page, "t2v-window", 129)
    generate(page)
    page.wait_for_function("() => document.querySelector('#t2v-status [data-testid=markdown]').innerText.includes('Not started')")
    lines = [line for line in status(page).splitlines() if line.strip()]
    assert lines == ["Not started: the settings need a change.",
                     "The prompt is empty: describe what the video should show.",
                     "Width 70 is not a multiple of 16, which selftest-t2v needs: try 64 or 80.",
                     "A window of 129 frames is more than selftest-t2v can see at once (its position table has 32 "
                     "rows for the frames): use at most 125."], lines
    # Said once: not on the result box, not in everyone's system panel; a short toast that closes by itself.
    assert no_error_badge(page, "t2v-video")
    assert "prompt" not in page.locator("#system-panel").inner_text()
    assert any("Not started" in toast for toast in toasts(page))
    shot(page, "t2v-settings-refused")
    page.wait_for_function("() => document.querySelectorAll('.toast-body').length === 0", timeout=15_000)
    # A number the form's own limits refuse gets the same kind of sentence and replaces the earlier one.
    set_number(page, "t2v-width", 64)
    set_number(page, "t2v-window", 0)
    set_number(page, "t2v-frames", 1030)
    page.locator("#t2v-prompt textarea").fill("a fox")
    generate(page)
    page.wait_for_function("() => document.querySelector('#t2v-status [data-testid=markdown]').innerText.includes('Frames 1030')")
    assert "The prompt is empty" not in status(page)
    assert "Frames 1030 is out of range: use 1 to 1025." in status(page)
    set_number(page, "t2v-frames", 9)
    set_number(page, "t2v-steps", 3)
    generate(page)
    page.wait_for_function("() => document.querySelector('#t2v-status [data-testid=markdown]').innerText.startsWith('Done in')",
                           timeout=120_000)
    assert "Not started" not in status(page) and "Frames 1030" not in status(page)
    # The console has one line per mistake and no traceback.
    log = _log(app_server)
    assert "[page] Not started: the settings need a change. The prompt is empty" in log
    assert "Traceback" not in log, log[-5000:]


def test_the_frames_maximum_and_hint_follow_the_model(page):
    open_tab(page, "Text to Video")
    set_text(page, "t2v-model", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    page.wait_for_function("() => document.querySelector('#t2v-frames').innerText.includes('in windows past 81')")
    assert page.locator("#t2v-frames input").get_attribute("max") == "1025"
    assert page.locator("#t2v-window input").get_attribute("max") == "257"
    set_text(page, "t2v-model", "selftest-t2v")
    page.wait_for_function("() => document.querySelector('#t2v-frames').innerText.includes("
                           "'Frames (4k+1, at most 1025; in windows past 125)')")
    assert page.locator("#t2v-window input").get_attribute("max") == "125"
    assert "the model's own, 125 frames" in page.locator("#t2v-window").inner_text()
    assert page.locator("#t2v-width input").get_attribute("max") == "512"
    # The plan says the same before anything runs.
    set_number(page, "t2v-frames", 241)
    set_number(page, "t2v-window", 129)
    page.wait_for_function("() => document.querySelector('#t2v-plan').innerText.includes("
                           "'A window of 129 frames is more than selftest-t2v can see at once')")
    set_number(page, "t2v-window", 0)
    set_number(page, "t2v-frames", 9)


def test_a_file_that_is_not_an_image_is_named_before_anything_runs(page, app_server, shot: Screenshots, tmp_path):
    not_an_image = tmp_path / "holiday.png"
    not_an_image.write_text("a text file named like a picture")
    open_tab(page, "Image to Video")
    page.locator("#i2v-image input[type=file]").set_input_files(str(not_an_image))
    page.wait_for_function("() => document.querySelector('#i2v-fit-note').innerText.includes('Cannot use this image')")
    said = "Image 'holiday.png' is not a readable image (not a known image format); upload a PNG, JPEG or WebP image."
    assert said in page.locator("#i2v-fit-note").inner_text()
    page.locator("#i2v-prompt textarea").fill("waves")
    generate(page, "i2v")
    page.wait_for_function("() => document.querySelector('#i2v-status [data-testid=markdown]').innerText.includes('Not started')")
    assert said in status(page, "i2v") and no_error_badge(page, "i2v-video")
    shot(page, "i2v-not-an-image")
    assert "Traceback" not in _log(app_server) and "UnidentifiedImageError" not in _log(app_server)
    page.locator("#i2v-image button[aria-label='Remove Image']").first.click()


def test_the_plan_on_a_cpu_hides_what_changes_nothing_and_offers_ti2v_5b_for_images(page):
    open_tab(page, "Text to Video")
    # Hidden once the engine process has said what it runs on (its libraries load with the page).
    page.locator("#t2v-strategy").wait_for(state="hidden")
    for hidden in ("strategy", "text-encoder", "compile", "attention"):
        assert page.locator(f"#t2v-{hidden}").is_hidden(), hidden
    assert "there is no strategy or text-encoder place to choose" in page.locator("#t2v-plan-cpu-note").inner_text()
    assert page.locator("#t2v-vae-tiling").is_visible()
    plan = page.locator("#t2v-plan").inner_text()
    assert "Strategy: CPU only" in plan and "Transfer" not in plan and "all_on_device" not in plan
    open_tab(page, "Image to Video")
    page.locator("#i2v-preset input").click()
    page.locator("[role=option]").first.wait_for()
    options = page.evaluate("() => [...document.querySelectorAll('[role=option]')].map(o => o.innerText)")
    page.keyboard.press("Escape")
    assert any("Wan2.2 TI2V 5B from an image" in option for option in options), options


def test_decode_again_with_nothing_saved_says_so_and_its_buttons_are_off(page, shot: Screenshots):
    open_tab(page, "Decode again")
    page.wait_for_function("() => document.querySelector('#decode-note').innerText.includes('No saved latents')")
    assert page.locator("#decode-tiled").is_disabled() and page.locator("#decode-cpu").is_disabled()
    shot(page, "decode-again-empty")


def test_after_a_fault_nothing_on_the_page_says_the_job_still_runs(page, app_server, shot: Screenshots):
    open_tab(page, "Text to Video")
    set_text(page, "t2v-model", "selftest-t2v")
    with long_job(page, "a job whose engine dies"):
        os.kill(engine_pid(app_server), signal.SIGKILL)
        page.wait_for_function("() => document.querySelector('#t2v-status [data-testid=markdown]').innerText.startsWith('Failed during Denoise')",
                               timeout=60_000)
        assert "The engine process stopped unexpectedly during denoise (killed by signal SIGKILL)" in status(page)
        assert "failed at step" in table_text(page, "t2v-timings") and "ETA" not in table_text(page, "t2v-timings")
        page.wait_for_function("() => /Engine: (idle|starting)/.test(document.querySelector('#system-panel').innerText)",
                               timeout=10_000)
        assert "running:" not in page.locator("#system-panel").inner_text()
        page.wait_for_function("() => /last job: failed during Denoise/.test("
                               "document.querySelector('#system-panel').innerText)", timeout=30_000)
        assert page.locator("#t2v-cancel").get_attribute("class").count("secondary") == 1
        shot(page, "t2v-failed")
    set_number(page, "t2v-steps", 3)
    generate(page)   # a fresh engine takes the next job
    page.wait_for_function("() => document.querySelector('#t2v-status [data-testid=markdown]').innerText.startsWith('Done in')",
                           timeout=120_000)


def _shown(selector: str) -> str:
    return f"(() => {{ const e = document.querySelector('{selector}'); return !!e && e.offsetParent !== null }})()"


def test_the_low_noise_fields_show_only_for_a_model_with_a_low_noise_expert(page, shot: Screenshots):
    """Guidance 2 and the low-noise transformer file mean something for Wan2.2 A14B only (the table of known
    models says so before any download); for a one-transformer model they are hidden."""
    fields = ("#t2v-guidance-2", "#t2v-transformer-2-file")
    open_tab(page, "Text to Video")
    set_text(page, "t2v-model", "selftest-t2v")
    for selector in fields:
        page.wait_for_function(f"() => !{_shown(selector)}")
    set_text(page, "t2v-model", "Wan-AI/Wan2.2-T2V-A14B-Diffusers")
    for selector in fields:
        page.wait_for_function(f"() => {_shown(selector)}")
    shot(page, "t2v-a14b-low-noise-fields")
    set_text(page, "t2v-model", "selftest-t2v")
    for selector in fields:
        page.wait_for_function(f"() => !{_shown(selector)}")
    assert page.locator("#t2v-guidance").is_visible() and page.locator("#t2v-transformer-file").is_visible()


def test_without_a_model_flag_the_tabs_open_on_a_preset_that_fits_this_machine(browser, tmp_path_factory,
                                                                               selftest_models_dir, shot: Screenshots):
    """On this CPU machine no real model fits its RAM: the tabs start on the self-test presets, whose plan fits,
    instead of a preset whose Generate would download gigabytes and then refuse."""
    from tests.conftest import open_page, running_app

    folder = tmp_path_factory.mktemp("no-model")
    with running_app(folder / "app.log", "--outputs", str(folder / "outputs"), "--models-dir",
                     str(selftest_models_dir)) as (url, _), open_page(browser, url) as page:
        for tab, prefix, preset in (("Text to Video", "t2v", "Self-test"), ("Image to Video", "i2v", "Self-test")):
            open_tab(page, tab)
            page.wait_for_function(f"() => document.querySelector('#{prefix}-preset input').value.includes('{preset}')",
                                   timeout=90_000)
            page.wait_for_function(f"() => document.querySelector('#{prefix}-model textarea, #{prefix}-model input')"
                                   f".value.startsWith('selftest-')")
            page.wait_for_function(f"() => /fits/i.test(document.querySelector('#{prefix}-plan').innerText) && "
                                   f"!/does NOT fit/.test(document.querySelector('#{prefix}-plan').innerText)",
                                   timeout=60_000)
        open_tab(page, "Text to Video")
        shot(page, "t2v-opens-on-a-preset-that-fits")
