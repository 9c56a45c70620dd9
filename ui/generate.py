"""Running a job from the page or the API: check it, wait for its turn in the queue, stream its events.

The generation events run with ``preprocess=False``: every value reaches ``build_request`` as the page or
the API client sent it (numbers unrounded, images as upload records), so each mistake gets the app's own
sentence, said once in the job's status, before the job waits or loads anything.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Iterator

import gradio as gr

from engine.events import Ending, Event, JobFailed, JobFinished, PreviewReady
from engine.errors import ModelError
from engine.run.failures import failure_event
from engine.service.jobqueue import QueueFull, Ticket
from engine.service.metrics import MODES, JobRecord, outcome_of
from engine.settings.draft import prepare_request
from engine.settings.fields import api_fields, by_field
from engine.settings.request import GenerationRequest
from engine.settings.values import InputError
from ui.context import AppContext
from ui.pacing import paced
from ui.parts.chains import when_ended
from ui.views.job_view import JobView

# Every event that runs the engine is in this concurrency group; the JobQueue orders them.
GPU_QUEUE = "gpu"
# A Generate click this long after this page's job joined the queue is a second one, told it waits its turn.
AGAIN_AFTER_S = 1.5
# Seconds between a waiting job's updates of its place and estimate.
WAIT_UPDATE_S = 1.0
# The least time between a running job's page updates for steps and previews (others are shown at once).
PAGE_UPDATE_S = 0.5
# The most engines whose jobs run at once that the page's event slots leave room for (one per GPU).
MAX_ENGINES = 16

Show = Callable[[JobView, "Event | None"], dict]


@dataclass(frozen=True)
class EngineWork:
    """A checked job, ready to wait for its turn: ``start(slots)`` runs it on the engines the queue gave it."""
    start: Callable[[tuple[int, ...]], Iterator[Event]]
    engines: int = 1            # how many engines it runs on at once (split across GPUs: more than one)
    model: str | None = None    # the model it uses (the queue prefers an engine that holds it)
    videos: int = 1             # how many videos it makes (the settings' count): the queue's estimate counts each


def owner_of(session: gr.Request | None) -> str | None:
    """Who asked for a job, as the server knows them: the page's session together with the login it came with.

    A session id alone is only what the client says; the login token is the server's own, so with a password
    another visitor who learns someone's session id still cannot cancel their job. None without a session.
    """
    session_hash = getattr(session, "session_hash", None)
    if not session_hash:
        return None
    return f"{_login_token(session)}:{session_hash}"


def _login_token(session: gr.Request | None) -> str:
    request = getattr(session, "request", None)
    cookies = dict(getattr(request, "cookies", None) or {})
    return next((value for name, value in cookies.items() if name.startswith("access-token")), "")


def login_of(session: gr.Request | None) -> str | None:
    """The login a page's job takes its share of the queue from: its login token (each sign-in to the page is one,
    as the JSON API's ``page:`` login is); None without a password, where this machine's one user has the whole
    queue."""
    return _login_token(session) or None


# What to upload instead of something that is no uploaded file, by the kind of file a field takes.
UPLOAD_HINTS = {"image": "upload a PNG, JPEG or WebP image", "video": "upload an MP4, WebM or MOV video"}
# The request fields that take an upload, and the kind of file each is.
UPLOAD_FIELDS = {"image": "image", "last_image": "image", "video": "video", "extend": "video"}


def upload_path(payload, name: str, kind: str = "image") -> str | None:
    """The file of an image (or a video: ``kind``) as the page or an API client sent it (gradio's upload record,
    whose path gradio has checked is an upload, or a file of the outputs folder), or None for none; InputError for
    anything else."""
    if payload is None or payload == "":
        return None
    if isinstance(payload, dict):
        path = payload.get("path")
        if isinstance(path, str) and path:
            return path
        if str(payload.get("url") or "").startswith("data:"):
            raise InputError(f"the {name} came as inline data: upload it as a file")
    raise InputError(f"the {name} is not an uploaded file: {UPLOAD_HINTS[kind]}")


def preset_named(ctx: AppContext, name, mode: str):
    """The named preset of the caller, or the tab's default when none is named."""
    if name in (None, ""):
        return ctx.presets[ctx.default_preset(mode)]
    preset = ctx.presets.get(name) if isinstance(name, str) else None
    if preset is None:
        choices = ", ".join(ctx.presets_for(mode))
        raise InputError(f"preset {str(name)[:60]!r} is unknown: pick one of {choices} (reload the page if it "
                         "was deleted meanwhile)")
    return preset


