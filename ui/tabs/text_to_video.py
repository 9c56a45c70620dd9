"""Text to Video tab (with text-to-image as its 1-frame mode)."""
from __future__ import annotations

import gradio as gr

from ui.context import AppContext
from ui.generate import generation, start_job, wire_cancel
from ui.parts.form import Form, build_form, build_plan_panel
from ui.parts.job_panel import build_job_panel


def build(ctx: AppContext, after_job) -> Form:
    """The tab; ``after_job(run)`` chains what the page does once any of its runs has ended."""
    with gr.Row():
        with gr.Column(scale=1):
            def actions():
                with gr.Row():
                    return (gr.Button("Generate video", variant="primary", elem_id="t2v-generate"),
                            gr.Button("Generate image (1 frame)", variant="secondary", elem_id="t2i-generate"),
                            gr.Button("Cancel", variant="secondary", elem_id="t2v-cancel"))

            form, (video_btn, image_btn, cancel_btn) = build_form(ctx, "t2v", "t2v", actions)
            panel = build_plan_panel(ctx, form, "t2v", "t2v", api_name="plan")
        with gr.Column(scale=1):
            job = build_job_panel("t2v", still=True)
    form.status = job.status

    # The API's parameters are the field table's (engine/settings/fields.py), in its order: the plan overrides,
    # the LoRAs, the transformer files, the GPUs and the low-noise guidance come last, each with its box's default.
    inputs = form.api_inputs("t2v")
    video_run = start_job(video_btn, cancel_btn, generation(ctx, "t2v", "text to video", job.show()), inputs,
                          job.outputs(), ctx, "text_to_video")
    image_run = start_job(image_btn, cancel_btn, generation(ctx, "t2i", "text to image", job.show(job.still)),
                          inputs, job.outputs(job.still), ctx, "text_to_image")
    job.reveal_after(video_run, image_run)
    wire_cancel(ctx, cancel_btn, job.cancel_answer, api_name="cancel")
    after_job(video_run)
    after_job(image_run)
    return form
