"""Presets tab: every preset with what it would need on this machine; use one, save your own, delete yours
(after a confirmation).

The cards are drawn (``@gr.render``) from a JSON listing that is filled when the page loads (the
engine process may not be up while the page is built) and again after every save or delete; the
same listing is the public ``/presets`` API. ``/save_preset`` and ``/delete_preset`` are API
endpoints of their own, so that callers pass values instead of the two forms' components.
"""
from __future__ import annotations

import html

import gradio as gr

from engine.words import sentence
from ui.context import AppContext
from ui.parts.form import Form, preset_choices, preset_values
from ui.parts.visibility import visible_if
from ui.preset_saving import SAVED_FIELDS, delete_user_preset, save_user_preset
from ui.tabs.ids import TAB_IDS, tab_by_id
from ui.views.plan_panel import lora_text
from ui.views.text import plain
from ui.views.preset_cards import MODE_TITLES, card_markdown, machine_markdown, preset_entries

SAVE_HELP = ("The current values of the chosen tab's form (preset, model, negative prompt, size, frames, steps, "
             "guidance, guidance 2, shift, LoRAs; not the prompt or the seed) become a preset of your own, listed "
             "above and in that tab's Preset list. Names: letters, digits, '-' and '_', up to 64 characters. "
             "Saving again under one of your names replaces that preset; the built-in presets' names are taken.")


def _saved_fields(form: Form, mode: str) -> dict:
    """{"<mode>:<field>": box} of what a saved preset holds of this form (SAVED_FIELDS)."""
    boxes = form.boxes()
    return {f"{mode}:{name}": boxes[name] for name in SAVED_FIELDS if name in boxes}


def _escaped(exc: Exception) -> str:
    # Messages are rendered as markdown/HTML, and names in them are the caller's own text.
    return html.escape(str(exc), quote=False)


class _Dropdowns:
    """The generation tabs' Preset dropdowns, kept in step with the presets that exist.

    Only through updates returned to one session: the components themselves are shared by every session and
    are never changed. (The generation events and the plan take a preset name as sent, preprocess=False, so
    an API caller may use a new preset by name without any dropdown listing it.)
    """

    def __init__(self, ctx: AppContext, forms: dict[str, Form]):
        self.ctx = ctx
        self.forms = forms
        self.components = [form.preset for form in forms.values()]

    def choices(self) -> dict[str, list]:
        """{mode: (title, name) of every preset now known}."""
        return {mode: preset_choices(self.ctx, mode) for mode in self.forms}

    def updates(self, *current: str | None, select: tuple[str, str] | None = None) -> list:
        """This session's dropdown updates; ``current`` = their values, ``select`` = (mode, name) to pick."""
        choices = self.choices()
        updates = []
        for mode, value in zip(self.forms, current):
            names = [name for _, name in choices[mode]]
            if select and select[0] == mode:
                updates.append(gr.Dropdown(choices=choices[mode], value=select[1]))
            elif value not in names:   # deleted: to the preset the tab starts on here
                updates.append(gr.Dropdown(choices=choices[mode], value=self.fallback(mode)))
            else:                      # the value stays, so the form keeps its edits
                updates.append(gr.Dropdown(choices=choices[mode]))
        return updates

    def fallback(self, mode: str) -> str:
        """The preset a tab whose preset is gone turns to: the one it starts on (--model's, else the first that
        fits this machine), never one that cannot run here while one can."""
        if self.ctx.default_model:
            return self.ctx.default_preset(mode)
        try:
            return self.ctx.fitting_preset(mode, self.ctx.client.hardware_profile())
        except OSError:   # the engine did not say what it runs on
            return self.ctx.default_preset(mode)

    def switched(self, *current: str | None) -> list[str]:
        """A sentence for each tab whose preset is gone, saying which preset it uses now."""
        known = self.choices()
        said = []
        for mode, value in zip(self.forms, current):
            if value and value not in [name for _, name in known[mode]]:
                now = self.ctx.presets[self.fallback(mode)]
                said.append(f"The {MODE_TITLES.get(mode, mode)} tab used it, so it now uses {now.title}, with that "
                            "preset's settings.")
        return said

    def skip(self) -> list:
        return [gr.skip()] * len(self.components)

    @property
    def filled(self) -> list:
        """The dropdowns, then every form's preset fields: what a deleted preset's tab gets back."""
        return [*self.components, *(box for form in self.forms.values() for box in form.preset_fields())]

    def updates_and_forms(self, *current: str | None) -> list:
        """``updates``, and the default preset's values in each form whose chosen preset is gone (a form whose
        preset stays keeps its edits)."""
        known = self.choices()
        fields = []
        for (mode, form), value in zip(self.forms.items(), current):
            gone = value not in [name for _, name in known[mode]]
            fields += (preset_values(self.ctx.presets[self.fallback(mode)]) if gone
                       else [gr.skip()] * len(form.preset_fields()))
        return [*self.updates(*current), *fields]

    def skip_all(self) -> list:
        return [gr.skip()] * len(self.filled)