def build_request(ctx: AppContext, mode: str, values: dict) -> GenerationRequest:
    """The request for a page or API call, from the values as sent, by field name (engine/settings/fields.py): a
    field left empty is missing (not the preset's), one not given is the preset's; -1 or no seed is random; the
    images are upload records. The request is made by engine/settings/draft.py, as the plan panel's settings
    are; the run's request check says what is wrong with it, with its prompts and images.
    Raises InputError or ModelError saying what to change."""
    values = dict(values)
    preset = preset_named(ctx, values.pop("preset", None), mode)
    for name, kind in UPLOAD_FIELDS.items():
        if name in values:
            words = {"extend": "video to extend", "video": "input video"}.get(name, name.replace("_", " "))
            values[name] = upload_path(values[name], words, kind)
    return prepare_request(values, preset, mode, ctx.paths, ctx.client.catalog.limits, ctx.outputs_dir)


def generation(ctx: AppContext, mode: str, what: str, show: Show):
    """The handler of a generation endpoint of ``mode``: the values by API parameter name (gradio's keyword
    inputs, in the field table's order), the job streamed as ``show``'s page updates."""
    videos = {field.name for field in api_fields(mode) if field.name in ("extend", "video")}

    # The videos are parameters of their own, defaulting to none: an API caller of an older signature (before the
    # video to extend was added last) leaves them out, and one who forgets the input video hears this app's sentence.
    def generate(session: gr.Request = None, extend=None, video=None, **values):
        values |= {name: given for name, given in (("extend", extend), ("video", video)) if name in videos}
        yield from run_job(ctx, session, what, engine_job(ctx, lambda: build_request(ctx, mode, by_field(values))),
                           show)
    return generate


def _say(text: str) -> None:
    """One line in the console for what a user got wrong (their own mistake: no traceback)."""
    print(f"[page] {text}", file=sys.stderr, flush=True)


def _fail(view: JobView, failure: JobFailed) -> gr.Error:
    """The failure is in the status already (said once there); the page gets a short toast that closes by
    itself, API callers the whole text as their error."""
    view.apply(failure)
    gr.Warning(f"{view.status} See the status under the result.", duration=6, title="Not started"
               if failure.ending.kind is Ending.REFUSED else "Failed")
    _say(f"{view.status} {failure.text}")
    # Never shown on the page (visible=False), so the API caller gets the text as it is, not HTML-escaped.
    return gr.Error(failure.text, visible=False, print_exception=False)


class Refusal(Exception):
    """A job that never started: its settings, its model or a full queue; ``failure`` says which and why."""

    def __init__(self, failure: JobFailed):
        super().__init__(failure.message)
        self.failure = failure


def admit(ctx: AppContext, owner: str | None, what: str, prepare: Callable[[], EngineWork],
          login: str | None = None) -> tuple[EngineWork, Ticket]:
    """(what starts the job, its place in the queue): ``prepare()`` checks the request (nothing waits or loads
    before it) and the job joins ctx.jobs as ``owner``'s, in ``login``'s share of it; Refusal when it is refused
    (and counted so)."""
    try:
        work = prepare()
        return work, ctx.jobs.join(owner, what, work.engines, work.model, work.videos, login)
    except (InputError, ModelError) as exc:
        failure = failure_event("refused", exc, None)
    except QueueFull as exc:
        failure = JobFailed("refused", str(exc), "", None, "queue")
    ctx.metrics.job_ended(JobRecord(MODES.get(what, what), "", "refused", failure=str(failure.kind)))
    raise Refusal(failure)


