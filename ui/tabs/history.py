"""History tab: past outputs from the outputs folder; see one's settings and timings, reuse them, make one smoother
or larger (ui/tabs/history_post.py), or delete it.

Everything is read from the outputs folder each time (engine.history), so the tab shows runs from
before a restart and from other visitors; a sidecar that cannot be read is named in the summary and
never hides the others. Public API: ``/history`` (the entries as dicts, newest first; unreadable sidecars
left out) and ``/delete_output`` (by key).
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from engine.outputs.history import (
    DEFAULT_LIMIT,
    HistoryEntry,
    HistoryError,
    ReuseValues,
    delete_output,
    find_entry,
    history_limit,
    read_history,
    reuse_values,
    scan_history,
)
from ui.context import AppContext, forget_served_copies
from ui.parts.form import Form, preset_choices, preset_values
from ui.parts.visibility import visible_if
from ui.tabs.history_post import PostParts, post_layout, wire_post
from ui.tabs.ids import TAB_IDS, tab_by_id
from ui.views.history_view import (
    NOTHING_CHOSEN,
    confirm_markdown,
    entry_markdown,
    gallery_caption,
    reused_markdown,
    started_markdown,
    summary_markdown,
)
from ui.views.plan_panel import lora_text


def _error(exc: HistoryError) -> gr.Error:
    # The page renders error text as HTML; a key is the caller's own text.
    return gr.Error(html.escape(str(exc), quote=False), title="History", print_exception=False)


def _shown(entry: HistoryEntry | None) -> tuple:
    """Updates of (video, image) showing the entry's media (or neither)."""
    video = entry.media if entry is not None and entry.kind == "video" else None
    image = entry.media if entry is not None and entry.kind == "image" else None
    return (gr.Video(value=video, visible=visible_if(video is not None)),
            gr.Image(value=image, visible=visible_if(image is not None)))


def form_updates(ctx: AppContext, forms: dict[str, Form], values: ReuseValues) -> tuple[dict, list[str]]:
    """{component: value} that put ``values`` into the matching form, and warnings for what cannot be refilled."""
    form = forms[values.tab]
    updates = {**form.settings_updates(values.settings, keep=values.keep), form.prompt: values.prompt,
               form.negative_prompt: values.negative_prompt, form.seed: values.seed}
    if form.loras is not None:   # the output's LoRAs (none: an empty box), a file in models/loras/ by name
        updates[form.loras] = lora_text(values.settings.loras, ctx.models_dir or ctx.client.models_dir)
    warnings = []
    choices = preset_choices(ctx, values.tab)
    if values.preset in {name for _, name in choices}:
        updates[form.preset] = gr.Dropdown(choices=choices, value=values.preset)
    elif values.preset:
        warnings.append(f"The preset {html.escape(values.preset)} no longer exists: the form keeps its preset, "
                        "and the output's other settings are filled in.")
    if values.tab == "i2v":
        for component, path in ((form.image, values.image), (form.last_image, values.last_image),
                                (form.extend, values.extend)):
            if component is not None:
                updates[component] = path
        if values.extend is not None and form.extend_box is not None:
            updates[form.extend_box] = gr.Accordion(open=True)
        if values.extended and values.extend is None:
            warnings.append("The video this output extended is no longer there: drop a video to extend again.")
        elif values.image is None and not values.extended:
            warnings.append("The input image of this output was not kept (an older output): drop it in again.")
    if values.tab == "v2v":
        updates |= {form.video: values.video, form.strength: values.settings.strength}
        if values.video is None:
            warnings.append("The input video of this output was not kept: drop it in again.")
    return updates, warnings


def extension_updates(ctx: AppContext, form: Form, entry: HistoryEntry) -> dict:
    """{component: value} that put ``entry``'s video on the Image to Video tab to be extended: the video, no image,
    the preset that continues it (engine/post/sources.py) with the output's prompts, size and factors."""
    from engine.post.sources import extension_preset, extension_start

    name = extension_preset(ctx.presets, Path(entry.media), Path(ctx.outputs_dir))
    updates: dict = {}
    base = ctx.presets[name].settings if name else entry.settings
    if name:
        updates |= {form.preset: gr.Dropdown(choices=preset_choices(ctx, "i2v"), value=name),
                    **dict(zip(form.preset_fields(), preset_values(ctx.presets[name])))}
        if form.loras is not None:
            updates[form.loras] = lora_text(ctx.presets[name].settings.loras, ctx.models_dir or ctx.client.models_dir)
    start = extension_start(Path(entry.media), Path(ctx.outputs_dir), base)
    updates |= {getattr(form, field): value for field, value in start.values.items()
                if getattr(form, field, None) is not None}
    updates |= {form.extend: entry.media, form.image: None, form.last_image: None, form.seed: -1}
    if form.extend_box is not None:
        updates[form.extend_box] = gr.Accordion(open=True)
    return updates


