"""Image to Video tab: an uploaded first frame (and optional last frame) animated."""
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
            with gr.Row():
                image = gr.Image(label="First frame", type="filepath", elem_id="i2v-image", sources=["upload", "clipboard"])
                last_image = gr.Image(label="Last frame (optional)", type="filepath", elem_id="i2v-last-image",
                                      sources=["upload", "clipboard"])
            gr.Markdown("The image is scaled to cover the target size and centre-cropped, keeping its aspect.")
            form = build_form(ctx, "i2v", "i2v")
            with gr.Row():
                run_btn = gr.Button("Generate video", variant="primary", elem_id="i2v-generate")
                cancel_btn = gr.Button("Cancel", variant="stop", elem_id="i2v-cancel")
            panel = build_plan_panel(ctx, form, "i2v", "i2v")
        with gr.Column(scale=1):
            video = gr.Video(label="Result video", elem_id="i2v-video", autoplay=True, loop=True)
            status = gr.Markdown(elem_id="i2v-status")
            seed_used = gr.Number(value=None, label="Seed used", precision=0, interactive=False, elem_id="i2v-seed-used")
            timings = gr.Dataframe(headers=TIMING_HEADERS, label="Phase timings", interactive=False,
                                   elem_id="i2v-timings", type="array")

    # The plan overrides come last, so callers that leave them out get Auto.
    def image_to_video(image, last_image, preset, prompt, negative_prompt, model, width, height, frames, steps,
                       guidance, shift, seed, strategy=AUTO, text_encoder=AUTO, vae_tiling=AUTO,
                       progress=gr.Progress(), session: gr.Request = None):
        request = build_request(ctx, "i2v", preset, prompt, negative_prompt, model, width, height, frames,
                                steps, guidance, shift, seed, strategy, text_encoder, vae_tiling,
                                image=image, last_image=last_image)
        yield from stream(ctx, ctx.client.submit(request), progress, session)

    run_btn.click(image_to_video, [image, last_image, *form.settings(), *panel.overrides()],
                  [video, status, timings, seed_used],
                  api_name="image_to_video", concurrency_id=GPU_QUEUE)
    def cancel_mine(session: gr.Request):
        return cancel(ctx, session)

    cancel_btn.click(cancel_mine, None, status, api_visibility="private", queue=False)
    return form
