"""Presets tab: every preset with its description; one click applies it to its tab."""
from __future__ import annotations

import gradio as gr

from .context import AppContext
from .form import Form, preset_values


def _card(preset) -> str:
    kind = "Image to Video" if preset.mode == "i2v" else "Text to Video"
    seconds = (preset.frames - 1) / preset.fps
    return (f"### {preset.title}\n{preset.description}\n\n"
            f"- Model: `{preset.model}` ({kind})\n"
            f"- {preset.width}x{preset.height}, {preset.frames} frames ({seconds:.1f} s at {preset.fps} fps), "
            f"{preset.steps} steps, guidance {preset.guidance:g}, shift {preset.shift:g}")


def build(ctx: AppContext, tabs: gr.Tabs, forms: dict[str, Form]) -> None:
    for name, preset in ctx.presets.items():
        with gr.Group():
            gr.Markdown(_card(preset))
            button = gr.Button(f"Use {preset.title}", size="sm", elem_id=f"use-preset-{name}")
        form = forms["i2v" if preset.mode == "i2v" else "t2v"]
        tab_id = "i2v-tab" if preset.mode == "i2v" else "t2v-tab"

        def apply(name=name):
            return [gr.Tabs(selected=tab_id), name, *preset_values(ctx.presets[name])]

        button.click(apply, None, [tabs, form.preset, *form.preset_fields()], api_visibility="private")