def remake_updates(ctx: AppContext, form: Form, entry: HistoryEntry) -> dict:
    """{component: value} that put ``entry``'s video on the Video to Video tab: the video, its prompts, and a size of
    its shape with as many of its frames as the output's preset (or the tab's first) makes."""
    from engine.post.sources import remake_start

    base = ctx.preset_or_default(entry.preset if entry.preset in ctx.presets_for("v2v") else None, "v2v").settings
    start = remake_start(Path(entry.media), Path(ctx.outputs_dir), base)
    updates = {getattr(form, field): value for field, value in start.values.items()
               if getattr(form, field, None) is not None}
    return updates | {form.video: entry.media, form.seed: -1}


@dataclass
class _Parts:
    """The tab's components (one set for the page; their values are per browser tab)."""
    keys: gr.State          # the keys of the gallery's items, in gallery order
    chosen: gr.State        # the key of the output shown on the right
    summary: gr.Markdown
    refresh: gr.Button
    gallery: gr.Gallery
    video: gr.Video
    image: gr.Image
    reuse: gr.Button
    extend: gr.Button       # the chosen video continued on the Image to Video tab
    remake: gr.Button       # the chosen video made again on the Video to Video tab
    delete: gr.Button
    confirm_box: gr.Group
    confirm_text: gr.Markdown
    yes: gr.Button
    keep: gr.Button
    details: gr.Markdown
    post: PostParts

    def shown(self) -> list:
        """What choosing an output updates (``show``'s outputs, in order): the last one, the steps' status, is
        cleared (what it said was of the output chosen before, or of none)."""
        return [self.chosen, self.details, self.video, self.image, self.reuse, self.extend, self.remake, self.delete,
                self.confirm_box, self.post.status]

    def listing(self) -> list:
        return [self.gallery, self.keys, self.summary]


def _layout() -> _Parts:
    keys, chosen = gr.State([]), gr.State(None)
    with gr.Row():
        summary = gr.Markdown("Open this tab or press Refresh to list past outputs.", elem_id="history-summary")
        refresh = gr.Button("Refresh", size="sm", scale=0, min_width=120, elem_id="history-refresh")
    with gr.Row():
        with gr.Column(scale=3):
            gallery = gr.Gallery(label="Past outputs, newest first", columns=4, height=640, allow_preview=False,
                                 object_fit="cover", interactive=False, elem_id="history-gallery")
        with gr.Column(scale=2):
            video = gr.Video(label="Output", visible=False, autoplay=True, loop=True, interactive=False,
                             elem_id="history-video")
            image = gr.Image(label="Output", visible=False, type="filepath", interactive=False,
                             elem_id="history-image")
            with gr.Row():
                reuse_btn = gr.Button("Reuse settings", variant="primary", interactive=False, elem_id="history-reuse")
                extend_btn = gr.Button("Extend", interactive=False, elem_id="history-extend")
                remake_btn = gr.Button("Video to Video", interactive=False, elem_id="history-remake")
                delete_btn = gr.Button("Delete", variant="stop", interactive=False, elem_id="history-delete")
            with gr.Group(visible=False, elem_id="history-confirm") as confirm_box:
                confirm_text = gr.Markdown(elem_id="history-confirm-text")
                with gr.Row():
                    yes_btn = gr.Button("Yes, delete", variant="stop", elem_id="history-confirm-delete")
                    keep_btn = gr.Button("Keep", elem_id="history-keep")
            post = post_layout()
            details = gr.Markdown(NOTHING_CHOSEN, elem_id="history-details")
    return _Parts(keys, chosen, summary, refresh, gallery, video, image, reuse_btn, extend_btn, remake_btn, delete_btn,
                  confirm_box, confirm_text, yes_btn, keep_btn, details, post)


def _entry_for(ctx: AppContext, key) -> HistoryEntry:
    try:
        return find_entry(ctx.outputs_dir, key)
    except HistoryError as exc:
        raise _error(exc) from None


def _delete_everywhere(ctx: AppContext, key) -> list[str]:
    """The output's files, and the copies of them the page was served from."""
    try:
        removed = delete_output(ctx.outputs_dir, key)
    except HistoryError as exc:
        raise _error(exc) from None
    forget_served_copies(ctx.served_dir, removed)
    return removed


def build(ctx: AppContext, tabs: gr.Tabs, forms: dict[str, Form]) -> None:
    parts = _layout()

    def list_outputs(chosen: str | None = None):
        """The gallery (still on ``chosen`` while it is listed), its keys and the summary."""
        found = read_history(ctx.outputs_dir, limit=DEFAULT_LIMIT)
        items = [(entry.media, gallery_caption(entry)) for entry in found.entries]
        keys = [entry.key for entry in found.entries]
        return (gr.Gallery(value=items, selected_index=keys.index(chosen) if chosen in keys else None), keys,
                summary_markdown(len(found.entries), DEFAULT_LIMIT, found.unreadable))

    history_tab = tab_by_id(tabs, "history")
    triggers = [parts.refresh.click] + ([history_tab.select] if history_tab is not None else [])
    gr.on(triggers, list_outputs, parts.chosen, parts.listing(), api_visibility="private", show_progress="minimal")
    _wire_one_output(ctx, parts, tabs, forms, list_outputs)
    wire_post(ctx, parts.post, parts.chosen, parts.listing(), list_outputs)
    _public_api(ctx)


