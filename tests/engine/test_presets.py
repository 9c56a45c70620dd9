"""Presets load into frozen dataclasses; a malformed file is named with its field."""
from __future__ import annotations

import json
import re

import pytest

from engine.models.spec import spec_for
from engine.settings.presets import (BUILTIN_PRESETS_DIR, PresetError, UserPresets, check_user_preset_name, get_preset,
                                     load_preset_file, load_presets, preset_json)


def test_builtin_presets_hold_the_articles_settings(presets):
    wan = presets["wan21-t2v-1.3b"]
    assert (wan.settings.width, wan.settings.height, wan.settings.frames, wan.settings.shift, wan.settings.guidance, wan.settings.fps) == (832, 480, 81, 8.0, 6.0, 16)
    # FastVideo's own default for FastWan (its fast_wan_t2v_480p preset), and the source article's quick size
    fast, quick = presets["fastwan21-t2v-1.3b"], presets["fastwan21-t2v-1.3b-quick"]
    assert (fast.settings.width, fast.settings.height, fast.settings.frames, fast.settings.steps, fast.settings.guidance) == (832, 448, 61, 3, 1.0)
    assert (quick.settings.width, quick.settings.height, quick.settings.frames) == (480, 480, 25)
    assert (quick.settings.steps, quick.settings.sigmas, quick.settings.scheduler) == (3, fast.settings.sigmas, "flow_dmd")
    i2v = presets["wan21-i2v-14b"]
    # shift 3: the official generate.py's for image to video at 480-class sizes
    assert tuple(getattr(i2v.settings, f) for f in ("mode", "width", "height", "frames", "steps", "guidance", "shift")) == ("i2v", 480, 480, 33, 20, 5.0, 3.0)
    assert (presets["wan21-flf2v-14b"].settings.guidance, presets["wan21-flf2v-14b"].settings.shift) == (5.0, 16.0)
    assert presets["wan22-ti2v-5b"].settings.fps == 24 and spec_for(presets["wan22-ti2v-5b"].settings.model).size_multiple == 32
    assert presets["selftest-t2v"].selftest and presets["selftest-i2v"].settings.mode == "i2v"


# The official default negative prompt (Wan2.1 and Wan2.2 wan/configs/shared_config.py, sample_neg_prompt), and the
# prefixes the official Wan2.1 image-to-video config (wan_i2v_14B.py) and first-last-frame config
# (configs/__init__.py, on top of the image-to-video one) put before it. Wan2.2's own configs add none.
OFFICIAL_NEGATIVE = ("色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，"
                     "丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，"
                     "静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走")
I2V_PREFIX, FLF2V_PREFIX = "镜头晃动，", "镜头切换，"


def test_every_guided_preset_suggests_the_official_negative_prompt(presets):
    guided = {name: p for name, p in presets.items() if p.settings.guidance > 1 and not p.selftest}
    assert len(guided) == 12
    for name, preset in guided.items():
        model = preset.settings.model
        prefix = (FLF2V_PREFIX + I2V_PREFIX if "FLF2V" in model else
                  I2V_PREFIX if "Wan2.1-I2V" in model else "")
        assert preset.negative_prompt == prefix + OFFICIAL_NEGATIVE, name
    # without guidance the negative prompt is never computed: the distilled presets suggest none
    assert all(not p.negative_prompt for p in presets.values() if p.settings.guidance <= 1)


def test_every_builtin_preset_is_a_valid_request_shape(presets):
    for preset in presets.values():
        multiple = spec_for(preset.settings.model).size_multiple   # the model's own (32 for Wan2.2 TI2V-5B)
        assert preset.settings.width % multiple == 0 and preset.settings.height % multiple == 0, preset.name
        assert (preset.settings.frames - 1) % 4 == 0


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
        presets["selftest-t2v"].settings.width = 128


def test_load_presets_from_a_user_folder(tmp_path):
    _write(tmp_path, "mine", width=128)
    assert load_presets(tmp_path)["mine"].settings.width == 128


# ----- the user's own presets -------------------------------------------------
def _store(folder, presets):
    return UserPresets(folder, dict(presets))


