"""Saving a generation form's settings as one of the user's presets, and deleting them (pure; no gradio)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine.models.selftest import SELFTEST_REFS
from engine.settings.loras import parse_lora_lines
from engine.settings.presets import Preset, PresetError, check_user_preset_name, preset_json
from engine.settings.draft import prepare
from engine.settings.values import PRESET_MODES, InputError
from engine.settings.request import check_prompt, clean_prompt
from ui.context import PRESETS_OWN, AppContext
from ui.views.preset_cards import MODE_TITLES


def _store(ctx: AppContext):
    if ctx.user_presets is None:
        raise PresetError("saving presets is off in this app (it was started without a user presets folder)")
    return ctx.user_presets


def _text(value, what: str) -> str:
    """``value`` cleaned as prompts are (control and invisible characters removed), or PresetError."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PresetError(f"the {what} must be text, got {type(value).__name__}")
    return clean_prompt(value)[0].strip()


def preset_data(ctx: AppContext, name: str, mode: str, preset: str | None, negative_prompt: str | None,
                model: str | None, width, height, frames, steps, guidance, shift,
                title: str | None = "", description: str | None = "", loras: str | None = None,
                guidance_2=PRESETS_OWN) -> dict:
    """The JSON object of a user preset holding these settings, checked as a run checks them.

    ``preset`` is the preset the form was filled from: values left out (None) come from it, and
    so does what the form does not show (fps, scheduler and fixed sigmas, size multiple), so the
    saved preset runs exactly as the form would. Raises a ValueError (PresetError, InputError,
    ModelError) that says what to change. ``loras``: the LoRA box's text (one ``file: strength[@high|@low]`` a
    line, each file found as a run finds it, a preset's published LoRA keeping its source); None keeps the
    preset's LoRAs. ``guidance_2``: Wan2.2 A14B's low-noise guidance (None: the same as guidance; left out: the
    preset's).
    """
    if mode not in PRESET_MODES:
        raise PresetError(f"mode must be one of {', '.join(PRESET_MODES)} (text or image to video), got {mode!r}")
    base = ctx.preset_or_default(preset, mode)
    # Values left out (None) are the preset's; the model as a run would take it (a path outside the models folder
    # is refused, unless allowed); checked as text-to-video settings (image-to-video checks the same numbers).
    given = {name: value for name, value in dict(model=model, width=width, height=height, frames=frames,
                                                 steps=steps, guidance=guidance, shift=shift).items()
             if value is not None}
    if guidance_2 is not PRESETS_OWN:
        given["guidance_2"] = guidance_2
    if loras is not None:
        given["loras"] = ctx.lora_files(parse_lora_lines(loras))
    settings = prepare(given, base.settings, "t2v", ctx.model_ref, ctx.client.catalog.limits,
                       drop_unused_guidance_2=False)
    problems: list[str] = []
    negative = check_prompt("negative prompt", base.negative_prompt if negative_prompt is None else negative_prompt,
                            False, problems, [])
    if problems:
        raise InputError(problems)
    title = " ".join(_text(title, "title").split()) or name
    description = _text(description, "description") or (
        f"Saved from the {MODE_TITLES[mode]} tab, starting from {base.title}.")
    return preset_json(Preset(name, title, description, replace(settings, mode=mode), negative,
                              selftest=settings.model in SELFTEST_REFS))


@dataclass(frozen=True)
class Saved:
    preset: Preset
    replaced: bool      # an earlier preset of the user's with this name was replaced

    @property
    def message(self) -> str:
        verb = "Replaced" if self.replaced else "Saved"
        return (f"{verb} your preset **{self.preset.name}** as {self.preset.name}.json in the user presets "
                f"folder. It is in the Preset list of the {MODE_TITLES[self.preset.settings.mode]} tab.")

    def to_dict(self) -> dict:
        """What the save_preset API returns."""
        return {"name": self.preset.name, "replaced": self.replaced, "message": self.message,
                "preset": preset_json(self.preset)}


def save_user_preset(ctx: AppContext, name: str, mode: str, preset: str | None, negative_prompt: str | None,
                     model: str | None, width, height, frames, steps, guidance, shift,
                     title: str | None = "", description: str | None = "", loras: str | None = None,
                     guidance_2=PRESETS_OWN) -> Saved:
    """Save (or replace) one of the user's presets.

    Refusals are ValueErrors saying what to change; nothing is written then.
    """
    store = _store(ctx)
    name = check_user_preset_name(name, store.builtin)   # the name first: the likeliest mistake
    data = preset_data(ctx, name, mode, preset, negative_prompt, model, width, height, frames, steps,
                       guidance, shift, title, description, loras, guidance_2)
    return Saved(*store.save(data))


def delete_user_preset(ctx: AppContext, name: str) -> str:
    """Delete one of the user's presets; a sentence saying so. Built-ins and unknown names are refused."""
    removed = _store(ctx).delete(name)
    return f"Deleted your preset **{removed.name}**."