def follow(ctx: AppContext, work: EngineWork, ticket: Ticket, show: Show,
           fail: Callable[[JobView, JobFailed], Exception]) -> Iterator[dict]:
    """An admitted job, as updates (``show(view, event)``): its wait for its turn (with its place and an estimate;
    its owner may take it out), then every engine event applied to its view. A failure ends it with ``fail(view,
    failure)``, raised; however it ends, it leaves the queue and is counted."""
    view = JobView()
    try:
        while not ctx.jobs.wait_turn(ticket, WAIT_UPDATE_S):
            if ticket.withdrawn:
                yield show(view.withdrawn(), None)
                return
            yield show(view.waiting(ctx.jobs.place(ticket), ctx.jobs.estimate(ticket)), None)
        view = JobView(videos=work.videos)   # the wait is over: what the page shows from now on is the job
        events = work.start(ticket.slots)
        # A closed page cancels the job (the engine is free once it has ended).
        batches = paced(events, PAGE_UPDATE_S, lambda: ctx.client.cancel(ticket.slots))
        try:
            for batch in batches:
                for event in batch:
                    view.apply(event)
                ctx.jobs.report(ticket, view.status, view.seconds_left(), view.video[0] if view.video else 1)
                yield _shown(show, view, batch)
                failed = next((event for event in batch if isinstance(event, JobFailed)), None)
                if failed is not None:
                    raise fail(view, failed)
        finally:
            batches.close()
            events.close()
    finally:
        ctx.jobs.leave(ticket, view.ending)
        ctx.metrics.job_ended(_record(ticket, work, view))


def _record(ticket: Ticket, work: EngineWork, view: JobView) -> JobRecord:
    """How ``ticket``'s job ended, as the metrics count it."""
    import time

    ran = time.monotonic() - ticket.started if ticket.started is not None else None
    waited = ticket.started - ticket.joined if ticket.started is not None else None
    failure = view.failure.kind if view.failure is not None else None
    phases = dict(view.result.timings) if view.result is not None else None
    return JobRecord(MODES.get(ticket.what, ticket.what), work.model or "", outcome_of(view.ending), ran, phases,
                     None if failure is None else str(failure), waited)


def run_job(ctx: AppContext, session: gr.Request | None, what: str, prepare: Callable[[], EngineWork],
            show: Show) -> Iterator[dict]:
    """One job, from a click or an API call, as updates of the page (``show(view, event)``).

    ``prepare()`` checks the request (InputError or ModelError at once: nothing waits or loads) and returns
    what starts it in the engine. Then the job waits its turn in ctx.jobs, showing its place and an
    estimate; its owner's Cancel takes it out. Once it runs (on the engines the queue gave it), every engine
    event updates the view.
    """
    try:
        work, ticket = admit(ctx, owner_of(session), what, prepare, login_of(session))
    except Refusal as refusal:
        view = JobView()
        error = _fail(view, refusal.failure)
        yield show(view, None)
        raise error from None
    yield from follow(ctx, work, ticket, show, _fail)


def _shown(show: Show, view: JobView, batch: list[Event]) -> dict:
    """The page's updates for a batch of events already applied to ``view``: the last event's, with a preview or
    a result that came earlier in the batch kept."""
    updates: dict = {}
    for event in batch[:-1]:
        if isinstance(event, (PreviewReady, JobFinished)):
            updates |= show(view, event)
    return updates | show(view, batch[-1])


def engine_job(ctx: AppContext, make: Callable[[], GenerationRequest]) -> Callable[[], EngineWork]:
    """``prepare`` for run_job: the request from ``make``, checked as the engine will check it, and on how many
    engines it runs."""
    def prepare():
        request, notes = ctx.client.check(make())
        request = under_ceiling(ctx, request)
        return EngineWork(lambda slots: ctx.client.run(request, notes, slots=slots),
                          ctx.client.engines_for(request), request.settings.model, request.settings.count)
    return prepare


def under_ceiling(ctx: AppContext, request: GenerationRequest) -> GenerationRequest:
    """``request`` carrying the server's ceiling on one job's time (serve --max-job-minutes), for the engine to
    hold it to once the machine is measured; InputError with the numbers when the whole job (all its videos, windows
    and steps after the video) is predicted past it already (a machine measured before)."""
    if ctx.ceiling.seconds is None:
        return request
    from dataclasses import replace

    from engine.service.ahead import plan_settings, predicted_job

    hardware = ctx.client.hardware_profile()
    plan = plan_settings(request.settings, hardware, ctx.client.catalog, ctx.client.engine_count())
    said = ctx.ceiling.refusal(predicted_job(request.settings, plan, hardware, ctx.client.catalog, ctx.outputs_dir,
                                             ctx.client.models_dir, bool(request.extend)))
    if said:
        raise InputError(said)
    return replace(request, max_seconds=ctx.ceiling.seconds)


