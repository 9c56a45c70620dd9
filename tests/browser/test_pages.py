"""Each tab used the way a person uses it, in a real browser, with screenshots."""
from __future__ import annotations

import re
import time
from pathlib import Path

from tests.conftest import Screenshots
from tests.helpers.page import generate, long_job, open_tab, set_number, status, table_text


def _preview_src(page, prefix: str) -> str | None:
    img = page.locator(f"#{prefix}-preview img")
    return img.get_attribute("src") if img.count() else None


def _wait_for_new_preview(page, prefix: str, after: str | None, timeout_s: float = 60) -> str:
    """The preview's image once it differs from ``after``, read as it is seen (the video may replace it next)."""
    return page.wait_for_function(
        """([sel, before]) => { const img = document.querySelector(sel);
                                 return img && img.src.startsWith('data:image/') && img.src !== before && img.src; }""",
        arg=[f"#{prefix}-preview img", after or ""], timeout=timeout_s * 1000).json_value()


def _wait_for_playing_video(page, prefix: str) -> dict:
    """The result video is there, has frames and its playback position advances."""
    selector = f"#{prefix}-video video"
    page.locator(selector).wait_for(timeout=120_000)
    page.wait_for_function(
        """sel => { const v = document.querySelector(sel); return v && v.readyState >= 2 && v.duration > 0; }""",
        arg=selector, timeout=60_000)
    page.evaluate("sel => { const v = document.querySelector(sel); v.muted = true; return v.play(); }", selector)
    start = page.evaluate("sel => document.querySelector(sel).currentTime", selector)
    page.wait_for_function(f"sel => document.querySelector(sel).currentTime !== {start}", arg=selector,
                           timeout=30_000)
    return page.evaluate("""sel => { const v = document.querySelector(sel);
        return {w: v.videoWidth, h: v.videoHeight, duration: v.duration, src: v.currentSrc}; }""", selector)


def test_text_to_video_shows_preview_progress_timings_and_plays_the_video(page, shot: Screenshots):
    from playwright.sync_api import expect

    seed_box = page.locator("#t2v-seed-used input")
    assert not seed_box.is_visible(), "the seed used is shown before any run"
    page.locator("#t2v-prompt textarea").fill("a red fox running through snow")
    for elem, value in (("t2v-width", 96), ("t2v-height", 64), ("t2v-frames", 33), ("t2v-steps", 40),
                        ("t2v-seed", 42)):
        set_number(page, elem, value)
    cancel = page.locator("#t2v-cancel")
    assert "secondary" in cancel.get_attribute("class"), "Cancel is red while nothing runs"
    generate(page)
    first = _wait_for_new_preview(page, "t2v", None)
    assert "stop" in cancel.get_attribute("class"), "Cancel is not red while the job runs"
    second = _wait_for_new_preview(page, "t2v", first)
    assert second != first, "the preview did not update"
    page.wait_for_function("() => document.querySelector('#t2v-timings').innerText.includes('Denoise')")
    assert "Live preview after step" in page.locator("#t2v-preview").inner_text()
    # The step count, while it denoises ("step 12/40") or, on a fast machine, once the denoise row is done ("40 steps")
    shown_so_far = page.locator("#t2v-status").inner_text() + table_text(page, "t2v-timings")
    assert re.search(r"step \d+/40|40 steps", shown_so_far)
    shot(page, "t2v-running")
    video = _wait_for_playing_video(page, "t2v")
    assert (video["w"], video["h"]) == (96, 64)
    page.wait_for_function("() => document.querySelector('#t2v-timings').innerText.includes('Total')")
    page.wait_for_function("() => document.querySelector('#system-panel').innerText.includes('Engine: idle')")
    final = page.locator("#t2v-status").inner_text()
    assert "Done in" in final and "Seed used: 42" in final
    expect(seed_box).to_be_visible()
    assert seed_box.input_value() == "42"
    chart = page.locator("#t2v-timing-chart")
    assert "Seconds per denoising step (40 of 40)" in chart.inner_text()
    assert chart.locator(".wan-step-bars span").count() == 40
    assert _preview_src(page, "t2v") is None, "the preview stays after the video arrived"
    assert "System:" in page.locator("#system-panel").inner_text()
    page.wait_for_function("() => document.querySelector('#t2v-cancel').className.includes('secondary')")
    # A 96x64 video is shown at its own size, not blown up to the column's width.
    assert page.evaluate("() => document.querySelector('#t2v-video video').getBoundingClientRect().width") <= 100
    shot(page, "t2v-done")


