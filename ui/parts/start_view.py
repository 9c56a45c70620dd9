"""What the image- and video-to-video tabs share: their Generate and Cancel row, and beside the result what the
model starts from (a frame at the run's size), a note on how it was prepared, and a button that fits the form to it."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr


def generate_and_cancel(prefix: str) -> tuple[gr.Button, gr.Button]:
    """The tab's Generate video and Cancel buttons, side by side (build_form places them under the prompt)."""
    with gr.Row():
        return (gr.Button("Generate video", variant="primary", elem_id=f"{prefix}-generate"),
                gr.Button("Cancel", variant="secondary", elem_id=f"{prefix}-cancel"))


@dataclass
class StartView:
    fitted: gr.Image     # the frame the model starts from, at the run's size
    note: gr.Markdown    # how it was prepared, or why it cannot be used
    button: gr.Button    # fits the form to the input (its aspect, its length)


def start_view(prefix: str, label: str, empty: str, button: str) -> StartView:
    """The row above the result: the frame the model starts from, its note (``empty`` while there is no input) and
    the button that fits the form to the input."""
    with gr.Row(equal_height=True):
        fitted = gr.Image(label=label, type="pil", interactive=False, elem_id=f"{prefix}-fitted", height=150,
                          min_width=150, scale=1)
        with gr.Column(scale=2):
            note = gr.Markdown(empty, elem_id=f"{prefix}-fit-note")
            fit = gr.Button(button, size="sm", elem_id=f"{prefix}-use-{'aspect' if prefix == 'i2v' else 'shape'}")
    return StartView(fitted, note, fit)
