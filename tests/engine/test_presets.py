"""Presets load into frozen dataclasses; a malformed file is named with its field."""
from __future__ import annotations

import json

import pytest

from engine.presets import PresetError, get_preset, load_preset_file, load_presets


def test_builtin_presets_hold_the_articles_settings(presets):
    wan = presets["wan21-t2v-1.3b"]
    assert (wan.width, wan.height, wan.frames, wan.shift, wan.guidance, wan.fps) == (832, 480, 81, 8.0, 6.0, 16)
    fast = presets["fastwan21-t2v-1.3b"]
    assert (fast.width, fast.height, fast.frames, fast.steps, fast.guidance) == (480, 480, 25, 3, 1.0)
    i2v = presets["wan21-i2v-14b"]
    assert (i2v.mode, i2v.width, i2v.height, i2v.frames, i2v.steps, i2v.guidance) == ("i2v", 480, 480, 33, 20, 5.0)
    assert presets["wan22-ti2v-5b"].fps == 24 and presets["wan22-ti2v-5b"].size_multiple == 32
    assert presets["selftest-t2v"].selftest and presets["selftest-i2v"].mode == "i2v"


def test_every_builtin_preset_is_a_valid_request_shape(presets):
    for preset in presets.values():
        assert preset.width % preset.size_multiple == 0 and preset.height % preset.size_multiple == 0
        assert (preset.frames - 1) % 4 == 0


def _write(folder, name, **changes):
    base = json.loads(json.dumps({
        "name": name, "title": "t", "description": "d", "model": "selftest-t2v", "mode": "t2v",
        "width": 64, "height": 64, "frames": 9, "steps": 4, "guidance": 5.0, "shift": 3.0, "fps": 16}))
    base.update(changes)
    for key in [k for k, v in changes.items() if v is _DROP]:
        del base[key]
    path = folder / f"{name}.json"
    path.write_text(json.dumps(base))
    return path


_DROP = object()


@pytest.mark.parametrize("changes, expected", [
    (dict(width="64"), "field 'width' must be int, got str"),
    (dict(steps=True), "field 'steps' must be int, got true/false"),
    (dict(colour="red"), "unknown field(s) colour"),
    (dict(fps=_DROP), "missing field(s) fps"),
    (dict(mode="v2v"), "field 'mode' must be one of t2v, i2v"),
    (dict(frames=-1), "field 'frames' must be positive"),
    (dict(sigmas=[1.0, 0.5]), "'sigmas' has 2 values but 'steps' is 4"),
    (dict(sigmas=[1.0, 2.0, 0.5, 0.1]), "'sigmas' must be a list of numbers between 0 and 1"),
])
def test_malformed_preset_names_file_and_field(tmp_path, changes, expected):
    path = _write(tmp_path, "broken", **changes)
    with pytest.raises(PresetError) as info:
        load_preset_file(path)
    assert str(info.value).startswith("broken.json:")
    assert expected in str(info.value)


def test_invalid_json_and_name_mismatch(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(PresetError, match="bad.json: not valid JSON"):
        load_preset_file(bad)
    other = _write(tmp_path, "other")
    other.rename(tmp_path / "renamed.json")
    with pytest.raises(PresetError, match="file is named 'renamed'"):
        load_preset_file(tmp_path / "renamed.json")


def test_unknown_preset_lists_the_choices(presets):
    with pytest.raises(PresetError, match="unknown preset 'nope'; choose one of: .*selftest-t2v"):
        get_preset(presets, "nope")


def test_presets_are_frozen(presets):
    with pytest.raises(AttributeError):
        presets["selftest-t2v"].width = 128


def test_load_presets_from_a_user_folder(tmp_path):
    _write(tmp_path, "mine", width=128)
    assert load_presets(tmp_path)["mine"].width == 128
