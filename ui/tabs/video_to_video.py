"""Video to Video tab: an uploaded video (or an output from the History tab) made again as the prompt says, with a
text-to-video model, by how much its strength says."""
from __future__ import annotations

import gradio as gr

from engine.errors import InputError
from engine.post.sources import remake_start
from engine.settings.videos import fitted_frames, read_video
from engine.words import plural
from ui.context import AppContext
from ui.generate import generation, start_job, upload_path, wire_cancel
from ui.parts.form import Form, build_form, build_plan_panel
from ui.parts.job_panel import build_job_panel
from ui.parts.start_view import generate_and_cancel, start_view
from ui.views.text import plain

NO_VIDEO = "Upload a video to see its first frame at the output's size."


def fitted_preview(ctx: AppContext, video, preset, width, height, frames):
    """(the input's first frame as the model will start from it, a note on what of it is used) for the form's
    size, frames and its preset's frame rate; the video as the page sent it (an upload record) or a path."""
    try:
        path = video if isinstance(video, str) else upload_path(video, "input video", "video")
        if not path:
            return None, NO_VIDEO
        fps = ctx.preset_or_default(preset, "v2v").settings.fps
        width, height, frames = int(width), int(height), int(frames)
        info = read_video(path, "video")
        first = next(iter(fitted_frames(path, width, height, fps, 1)))
    except InputError as exc:
        return None, f"**Cannot use this video:** {plain(exc)}"
    except (TypeError, ValueError, OverflowError, StopIteration):
        return None, "**Size:** give the width, height and frames as whole numbers to see what is used."
    lines = [f"**Made again at {width}x{height}, {plural(frames, 'frame')}** (from {info.width}x{info.height}, "
             f"{plural(info.frames, 'frame')} at {info.fps:g} fps: scaled to cover, centre-cropped)."]
    lines += [f"- {note[0].upper()}{note[1:]}." for note in info.notes(width, height, fps, frames)]
    if frames > info.frames_at(fps):
        lines.append(f"- **It has {info.frames_at(fps)} frames at {fps} fps: make at most "
                     f"{info.usable_frames(fps)}.**")
    return first, "\n".join(lines)


def video_shape(ctx: AppContext, video, preset, width, height, frames):
    """The form's width, height and frames set to the video's shape (about the preset's pixels) and its whole
    length (up to the app's longest video; past the model's window it is made in windows); unchanged for no
    video."""
    try:
        path = upload_path(video, "input video", "video")
        if not path:
            return gr.skip(), gr.skip(), gr.skip()
        base = ctx.preset_or_default(preset, "v2v").settings
        base = base.changed(width=int(width), height=int(height), frames=int(frames))
        values = remake_start(path, ctx.outputs_dir, base).values
    except (InputError, TypeError, ValueError, OverflowError):
        return gr.skip(), gr.skip(), gr.skip()
    return values["width"], values["height"], values["frames"]


def build(ctx: AppContext, after_job) -> Form:
    """The tab; ``after_job(run)`` chains what the page does once its run has ended."""
    with gr.Row():
        with gr.Column(scale=1):
            video = gr.Video(label="Video to make again", sources=["upload"], elem_id="v2v-input", height=220,
                             interactive=True)

            form, (run_btn, cancel_btn) = build_form(ctx, "v2v", "v2v", lambda: generate_and_cancel("v2v"))
            build_plan_panel(ctx, form, "v2v", "v2v")
        with gr.Column(scale=1):
            start = start_view("v2v", "What the model starts from (first frame)", NO_VIDEO,
                               "Use the video's shape and length")
            fitted, fit_note, shape_btn = start.fitted, start.note, start.button
            job = build_job_panel("v2v")

    form.video = video
    form.status = job.status
    run = start_job(run_btn, cancel_btn, generation(ctx, "v2v", "video to video", job.show()), form.api_inputs("v2v"),
                    job.outputs(), ctx, "video_to_video")
    job.reveal_after(run)
    wire_cancel(ctx, cancel_btn, job.cancel_answer)
    after_job(run)
    shape_inputs = [video, form.preset, form.width, form.height, form.frames]
    # The upload as sent (preprocess=False): a file that is no video gets this app's sentence, not an error.
    gr.on([video.change, form.width.change, form.height.change, form.frames.change],
          lambda *values: fitted_preview(ctx, *values), shape_inputs, [fitted, fit_note], queue=False,
          show_progress="hidden", api_visibility="private", preprocess=False, trigger_mode="always_last")
    # A new upload takes its shape and length at once; the button takes them again after the form was changed.
    for trigger in (video.upload, shape_btn.click):
        trigger(lambda *values: video_shape(ctx, *values), shape_inputs, [form.width, form.height, form.frames],
                queue=False, api_visibility="private", preprocess=False)
    return form
