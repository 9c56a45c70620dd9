"""The command line, the page's plan panel, its Generate buttons and preset saving make their settings in one
place (engine/settings/draft.py): the same values give the same Settings, and an empty box is missing for the
plan as for Generate."""
from __future__ import annotations

import pytest

from app import _settings, build_parser
from engine.service.worker import WorkerClient
from engine.settings.draft import prepare
from engine.settings.values import InputError, check_settings
from ui.context import AppContext
from ui.generate import build_request
from ui.preset_saving import preset_data
from ui.views.plan_panel import AUTO, OFF, OWN_TRANSFORMER, _form_settings, form_overrides


@pytest.fixture
def ctx(presets, selftest_models_dir, outputs):
    return AppContext(WorkerClient(selftest_models_dir), presets, str(outputs))


# (command-line options, the page's boxes): the same choices, written as each takes them.
CASES = {
    "the preset's own": ([], dict(width=64, height=64, frames=9)),
    "another size and steps": (["--width", "96", "--height", "48", "--frames", "5", "--steps", "3"],
                               dict(width=96, height=48, frames=5, steps=3)),
    "memory and speed choices": (["--vae-tiling", "on", "--decoder", "fast", "--step-cache", "first_block"],
                                 dict(width=64, height=64, frames=9, vae_tiling="On", decoder="fast",
                                      step_cache="first_block")),
}


def _cli(models_dir, options) -> object:
    args = build_parser().parse_args(["plan", "--preset", "selftest-t2v", "--models-dir", str(models_dir),
                                      *options])
    return check_settings(_settings(args)[1])


def _choices(values: dict) -> tuple:
    """The plan panel's dropdowns (override_fields' order) for these values."""
    return (AUTO, AUTO, values.get("vae_tiling", AUTO), values.get("decoder", "vae"), values.get("step_cache", OFF),
            AUTO, AUTO, AUTO, "", OWN_TRANSFORMER, OWN_TRANSFORMER, AUTO)


@pytest.mark.parametrize("case", CASES)
def test_the_cli_the_plan_panel_and_generate_make_the_same_settings(ctx, selftest_models_dir, case):
    options, boxes = CASES[case]
    preset = ctx.presets["selftest-t2v"].settings
    steps = boxes.get("steps", preset.steps)
    choices = _choices(boxes)
    from_cli = _cli(selftest_models_dir, options)
    from_plan = _form_settings(ctx, "t2v", "selftest-t2v", "", boxes["width"], boxes["height"], boxes["frames"],
                               form_overrides(ctx, *choices))
    generated = build_request(ctx, "t2v", "selftest-t2v", "a fox", None, "", boxes["width"], boxes["height"],
                              boxes["frames"], steps, preset.guidance, preset.shift, 1, *choices).settings
    # the plan panel is not given steps, guidance and shift: the preset's, as the others were given here
    assert from_cli == check_settings(generated) == from_plan.changed(steps=steps), case
    if case == "another size and steps":
        saved = preset_data(ctx, "mine", "t2v", "selftest-t2v", None, "", 96, 48, 5, 3, preset.guidance,
                            preset.shift)
        assert (saved["width"], saved["height"], saved["frames"], saved["steps"]) == (96, 48, 5, 3)


def test_an_empty_width_is_refused_alike_by_the_plan_panel_and_by_generate(ctx):
    preset = ctx.presets["selftest-t2v"].settings
    choices = _choices({})
    with pytest.raises(InputError, match="Width is missing: give a whole number"):
        _form_settings(ctx, "t2v", "selftest-t2v", "", None, 64, 9, form_overrides(ctx, *choices))
    request = build_request(ctx, "t2v", "selftest-t2v", "a fox", None, "", None, 64, 9, preset.steps,
                            preset.guidance, preset.shift, 1, *choices)
    with pytest.raises(InputError, match="Width is missing: give a whole number"):
        check_settings(request.settings)


def test_a_value_not_given_is_the_preset_s_and_one_given_empty_is_missing(presets):
    preset = presets["selftest-t2v"].settings
    same = prepare({}, preset, "t2v", lambda ref: ref, lambda ref: None)
    assert same == check_settings(preset)
    with pytest.raises(InputError, match="Steps is missing"):
        prepare({"steps": ""}, preset, "t2v", lambda ref: ref, lambda ref: None)
    # an empty Model box is the preset's model; a still is one frame
    still = prepare({"model": " ", "frames": 9}, preset, "t2i", lambda ref: ref, lambda ref: None)
    assert (still.model, still.frames, still.mode) == (preset.model, 1, "t2i")
    with pytest.raises(TypeError, match="not settings: colour"):
        prepare({"colour": "red"}, preset, "t2v", lambda ref: ref, lambda ref: None)
