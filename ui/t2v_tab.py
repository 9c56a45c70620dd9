"""Text to Video tab (with text-to-image as its 1-frame mode)."""
from __future__ import annotations

import gradio as gr

from .context import AppContext
from .form import Form, build_form, build_plan_panel
from .generate import GPU_QUEUE, build_request, stream, wire_cancel
from .job_panel import build_job_panel
from .plan_panel import AUTO


def build(ctx: AppContext) -> Form:
    with gr.Row():
        with gr.Column(scale=1):
            form = build_form(ctx, "t2v", "t2v")
            with gr.Row():
                video_btn = gr.Button("Generate video", variant="primary", elem_id="t2v-generate")
                image_btn = gr.Button("Generate image (1 frame)", elem_id="t2i-generate")
                cancel_btn = gr.Button("Cancel", variant="stop", elem_id="t2v-cancel")
            panel = build_plan_panel(ctx, form, "t2v", "t2v", api_name="plan")
        with gr.Column(scale=1):
            job, still = build_job_panel("t2v", image=True)

    # The plan overrides come last, so callers that leave them out get Auto.
    def text_to_video(preset, prompt, negative_prompt, model, width, height, frames, steps, guidance, shift,
                      seed, strategy=AUTO, text_encoder=AUTO, vae_tiling=AUTO, progress=gr.Progress(), session: gr.Request = None):
        request = build_request(ctx, "t2v", preset, prompt, negative_prompt, model, width, height, frames,
                                steps, guidance, shift, seed, strategy, text_encoder, vae_tiling)
        yield from stream(ctx, ctx.client.submit(request), progress, session)

    def text_to_image(preset, prompt, negative_prompt, model, width, height, frames, steps, guidance, shift,
                      seed, strategy=AUTO, text_encoder=AUTO, vae_tiling=AUTO, progress=gr.Progress(), session: gr.Request = None):
        request = build_request(ctx, "t2i", preset, prompt, negative_prompt, model, width, height, frames,
                                steps, guidance, shift, seed, strategy, text_encoder, vae_tiling)
        outputs = stream(ctx, ctx.client.submit(request), progress, session)
        try:
            for number, output in enumerate(outputs):
                # The still's box appears with the first still job (the first output is never the result).
                yield (gr.Image(visible=True), *output[1:]) if number == 0 else output
        finally:
            outputs.close()

    inputs = [*form.settings(), *panel.overrides()]
    video_run = video_btn.click(text_to_video, inputs, job.outputs(), api_name="text_to_video",
                                concurrency_id=GPU_QUEUE, show_progress_on=job.result)
    image_run = image_btn.click(text_to_image, inputs, job.outputs(still), api_name="text_to_image",
                                concurrency_id=GPU_QUEUE, show_progress_on=still)

    job.reveal_seed_after(video_run, image_run)
    wire_cancel(ctx, cancel_btn, job.status, job.preview, [video_run, image_run], api_name="cancel")
    return form
