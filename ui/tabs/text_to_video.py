"""Text to Video tab (with text-to-image as its 1-frame mode)."""
from __future__ import annotations

import gradio as gr

from ui.context import AppContext
from ui.generate import build_request, engine_job, run_job, start_job, wire_cancel
from ui.parts.form import Form, build_form, build_plan_panel
from ui.parts.job_panel import build_job_panel
from ui.views.plan_panel import AUTO, OFF, OWN_TRANSFORMER


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

    # The plan overrides, the LoRAs, the transformer files, the GPUs and the low-noise guidance come last, so
    # callers that leave them out get Auto, none, the model's own, automatic and the same guidance for both experts.
    def text_to_video(preset, prompt, negative_prompt, model, width, height, frames, steps, guidance, shift,
                      seed, strategy=AUTO, text_encoder=AUTO, vae_tiling=AUTO, decoder="vae", step_cache=OFF,
                      compile=AUTO, attention=AUTO, vae_precision=AUTO, loras="",
                      transformer=OWN_TRANSFORMER, transformer_2=OWN_TRANSFORMER, gpus=AUTO, guidance_2=0,
                      session: gr.Request = None):
        yield from run_job(ctx, session, "text to video", engine_job(ctx, lambda: build_request(
            ctx, "t2v", preset, prompt, negative_prompt, model, width, height, frames, steps, guidance, shift, seed,
            strategy, text_encoder, vae_tiling, decoder, step_cache, compile, attention, vae_precision, loras,
            transformer, transformer_2, gpus, guidance_2=guidance_2)),
            job.show())

    def text_to_image(preset, prompt, negative_prompt, model, width, height, frames, steps, guidance, shift,
                      seed, strategy=AUTO, text_encoder=AUTO, vae_tiling=AUTO, decoder="vae", step_cache=OFF,
                      compile=AUTO, attention=AUTO, vae_precision=AUTO, loras="",
                      transformer=OWN_TRANSFORMER, transformer_2=OWN_TRANSFORMER, gpus=AUTO, guidance_2=0,
                      session: gr.Request = None):
        yield from run_job(ctx, session, "text to image", engine_job(ctx, lambda: build_request(
            ctx, "t2i", preset, prompt, negative_prompt, model, width, height, frames, steps, guidance, shift, seed,
            strategy, text_encoder, vae_tiling, decoder, step_cache, compile, attention, vae_precision, loras,
            transformer, transformer_2, gpus, guidance_2=guidance_2)),
            job.show(job.still))

    inputs = [*form.settings(), *panel.overrides(), form.guidance_2]
    video_run = start_job(video_btn, cancel_btn, text_to_video, inputs, job.outputs(), ctx, "text_to_video")
    image_run = start_job(image_btn, cancel_btn, text_to_image, inputs, job.outputs(job.still), ctx, "text_to_image")
    job.reveal_after(video_run, image_run)
    wire_cancel(ctx, cancel_btn, job.cancel_answer, api_name="cancel")
    after_job(video_run)
    after_job(image_run)
    return form