def test_a_still_replaces_the_video_box_and_the_next_video_replaces_the_still(page, shot: Screenshots):
    assert not page.locator("#t2i-image").is_visible()
    set_number(page, "t2v-steps", 4)
    generate(page, "t2i")
    page.wait_for_function("() => { const img = document.querySelector('#t2i-image img');"
                           " return img && img.naturalWidth === 96 && img.naturalHeight === 64; }")
    # One result box at a time: the still's, at its own size; no empty video box above it.
    page.wait_for_function("() => !document.querySelector('#t2v-video') || "
                           "document.querySelector('#t2v-video').offsetParent === null")
    assert page.locator("#t2i-image").bounding_box()["height"] > 200
    shot(page, "t2i-done")
    set_number(page, "t2v-frames", 9)
    generate(page)
    page.locator("#t2v-video video").wait_for(timeout=120_000)
    page.wait_for_function("() => !document.querySelector('#t2i-image') || "
                           "document.querySelector('#t2i-image').offsetParent === null")
    set_number(page, "t2v-frames", 17)


def test_image_to_video_shows_the_crop_at_its_final_size_then_makes_a_video(page, shot: Screenshots, image_file):
    open_tab(page, "Image to Video")
    set_number(page, "i2v-width", 96)
    set_number(page, "i2v-height", 64)
    page.locator("#i2v-image input[type=file]").set_input_files(str(image_file))
    page.wait_for_function("() => document.querySelector('#i2v-fit-note').innerText.includes('Final size: 96x64')")
    fitted = page.locator("#i2v-fitted img")
    fitted.wait_for()
    page.wait_for_function("() => document.querySelector('#i2v-fitted img').naturalWidth === 96")
    assert page.evaluate("() => document.querySelector('#i2v-fitted img').naturalHeight") == 64
    page.locator("#i2v-prompt textarea").fill("waves rolling onto a beach")
    set_number(page, "i2v-frames", 9)
    set_number(page, "i2v-steps", 12)
    generate(page, "i2v")
    _wait_for_new_preview(page, "i2v", None)
    shot(page, "i2v-running")
    video = _wait_for_playing_video(page, "i2v")
    assert (video["w"], video["h"]) == (96, 64)
    page.wait_for_function("() => document.querySelector('#i2v-timings').innerText.includes('Image encode')")
    shot(page, "i2v-done")


def test_cancel_stops_a_running_job_and_keeps_the_earlier_video(page, shot: Screenshots):
    open_tab(page, "Text to Video")
    video = page.locator("#t2v-video video")
    before = video.get_attribute("src") if video.count() else None
    with long_job(page, "a slow sunrise"):
        # A second Generate while it runs starts nothing, and says so.
        time.sleep(1.6)
        page.locator("#t2v-generate").click()
        page.wait_for_function("() => [...document.querySelectorAll('.toast-body')].some(t => "
                               "t.innerText.includes('Your text to video job is still running'))")
        page.locator("#t2v-cancel").click()
        # The last word is the cancel's, written once the job has stopped (a step update on its way must not
        # leave the page saying the job still runs).
        page.wait_for_function("() => document.querySelector('#t2v-status').innerText.includes('earlier result is kept')")
        # One wording, true for where it stopped; the phase table no longer counts down.
        assert re.search(r"Cancelled during the denoising, after step \d+ of 200: nothing new was saved, and the "
                         r"earlier result is kept\. The model stays loaded", status(page))
        assert re.search(r"Denoise\s+[\d.]+\s+cancelled after step \d+/200", table_text(page, "t2v-timings"))
        assert "ETA" not in table_text(page, "t2v-timings")
        # The engine is free again, and the panel says so at once (not at its next refresh), without the job's text.
        page.wait_for_function("() => /Engine: idle · last job: cancelled during the denoising/.test("
                               "document.querySelector('#system-panel').innerText)", timeout=5_000)
        assert (video.get_attribute("src") if video.count() else None) == before, "the earlier video was lost"
        shot(page, "t2v-cancelled")