def build(ctx: AppContext, tabs: gr.Tabs, forms: dict[str, Form]) -> None:
    dropdowns = _Dropdowns(ctx, forms)
    listing = gr.JSON(preset_entries(ctx, None, "still being worked out"), label="presets", visible="hidden",
                      elem_id="presets-data")

    def presets() -> list[dict]:
        """Every preset: its settings, whether it is yours (user), and the memory plan the engine expects
        on its hardware (plan: strategy, fits, expected_peak_vram_gb, expected_peak_ram_gb, to_make_it_fit...)."""
        if ctx.user_presets is not None:
            ctx.user_presets.reload()   # files dropped into the folder (or removed) while the app runs
        try:
            hardware = ctx.client.hardware_profile()
        except (EOFError, OSError) as exc:
            return preset_entries(ctx, None, f"the engine process did not answer ({exc}); reload the page")
        return preset_entries(ctx, hardware)

    # On page load (public as /presets) and whenever the tab is opened (presets another visitor saved or
    # deleted meanwhile): the listing, then the dropdowns.
    presets_tab = tab_by_id(tabs, "presets")
    refreshes = [gr.on(None, presets, None, listing, api_name="presets", show_progress="hidden")]
    if presets_tab is not None:
        refreshes.append(presets_tab.select(presets, None, listing, api_visibility="private", show_progress="hidden"))
    skipped = gr.Markdown(elem_id="presets-skipped")
    for refresh in refreshes:
        refresh.then(dropdowns.updates_and_forms, dropdowns.components, dropdowns.filled, api_visibility="private",
                     show_progress="hidden")
        refresh.then(lambda: skipped_markdown(ctx), None, skipped, api_visibility="private", show_progress="hidden")

    # Shared by the cards' Delete buttons and the save section; placed under the Save button.
    message = gr.Markdown(elem_id="preset-message", render=False)
    _build_cards(ctx, tabs, forms, listing, dropdowns, presets, message)
    _build_save(ctx, forms, listing, dropdowns, presets, message)
    _build_api(ctx)


def skipped_markdown(ctx: AppContext) -> str:
    """The user preset files that could not be used, each with why ('' when there are none)."""
    problems = ctx.user_presets.reload() if ctx.user_presets is not None else []
    if not problems:
        return ""
    return "**Preset files skipped:**\n" + "\n".join(f"- {plain(sentence(problem))}" for problem in problems)


def _build_cards(ctx: AppContext, tabs: gr.Tabs, forms: dict[str, Form], listing: gr.JSON,
                 dropdowns: _Dropdowns, presets, message: gr.Markdown) -> None:
    """The cards, redrawn whenever the listing changes."""
    def card(entry: dict) -> None:
        name = entry["name"]
        form = forms["i2v" if entry["mode"] == "i2v" else "t2v"]
        with gr.Group(elem_id=f"preset-card-{name}", elem_classes=["preset-card"]):
            gr.Markdown(card_markdown(entry))
            with gr.Row():
                use = gr.Button("Use this preset", size="sm", variant="primary", elem_id=f"use-preset-{name}",
                                scale=0, min_width=160)
                if entry.get("user"):   # the user's own: Delete asks first
                    delete = gr.Button("Delete", size="sm", variant="stop", elem_id=f"delete-preset-{name}")
                    sure = gr.Button(f"Yes, delete {name}", size="sm", variant="stop", visible=False,
                                     elem_id=f"confirm-delete-preset-{name}")
                    keep = gr.Button("Keep it", size="sm", visible=False, elem_id=f"keep-preset-{name}")
                else:
                    delete = None

        def apply():
            preset = ctx.presets.get(name)
            if preset is None:
                raise gr.Error(f"The preset {html.escape(name)} was deleted; reload the page.", print_exception=False)
            models = ctx.models_dir or ctx.client.models_dir
            box = [lora_text(preset.settings.loras, models)] if form.loras is not None else []
            return [gr.Tabs(selected=TAB_IDS["i2v" if preset.settings.mode == "i2v" else "t2v"]), name,
                    *preset_values(preset), *box]

        filled = [*form.preset_fields(), *([form.loras] if form.loras is not None else [])]
        use.click(apply, None, [tabs, form.preset, *filled], api_visibility="private")
        if delete is not None:
            def remove(*current):
                try:
                    text = delete_user_preset(ctx, name)
                except ValueError as exc:
                    return [f"**Not deleted:** {_escaped(exc)}", gr.skip(), *dropdowns.skip_all()]
                switched = " ".join(dropdowns.switched(*current))
                return [f"{text} {switched}".strip(), presets(), *dropdowns.updates_and_forms(*current)]

            def asking(ask: bool):
                return [gr.Button(visible=visible_if(not ask)), *(gr.Button(visible=visible_if(ask)) for _ in range(2))]

            delete.click(lambda: asking(True), None, [delete, sure, keep], api_visibility="private",
                         queue=False, show_progress="hidden")
            keep.click(lambda: asking(False), None, [delete, sure, keep], api_visibility="private",
                       queue=False, show_progress="hidden")
            sure.click(remove, dropdowns.components, [message, listing, *dropdowns.filled],
                       api_visibility="private")

    @gr.render(inputs=listing)
    def cards(entries):
        gr.Markdown(machine_markdown(entries or []), elem_id="presets-machine")
        for entry in entries or []:
            card(entry)