def _data(name, **changes):
    data = {"name": name, "title": "Mine", "description": "d", "model": "selftest-t2v", "mode": "t2v",
            "width": 64, "height": 64, "frames": 9, "steps": 4, "guidance": 5.0, "shift": 3.0, "fps": 16}
    data.update(changes)
    return data


def _builtin_files():
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in BUILTIN_PRESETS_DIR.iterdir()}


def test_user_presets_load_beside_the_builtins_and_bad_files_are_skipped(tmp_path, presets):
    _write(tmp_path, "mine", width=128)
    _write(tmp_path, "broken", width="wide")
    (tmp_path / "garbled.json").write_bytes(b"\xff\xfe{")
    _write(tmp_path, "selftest-t2v", width=32)          # a built-in's name: never replaces it
    _write(tmp_path, "with.dot")                         # not a valid user preset name
    store = _store(tmp_path, presets)
    problems = store.load()
    assert store.presets["mine"].settings.width == 128 and store.is_user("mine")
    assert store.presets["selftest-t2v"] == presets["selftest-t2v"] and not store.is_user("selftest-t2v")
    assert list(store.presets)[:len(presets)] == list(presets)   # built-ins first, in their order
    assert store.names() == ["mine"]
    assert len(problems) == 4 and all(p.startswith("user preset ") and " skipped: " in p for p in problems)
    joined = "\n".join(problems)
    assert "broken.json: field 'width' must be int, got str" in joined
    assert "garbled.json skipped" in joined
    assert "'selftest-t2v' is the name of a built-in preset" in joined
    assert "'with.dot' has a dot in it" in joined


def test_a_missing_user_folder_is_no_problem_and_the_builtin_folder_is_refused(tmp_path, presets):
    store = _store(tmp_path / "not-yet", presets)
    assert store.load() == [] and store.names() == []
    with pytest.raises(PresetError, match="holds the built-in presets"):
        _store(BUILTIN_PRESETS_DIR, presets)


def test_save_writes_the_user_folder_and_never_the_builtin_one(tmp_path, presets):
    before = _builtin_files()
    folder = tmp_path / "user"
    store = _store(folder, presets)
    preset, replaced = store.save(_data("my-clip_2", sigmas=[1.0, 0.7, 0.5, 0.2]))
    assert not replaced and store.presets["my-clip_2"] is preset and store.is_user("my-clip_2")
    assert [p.name for p in folder.iterdir()] == ["my-clip_2.json"]   # no temporary file left
    assert load_preset_file(folder / "my-clip_2.json") == preset      # reads back the same
    assert json.loads((folder / "my-clip_2.json").read_text())["sigmas"] == [1.0, 0.7, 0.5, 0.2]
    again, replaced = store.save(_data("my-clip_2", width=128))
    assert replaced and store.presets["my-clip_2"].settings.width == 128 and load_preset_file(folder / "my-clip_2.json") == again
    assert _builtin_files() == before
    # A fresh start finds it.
    fresh = _store(folder, presets)
    assert fresh.load() == [] and fresh.presets["my-clip_2"] == again


@pytest.mark.parametrize("name, expected", [
    ("selftest-t2v", "'selftest-t2v' is the name of a built-in preset, which cannot be replaced; pick another name"),
    ("SELFTEST-T2V", "is the name of a built-in preset"),
    ("", "give the preset a name"),
    (None, "give the preset a name"),
    ("my preset", "the name 'my preset' has a space in it: use only letters, digits, '-' and '_'"),
    ("../evil", "has a dot and a slash in it"),
    ("my preset!", "the name 'my preset!' has a space and '!' in it"),
    ("con", "'con' is a name Windows keeps for a device"),
    ("NUL", "'NUL' is a name Windows keeps for a device"),
    ("lpt1", "'lpt1' is a name Windows keeps for a device"),
    ("x" * 65, "the name has 65 characters; use at most 64"),
])
def test_bad_names_are_refused_with_what_to_change(tmp_path, presets, name, expected):
    store = _store(tmp_path, presets)
    with pytest.raises(PresetError) as info:
        store.save(_data(name))
    assert expected in str(info.value)
    assert list(tmp_path.iterdir()) == [] and store.names() == []


