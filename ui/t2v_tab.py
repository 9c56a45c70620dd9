"""Text to Video tab (with text-to-image as its 1-frame mode)."""
from __future__ import annotations

import gradio as gr

from .context import AppContext
from .form import Form, build_form, build_plan_panel
from .generate import GPU_QUEUE, build_request, cancel, stream
from .job_view import TIMING_HEADERS
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
            video = gr.Video(label="Result video", elem_id="t2v-video", autoplay=True, loop=True)
            image = gr.Image(label="Result image", type="filepath", elem_id="t2i-image", interactive=False)
            status = gr.Markdown(elem_id="t2v-status")
            seed_used = gr.Number(value=None, label="Seed used", precision=0, interactive=False, elem_id="t2v-seed-used")
            timings = gr.Dataframe(headers=TIMING_HEADERS, label="Phase timings", interactive=False,
                                   elem_id="t2v-timings", type="array")

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
        yield from stream(ctx, ctx.client.submit(request), progress, session)

    inputs = [*form.settings(), *panel.overrides()]
    video_btn.click(text_to_video, inputs, [video, status, timings, seed_used], api_name="text_to_video",
                    concurrency_id=GPU_QUEUE)
    image_btn.click(text_to_image, inputs, [image, status, timings, seed_used], api_name="text_to_image",
                    concurrency_id=GPU_QUEUE)
    def cancel_mine(session: gr.Request):
        return cancel(ctx, session)

    cancel_btn.click(cancel_mine, None, status, api_name="cancel", queue=False)
    return form
