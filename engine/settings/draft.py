"""One way from raw values to checked Settings: every caller (the command line, the page's Generate buttons, its
plan panel, preset saving) gives the values it has by field name, and ``prepare`` applies the preset and checks.

The one rule for a value: a field the caller does not give takes the preset's value; a field given as None or
as empty text is missing, and the check says so ("width is missing: give a whole number"). The command line
leaves out the options not typed; the page gives every box it has, so an empty box is missing for the plan
panel as for Generate (they plan and run the same settings). The Model box is the exception people expect:
empty is the preset's model. Preset saving's API documents null as "left out": it drops those before it calls.

Also here, once: a step count that differs from the preset's drops its fixed timesteps (Settings.changed), a
still (text to image) is one frame, and the low-noise guidance (Wan2.2 A14B) is kept only for a model with two
experts and while guidance is on (the box is on every form: a value left in it is left out, not refused).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from engine.settings.values import SETTING_NAMES, Settings, check_settings

# Fields whose empty value means the preset's, not a missing one.
EMPTY_IS_PRESETS = ("model",)


def low_noise_guidance(value):
    """The low-noise guidance as given (a Guidance 2 box, an option) as a setting: empty or 0 (the page's box
    shows 0 for none) is None, the same guidance as the high-noise expert's; anything else as it came, for the
    check."""
    return None if value is None or value == "" or (isinstance(value, (int, float)) and value == 0) else value


def _empty(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def prepare(values: dict, preset_settings: Settings, mode: str, model_ref: Callable[[str], str],
            limits_of: Callable[[str], object], check: bool = True, drop_unused_guidance_2: bool = True) -> Settings:
    """The settings of a job made from ``values`` (raw, by field name; LoRA and transformer files found by the
    caller, whose path policy it is) on ``preset_settings``, for ``mode``, checked as a run checks them.

    ``model_ref`` checks and resolves the model reference (the page refuses paths outside its models folder);
    ``limits_of(ref)`` gives the model's limits (or None when unknown). ``check``: False leaves the check to the
    caller (a run's request check lists the settings' problems with its prompts' and images'). The command line
    passes ``drop_unused_guidance_2=False``: a low-noise guidance typed for a model of one transformer is refused
    there, not left out. InputError (or ModelError) listing what to change."""
    unknown = sorted(set(values) - set(SETTING_NAMES))
    if unknown:
        raise TypeError(f"not settings: {', '.join(unknown)}")
    given = dict(values)
    for name in EMPTY_IS_PRESETS:
        if name in given and _empty(given[name]):
            del given[name]
    ref = model_ref(given.pop("model", preset_settings.model))
    base = preset_settings.changed(steps=given["steps"]) if "steps" in given else preset_settings
    if "guidance_2" in given and drop_unused_guidance_2:
        given["guidance_2"] = _guidance_2(given["guidance_2"], given.get("guidance", base.guidance), ref, limits_of)
    settings = replace(base, **given, mode=mode, model=ref)
    if mode == "t2i":
        settings = replace(settings, frames=1)
    return check_settings(settings, limits_of(ref)) if check else settings


def _guidance_2(value, guidance, ref: str, limits_of):
    """The low-noise guidance asked for, or None where it does not apply (one transformer, or guidance off)."""
    value = low_noise_guidance(value)
    if value is None:
        return None
    limits = limits_of(ref)
    guidance_off = isinstance(guidance, (int, float)) and not isinstance(guidance, bool) and guidance <= 1.0
    return None if guidance_off or (limits is not None and limits.experts < 2) else value