def test_names_of_64_characters_and_names_with_spaces_around_are_fine(tmp_path, presets):
    store = _store(tmp_path, presets)
    assert check_user_preset_name("A" * 64, store.builtin) == "A" * 64
    assert store.save(_data("  padded "))[0].name == "padded"


@pytest.mark.parametrize("changes, expected", [
    (dict(width="64"), "mine.json: field 'width' must be int, got str"),
    (dict(mode="v2v"), "mine.json: field 'mode' must be one of t2v, i2v"),
    (dict(colour="red"), "mine.json: unknown field(s) colour"),
    (dict(title=""), "the title must be one line"),
    (dict(description="x" * 1001), "the description has 1001 characters"),
])
def test_bad_values_are_refused_by_parse_preset(tmp_path, presets, changes, expected):
    store = _store(tmp_path, presets)
    with pytest.raises(PresetError, match=re.escape(expected)):
        store.save(_data("mine", **changes))
    assert list(tmp_path.iterdir()) == []


def test_a_name_differing_only_in_case_and_one_too_many_are_refused(tmp_path, presets):
    store = UserPresets(tmp_path, dict(presets), limit=2)
    store.save(_data("mine"))
    with pytest.raises(PresetError, match="'MINE' differs from your preset 'mine' only in case"):
        store.save(_data("MINE"))
    store.save(_data("other"))
    with pytest.raises(PresetError, match="you have 2 presets, the most kept; delete one first"):
        store.save(_data("third"))
    store.save(_data("other", width=32))   # replacing is still fine


def test_delete_removes_only_user_presets(tmp_path, presets):
    before = _builtin_files()
    store = _store(tmp_path, presets)
    store.save(_data("mine"))
    assert store.delete("mine").name == "mine"
    assert "mine" not in store.presets and list(tmp_path.iterdir()) == []
    with pytest.raises(PresetError, match="'selftest-t2v' is a built-in preset; only your own presets can be deleted"):
        store.delete("selftest-t2v")
    with pytest.raises(PresetError, match="there is no preset of yours named 'mine'"):
        store.delete("mine")
    assert "selftest-t2v" in store.presets and _builtin_files() == before


def test_every_setting_has_its_place_in_a_preset_file():
    """A new setting is one field of Settings plus its line in SETTING_TYPES: presets read and write it."""
    from engine.settings.values import SETTING_NAMES, SETTING_TYPES

    assert set(SETTING_TYPES) == set(SETTING_NAMES)


def test_a_preset_may_force_a_memory_choice_and_a_bad_one_is_refused(tmp_path):
    _write(tmp_path, "tiled", vae_tiling=True, strategy="group_offload")
    settings = load_presets(tmp_path)["tiled"].settings
    assert (settings.vae_tiling, settings.strategy, settings.text_encoder) == (True, "group_offload", None)
    assert preset_json(load_presets(tmp_path)["tiled"])["vae_tiling"] is True
    _write(tmp_path, "turbo", strategy="turbo")
    with pytest.raises(PresetError, match="turbo.json: Strategy 'turbo' is unknown"):
        load_presets(tmp_path)


def test_the_readme_s_preset_table_lists_every_built_in_preset_with_its_numbers(presets):
    from tests.conftest import ROOT

    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        found = re.match(r"^\| `([^`]+)`(?:, `([^`]+)`)? \|(.*)$", line)
        if found:
            for name in filter(None, found.groups()[:2]):
                rows[name] = found[3]
    assert set(presets) <= set(rows), sorted(set(presets) - set(rows))
    for name, preset in presets.items():
        s = preset.settings
        assert f"{s.width}x{s.height}, {s.frames} frames" in rows[name] and f"| {s.steps}" in rows[name], name


def test_a_preset_saved_before_size_multiple_became_the_model_s_own_still_loads(tmp_path):
    path = _write(tmp_path, "older", size_multiple=32)   # every saved preset held it until then
    preset = load_preset_file(path)
    assert preset.settings.width == 64 and not hasattr(preset.settings, "size_multiple")