def test_presets_and_history_during_and_after_a_run_reuse_and_apply(page, shot: Screenshots):
    from playwright.sync_api import expect

    open_tab(page, "Text to Video")
    with long_job(page, "a lighthouse at dawn"):
        page.wait_for_function("() => document.querySelector('#system-panel').innerText.includes('Engine: running')",
                               timeout=30_000)
        open_tab(page, "Presets")
        # gradio puts a group's elem_id on two nested elements: take the outer one.
        page.locator("#preset-card-selftest-i2v").first.wait_for()
        expect(page.locator("#preset-card-selftest-t2v").first).to_contain_text("Expected on this machine")
        shot(page, "presets-during-run")
        open_tab(page, "History")
        page.locator("#history-gallery .thumbnail-item").first.wait_for()
        shot(page, "history-during-run")
        open_tab(page, "Decode again")
        page.locator("#decode-tiled").wait_for()
        open_tab(page, "Text to Video")
        page.locator("#t2v-cancel").click()
        page.wait_for_function("() => document.querySelector('#t2v-status').innerText.includes('earlier result is kept')")
    page.locator("#t2v-prompt textarea").fill("a lighthouse at dusk")
    set_number(page, "t2v-seed", 77)
    set_number(page, "t2v-steps", 3)
    generate(page)
    page.wait_for_function("() => document.querySelector('#t2v-status').innerText.includes('Done in')",
                           timeout=120_000)
    open_tab(page, "History")
    page.locator("#history-refresh").click()
    item = page.locator("#history-gallery .thumbnail-item", has_text="a lighthouse at dusk")
    item.wait_for()
    item.click()
    expect(page.locator("#history-details")).to_contain_text("a lighthouse at dusk")
    assert "a lighthouse at dawn" not in page.locator("#history-gallery").inner_text(), "a cancelled job was kept"
    shot(page, "history-after-run")
    open_tab(page, "Text to Video")
    page.locator("#t2v-prompt textarea").fill("something else")
    set_number(page, "t2v-seed", 5)
    set_number(page, "t2v-steps", 5)
    open_tab(page, "History")
    page.locator("#history-reuse").click()
    expect(page.locator("#t2v-prompt textarea")).to_have_value("a lighthouse at dusk")
    expect(page.locator("#t2v-seed input")).to_have_value("77")
    expect(page.locator("#t2v-steps input")).to_have_value("3")

    open_tab(page, "Presets")
    shot(page, "presets-after-run")
    page.locator("#use-preset-selftest-i2v").click()
    expect(page.locator("#i2v-generate")).to_be_visible()
    expect(page.locator("#i2v-preset input")).to_have_value("Self-test I2V - tiny offline model")
    open_tab(page, "Decode again")


def test_a_second_visitor_waits_in_the_queue_and_can_leave_it(page, browser, app_server, shot: Screenshots):
    import json

    from tests.conftest import open_page

    open_tab(page, "Text to Video")
    with long_job(page, "the first visitor's long job"), open_page(browser, app_server["url"]) as other:
        other.locator("#t2v-prompt textarea").fill("the second visitor's job")
        set_number(other, "t2v-steps", 3)
        other.locator("#t2v-generate").click()
        # Its place and an estimate, in its own status: the first job reports its time left as it runs.
        other.wait_for_function("() => /Waiting in the queue: 1 job ahead of yours, about \\d+(\\.\\d)? (s|min) until it starts/"
                                ".test(document.querySelector('#t2v-status').innerText)")
        shot(other, "t2v-queued")
        other.locator("#t2v-cancel").click()
        other.wait_for_function("() => document.querySelector('#t2v-status').innerText.includes("
                                "'Taken out of the queue: it did not run')")
        page.locator("#t2v-cancel").click()
        page.wait_for_function("() => document.querySelector('#t2v-status').innerText.includes('earlier result is kept')")
    page.wait_for_function("() => document.querySelector('#system-panel').innerText.includes('Engine: idle')",
                           timeout=30_000)
    page.wait_for_timeout(3000)   # had the withdrawn job still been queued, it would be running or done now
    assert "Engine: idle" in page.locator("#system-panel").inner_text()
    prompts = [json.loads(p.read_text()).get("prompt") for p in app_server["outputs"].rglob("*.json")]
    assert "the second visitor's job" not in prompts, "the withdrawn job ran anyway"
    assert "the first visitor's long job" not in prompts, "the cancelled job was saved"


def test_closing_the_page_stops_its_running_job(page, browser, app_server):
    import json

    from tests.conftest import open_page

    with open_page(browser, app_server["url"]) as leaving, long_job(leaving, "a job whose page is closed"):
        pass
    # 200 steps take minutes here; the engine is free again long before that.
    page.wait_for_function("() => document.querySelector('#system-panel').innerText.includes('Engine: idle')",
                           timeout=45_000)
    prompts = [json.loads(p.read_text()).get("prompt") for p in app_server["outputs"].rglob("*.json")]
    assert "a job whose page is closed" not in prompts


