"""The History tab on one real server: the /history and /delete_output API, then the page itself.

Everything shares one module-scoped server (starts are slow); each test makes or picks the outputs
it changes, so they do not depend on each other's order.
"""
from __future__ import annotations

from dataclasses import replace

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from gradio_client import handle_file

from engine.outputs.history import DEFAULT_LIMIT, MAX_LIMIT, Unreadable
from tests.conftest import open_page
from tests.helpers.api import call_api
from ui.views.history_view import summary_markdown

pytestmark = pytest.mark.server

T2V = ["selftest-t2v", "a red fox in the snow", "", "selftest-t2v", 64, 64, 5, 2, 5.0, 3.0, 7]
I2V = ["selftest-i2v", "waves on a shore", "blurry", "selftest-i2v", 64, 48, 5, 2, 5.0, 3.0, 3]
T2I = ["selftest-t2v", "a still lake", "", "selftest-t2v", 64, 48, 1, 2, 5.0, 3.0, 5]


@pytest.fixture(scope="module")
def server(shared_app):
    return shared_app


@pytest.fixture(scope="module")
def made(client, image_file):
    """Two runs through the API, oldest first: a text-to-video and an image-to-video from an upload."""
    t2v = client.predict(*T2V, api_name="/text_to_video")[0]
    i2v = client.predict(handle_file(str(image_file)), None, *I2V, api_name="/image_to_video")[0]
    return {"t2v": Path(t2v).name, "i2v": Path(i2v).name}


def _by_file(entries: list[dict]) -> dict[str, dict]:
    return {Path(e["media"]).name: e for e in entries}


def test_history_and_delete_output_through_the_api(client, server, made):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/history", "/delete_output"} <= set(endpoints)

    entries = client.predict(api_name="/history")
    files = [Path(e["media"]).name for e in entries]
    assert files.index(made["i2v"]) < files.index(made["t2v"])          # newest first
    t2v, i2v = _by_file(entries)[made["t2v"]], _by_file(entries)[made["i2v"]]
    assert (t2v["mode"], t2v["prompt"], t2v["model"], t2v["preset"]) == ("t2v", T2V[1], "selftest-t2v", "selftest-t2v")
    assert (t2v["width"], t2v["height"], t2v["frames"], t2v["steps"], t2v["seed"]) == (64, 64, 5, 2, 7)
    assert (t2v["guidance"], t2v["shift"], t2v["kind"], t2v["strategy"]) == (5.0, 3.0, "video", "all_on_device")
    assert {"text_encode", "denoise", "vae_decode", "export"} <= set(t2v["timings"]) and t2v["peak_ram_gb"] > 0
    assert (i2v["mode"], i2v["negative_prompt"], i2v["width"], i2v["height"], i2v["seed"]) == (
        "i2v", "blurry", 64, 48, 3)
    # The upload was a temporary file; a copy stays beside the output for "Reuse settings".
    kept = Path(i2v["first_image"])
    assert kept.parent == Path(i2v["media"]).parent and kept.name.endswith(".first.png") and kept.is_file()
    assert json.loads(Path(i2v["sidecar"]).read_text())["inputs"] == {"image": kept.name, "last_image": None}
    assert len(client.predict(1, api_name="/history")) == 1

    folder = Path(t2v["media"]).parent
    stem = made["t2v"][: -len(".mp4")]
    assert {f"{stem}.mp4", f"{stem}.json"} <= {p.name for p in folder.iterdir()}
    result = client.predict(t2v["key"], api_name="/delete_output")
    assert result["key"] == t2v["key"] and result["removed"][:2] == [f"{stem}.mp4", f"{stem}.json"]
    assert not [p for p in folder.iterdir() if p.name.startswith(stem)]
    assert Path(i2v["media"]).is_file() and Path(i2v["sidecar"]).is_file() and kept.is_file()
    remaining = [e["key"] for e in client.predict(api_name="/history")]
    assert t2v["key"] not in remaining and i2v["key"] in remaining

    with pytest.raises(Exception, match="deleted already"):
        client.predict(t2v["key"], api_name="/delete_output")
    with pytest.raises(Exception, match="is not an output key"):
        client.predict("../../etc/passwd", api_name="/delete_output")
    assert Path(i2v["media"]).is_file()


# ----- sidecars that cannot be read -----------------------------------------------------
BAD_DAY = "2001-01-01"


@pytest.fixture
def bad_sidecars(server, made):
    """Beside the good outputs, in a day folder of their own: sidecars nested 200,000 deep, with "seed": 10**300,
    with "width": 1e308, of 50 MB, cut short (each with a media file); removed afterwards."""
    good = next(server["outputs"].rglob(made["i2v"].replace(".mp4", ".json")))
    data = json.loads(good.read_text())
    texts = {"deep": json.dumps(data)[:-1] + ', "x": ' + "[" * 200_000 + "]" * 200_000 + "}",
             "seed": json.dumps(dict(data, seed=10**300)),
             "wide": json.dumps(dict(data, parameters=dict(data["parameters"], width=1e308))),
             "big": json.dumps(dict(data, note="x" * 50_000_000)), "cut": json.dumps(data)[:300]}
    folder = server["outputs"] / BAD_DAY
    folder.mkdir()
    for name, text in texts.items():
        (folder / f"{name}_t2v_x_1.mp4").write_bytes(b"x")
        (folder / f"{name}_t2v_x_1.json").write_text(text.replace(made["i2v"], f"{name}_t2v_x_1.mp4"))
        os.utime(folder / f"{name}_t2v_x_1.json", (time.time() + 60,) * 2)    # the newest: read first
    yield [f"{BAD_DAY}/{name}_t2v_x_1.json" for name in texts]
    shutil.rmtree(folder)


