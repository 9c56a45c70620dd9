"""Runs that start from a video, on the page: the Video to Video tab, and History's Extend and Video to Video."""
from __future__ import annotations

import numpy as np
import pytest
from playwright.sync_api import expect

from engine.outputs.export import write_mp4
from tests.conftest import Screenshots
from tests.helpers.page import generate, open_tab, set_number, set_text

RUN_S = 120_000


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """24 frames at 24 fps of a moving colour ramp, 96x64: another rate and shape than the self-test's."""
    ramp = np.linspace(0, 255, 96 * 64 * 3).reshape(64, 96, 3)
    frames = np.stack([np.roll(ramp, 4 * i, axis=1) for i in range(24)]).astype(np.uint8)
    return write_mp4(frames, tmp_path_factory.mktemp("clips") / "ramp.mp4", 24)


def _number(page, elem_id: str) -> int:
    return int(float(page.locator(f"#{elem_id} input").input_value()))


def test_the_video_to_video_tab_shows_what_it_starts_from_and_makes_it_again(page, shot: Screenshots, clip):
    open_tab(page, "Video to Video")
    set_text(page, "v2v-model", "selftest-t2v")
    page.locator("#v2v-input input[type=file]").set_input_files(str(clip))
    note = page.locator("#v2v-fit-note")
    expect(note).to_contain_text("Made again at", timeout=30_000)
    # The upload takes its shape (wider than tall) and its whole length: 24 frames at 24 fps are 16 at the model's
    # 16 fps, so 13 (4k+1), more than the self-test preset's 9.
    page.wait_for_function("() => Number(document.querySelector('#v2v-width input').value) > "
                           "Number(document.querySelector('#v2v-height input').value)")
    expect(page.locator("#v2v-frames input")).to_have_value("13")
    set_number(page, "v2v-frames", 5)
    page.locator("#v2v-use-shape").click()     # the button takes the whole length again
    expect(page.locator("#v2v-frames input")).to_have_value("13")
    expect(note).to_contain_text("read at 16 fps")
    page.locator("#v2v-fitted img").wait_for()
    page.locator("#v2v-prompt textarea").fill("the ramp, in other colours")
    set_number(page, "v2v-steps", 4)
    set_number(page, "v2v-frames", 9)
    slider = page.locator("#v2v-strength input[type=number]")
    # A strength past 1 typed in the box: the page sets 1 and says so, in the sentence the API refuses it with.
    slider.fill("1.5")
    slider.press("Enter")
    expect(slider).to_have_value("1")
    page.wait_for_function("() => document.body.innerText.includes('Strength 1.5 is out of range: use 0 (the input "
                           "video back) to 1 (a new video). The page set it to 1.')")
    shot(page, "v2v-strength-past-one")
    slider.fill("0.5")
    slider.press("Enter")
    generate(page, "v2v")
    expect(page.locator("#v2v-status")).to_contain_text("Done", timeout=RUN_S)
    timings = page.locator("#v2v-timings")
    expect(timings).to_contain_text("Video encode (the input)")
    assert "Denoise" in timings.inner_text()
    page.locator("#v2v-video video").wait_for()
    shot(page, "v2v-tab-run")
    # Too many frames for the video: said under the preview, and refused in a sentence.
    set_number(page, "v2v-frames", 33)
    expect(note).to_contain_text("make at most 13")
    generate(page, "v2v")
    expect(page.locator("#v2v-status")).to_contain_text("make at most 13 frames", timeout=30_000)
    set_number(page, "v2v-frames", 9)


def test_history_extends_an_output_and_makes_it_again(page, shot: Screenshots):
    open_tab(page, "Text to Video")
    set_text(page, "t2v-model", "selftest-t2v")
    page.locator("#t2v-prompt textarea").fill("a lantern swinging in the wind")
    for name, value in (("frames", 9), ("steps", 4), ("width", 64), ("height", 64)):
        set_number(page, f"t2v-{name}", value)
    generate(page)
    expect(page.locator("#t2v-status")).to_contain_text("Done", timeout=RUN_S)

    open_tab(page, "History")
    item = page.locator("#history-gallery .thumbnail-item", has_text="a lantern swinging")
    item.first.click()
    expect(page.locator("#history-extend")).to_be_enabled()
    page.locator("#history-extend").click()
    # The Image to Video tab, its video to extend filled in, its start the video's last frame.
    expect(page.locator("#i2v-fit-note")).to_contain_text("Extending", timeout=30_000)
    expect(page.locator("#i2v-status")).to_contain_text("Extending")
    assert page.locator("#i2v-preset input").input_value().startswith("Self-test I2V")
    assert (_number(page, "i2v-width"), _number(page, "i2v-height")) == (64, 64)
    assert "lantern" in page.locator("#i2v-prompt textarea").input_value()
    page.locator("#i2v-prompt textarea").fill("the lantern falls")
    set_number(page, "i2v-frames", 5)
    set_number(page, "i2v-steps", 4)
    expect(page.locator("#i2v-fit-note")).to_contain_text("The joined video: 9 frames and 4 new, 13 frames")
    generate(page, "i2v")
    status = page.locator("#i2v-status")
    expect(status).to_contain_text("Done", timeout=RUN_S)
    expect(status).to_contain_text("It extends")
    expect(page.locator("#i2v-timings")).to_contain_text("Join (the new part after the video)")
    shot(page, "i2v-extend-run")

    open_tab(page, "History")
    page.locator("#history-refresh").click()
    page.locator("#history-gallery .thumbnail-item", has_text="the lantern falls").first.click()
    details = page.locator("#history-details")
    expect(details).to_contain_text("Extends")
    expect(details).to_contain_text("2 parts, 9 + 4 frames")
    expect(details).to_contain_text("13 frames")
    shot(page, "history-extended-output")
    page.locator("#history-remake").click()
    expect(page.locator("#v2v-status")).to_contain_text("is the input video", timeout=30_000)
    expect(page.locator("#v2v-fit-note")).to_contain_text("Made again at")
    assert "the lantern falls" in page.locator("#v2v-prompt textarea").input_value()
    shot(page, "v2v-from-history")


def test_a_video_put_on_an_image_box_says_where_a_video_goes(page, shot: Screenshots, clip, image_file):
    """Picked for the first frame, or dropped on the last frame: no "Invalid file type … Only image/* allowed", one
    sentence under the boxes pointing to Extend a video; an image afterwards clears it."""
    open_tab(page, "Image to Video")
    page.locator("#i2v-image input[type=file]").set_input_files(str(clip))
    note = page.locator(".wan-video-on-image")
    expect(note).to_contain_text("ramp.mp4 is a video, and this box takes an image (the frame the video starts from): "
                                 "to continue a video, open “Extend a video” below and put it in “Video to extend”")
    page.evaluate("""() => { const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array(16)], 'dropped.webm', {type: 'video/webm'}));
        document.querySelector('#i2v-last-image').dispatchEvent(
            new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true})); }""")
    expect(note).to_contain_text("dropped.webm is a video")
    assert not page.locator("#i2v-image img").count()
    assert not [t for t in page.evaluate("() => [...document.querySelectorAll('.toast-body')].map(t => t.innerText)")
                if "Invalid file type" in t]
    shot(page, "i2v-video-on-image-box")
    page.locator("#i2v-image input[type=file]").set_input_files(str(image_file))
    expect(note).to_have_text("")
    page.locator("#i2v-image img").first.wait_for()
