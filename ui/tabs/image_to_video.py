"""Image to Video tab: an uploaded first frame (and optional last frame) animated."""
from __future__ import annotations

import gradio as gr

from engine.settings.images import describe_image, fit_image, size_for_aspect, upright_rgb
from engine.settings.values import MAX_SIDE, MIN_SIDE, SIDE_MULTIPLE, InputError
from ui.context import AppContext
from ui.generate import generation, start_job, upload_path, wire_cancel
from ui.parts.form import Form, build_form, build_plan_panel
from ui.parts.job_panel import build_job_panel

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
        if width % SIDE_MULTIPLE or height % SIDE_MULTIPLE or not all(MIN_SIDE <= side <= MAX_SIDE
                                                                      for side in (width, height)):
            return None, (f"**Size:** {width}x{height} cannot be used: width and height must be multiples of "
                          f"{SIDE_MULTIPLE} "
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

    form.image, form.last_image = image, last_image
    form.status = job.status
    # The API's parameters: the images, then the field table's as on the Text to Video tab.
    run = start_job(run_btn, cancel_btn, generation(ctx, "i2v", "image to video", job.show()), form.api_inputs("i2v"),
                    job.outputs(), ctx, "image_to_video")
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
    return form