def test_history_survives_any_sidecar_and_lists_every_good_output(client, made, bad_sidecars):
    files = [Path(e["media"]).name for e in client.predict(api_name="/history")]
    assert made["i2v"] in files and not [f for f in files if f.endswith("_t2v_x_1.mp4")]
    assert [Path(e["media"]).name for e in client.predict(1, api_name="/history")] == [files[0]]


@pytest.mark.parametrize("limit", ["abc", None, -1, 1e9, 0, "2"])
def test_a_bad_history_limit_gets_the_app_s_sentence_or_a_sane_default(server, made, limit):
    reply = call_api(server, "history", [limit])
    if limit in (None, 1e9, "2"):       # left out, too many, a number as text: a count that makes sense
        assert "event: complete" in reply, reply
        entries = json.loads(reply.split("event: complete", 1)[1].split("data:", 1)[1].strip())[0]
        assert entries and (len(entries) <= 2 if limit == "2" else True)
    else:
        assert "event: error" in reply, reply
        assert (f"is not a number of outputs: give a whole number from 1 to {MAX_LIMIT} (how many to list, "
                f"newest first), or leave it out for the newest {DEFAULT_LIMIT}") in reply, reply


def test_the_summary_names_the_sidecars_that_could_not_be_read():
    said = summary_markdown(2, DEFAULT_LIMIT, [Unreadable("2001-01-01/deep_t2v_x_1.json", "it is nested deep")])
    assert said == ("2 outputs, newest first. Click one to see its settings. 1 sidecar could not be read, so its "
                    "output is left out: 2001-01-01/deep_t2v_x_1.json (it is nested deep). Fix or remove "
                    "those files in the outputs folder.")
    many = [Unreadable(f"d/{n}.json", "cut") for n in range(7)]
    assert summary_markdown(0, DEFAULT_LIMIT, many).endswith("d/4.json (cut); and 2 others. Fix or remove those "
                                                             "files in the outputs folder.")


# ----- the page, in a real browser ----------------------------------------------------
@pytest.fixture(scope="module")
def page(server, browser):
    with open_page(browser, server["url"], timeout_s=30) as page:
        yield page


def _open_history(page, caption: str):
    page.get_by_role("tab", name="History").click()       # selecting the tab refreshes the gallery
    item = page.locator("#history-gallery .thumbnail-item", has_text=caption)
    item.wait_for()
    item.click()
    page.locator("#history-details", has_text=caption).wait_for()


def test_the_page_shows_reuses_and_deletes_with_a_confirmation(page, client, server, made):
    from playwright.sync_api import expect

    image = Path(client.predict(*T2I, api_name="/text_to_image")[0]).name
    stem = image[: -len(".png")]
    _open_history(page, "a still lake")
    expect(page.locator("#history-details")).to_contain_text("Text to image")
    # The plan and the phases named as the live page named them (a CPU run), with the run's speed choices.
    details = page.locator("#history-details").inner_text()
    assert "CPU only" in details and "Apply the plan" in details and "Transfer (to device)" not in details, details
    assert "all_on_device" not in details and "decoder vae" in details and "(exact)" in details, details
    expect(page.locator("#history-image img")).to_be_visible()
    expect(page.locator("#history-video")).to_be_hidden()

    page.locator("#history-delete").click()
    expect(page.locator("#history-confirm-text")).to_contain_text(f"Delete {stem}")
    page.locator("#history-keep").click()
    expect(page.locator("#history-confirm-delete")).to_be_hidden()
    files = [p for p in server["outputs"].rglob(f"{stem}*")]
    assert {p.suffix for p in files} >= {".png", ".json"}
    page.locator("#history-delete").click()
    page.locator("#history-confirm-delete").click()
    expect(page.locator("#history-gallery .thumbnail-item", has_text="a still lake")).to_have_count(0)
    expect(page.locator("#history-reuse")).to_be_disabled()
    assert not list(server["outputs"].rglob(f"{stem}*"))

    # Reuse an image-to-video output: the Image to Video tab opens with its settings and its image.
    _open_history(page, "waves on a shore")
    page.locator("#history-reuse").click()
    expect(page.locator("#i2v-generate")).to_be_visible()
    expected = {"i2v-prompt": "waves on a shore", "i2v-negative": "blurry", "i2v-model": "selftest-i2v",
                "i2v-width": "64", "i2v-height": "48", "i2v-frames": "5", "i2v-steps": "2", "i2v-seed": "3"}
    for _ in range(2):    # and still so a moment later (a preset set by code does not refill the form)
        for elem_id, value in expected.items():
            expect(page.locator(f"#{elem_id} input, #{elem_id} textarea").first).to_have_value(value)
        time.sleep(1.0)
    expect(page.locator("#i2v-preset input")).to_have_value("Self-test I2V - tiny offline model")
    # The tab's status says what was filled in, not an earlier job's words.
    expect(page.locator("#i2v-status")).to_contain_text(f"Settings of {made['i2v']} filled in")
    kept = re.escape(made["i2v"][: -len(".mp4")] + ".first.png")
    expect(page.locator("#i2v-image img")).to_have_attribute("src", re.compile(f"/{kept}$"))


