"""Running a job from the page: build the request, stream events, render updates."""
from __future__ import annotations

import html
from typing import Iterator

import gradio as gr

from engine.events import JobFailed, JobFinished, JobStarted, PreviewReady
from engine.models import ModelError
from engine.request import GenerationRequest

from .context import ENDINGS, AppContext, RunningJob, where_it_was
from .job_view import JobView
from .plan_panel import AUTO, override_fields

# Every event that runs the engine shares this queue, so jobs run one at a time in order.
GPU_QUEUE = "gpu"


def build_request(ctx: AppContext, mode: str, preset_name: str, prompt: str, negative_prompt: str,
                  model: str, width, height, frames, steps, guidance, shift, seed,
                  strategy: str | None = AUTO, text_encoder: str | None = AUTO, vae_tiling: str | None = AUTO,
                  image: str | None = None, last_image: str | None = None) -> GenerationRequest:
    """The request for a page or API call; a model path the app does not accept is refused here, before any work."""
    preset = ctx.preset_or_default(preset_name, mode)
    try:
        model = ctx.model_ref(model or preset.model)
    except ModelError as exc:
        # The page renders error text as HTML; the reference is the caller's own text.
        raise gr.Error(html.escape(str(exc), quote=False), duration=None, title="Model refused") from None
    return GenerationRequest.from_preset(
        preset, prompt or "", mode=mode, model=model,
        negative_prompt=negative_prompt, width=width, height=height,
        frames=1 if mode == "t2i" else frames, steps=steps, guidance=guidance, shift=shift,
        seed=-1 if seed is None else seed, image=image, last_image=last_image,
        outputs_dir=ctx.outputs_dir, **override_fields(strategy, text_encoder, vae_tiling))


def cancel(ctx: AppContext, session: gr.Request | None) -> str:
    """Stop the running job at its next step, if the caller's session started it.

    On the page the Cancel button also takes the caller's waiting jobs out of the queue
    (gradio's own cancel, scoped to the session); this answers for the running one.
    """
    mine = getattr(session, "session_hash", None)
    if ctx.running.owned_by(mine):
        ctx.client.cancel()
        return "Cancelling at the next step... the model stays loaded."
    if ctx.running.recently_owned_by(mine):
        return "Cancelled. The model stays loaded."
    return ("Nothing of yours is running: only the person who started the running job can cancel it. "
            "A job of yours waiting in the queue is taken out of it.")


def cancelled_status(running: RunningJob, mine: str | None, timeout_s: float = 60.0) -> str | None:
    """The status to end a cancel with once session ``mine``'s job has really stopped (None: nothing of theirs ran).

    Written after the job's last update, so a step that was on its way when Cancel was
    pressed cannot leave the page saying the job still runs.
    """
    if not running.recently_owned_by(mine):
        return None
    ended, last = running.wait_until_ended(mine, timeout_s)
    if not ended:
        return "Cancel asked for; the job has not stopped yet (it stops at the end of its current step)."
    last = last.splitlines()[0] if last else ""
    if last.startswith("Done"):
        return (f"Nothing of yours was running: your last job had already finished ({last}). "
                "A job of yours waiting in the queue is taken out of it.")
    if last.startswith(ENDINGS):
        return f"{last} Your earlier result is kept."
    where = f" during {where_it_was(last)}" if last else ""
    return f"Cancelled{where}. The model stays loaded; your earlier result is kept."


def wire_cancel(ctx: AppContext, button: gr.Button, status, preview, runs: list, api_name: str | None = None) -> None:
    """The tab's Cancel: stops this visitor's running job (public as ``api_name`` when given), takes their
    waiting ``runs`` out of the queue (gradio's cancels=, scoped to the session), clears the preview and,
    once the job has stopped, says so."""
    def cancel_mine(session: gr.Request):
        return cancel(ctx, session)

    def settle(session: gr.Request):
        final = cancelled_status(ctx.running, getattr(session, "session_hash", None))
        return gr.skip() if final is None else final, ""

    visibility = {"api_name": api_name} if api_name else {"api_visibility": "private"}
    button.click(cancel_mine, None, status, queue=False, cancels=runs, **visibility).then(
        settle, None, [status, preview], queue=False, api_visibility="private")


def stream(ctx: AppContext, events: Iterator, progress: gr.Progress,
           session: gr.Request | None = None) -> Iterator[tuple]:
    """Yield (result, status markdown, timing rows, seed used, preview html, chart html) per event.

    The result slot stays unchanged (gr.skip) until a new file exists, so an
    earlier output is never lost; the live preview is cleared when it arrives.
    A failure ends with gr.Error, which the page shows and API clients receive
    as an exception.
    """
    view = JobView()
    try:
        for event in events:
            if isinstance(event, JobStarted):
                ctx.running.start(getattr(session, "session_hash", None))
            view.apply(event)
            ctx.running.update(view.status)
            progress(view.progress, desc=view.status)
            rows = view.timing_rows()
            if isinstance(event, JobFinished):
                yield event.paths[0], view.markdown(), rows, event.seed, "", view.chart_html()
                continue
            preview = view.preview_html() if isinstance(event, PreviewReady) else gr.skip()
            yield gr.skip(), view.markdown(), rows, gr.skip(), preview, view.chart_html()
            if isinstance(event, JobFailed):
                raise gr.Error(f"{event.message} {event.hint}", duration=None)
    finally:
        events.close()   # cancels and releases the engine at once when the stream ends early
        ctx.running.finish()