def _wire_one_output(ctx: AppContext, parts: _Parts, tabs: gr.Tabs, forms: dict[str, Form], list_outputs) -> None:
    """Choosing an output shows its settings; Reuse fills the matching form; Delete asks, then deletes."""
    def show(keys, evt: gr.SelectData):
        index = evt.index if isinstance(evt.index, int) else -1
        if not 0 <= index < len(keys):
            raise gr.Error("That output is no longer listed; press Refresh.", title="History", print_exception=False)
        entry = _entry_for(ctx, keys[index])
        video = entry.kind == "video"
        return (entry.key, entry_markdown(entry), *_shown(entry), gr.Button(interactive=True),
                gr.Button(interactive=video), gr.Button(interactive=video), gr.Button(interactive=True),
                gr.Group(visible=False), "")

    parts.gallery.select(show, parts.keys, parts.shown(), api_visibility="private", show_progress="hidden")
    reuse_targets = [tabs, *(box for form in forms.values() for box in form.boxes().values()),
                     *(form.extend_box for form in forms.values() if form.extend_box is not None),
                     *(form.status for form in forms.values() if form.status is not None)]

    def reuse(key):
        """Fill the matching tab's form with the output's settings (its seed included) and switch to it."""
        values = reuse_values(_entry_for(ctx, key))
        updates, warnings = form_updates(ctx, forms, values)
        for warning in warnings:
            gr.Warning(warning)
        form = forms[values.tab]
        said = {form.status: reused_markdown(_entry_for(ctx, key))} if form.status is not None else {}
        return {tabs: gr.Tabs(selected=TAB_IDS[values.tab]), **updates, **said}

    parts.reuse.click(reuse, parts.chosen, reuse_targets, api_visibility="private", show_progress="hidden")

    def from_video(key, kind: str):
        """The chosen video put on the tab that continues it (``kind`` "i2v") or makes it again ("v2v")."""
        entry = _entry_for(ctx, key)
        if entry.kind != "video":
            raise gr.Error("Pick a video: a still has no frames to go on from.", title="History", print_exception=False)
        form = forms[kind]
        updates = (extension_updates if kind == "i2v" else remake_updates)(ctx, form, entry)
        said = {form.status: started_markdown(entry, kind)} if form.status is not None else {}
        return {tabs: gr.Tabs(selected=TAB_IDS[kind]), **updates, **said}

    if "v2v" in forms:
        parts.extend.click(lambda key: from_video(key, "i2v"), parts.chosen, reuse_targets, api_visibility="private",
                           show_progress="hidden")
        parts.remake.click(lambda key: from_video(key, "v2v"), parts.chosen, reuse_targets, api_visibility="private",
                           show_progress="hidden")
    parts.delete.click(lambda key: (gr.Group(visible=True), confirm_markdown(_entry_for(ctx, key))), parts.chosen,
                       [parts.confirm_box, parts.confirm_text], api_visibility="private", show_progress="hidden")
    parts.keep.click(lambda: gr.Group(visible=False), None, parts.confirm_box, api_visibility="private",
                     show_progress="hidden")

    def confirm_delete(key):
        removed = _delete_everywhere(ctx, key)
        gr.Info(f"Deleted {html.escape(removed[0])} and {len(removed) - 1} file(s) that belonged to it.")
        return (None, NOTHING_CHOSEN, *_shown(None), *(gr.Button(interactive=False) for _ in range(4)),
                gr.Group(visible=False), "", *list_outputs())

    parts.yes.click(confirm_delete, parts.chosen, [*parts.shown(), *parts.listing()], api_visibility="private",
                    show_progress="hidden")


def _public_api(ctx: AppContext) -> None:
    def history(limit: int = DEFAULT_LIMIT) -> list[dict]:
        """Past outputs, newest first (at most ``limit``, 1 to 1000; left out: 100): key, media and sidecar paths,
        created, mode, prompt, negative prompt, model, preset, size, frames, steps, guidance, shift, seed, fps,
        plan strategy, per-phase timings, peak VRAM and RAM, kept input images and note. Sidecars that cannot be
        read are left out (the History tab names them)."""
        try:
            count = history_limit(limit)
        except HistoryError as exc:
            raise _error(exc) from None
        return [entry.to_dict() for entry in scan_history(ctx.outputs_dir, limit=count)]

    def delete_output_api(key: str) -> dict:
        """Delete the output with this key (as /history lists it) and its sidecar, latents and kept inputs.
        Returns {"key": key, "removed": [file names]}; an unknown or already deleted key is an error."""
        return {"key": key, "removed": _delete_everywhere(ctx, key)}

    gr.api(history, api_name="history")
    gr.api(delete_output_api, api_name="delete_output")