def test_the_history_tab_lists_the_good_outputs_and_names_the_unreadable_sidecars(page, made, bad_sidecars):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="History").click()
    page.locator("#history-refresh").click()
    summary = page.locator("#history-summary")
    expect(summary).to_contain_text("5 sidecars could not be read, so their outputs are left out")
    for name in bad_sidecars:
        expect(summary).to_contain_text(name)
    expect(page.locator("#history-gallery .thumbnail-item", has_text="waves on a shore")).to_have_count(1)


def test_the_details_list_the_loras_and_the_speed_choices_of_a_run(presets):
    from engine.models.loras import Lora
    from engine.outputs.history import HistoryEntry
    from ui.views.history_view import entry_markdown

    settings = replace(presets["selftest-t2v"].settings, loras=(Lora("style.safetensors", 0.75, "both"),
                                                               Lora("detail.safetensors", 1.5, "low")))
    entry = HistoryEntry("d/x.mp4", "video", "/o/d/x.mp4", "/o/d/x.json", "2026-12-02T07:00:00", settings, "a fox",
                         "", "selftest-t2v", 7, fps=16, strategy="group_offload", device="cuda",
                         speed={"decoder": "fast", "step_cache": "mag", "attention": "native", "approximate": True},
                         timings={"transfer": 1.0, "denoise": 2.0})
    text = entry_markdown(entry)
    assert "| LoRAs | style.safetensors: 0.75; detail.safetensors: 1.5@low |" in text, text
    assert "| Speed | decoder fast, step cache mag, attention native (approximate) |" in text, text
    assert "| Memory plan | group_offload |" in text and "Transfer (to device)" in text


# ----- smoother and larger (last: their runs leave the self-test T2V model loaded) -------------------
def _key_of(client, media: str) -> dict:
    return next(e for e in client.predict(MAX_LIMIT, api_name="/history") if Path(e["media"]).name == Path(media).name)


def test_smoother_and_larger_through_the_api_make_new_outputs_beside_the_first(client):
    video = client.predict(*T2V[:-1], 21, api_name="/text_to_video")[0]
    first = _key_of(client, video)
    made = client.predict(first["key"], 2, api_name="/smoother")
    assert "Done" in made["status"] and Path(made["file"]).name == Path(video).stem + "_smoother2x.mp4", made
    smoother = _key_of(client, Path(video).stem + "_smoother2x.mp4")
    assert (smoother["frames"], smoother["fps"], smoother["post"][0]["step"]) == (5, 32, "interpolate")
    assert smoother["made"]["frames"] == 9 and Path(first["media"]).is_file()
    client.predict(smoother["key"], 4, api_name="/larger")
    larger = _key_of(client, Path(smoother["media"]).stem + "_larger4x.mp4")
    assert larger["made"] == {"frames": 9, "width": 256, "height": 256} and [p["step"] for p in larger["post"]] == [
        "interpolate", "upscale"]
    for key, factor, words in ((first["key"], 3, "pick 2x or 4x"), ("no/such.mp4", 2, "There is no output")):
        with pytest.raises(Exception, match=words):
            client.predict(key, factor, api_name="/smoother")
    still = client.predict(T2I[0], "a still pond", *T2I[2:-1], 22, api_name="/text_to_image")[0]
    with pytest.raises(Exception, match="(?i)a still has no frames"):
        client.predict(_key_of(client, still)["key"], 2, api_name="/smoother")


def test_smoother_and_larger_on_the_page_add_an_output_that_says_what_was_done(page, client, shot):
    from playwright.sync_api import expect

    video = client.predict("selftest-t2v", "a heron at dawn", *T2V[2:-1], 23, api_name="/text_to_video")[0]
    page.get_by_role("tab", name="History").click()
    page.locator("#history-refresh").click()
    _open_history(page, "a heron at dawn")
    page.locator("#history-smoother").click()
    expect(page.locator("#history-post-status")).to_contain_text("Done", timeout=60_000)
    expect(page.locator("#history-gallery .thumbnail-item", has_text="a heron at dawn")).to_have_count(2)
    page.locator("#history-gallery .thumbnail-item", has_text="a heron at dawn").first.click()
    details = page.locator("#history-details")
    expect(details).to_contain_text("Smoother 2x (ffmpeg minterpolate")
    expect(details).to_contain_text("9 frames at 32 fps")
    shot(page, "history-smoother-larger")
    assert Path(video).is_file()