def test_deleting_your_own_preset_asks_first(page, app_server, shot: Screenshots):
    from playwright.sync_api import expect

    from gradio_client import Client

    saved = Path(app_server["log"]).parent / "user_presets" / "fox-draft.json"
    open_tab(page, "Text to Video")
    # A colleague saves a preset while this page is open: it shows when the Presets tab is opened.
    Client(app_server["url"], verbose=False).predict("colleague-pick", "t2v", "selftest-t2v",
                                                    api_name="/save_preset")
    open_tab(page, "Presets")
    page.locator("#preset-card-colleague-pick").first.wait_for()
    page.locator("#preset-save-name").locator("input, textarea").first.fill("fox-draft")
    page.locator("#preset-save-button").click()
    card = page.locator("#preset-card-fox-draft").first
    card.wait_for()
    assert saved.is_file()
    delete, sure, keep = (page.locator(f"#{kind}-fox-draft") for kind in ("delete-preset", "confirm-delete-preset",
                                                                         "keep-preset"))
    assert not page.locator("#delete-preset-selftest-t2v").count(), "a built-in preset offers Delete"
    expect(sure).to_be_hidden()
    delete.click()
    expect(sure).to_be_visible()
    expect(keep).to_be_visible()
    expect(delete).to_be_hidden()
    shot(page, "presets-delete-asks")
    keep.click()
    expect(delete).to_be_visible()
    expect(sure).to_be_hidden()
    assert card.is_visible() and saved.is_file(), "Keep it deleted the preset"
    delete.click()
    sure.click()
    expect(page.locator("#preset-message")).to_contain_text("Deleted your preset fox-draft")
    # The tab that used it turns to the preset it starts on here (one that runs), and the message says so.
    expect(page.locator("#preset-message")).to_contain_text(
        "The Text to Video tab used it, so it now uses Self-test T2V - tiny offline model")
    shot(page, "presets-deleted-tab-switched")
    expect(page.locator("#preset-card-fox-draft")).to_have_count(0)
    assert not saved.exists()
    open_tab(page, "Text to Video")
    expect(page.locator("#t2v-preset input")).to_have_value("Self-test T2V - tiny offline model")


def test_a_transformer_file_put_in_the_models_folder_is_listed_after_refresh_and_the_plan_follows_it(
        page, selftest_models_dir, shot: Screenshots):
    from safetensors.torch import save_file

    from engine.models.selftest import SELFTEST_T2V
    from engine.models.single_file import PREFIX
    from tests.helpers.weights import original_state

    open_tab(page, "Text to Video")
    folder = selftest_models_dir / "transformers"
    folder.mkdir(exist_ok=True)
    state = original_state(selftest_models_dir / SELFTEST_T2V)
    save_file({PREFIX + name: tensor for name, tensor in state.items()}, str(folder / "browser-t2v.safetensors"))
    page.locator("#t2v-transformer-refresh").click()
    page.locator("#t2v-transformer-file input").click()
    option = page.get_by_role("option", name="browser-t2v.safetensors")
    option.wait_for(timeout=10_000)
    option.click()
    page.wait_for_function("() => document.querySelector('#t2v-plan').innerText.includes("
                           "'comes from browser-t2v.safetensors')", timeout=30_000)
    shot(page, "transformer-file-chosen")
    page.locator("#t2v-transformer-file input").click()
    page.get_by_role("option", name="(the model's own)").click()
    page.wait_for_function("() => !document.querySelector('#t2v-plan').innerText.includes('comes from')",
                           timeout=30_000)


