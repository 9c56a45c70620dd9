"""The History tab's Smoother and Larger: the chosen output made smoother (frames between) or larger (upscaled) as
a new output beside it, through the job queue like any run (engine/post/on_output.py).

Public API: ``/smoother`` and ``/larger`` (an output's key, as ``/history`` lists it, and a factor, 2 or 4):
{"file", "sidecar", "status"} of the new output, once it is written.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from engine.errors import InputError
from engine.events import JobFinished
from engine.outputs.history import HistoryError, find_entry
from engine.post.apply import Media
from engine.post.on_output import check_step, read_output
from engine.post.steps import PostStep
from ui.context import AppContext
from ui.generate import EngineWork, gpu_event, run_job

FACTOR_CHOICES = [("2x", 2), ("4x", 4)]
POST_INFO = ("Smoother: frames made between the output's (RIFE from models/interpolators/, else ffmpeg's "
             "minterpolate), 16 fps becoming 32 or 64. Larger: upscaled (a model from models/upscalers/, else "
             "Lanczos). Each makes a new output beside this one.")


@dataclass
class PostParts:
    factor: gr.Dropdown
    smoother: gr.Button
    larger: gr.Button
    status: gr.Markdown


def post_layout() -> PostParts:
    """The factor, the two buttons and their status (under the chosen output)."""
    with gr.Row():
        factor = gr.Dropdown(choices=FACTOR_CHOICES, value=2, label="By", scale=1, min_width=110,
                             elem_id="history-post-factor")
        smoother = gr.Button("Smoother", scale=2, elem_id="history-smoother")
        larger = gr.Button("Larger", scale=2, elem_id="history-larger")
    gr.Markdown(POST_INFO, elem_id="history-post-info")
    return PostParts(factor, smoother, larger, gr.Markdown(elem_id="history-post-status", elem_classes=["wan-status"]))


def wire_post(ctx: AppContext, parts: PostParts, chosen: gr.State, listing: list, list_outputs) -> None:
    """The buttons run their step on the ``chosen`` output; ``listing`` (the gallery, its keys and the summary) is
    refreshed by ``list_outputs`` when the new output is written."""
    status = parts.status

    def shower(key: str | None):
        def show(view, event) -> dict:
            updates = {status: view.markdown()}
            if isinstance(event, JobFinished):   # the new output listed, the chosen one still chosen
                updates.update(zip(listing, list_outputs(key)))
            return updates
        return show

    def prepare(key, how, kind: str):
        def check():
            step = PostStep(kind, _factor(how))
            if step.factor not in (2, 4):
                raise InputError(f"the factor {html.escape(str(how))} is not one this app makes: pick 2x or 4x")
            media = _chosen_media(ctx, key)
            bundle, sidecar = read_output(media)
            check_step(step, sidecar, Media.read(media))
            return EngineWork(lambda slots: ctx.client.post(media, step.kind, step.factor, slots=slots))
        return check

    def make_smoother(key: str | None, how: int = 2, session: gr.Request = None):
        yield from run_job(ctx, session, "smoother", prepare(key, how, "interpolate"), shower(key))

    def make_larger(key: str | None, how: int = 2, session: gr.Request = None):
        yield from run_job(ctx, session, "larger", prepare(key, how, "upscale"), shower(key))

    targets = [status, *listing]
    parts.smoother.click(make_smoother, [chosen, parts.factor], targets, api_visibility="private", **gpu_event(ctx))
    parts.larger.click(make_larger, [chosen, parts.factor], targets, api_visibility="private", **gpu_event(ctx))

    def finished(view, event) -> dict:
        if not isinstance(event, JobFinished):
            return {}
        return {"file": event.paths[0], "sidecar": event.sidecar, "status": view.markdown()}

    def smoother_api(key: str, factor: int = 2, request: gr.Request = None) -> dict:
        """The output ``key`` (as /history lists it) made ``factor`` (2 or 4) times smoother, as a new output
        beside it: {"file", "sidecar", "status"}. Waits its turn in the page's queue."""
        return _last(run_job(ctx, request, "smoother", prepare(key, factor, "interpolate"), finished))

    def larger_api(key: str, factor: int = 2, request: gr.Request = None) -> dict:
        """The output ``key`` (as /history lists it) made ``factor`` (2 or 4) times larger (its width and height),
        as a new output beside it: {"file", "sidecar", "status"}. Waits its turn in the page's queue."""
        return _last(run_job(ctx, request, "larger", prepare(key, factor, "upscale"), finished))

    queue = {name: value for name, value in gpu_event(ctx).items() if name.startswith("concurrency")}
    gr.api(smoother_api, api_name="smoother", **queue)
    gr.api(larger_api, api_name="larger", **queue)


def _last(updates) -> dict:
    """What a job's updates said last that was not empty (the finished output's)."""
    said: dict = {}
    for update in updates:
        said = update or said
    return said


def _factor(value) -> int:
    """A factor as sent (2, 2.0, "2"), or -1 for anything else."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):   # an integer past a float's range is no factor either
        return -1
    return int(number) if not isinstance(value, bool) and number.is_integer() else -1


def _chosen_media(ctx: AppContext, key) -> str:
    """The media file of the output ``key`` in this app's outputs folder; InputError when there is none."""
    if not isinstance(key, str) or not key:
        raise InputError("pick an output in the gallery first")
    try:
        return find_entry(ctx.outputs_dir, key).media
    except HistoryError as exc:
        raise InputError(str(exc)) from None