def cancel(ctx: AppContext, session: gr.Request | None) -> str:
    """Take the caller's waiting jobs out of the queue and stop their running one at its next step.

    Only what the caller's own session started is touched; the answer says what happened.
    """
    mine = owner_of(session)
    withdrawn = ctx.jobs.withdraw(mine)
    left = ("Your waiting job was taken out of the queue." if withdrawn == 1 else
            f"Your {withdrawn} waiting jobs were taken out of the queue.")
    running = ctx.jobs.running_for(mine)
    if running:
        ctx.client.cancel(tuple(slot for ticket in running for slot in ticket.slots))
        return "Cancelling your job at the end of its current step." + (f" {left}" if withdrawn else "")
    if withdrawn:
        return f"{left} {'It' if withdrawn == 1 else 'They'} will not run."
    if ctx.jobs.ended_recently_for(mine):
        return "Nothing to cancel: your last job had already finished."
    return "Nothing of yours is running or waiting: only the person who started a job can cancel it."


def wire_cancel(ctx: AppContext, button: gr.Button, answer: gr.Textbox, api_name: str | None = None) -> None:
    """The tab's Cancel: the answer as a toast on the page (the job's own status says how it ended) and as
    the return value of ``api_name`` when given."""
    def cancel_mine(session: gr.Request):
        said = cancel(ctx, session)
        gr.Info(said, duration=5, title="Cancel")
        return said

    visibility = {"api_name": api_name} if api_name else {"api_visibility": "private"}
    # Its own group without a limit: a cancel never waits behind the jobs it is meant to stop.
    button.click(cancel_mine, None, answer, concurrency_id="cancel", concurrency_limit=None,
                 show_progress="hidden", **visibility)


def start_job(button: gr.Button, cancel_button: gr.Button, fn, inputs: dict, outputs: list, ctx: AppContext,
              api_name: str):
    """``button`` runs ``fn`` as a job (public as ``api_name``, its parameters ``inputs``' names in order); the
    page's Cancel turns red from the click until that job has ended. Returns the job's event, for what follows."""
    armed = button.click(lambda: gr.Button(variant="stop"), None, cancel_button, queue=False,
                         api_visibility="private", show_progress="hidden")
    # The page sends no second click of a button whose job has not ended: this listener, taking every click,
    # says why nothing starts.
    what = api_name.replace("_", " ")   # the job's own words: text_to_video runs "text to video"

    def again(session: gr.Request = None):
        still_yours(ctx, session, what)

    button.click(again, None, None, trigger_mode="multiple", concurrency_limit=None, api_visibility="private",
                 show_progress="hidden")
    run = armed.then(fn, inputs_kwargs=inputs, outputs=outputs, api_name=api_name, **gpu_event(ctx))
    when_ended(run, lambda: gr.Button(variant="secondary"), None, cancel_button)
    return run


def still_yours(ctx: AppContext, session: gr.Request | None, what: str) -> None:
    """A click of Generate while this page's own job of that button (``what``) waits or runs (joined a moment
    ago or more: not the click that started it) is told so; another button's job does not stop this one."""
    ticket = ctx.jobs.held_for(owner_of(session), joined_before=AGAIN_AFTER_S, what=what)
    if ticket is not None:
        state = "is still running" if ticket.started is not None else "is still waiting for its turn"
        gr.Warning(f"Your {ticket.what} job {state}: wait for it to end, or Cancel it, then Generate again.",
                   duration=6, title="Not started")


def gpu_event(ctx: AppContext) -> dict:
    """How an event that runs the engine is registered: values as sent (run_job checks them), no gradio
    progress overlay (the status and the chart say it all) and no output marked as waiting (gradio counts the
    seconds of each waiting output on every frame the browser draws, shown or not: about a quarter of a core in
    headless Chromium through a job), and enough slots that every job reaches the JobQueue, which orders them:
    the running one, every waiting one, and one being refused."""
    return {"concurrency_id": GPU_QUEUE, "concurrency_limit": ctx.jobs.max_waiting + 1 + MAX_ENGINES,
            "preprocess": False, "show_progress": "hidden", "show_progress_on": []}
