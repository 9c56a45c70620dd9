"""The field table (engine/settings/fields.py): every setting declared once, and the views the app reads of it."""
from __future__ import annotations

from dataclasses import fields

import pytest

from engine.models.loras import Lora
from engine.settings.fields import (AUTO, FIELD, FIELDS, OFF, OWN_TRANSFORMER, Group, Parse, Place, api_fields,
                                    by_field, cli_fields, names_in, on_page, plan_fields, read, read_all)
from engine.settings.values import (MEMORY_CHOICES, REQUIRED_SETTINGS, SETTING_TYPES, InputError, Settings,
                                    check_settings)


def test_every_setting_has_one_line_and_every_line_is_a_setting_or_a_part_of_a_request():
    names = [field.name for field in FIELDS]
    assert len(names) == len(set(names))
    settings = {field.name for field in fields(Settings)}
    assert {field.name for field in FIELDS if field.group is not Group.REQUEST} == settings == set(SETTING_TYPES)
    assert {field.name for field in FIELDS if field.group is Group.REQUEST} == {
        "image", "last_image", "preset", "prompt", "negative_prompt", "seed", "extend", "video"}
    assert set(REQUIRED_SETTINGS) == {"model", "mode", "width", "height", "frames", "steps", "guidance", "shift",
                                      "fps"}
    assert MEMORY_CHOICES == names_in(Group.MEMORY) == ("strategy", "text_encoder", "vae_tiling", "gpus")


def test_each_choice_the_page_offers_reads_as_a_value_the_check_accepts(presets):
    """A dropdown's every choice, read as a run reads it, passes check_settings: the table's words and the
    check's cannot drift apart."""
    base = presets["selftest-t2v"].settings
    for field in on_page(Place.PLAN):
        for shown in field.shown:
            value = shown[1] if isinstance(shown, tuple) else shown
            setting = read(field, value)
            assert check_settings(base.changed(**{field.name: setting})) is not None, (field.name, value)
        defaults = Settings(base.model, "t2v", 64, 64, 9, 2, 5.0, 3.0)
        assert read(field, field.start) == getattr(defaults, field.name), field.name   # a box starts at the default


@pytest.mark.parametrize("name, raw, value", [
    ("strategy", AUTO, None), ("strategy", "", None), ("strategy", "group_offload", "group_offload"),
    ("vae_tiling", "On", True), ("vae_tiling", "off", False), ("vae_tiling", AUTO, None),
    ("vae_tiling", "maybe", "maybe"),
    ("compile", "OFF", False), ("decoder", "", "vae"), ("decoder", "fast", "fast"),
    ("step_cache", OFF, None), ("step_cache", "mag", "mag"),
    ("transformer", OWN_TRANSFORMER, None), ("transformer", "", None), ("transformer", "a.gguf", "a.gguf"),
    ("gpus", AUTO, 0), ("gpus", "2", 2), ("gpus", 3, 3), ("gpus", "two", "two"),
    ("guidance_2", 0, None), ("guidance_2", "", None), ("guidance_2", 2.5, 2.5), ("guidance_2", "x", "x"),
    ("width", "64", "64"), ("width", None, None),
    ("loras", "a.safetensors: 0.5\n\n# off\nb.safetensors@low",
     (Lora("a.safetensors", 0.5), Lora("b.safetensors", 1.0, "low"))),
    ("loras", "", ()), ("loras", None, ()), ("loras", [Lora("c.safetensors", 0.2)], (Lora("c.safetensors", 0.2),)),
])
def test_a_raw_value_reads_as_its_field_says_and_what_does_not_read_stays_for_the_check(name, raw, value):
    assert read(FIELD[name], raw) == value


def test_a_lora_line_that_does_not_read_is_refused_with_its_sentence_and_an_unknown_name_is_a_programming_error():
    with pytest.raises(InputError, match="the strength after the last ':' must be a number"):
        read(FIELD["loras"], "a.safetensors: strong")
    with pytest.raises(TypeError, match="not fields: colour"):
        read_all({"colour": "red"})


def test_the_page_api_s_order_is_the_table_s_and_its_names_map_back_to_fields():
    text = [field.name for field in api_fields("t2v")]
    assert text == [field.name for field in api_fields("t2i")]
    assert [field.name for field in api_fields("i2v")] == ["image", "last_image", *text, "extend"]
    assert [field.name for field in api_fields("v2v")] == [*text, "video", "strength"]
    # What was added later comes last, in the order it was added, so that older callers keep working.
    assert text[-8:] == ["guidance_2", "window", "overlap", "count", "interpolate", "upscale", "guidance_batch",
                         "compute"] and text.index("seed") < text.index("strategy")
    assert by_field({"vae_precision": "float32", "width": 64}) == {"vae_dtype": "float32", "width": 64}
    plan = [field.name for field in plan_fields()]
    assert plan[:5] == ["preset", "model", "width", "height", "frames"] and len(plan) == len(set(plan))
    assert {field.name for field in on_page(Place.FORM)} <= set(plan)


def test_the_command_line_s_options_are_the_table_s():
    from app import build_parsers

    _, commands = build_parsers()
    for command in ("generate", "plan"):
        flags = {action.option_strings[0] for action in commands[command]._actions if action.option_strings}
        assert {field.option.flag for field in cli_fields(command)} <= flags, command
    generate = {field.name for field in cli_fields("generate")}
    assert {"seed", "fps", "guidance", "image", "negative_prompt"} <= generate
    assert not {"seed", "fps", "image"} & {field.name for field in cli_fields("plan")}
    # every choice option offers the table's choices (On/Off as on/off)
    for field in cli_fields("generate"):
        action = next(a for a in commands["generate"]._actions if field.option.flag in a.option_strings)
        if field.parse is Parse.ON_OFF:
            assert tuple(action.choices) == ("on", "off")
        elif field.choices:
            assert tuple(action.choices) == field.choices, field.name