def test_a_lora_added_from_the_models_folder_gets_a_slider_that_rewrites_its_line(
        page, selftest_models_dir, shot: Screenshots):
    from playwright.sync_api import expect

    open_tab(page, "Text to Video")
    folder = selftest_models_dir / "loras"
    folder.mkdir(exist_ok=True)
    (folder / "browser-style.safetensors").write_bytes(b"")   # listing reads names only
    box = page.locator("#t2v-loras textarea")
    box.fill("")
    box.press("Tab")
    page.locator("#t2v-lora-refresh").click()
    page.locator("#t2v-lora-add input").click()
    option = page.get_by_role("option", name="browser-style.safetensors")
    option.wait_for(timeout=10_000)
    option.click()
    expect(box).to_have_value("browser-style.safetensors: 1")
    expect(page.locator("#t2v-lora-add input")).to_have_value("")
    slider = page.locator("#t2v-lora-slider-0")
    expect(slider).to_contain_text("browser-style.safetensors")
    expect(slider.locator("input[type=number]")).to_have_value("1")
    # The slider's number box, typed into and left: the slider is released and the box's line follows.
    number = slider.locator("input[type=number]")
    number.fill("0.65")
    number.press("Tab")
    expect(box).to_have_value("browser-style.safetensors: 0.65")
    # The range itself, moved by keys and let go.
    slider.locator("input[type=range]").focus()
    slider.locator("input[type=range]").press("ArrowRight")
    slider.locator("input[type=range]").dispatch_event("pointerup")
    expect(box).to_have_value("browser-style.safetensors: 0.7")
    # Enter commits a typed strength as Tab does; one past the ends is set to the nearest end, and said.
    slider = page.locator("#t2v-lora-slider-0")
    number = slider.locator("input[type=number]")
    number.fill("0.5")
    number.press("Enter")
    expect(box).to_have_value("browser-style.safetensors: 0.5")
    number = page.locator("#t2v-lora-slider-0 input[type=number]")
    number.fill("7")
    number.press("Enter")
    expect(box).to_have_value("browser-style.safetensors: 4")
    expect(page.locator("#t2v-lora-slider-0 input[type=number]")).to_have_value("4")
    page.wait_for_function("() => document.body.innerText.includes('7 was set to 4')")
    shot(page, "lora-slider")
    page.locator("#t2v-lora-remove-0").click()
    expect(box).to_have_value("")
    expect(page.locator("#t2v-lora-slider-0")).to_have_count(0)


def test_a_two_expert_preset_fills_the_guidance_2_box_and_another_resets_it(page, shot: Screenshots):
    from playwright.sync_api import expect

    open_tab(page, "Text to Video")
    box = page.locator("#t2v-guidance-2 input")
    expect(box).to_be_hidden()           # the self-test preset has one transformer: no low-noise guidance shown
    page.locator("#t2v-preset input").click()
    page.get_by_role("option", name="Wan2.2 T2V A14B - 832x480, 81 frames, 40 steps").click()
    expect(box).to_have_value("3", timeout=20_000)   # shown once the model's limits are read: slower on a busy machine
    expect(page.locator("#t2v-guidance input")).to_have_value("4")
    shot(page, "guidance-2")
    page.locator("#t2v-preset input").click()
    page.get_by_role("option", name="Self-test T2V - tiny offline model").click()
    expect(box).to_be_hidden(timeout=20_000)


def test_a_guided_preset_shows_the_official_negative_prompt_and_a_distilled_one_none(page, shot: Screenshots):
    from playwright.sync_api import expect

    open_tab(page, "Image to Video")
    box = page.locator("#i2v-negative textarea")
    page.locator("#i2v-preset input").click()
    page.get_by_role("option", name="Wan2.1 I2V 14B - 480x480, 33 frames, 20 steps").click()
    expect(box).to_have_value(re.compile("^镜头晃动，色调艳丽，过曝，静态"))
    expect(page.locator("#i2v-shift input")).to_have_value("3")
    expect(page.locator("#i2v-negative")).to_contain_text("the README gives it in English")
    shot(page, "negative-prompt")
    page.locator("#i2v-preset input").click()
    page.get_by_role("option", name=re.compile("^Wan2.2 I2V A14B - fast, 4 steps")).click()
    expect(box).to_have_value("")


def test_the_api_docs_page_shows_its_operations_with_no_internet(browser, app_server, shot: Screenshots):
    """Every request the docs page makes goes to the app itself (any other is refused, as with no internet), and
    Swagger UI draws the API's operations from the app's own files."""
    from playwright.sync_api import expect

    here = app_server["url"].rstrip("/")
    elsewhere: list[str] = []
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        def only_here(route):
            if route.request.url.startswith(here):
                route.continue_()
            else:
                elsewhere.append(route.request.url)
                route.abort("internetdisconnected")

        context.route("**/*", only_here)
        page = context.new_page()
        page.goto(f"{here}/api/docs")
        expect(page.locator(".opblock-summary-path", has_text="/v1/jobs").first).to_be_visible(timeout=30_000)
        expect(page.locator(".opblock")).not_to_have_count(0)
        shot(page, "api-docs-offline")
    finally:
        context.close()
    assert elsewhere == []
