"""One way from raw values to a checked job: every caller (the command line, the page's Generate buttons, its
plan panel, preset saving, the shortest API) gives the values it has by field name (engine/settings/fields.py),
with its own path policy, and ``prepare`` reads them, applies the preset and checks.

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

from dataclasses import dataclass, replace
from typing import Callable

from engine.models.single_file import TRANSFORMERS
from engine.settings.fields import FIELD, SETTING_TYPES, Group, read_all
from engine.settings.presets import Preset
from engine.settings.request import GenerationRequest
from engine.settings.values import Settings, check_settings

# Fields whose empty value means the preset's, not a missing one.
EMPTY_IS_PRESETS = ("model",)


def _same(value):
    return value


@dataclass(frozen=True)
class Paths:
    """The caller's path policy: how a model reference, LoRA files and transformer files it was given are found
    and allowed. The page refuses paths outside its models folder; the command line finds a bare name there."""
    model: Callable[[str], str] = _same                     # a model reference, checked and resolved
    loras: Callable[[tuple], tuple] = _same                 # Lora values with each file found
    transformers: Callable[[dict], dict] = _same            # {"transformer": file or None, ...} with files found


def _empty(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def prepare(values: dict, preset_settings: Settings, mode: str, paths: Paths,
            limits_of: Callable[[str], object], check: bool = True, drop_unused_guidance_2: bool = True) -> Settings:
    """The settings of a job made from ``values`` (raw, by setting name, as a box or an option gives them: read by
    the field table) on ``preset_settings``, for ``mode``, checked as a run checks them.

    ``paths`` finds the model and the files; ``limits_of(ref)`` gives the model's limits (or None when unknown).
    ``check``: False leaves the check to the caller (a run's request check lists the settings' problems with its
    prompts' and images'). The command line passes ``drop_unused_guidance_2=False``: a low-noise guidance typed
    for a model of one transformer is refused there, not left out. InputError (or ModelError) listing what to
    change; TypeError for a name that is no setting (a programming error)."""
    unknown = sorted(set(values) - set(SETTING_TYPES))
    if unknown:
        raise TypeError(f"not settings: {', '.join(unknown)}")
    given = read_all(values)
    for name in EMPTY_IS_PRESETS:
        if name in given and _empty(given[name]):
            del given[name]
    if "loras" in given:
        given["loras"] = paths.loras(given["loras"])
    files = {name: given[name] for name in TRANSFORMERS if name in given}
    given |= paths.transformers(files) if files else {}
    ref = paths.model(given.pop("model", preset_settings.model))
    base = preset_settings.changed(steps=given["steps"]) if "steps" in given else preset_settings
    if drop_unused_guidance_2:   # the preset's too: another model, or guidance off, leaves it out
        given["guidance_2"] = _guidance_2(given.get("guidance_2", base.guidance_2), given.get("guidance", base.guidance),
                                          ref, limits_of)
    settings = replace(base, **given, mode=mode, model=ref)
    if mode == "t2i":
        settings = replace(settings, frames=1)
    return check_settings(settings, limits_of(ref)) if check else settings


def prepare_request(values: dict, preset: Preset, mode: str, paths: Paths, limits_of: Callable[[str], object],
                    outputs_dir: str, drop_unused_guidance_2: bool = True, keep_latents: bool = False
                    ) -> GenerationRequest:
    """The request ``values`` make (settings and the request's own fields by name: prompt, negative_prompt, seed,
    image, last_image, video, extend as paths), unchecked: the run's request check lists every problem, its prompts' and images'
    with its settings'. A negative prompt not given (or None) is the preset's, no seed (or None) is random."""
    own = {name: values[name] for name in values if name in FIELD and FIELD[name].group is Group.REQUEST}
    settings = prepare({name: value for name, value in values.items() if name not in own}, preset.settings, mode,
                       paths, limits_of, check=False, drop_unused_guidance_2=drop_unused_guidance_2)
    negative = own.get("negative_prompt")
    seed = own.get("seed")
    return GenerationRequest(
        settings, own.get("prompt"), negative_prompt=preset.negative_prompt if negative is None else negative,
        seed=-1 if seed is None else seed, image=own.get("image"), last_image=own.get("last_image"),
        video=own.get("video"), extend=own.get("extend"), preset=preset.name, outputs_dir=outputs_dir, keep_latents=keep_latents)


def _guidance_2(value, guidance, ref: str, limits_of):
    """The low-noise guidance asked for, or None where it does not apply (one transformer, or guidance off)."""
    if value is None:
        return None
    limits = limits_of(ref)
    guidance_off = isinstance(guidance, (int, float)) and not isinstance(guidance, bool) and guidance <= 1.0
    return None if guidance_off or (limits is not None and limits.experts < 2) else value