def _build_save(ctx: AppContext, forms: dict[str, Form], listing: gr.JSON, dropdowns: _Dropdowns, presets,
                message: gr.Markdown) -> None:
    """Save current settings as a preset: one section, with a selector for which tab's form."""
    with gr.Group(elem_id="preset-save-panel"):
        gr.Markdown("### Save current settings as a preset\n" + SAVE_HELP)
        with gr.Row():
            mode = gr.Radio([(MODE_TITLES[key], key) for key in forms], value="t2v", label="Settings of the tab",
                            elem_id="preset-save-mode", scale=1)
            name = gr.Textbox(label="Name", placeholder="my-preset", elem_id="preset-save-name",
                              scale=1)
            title = gr.Textbox(label="Title (optional)", elem_id="preset-save-title", scale=2)
        description = gr.Textbox(label="Description (optional)", lines=2, elem_id="preset-save-description")
        save_btn = gr.Button("Save as preset", variant="primary", elem_id="preset-save-button")
        message.render()
    def save_from_page(name, title, description, mode, **boxes):
        """``boxes``: every form's saved fields, as "<mode>:<field>" (_saved_fields)."""
        by_mode = {key: {field: value for box, value in boxes.items() if box.startswith(f"{key}:")
                         for field in [box.partition(":")[2]]} for key in forms}
        if mode not in by_mode:
            return ["**Not saved:** choose whose settings to save: Text to Video or Image to Video.",
                    gr.skip(), *dropdowns.skip()]
        try:
            saved = save_user_preset(ctx, name, mode, by_mode[mode], title=title, description=description)
        except ValueError as exc:
            return [f"**Not saved:** {_escaped(exc)}", gr.skip(), *dropdowns.skip()]
        current = [values.get("preset") for values in by_mode.values()]   # each form's Preset value
        return [saved.message, presets(), *dropdowns.updates(*current, select=(mode, saved.preset.name))]

    fields = {key: box for mode_, form in forms.items() for key, box in _saved_fields(form, mode_).items()}
    save_btn.click(save_from_page, [name, title, description, mode], [message, listing, *dropdowns.components],
                   inputs_kwargs=fields, api_visibility="private")


def _build_api(ctx: AppContext) -> None:
    """/save_preset and /delete_preset, with values for inputs (the page's buttons are private)."""
    def save_preset(name: str, mode: str = "t2v", preset: str = "", negative_prompt: str | None = None,
                    model: str = "", width: int | None = None, height: int | None = None,
                    frames: int | None = None, steps: int | None = None, guidance: float | None = None,
                    shift: float | None = None, title: str = "", description: str = "",
                    guidance_2: float | None = None) -> dict:
        """Save settings as one of your presets; mode t2v or i2v; values left out (null) come from `preset`
        (guidance_2, Wan2.2 A14B's low-noise guidance, too; 0 is the same as guidance). Returns {name, replaced,
        message, preset}; the preset is usable by its name at once."""
        given = dict(preset=preset, negative_prompt=negative_prompt, model=model, width=width, height=height,
                     frames=frames, steps=steps, guidance=guidance, shift=shift, guidance_2=guidance_2)
        try:
            saved = save_user_preset(ctx, name, mode, {key: value for key, value in given.items() if value is not None},
                                     title=title, description=description)
        except ValueError as exc:
            raise gr.Error(_escaped(exc), title="Preset not saved", print_exception=False) from None
        return saved.to_dict()

    def delete_preset(name: str) -> str:
        """Delete one of your presets (built-in presets cannot be deleted)."""
        try:
            text = delete_user_preset(ctx, name)
        except ValueError as exc:
            raise gr.Error(_escaped(exc), title="Preset not deleted", print_exception=False) from None
        return text

    gr.api(save_preset, api_name="save_preset")
    gr.api(delete_preset, api_name="delete_preset")
