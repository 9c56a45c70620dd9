"""Image to Video tab: an uploaded first frame (and optional last frame) animated."""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from engine.settings.images import describe_image, fit_image, fit_rgb, size_for_aspect, upright_rgb
from engine.settings.values import MAX_SIDE, MIN_SIDE, SIDE_MULTIPLE, InputError
from engine.settings.videos import last_frame, read_video
from engine.words import plural
from ui.context import AppContext
from ui.generate import generation, start_job, upload_path, wire_cancel
from ui.parts.form import Form, build_form, build_plan_panel
from ui.parts.job_panel import build_job_panel
from ui.parts.start_view import generate_and_cancel, start_view

NO_IMAGE = "Upload a first frame (or a video to extend) to see it at the video's size."
EXTEND_INFO = ("a new part that starts from this video's last frame, joined after it into one video (its colours "
               "matched); the History tab's Extend puts an output here")


def _size(width, height) -> tuple[int, int] | str:
    """(width, height) as whole numbers, or the sentence that says why the size cannot be used."""
    width, height = int(width), int(height)
    if width % SIDE_MULTIPLE or height % SIDE_MULTIPLE or not all(MIN_SIDE <= side <= MAX_SIDE
                                                                  for side in (width, height)):
        return (f"**Size:** {width}x{height} cannot be used: width and height must be multiples of "
                f"{SIDE_MULTIPLE} from {MIN_SIDE} to {MAX_SIDE}.")
    return width, height


def crop_preview(image, width, height, extend=None, frames=None):
    """(the first frame as the model will see it, a sentence on the final size) for the form's size; the
    image (and the video to extend, which gives the first frame instead) as the page sent it (an upload record)
    or a path."""
    try:
        video = extend if isinstance(extend, str) else upload_path(extend, "video to extend", "video")
        if video:
            return extension_preview(video, width, height, frames)
        path = image if isinstance(image, str) else upload_path(image, "image")
    except InputError as exc:
        return None, f"**Cannot use this image:** {exc}"
    if not path:
        return None, NO_IMAGE
    try:
        size = _size(width, height)
        if isinstance(size, str):
            return None, size
        width, height = size
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


def extension_preview(video: str, width, height, frames):
    """(the video's last frame as the new part starts from it, at the form's size; what the joined video holds)."""
    from PIL import Image

    try:
        size = _size(width, height)
        if isinstance(size, str):
            return None, size
        width, height = size
        info = read_video(video, "video to extend")
        fitted = fit_rgb(Image.fromarray(last_frame(video, "video to extend")), width, height)
        added = max(0, int(frames) - 1) if frames not in (None, "") else None
    except InputError as exc:
        return None, f"**Cannot extend this video:** {exc}"
    except (TypeError, ValueError, OverflowError):
        return None, "**Size:** give the width, height and frames as whole numbers to see the start."
    joined = (f" The joined video: {plural(info.frames, 'frame')} and {added} new, "
              f"{plural(info.frames + added, 'frame')}." if added is not None else "")
    return fitted, (f"**Extending {Path(video).name}** ({info.width}x{info.height}, {plural(info.frames, 'frame')} at "
                    f"{info.fps:g} fps): the new part starts from its last frame, shown at {width}x{height}, and is "
                    f"joined after it.{joined} Clear the video to start from an image instead.")


def build(ctx: AppContext, after_job) -> Form:
    """The tab; ``after_job(run)`` chains what the page does once its run has ended."""
    with gr.Row():
        with gr.Column(scale=1):
            with gr.Row():
                image = gr.Image(label="First frame", type="filepath", elem_id="i2v-image", height=180,
                                 sources=["upload", "clipboard"])
                last_image = gr.Image(label="Last frame (optional; first-and-last-frame models)", type="filepath",
                                      elem_id="i2v-last-image", height=180, sources=["upload", "clipboard"])
            with gr.Accordion("Extend a video (optional)", open=False, elem_id="i2v-extend-box") as extend_box:
                extend = gr.Video(label="Video to extend", sources=["upload"], elem_id="i2v-extend", height=180,
                                  interactive=True)
                gr.Markdown(EXTEND_INFO, elem_id="i2v-extend-info")

            form, (run_btn, cancel_btn) = build_form(ctx, "i2v", "i2v", lambda: generate_and_cancel("i2v"))
            panel = build_plan_panel(ctx, form, "i2v", "i2v")
        with gr.Column(scale=1):
            # Beside the result: the first frame as the model will start from it, at the video's size.
            start = start_view("i2v", "What the model starts from", NO_IMAGE, "Use the image's aspect")
            fitted, fit_note, aspect_btn = start.fitted, start.note, start.button
            job = build_job_panel("i2v")

    form.image, form.last_image, form.extend = image, last_image, extend
    form.extend_box = extend_box
    form.status = job.status
    # The API's parameters: the images, then the field table's as on the Text to Video tab.
    run = start_job(run_btn, cancel_btn, generation(ctx, "i2v", "image to video", job.show()), form.api_inputs("i2v"),
                    job.outputs(), ctx, "image_to_video")
    job.reveal_after(run)
    wire_cancel(ctx, cancel_btn, job.cancel_answer)
    after_job(run)
    # The upload as sent (preprocess=False): a file that is no image gets this app's sentence, not an error.
    gr.on([image.change, extend.change, form.width.change, form.height.change, form.frames.change], crop_preview,
          [image, form.width, form.height, extend, form.frames], [fitted, fit_note], queue=False,
          show_progress="hidden", api_visibility="private", preprocess=False, trigger_mode="always_last")

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
