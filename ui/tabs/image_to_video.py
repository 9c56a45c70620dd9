"""Image to Video tab: an uploaded first frame (and optional last frame) animated."""
from __future__ import annotations

import gradio as gr

from engine.settings.images import describe_image, fit_image, size_for_aspect, upright_rgb
from engine.settings.values import MAX_SIDE, MIN_SIDE, InputError
from ui.context import AppContext
from ui.generate import build_request, engine_job, run_job, start_job, upload_path, wire_cancel
from ui.parts.form import Form, build_form, build_plan_panel
from ui.parts.job_panel import build_job_panel
from ui.views.plan_panel import AUTO, OFF, OWN_TRANSFORMER

NO_IMAGE = "Upload a first frame to see it at the video's size."


def crop_preview(image, width, height):
    """(the first frame as the model will see it, a sentence on the final size) for the form's size; the
    image as the page sent it (an upload record) or a path."""
    try:
        path = image if isinstance(image, str) else upload_path(image, "image")
    except InputError as exc:
        return None, f"**Cannot use this image:** {exc}"
    if not path:
        return None, NO_IMAGE
    try:
        width, height = int(width), int(height)
        if width % 16 or height % 16 or not all(MIN_SIDE <= side <= MAX_SIDE for side in (width, height)):
            return None, (f"**Size:** {width}x{height} cannot be used: width and height must be multiples of 16 "
                          f"from {MIN_SIDE} to {MAX_SIDE}.")
        fitted = fit_image(path, width, height)
        source = upright_rgb(path).size
    except InputError as exc:
        return None, f"**Cannot use this image:** {exc}"
    except (TypeError, ValueError, OverflowError):
        return None, "**Size:** give the width and height as whole numbers to see the crop."
    notes = describe_image(path, width, height)
    lines = [f"**Final size: {width}x{height}** (from {source[0]}x{source[1]}: scaled to cover, centre-cropped, "
             "aspect kept)."] + [f"- {note[0].upper()}{note[1:]}." for note in notes]
    return fitted, "\n".join(lines)


def build(ctx: AppContext, after_job) -> Form:
    """The tab; ``after_job(run)`` chains what the page does once its run has ended."""
    with gr.Row():
        with gr.Column(scale=1):
            with gr.Row():
                image = gr.Image(label="First frame", type="filepath", elem_id="i2v-image", height=180,
                                 sources=["upload", "clipboard"])
                last_image = gr.Image(label="Last frame (optional; first-and-last-frame models)", type="filepath",
                                      elem_id="i2v-last-image", height=180, sources=["upload", "clipboard"])

            def actions():
                with gr.Row():
                    return (gr.Button("Generate video", variant="primary", elem_id="i2v-generate"),
                            gr.Button("Cancel", variant="secondary", elem_id="i2v-cancel"))

            form, (run_btn, cancel_btn) = build_form(ctx, "i2v", "i2v", actions)
            panel = build_plan_panel(ctx, form, "i2v", "i2v")
        with gr.Column(scale=1):
            # Beside the result: the first frame as the model will start from it, at the video's size.
            with gr.Row(equal_height=True):
                fitted = gr.Image(label="What the model starts from", type="pil", interactive=False,
                                  elem_id="i2v-fitted", height=150, min_width=150, scale=1)
                with gr.Column(scale=2):
                    fit_note = gr.Markdown(NO_IMAGE, elem_id="i2v-fit-note")
                    aspect_btn = gr.Button("Use the image's aspect", size="sm", elem_id="i2v-use-aspect")
            job = build_job_panel("i2v")

    # The plan overrides, the LoRAs, the transformer files, the GPUs and the low-noise guidance come last, so
    # callers that leave them out get Auto, none, the model's own, automatic and the same guidance for both experts.
    def image_to_video(image, last_image, preset, prompt, negative_prompt, model, width, height, frames, steps,
                       guidance, shift, seed, strategy=AUTO, text_encoder=AUTO, vae_tiling=AUTO, decoder="vae",
                       step_cache=OFF, compile=AUTO, attention=AUTO, vae_precision=AUTO, loras="",
                       transformer=OWN_TRANSFORMER, transformer_2=OWN_TRANSFORMER, gpus=AUTO, guidance_2=0,
                       session: gr.Request = None):
        yield from run_job(ctx, session, "image to video", engine_job(ctx, lambda: build_request(
            ctx, "i2v", preset, prompt, negative_prompt, model, width, height, frames, steps, guidance, shift, seed,
            strategy, text_encoder, vae_tiling, decoder, step_cache, compile, attention, vae_precision, loras,
            transformer, transformer_2, gpus, guidance_2=guidance_2, image=image, last_image=last_image)),
            job.show())

    inputs = [image, last_image, *form.settings(), *panel.overrides(), form.guidance_2]
    run = start_job(run_btn, cancel_btn, image_to_video, inputs, job.outputs(), ctx, "image_to_video")
    job.reveal_after(run)
    wire_cancel(ctx, cancel_btn, job.cancel_answer)
    after_job(run)
    # The upload as sent (preprocess=False): a file that is no image gets this app's sentence, not an error.
    gr.on([image.change, form.width.change, form.height.change], crop_preview, [image, form.width, form.height],
          [fitted, fit_note], queue=False, show_progress="hidden", api_visibility="private", preprocess=False)

    def use_aspect(image, width, height):
        try:
            path = upload_path(image, "image")
            if not path:
                return gr.skip(), gr.skip()
            return size_for_aspect(upright_rgb(path).size, int(width), int(height))
        except (InputError, TypeError, ValueError, OverflowError):
            return gr.skip(), gr.skip()

    aspect_btn.click(use_aspect, [image, form.width, form.height], [form.width, form.height],
                     queue=False, api_visibility="private", preprocess=False)
    form.image, form.last_image = image, last_image
    return form
