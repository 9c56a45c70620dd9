"""Saving a generation form's settings as one of the user's presets, and deleting them (pure; no gradio)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine.models.selftest import SELFTEST_REFS
from engine.settings.presets import Preset, PresetError, check_user_preset_name, preset_json
from engine.settings.draft import prepare
from engine.settings.fields import Place, on_page
from engine.settings.values import PRESET_MODES, InputError
from engine.settings.request import check_prompt, clean_prompt
from ui.context import AppContext
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


# What a preset saved from the page holds of the form: the preset it started from, the negative prompt, the
# settings boxes (engine/settings/fields.py, Place.FORM) and the LoRA box; the rest comes from that preset.
SAVED_FIELDS = ("preset", "negative_prompt", *(field.name for field in on_page(Place.FORM)), "loras")


def preset_data(ctx: AppContext, name: str, mode: str, values: dict, title: str | None = "",
                description: str | None = "") -> dict:
    """The JSON object of a user preset holding these settings, checked as a run checks them.

    ``values`` are raw, by field name (SAVED_FIELDS): ``preset`` is the preset the form was filled from; values
    not given come from it, and so does what the form does not show (fps, scheduler and fixed sigmas, size
    multiple), so the saved preset runs exactly as the form would. ``loras`` is the LoRA box's text (one
    ``file: strength[@high|@low]`` a line, each file found as a run finds it, a preset's published LoRA keeping
    its source); ``guidance_2`` Wan2.2 A14B's low-noise guidance (0 or empty: the same as guidance). Raises a
    ValueError (PresetError, InputError, ModelError) that says what to change.
    """
    if mode not in PRESET_MODES:
        raise PresetError(f"mode must be one of {', '.join(PRESET_MODES)} (text or image to video), got {mode!r}")
    values = dict(values)
    base = ctx.preset_or_default(values.pop("preset", None), mode)
    negative_prompt = values.pop("negative_prompt", None)
    # The model as a run would take it (a path outside the models folder is refused, unless allowed); checked as
    # text-to-video settings (image-to-video checks the same numbers).
    settings = prepare(values, base.settings, "t2v", ctx.paths, ctx.client.catalog.limits,
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


def save_user_preset(ctx: AppContext, name: str, mode: str, values: dict, title: str | None = "",
                     description: str | None = "") -> Saved:
    """Save (or replace) one of the user's presets from ``values`` (preset_data's).

    Refusals are ValueErrors saying what to change; nothing is written then.
    """
    store = _store(ctx)
    name = check_user_preset_name(name, store.builtin)   # the name first: the likeliest mistake
    return Saved(*store.save(preset_data(ctx, name, mode, values, title, description)))


def delete_user_preset(ctx: AppContext, name: str) -> str:
    """Delete one of the user's presets; a sentence saying so. Built-ins and unknown names are refused."""
    removed = _store(ctx).delete(name)
    return f"Deleted your preset **{removed.name}**."
