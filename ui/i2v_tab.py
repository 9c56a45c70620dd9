"""Image to Video tab: an uploaded first frame (and optional last frame) animated."""
from __future__ import annotations

import gradio as gr

from engine.images import describe_image, fit_image, size_for_aspect, upright_rgb
from engine.request import MAX_SIDE, MIN_SIDE, InputError

from .context import AppContext
from .form import Form, build_form, build_plan_panel
from .generate import GPU_QUEUE, build_request, stream, wire_cancel
from .job_panel import build_job_panel
from .plan_panel import AUTO


def crop_preview(image: str | None, width, height):
    """(the first frame as the model will see it, a sentence on the final size) for the form's size."""
    if not image:
        return None, "Upload a first frame to see it at the video's size."
    try:
        width, height = int(width), int(height)
        if width % 16 or height % 16 or not all(MIN_SIDE <= side <= MAX_SIDE for side in (width, height)):
            return None, (f"**Size:** {width}x{height} cannot be used: width and height must be multiples of 16 "
                          f"from {MIN_SIDE} to {MAX_SIDE}.")
        fitted = fit_image(image, width, height)
        source = upright_rgb(image).size
    except (InputError, TypeError, ValueError) as exc:
        return None, f"**Cannot use this image:** {exc}"
    notes = describe_image(image, width, height)
    lines = [f"**Final size: {width}x{height}** (from {source[0]}x{source[1]}: scaled to cover, centre-cropped, "
             "aspect kept)."] + [f"- {note[0].upper()}{note[1:]}." for note in notes]
    return fitted, "\n".join(lines)


def build(ctx: AppContext) -> Form:
    with gr.Row():
        with gr.Column(scale=1):
            with gr.Row():
                image = gr.Image(label="First frame", type="filepath", elem_id="i2v-image", sources=["upload", "clipboard"])
                last_image = gr.Image(label="Last frame (optional; first-and-last-frame models)", type="filepath", elem_id="i2v-last-image",
                                      sources=["upload", "clipboard"])
            with gr.Row():
                fitted = gr.Image(label="What the model starts from", type="pil", interactive=False,
                                  elem_id="i2v-fitted", height=200)
                with gr.Column():
                    fit_note = gr.Markdown("Upload a first frame to see it at the video's size.",
                                           elem_id="i2v-fit-note")
                    aspect_btn = gr.Button("Use the image's aspect", size="sm", elem_id="i2v-use-aspect")
            form = build_form(ctx, "i2v", "i2v")
            with gr.Row():
                run_btn = gr.Button("Generate video", variant="primary", elem_id="i2v-generate")
                cancel_btn = gr.Button("Cancel", variant="stop", elem_id="i2v-cancel")
            panel = build_plan_panel(ctx, form, "i2v", "i2v")
        with gr.Column(scale=1):
            job, _ = build_job_panel("i2v")

    # The plan overrides come last, so callers that leave them out get Auto.
    def image_to_video(image, last_image, preset, prompt, negative_prompt, model, width, height, frames, steps,
                       guidance, shift, seed, strategy=AUTO, text_encoder=AUTO, vae_tiling=AUTO,
                       progress=gr.Progress(), session: gr.Request = None):
        request = build_request(ctx, "i2v", preset, prompt, negative_prompt, model, width, height, frames,
                                steps, guidance, shift, seed, strategy, text_encoder, vae_tiling,
                                image=image, last_image=last_image)
        yield from stream(ctx, ctx.client.submit(request), progress, session)

    run = run_btn.click(image_to_video, [image, last_image, *form.settings(), *panel.overrides()], job.outputs(),
                        api_name="image_to_video", concurrency_id=GPU_QUEUE, show_progress_on=job.result)

    job.reveal_seed_after(run)
    wire_cancel(ctx, cancel_btn, job.status, job.preview, [run])
    gr.on([image.change, form.width.change, form.height.change], crop_preview, [image, form.width, form.height],
          [fitted, fit_note], queue=False, show_progress="hidden", api_visibility="private")

    def use_aspect(image, width, height):
        if not image:
            return gr.skip(), gr.skip()
        try:
            return size_for_aspect(upright_rgb(image).size, int(width), int(height))
        except (InputError, TypeError, ValueError):
            return gr.skip(), gr.skip()

    aspect_btn.click(use_aspect, [image, form.width, form.height], [form.width, form.height],
                     queue=False, api_visibility="private")
    form.image, form.last_image = image, last_image
    return form
