"""Bad input is refused before anything heavy runs, with a message saying what to change."""
from __future__ import annotations

import os

import pytest

from engine.models.limits import limits_of
from engine.models.spec import KNOWN_MODELS
from engine.settings.request import GenerationRequest, check_request
from engine.settings.values import InputError
from tests.conftest import said, tiny_request


@pytest.fixture
def good(presets, outputs, image_file):
    return tiny_request(presets, "selftest-t2v", outputs)


def test_good_request_passes_and_is_normalised(good):
    checked = check_request(good.with_values(width=64.0, steps="4", prompt="  a cat  "))
    assert (checked.settings.width, checked.settings.steps, checked.prompt) == (64, 4, "a cat")


@pytest.mark.parametrize("change, expected", [
    (dict(width=70), "width 70 is not a multiple of 16: try 64 or 80"),
    (dict(height=100), "height 100 is not a multiple of 16: try 96 or 112"),
    (dict(frames=10), "frames must be 4k+1"),
    (dict(frames=0), "frames 0 is out of range"),
    (dict(width=0), "width 0 is out of range"),
    (dict(height=-64), "height -64 is out of range"),
    (dict(width=100000), "width 100000 is out of range"),
    (dict(steps=0), "steps 0 is out of range"),
    (dict(steps=-3), "steps -3 is out of range"),
    (dict(steps=100000), "steps 100000 is out of range"),
    (dict(steps="many"), "steps must be a whole number"),
    (dict(guidance=float("nan")), "guidance must be a number"),
    (dict(guidance=1e9), "guidance 1000000000.0 is out of range"),
    (dict(shift=0), "shift 0.0 is out of range"),
    (dict(seed=-5), "seed -5 is out of range"),
    (dict(prompt=""), "the prompt is empty"),
    (dict(prompt="   \n"), "the prompt is empty"),
    (dict(mode="i2v"), "image-to-video needs an image"),
    (dict(mode="t2i", frames=9), "text-to-image makes 1 frame"),
])
def test_bad_values_are_refused_with_what_to_change(good, change, expected):
    with pytest.raises(InputError) as info:
        check_request(good.with_values(**change))
    assert said(expected) in str(info.value)


def test_a_known_model_s_own_size_multiple_is_checked(good):
    """Wan2.2 TI2V-5B's VAE scales by 16, so its sides are multiples of 32: the model's spec says so, and the
    check uses it once the model is known (the 16 every Wan model needs before then)."""
    ti2v = limits_of(KNOWN_MODELS["Wan-AI/Wan2.2-TI2V-5B-Diffusers"])
    assert check_request(good.with_values(width=80)).settings.width == 80
    with pytest.raises(InputError) as info:
        check_request(good.with_values(width=80), ti2v)
    assert said("width 80 is not a multiple of 32, which Wan2.2 TI2V 5B needs: try 64 or 96") in str(info.value)
    assert check_request(good.with_values(width=96), ti2v).settings.width == 96


def test_every_problem_is_listed_at_once(good):
    with pytest.raises(InputError) as info:
        check_request(good.with_values(width=70, frames=10, prompt=""))
    problems = info.value.problems
    assert len(problems) == 3 and all(p[0].isupper() and p.endswith(".") for p in problems), problems
    assert problems[0].startswith("The prompt is empty: describe")
    assert problems[1].startswith("Width 70 is not a multiple of 16") and problems[2].startswith("Frames must be 4k+1")
    assert str(info.value) == " ".join(problems)


def test_unreadable_and_empty_images_are_refused(good, tmp_path):
    text = tmp_path / "notes.png"
    text.write_text("this is not an image")
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    for path, expected in ((text, "is not a readable image"), (empty, "is empty (0 bytes)"),
                           (tmp_path / "missing.png", "does not exist")):
        with pytest.raises(InputError) as info:
            check_request(good.with_values(mode="i2v", image=str(path)))
        assert expected in str(info.value)


def test_i2v_with_a_real_image_passes(good, image_file):
    assert check_request(good.with_values(mode="i2v", image=str(image_file))).image == str(image_file)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_unwritable_outputs_folder_is_refused(good, tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(InputError, match="not writable"):
            check_request(good.with_values(outputs_dir=str(folder)))
    finally:
        folder.chmod(0o700)


def test_outputs_path_that_is_a_file_is_refused(good, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="outputs folder .* is not writable"):
        check_request(good.with_values(outputs_dir=str(blocker / "sub")))


def test_today_s_folder_as_a_link_is_refused_before_any_work(good, tmp_path):
    import time

    outputs, elsewhere = tmp_path / "linked-outputs", tmp_path / "elsewhere"
    outputs.mkdir()
    elsewhere.mkdir()
    today = time.strftime("%Y-%m-%d")
    (outputs / today).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InputError, match=f"outputs folder's {today} is a link, and the app writes nothing through"):
        check_request(good.with_values(outputs_dir=str(outputs)))
    assert list(elsewhere.iterdir()) == []


def test_from_preset_drops_a_fixed_schedule_when_steps_change(presets):
    fast = presets["fastwan21-t2v-1.3b"]
    kept = GenerationRequest.from_preset(fast, "a cat")
    changed = GenerationRequest.from_preset(fast, "a cat", steps=8)
    assert kept.settings.sigmas == (1.0, 0.757, 0.522) and kept.settings.scheduler == "flow_dmd"
    assert changed.settings.sigmas is None and changed.settings.scheduler == "flow_dmd"   # its own even schedule


def test_a_side_out_of_every_range_is_told_the_model_s_own_range(good):
    from engine.models.spec import SELFTEST_SPECS

    with pytest.raises(InputError) as info:
        check_request(good.with_values(width=16384), limits_of(SELFTEST_SPECS["selftest-t2v"]))
    assert "Width 16384 is out of range: use 32 to 512 pixels for selftest-t2v." in str(info.value)


def test_a_seed_typed_with_twenty_digits_is_named_as_typed(good):
    with pytest.raises(InputError) as info:
        check_request(good.with_values(seed=10**20))
    assert "Seed 100000000000000000000 is out of range" in str(info.value)
