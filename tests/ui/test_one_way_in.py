"""The command line, the page's plan panel, its Generate buttons and preset saving make their settings in one
place (engine/settings/draft.py): the same values give the same Settings, and an empty box is missing for the
plan as for Generate."""
from __future__ import annotations

from dataclasses import replace

import pytest

from app import _settings, build_parser
from engine.service.worker import WorkerClient
from engine.settings.draft import Paths, prepare
from engine.settings.fields import Place, on_page, starting_values
from engine.settings.values import InputError, Settings, check_settings
from ui.context import AppContext
from ui.generate import build_request
from ui.preset_saving import SAVED_FIELDS, preset_data
from ui.views.plan_panel import form_settings


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
    "every other plan choice": (["--strategy", "group_offload", "--text-encoder", "cpu", "--compile", "off",
                                 "--attention", "native", "--vae-precision", "float32", "--split", "1"],
                                dict(width=64, height=64, frames=9, strategy="group_offload", text_encoder="cpu",
                                     compile="Off", attention="native", vae_dtype="float32", gpus="1")),
}


def _cli(models_dir, options) -> object:
    args = build_parser().parse_args(["plan", "--preset", "selftest-t2v", "--models-dir", str(models_dir),
                                      *options])
    return check_settings(_settings(args)[1])


@pytest.mark.parametrize("case", CASES)
def test_the_cli_the_plan_panel_and_generate_make_the_same_settings(ctx, selftest_models_dir, case):
    """The same choices, typed as options and as the page's boxes (every box given, as the page gives them), make
    the same Settings through the CLI, the plan panel, Generate and preset saving."""
    options, typed = CASES[case]
    preset = ctx.presets["selftest-t2v"].settings
    page = {**starting_values(on_page(Place.PLAN)), "model": "", "steps": preset.steps, "guidance": preset.guidance,
            "shift": preset.shift, "guidance_2": 0, **typed}
    from_cli = _cli(selftest_models_dir, options)
    from_plan = form_settings(ctx, "t2v", {"preset": "selftest-t2v", **page})
    generated = build_request(ctx, "t2v", {"preset": "selftest-t2v", "prompt": "a fox", "seed": 1, **page}).settings
    assert from_cli == check_settings(generated) == from_plan, case
    saved = preset_data(ctx, "mine", "t2v", {"preset": "selftest-t2v", **{name: page[name] for name in
                                                                         SAVED_FIELDS if name in page}})
    not_saved = {f.name: getattr(preset, f.name) for f in on_page(Place.PLAN) if f.name not in SAVED_FIELDS}
    assert Settings.from_dict(saved) == replace(from_cli, **not_saved), case   # the plan's choices are not saved


def test_an_empty_width_is_refused_alike_by_the_plan_panel_and_by_generate(ctx):
    page = {"preset": "selftest-t2v", **starting_values(on_page(Place.PLAN)), "model": "", "width": None,
            "height": 64, "frames": 9}
    with pytest.raises(InputError, match="Width is missing: give a whole number"):
        form_settings(ctx, "t2v", page)
    request = build_request(ctx, "t2v", {**page, "prompt": "a fox"})
    with pytest.raises(InputError, match="Width is missing: give a whole number"):
        check_settings(request.settings)


def test_a_value_not_given_is_the_preset_s_and_one_given_empty_is_missing(presets):
    preset = presets["selftest-t2v"].settings
    same = prepare({}, preset, "t2v", Paths(), lambda ref: None)
    assert same == check_settings(preset)
    with pytest.raises(InputError, match="Steps is missing"):
        prepare({"steps": ""}, preset, "t2v", Paths(), lambda ref: None)
    # an empty Model box is the preset's model; a still is one frame
    still = prepare({"model": " ", "frames": 9}, preset, "t2i", Paths(), lambda ref: None)
    assert (still.model, still.frames, still.mode) == (preset.model, 1, "t2i")
    with pytest.raises(TypeError, match="not settings: colour"):
        prepare({"colour": "red"}, preset, "t2v", Paths(), lambda ref: None)
