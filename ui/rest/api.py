"""The JSON API under /api/v1: make, follow, fetch and cancel jobs with plain HTTP, and read the presets, the
models, the history and a plan. It shares everything with the page: the field table (every setting by its name),
the one check, the queue, the engines, the outputs, and the guard's logins (a job is its login's own).

    POST   /api/v1/jobs                 a job: 202 {"id", "state", "place", "estimate_s"}; 422 what to change; 429
    GET    /api/v1/jobs                 the caller's jobs
    GET    /api/v1/jobs/{id}            its state, place, phase, step, seconds and ending
    GET    /api/v1/jobs/{id}/events     its engine events, as server-sent events
    GET    /api/v1/jobs/{id}/result     the mp4 or png (?format=base64: JSON; ?index=N: a job of several)
    GET    /api/v1/jobs/{id}/sidecar    the output's sidecar
    DELETE /api/v1/jobs/{id}            cancel it (or take it out of the queue)
    GET    /api/v1/presets | /models | /history;  POST /api/v1/plan
    GET    /api/docs, /api/openapi.json
"""
from __future__ import annotations

import json
from pathlib import Path

from fastapi import Request
from pydantic import BaseModel

from engine import APP_NAME, __version__
from engine.errors import InputError, ModelError
from engine.events import FailureKind
from engine.service.metrics import JobRecord
from engine.settings.values import MODE_NAMES
from ui.context import AppContext
from ui.generate import Refusal, admit, engine_job, preset_named
from ui.guard.api_login import LOCAL
from ui.guard.middleware import LOGIN_KEY
from ui.rest.bodies import BodyError, JobBody, job_schema, parse_json_object, read_body
from ui.rest.jobs import ApiJobs, output_key

JSON = "application/json"
MEDIA = {".mp4": "video/mp4", ".png": "image/png"}


# ----- what the answers look like (the OpenAPI document's) --------------------------------------------------
class Problem(BaseModel):
    """What is wrong, in the app's sentences: ``error`` all of it, ``problems`` one sentence each."""
    error: str
    problems: list[str] = []


class Accepted(BaseModel):
    id: str
    state: str
    place: int
    estimate_s: float | None = None
    links: dict[str, str]


class JobStatus(BaseModel):
    id: str
    mode: str
    state: str                       # waiting, running, done, failed, cancelled
    place: int
    wait_s: float | None = None
    phase: str | None = None
    step: int
    steps: int
    seconds: float
    predicted_s: float | None = None
    status: str
    notes: list[str]
    ending: str | None = None
    outputs: list[str] | None = None
    seed: int | None = None
    seeds: list[int] | None = None
    timings: dict[str, float] | None = None
    error: str | None = None
    problems: list[str] | None = None
    kind: str | None = None
    kept: list[str] | None = None


class Cancel(BaseModel):
    id: str
    state: str
    said: str


ERRORS = {404: {"model": Problem, "description": "no such job of this login"},
          401: {"model": Problem, "description": "no login, or a wrong one"}}


def _answer(status: int, value) -> "JSONResponse":
    from starlette.responses import JSONResponse

    return JSONResponse(value, status_code=status)


def _problem(status: int, exc: Exception) -> "JSONResponse":
    problems = list(getattr(exc, "problems", ()) or [str(exc)])
    return _answer(status, {"error": " ".join(problems) if problems else str(exc), "problems": problems})


# Where the docs page's own files (Swagger UI's script, styles and icon) are served, under /api.
DOCS_ASSETS = "/docs-assets"
# A History entry's fields that name files (engine/outputs/history.py's HistoryEntry).
ENTRY_FILES = ("media", "sidecar", "first_image", "last_image", "input_video", "extends")


def _login(request) -> str:
    return request.scope.get(LOGIN_KEY, LOCAL)


def _owner(login: str) -> str:
    """A login's jobs in the queue: apart from the page's sessions (a page's Cancel never reaches them)."""
    return f"api:{login}"


def _share_of(login: str) -> str | None:
    """Whose share of the queue a login's jobs take: a browser's cookie is that sign-in's, as on the page; the one
    login of a server without a password (this machine's user) has the whole queue."""
    if login == LOCAL:
        return None
    return login.removeprefix("page:")


async def _given(request) -> tuple[dict, dict]:
    """(the body's fields, its files): a JSON object, or a form (multipart: with files) whose text fields are the
    fields (a field given as JSON text of a list or an object reads as that value) and whose files are the inputs."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":   # curl -d without a content type: JSON all the same, or a form
        raw = await request.body()
        if raw.lstrip()[:1] == b"{":
            return parse_json_object(raw), {}
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.form(max_files=8, max_fields=200)
        given, uploads = {}, {}
        for name, value in form.multi_items():
            if name in given or name in uploads:
                raise BodyError(f"the form names {name!r} twice; give each field once")
            if hasattr(value, "read"):
                uploads[name] = (value.filename or name, await value.read())
            else:
                given[name] = _form_value(value)
        await form.close()
        return given, uploads
    if kind not in ("", JSON) and not kind.endswith("+json"):
        raise BodyError("send the job as JSON (Content-Type: application/json) or as a multipart form")
    return parse_json_object(await request.body()), {}


def _form_value(text: str):
    """A form's text field: JSON where it is JSON of a list or an object (LoRAs), else the text as it came (the
    check reads "64" as 64)."""
    stripped = text.strip()
    if stripped[:1] in ("[", "{"):
        try:
            return json.loads(stripped)
        except ValueError:
            return text
    return text


def _request(ctx: AppContext, body: JobBody):
    """The generation request a job's body makes (engine/settings/draft.py, as the page's Generate makes it)."""
    from engine.settings.draft import prepare_request

    values = dict(body.values)
    preset = preset_named(ctx, values.pop("preset", None), body.mode)
    return prepare_request(values, preset, body.mode, ctx.paths, ctx.client.catalog.limits, ctx.outputs_dir)


def _output_path(ctx: AppContext, key) -> str:
    """The media file of the History's output ``key`` (BodyError when there is none)."""
    from engine.outputs.history import HistoryError, find_entry

    try:
        return find_entry(ctx.outputs_dir, key).media
    except HistoryError as exc:
        raise BodyError(str(exc)) from None


def api_app(ctx: AppContext):
    """The API as a FastAPI app of its own (mounted at /api: its docs at /api/docs)."""
    from fastapi_offline import FastAPIOffline

    # Its docs page with Swagger UI's files served from here (a package of them), not from a CDN: it works offline.
    app = FastAPIOffline(title=f"{APP_NAME} API", version=__version__, docs_url="/docs", redoc_url=None,
                         static_url=DOCS_ASSETS, openapi_url="/openapi.json",
                         description="Make, follow, fetch and cancel jobs; every setting by its name, as the page and "
                                     "the command line name it. Log in with the page's user and password (HTTP basic) "
                                     "or a token of --api-token (Authorization: Bearer).")
    jobs = ApiJobs(ctx)
    _job_routes(app, ctx, jobs)
    _follow_routes(app, ctx, jobs)
    _job_files(app, ctx, jobs)
    _reading_routes(app, ctx)
    return app


def _job_routes(app, ctx: AppContext, jobs: ApiJobs) -> None:
    from starlette.concurrency import run_in_threadpool

    def create(login: str, given: dict, uploads: dict):
        body = read_body(given, uploads, lambda key: _output_path(ctx, key))
        what = MODE_NAMES[body.mode]
        try:
            work, ticket = admit(ctx, _owner(login), what, engine_job(ctx, lambda: _request(ctx, body)),
                                  _share_of(login))
        except Refusal as refusal:
            body.discard()
            failure = refusal.failure
            return _answer(429 if failure.kind == "queue" else 422,
                           {"error": failure.text, "problems": list(failure.problems) or [failure.text]})
        except BaseException:
            body.discard()
            raise
        job = jobs.start(login, what, body.mode, work, ticket, body)
        base = f"/api/v1/jobs/{job.id}"
        return _answer(202, {"id": job.id, "state": job.state(), "place": ctx.jobs.place(ticket),
                             "estimate_s": ctx.jobs.estimate(ticket),
                             "links": {"status": base, "events": f"{base}/events", "result": f"{base}/result",
                                       "sidecar": f"{base}/sidecar"}})

    @app.post("/v1/jobs", status_code=202, summary="Make a job", responses={
        202: {"model": Accepted}, 422: {"model": Problem, "description": "what to change"},
        429: {"model": Problem, "description": "the queue is full"}, **ERRORS},
        openapi_extra={"requestBody": {"required": True, "content": {
            JSON: {"schema": job_schema()}, "multipart/form-data": {"schema": job_schema()}}}})
    async def create_job(request: Request):
        """A job: the fields of the page's form by name (mode, prompt, preset, width, frames, steps, loras ...),
        images and videos uploaded (multipart) or in base64. Checked first, then queued: 202 with its id."""
        given: dict = {}
        try:
            given, uploads = await _given(request)
            return await run_in_threadpool(create, _login(request), given, uploads)
        except (InputError, ModelError) as exc:
            # A body refused before it reached the queue is a refused job all the same, as on the page.
            mode = given.get("mode") if isinstance(given, dict) else None
            known = isinstance(mode, str) and mode in MODE_NAMES   # a list or an object is no mode either
            ctx.metrics.job_ended(JobRecord(mode if known else "other", "", "refused",
                                            failure=str(FailureKind.MODEL if isinstance(exc, ModelError)
                                                        else FailureKind.INPUT)))
            return _problem(422, exc)



def _follow_routes(app, ctx: AppContext, jobs: ApiJobs) -> None:
    @app.get("/v1/jobs", summary="The caller's jobs", responses={200: {"model": list[JobStatus]}, **ERRORS})
    def list_jobs(request: Request):
        return [job.status(ctx) for job in jobs.of(_login(request))]

    @app.get("/v1/jobs/{job_id}", summary="A job's state", responses={200: {"model": JobStatus}, **ERRORS})
    def job_status(job_id: str, request: Request):
        job = jobs.get(job_id, _login(request))
        return job.status(ctx) if job is not None else _no_job(job_id)

    @app.delete("/v1/jobs/{job_id}", summary="Cancel a job", responses={200: {"model": Cancel}, **ERRORS})
    def cancel_job(job_id: str, request: Request):
        """A waiting job is taken out of the queue; a running one stops at the end of its current step (what it
        wrote before is kept)."""
        job = jobs.get(job_id, _login(request))
        if job is None:
            return _no_job(job_id)
        said = jobs.cancel(job)
        return {"id": job.id, "state": job.state(), "said": said}

    @app.get("/v1/jobs/{job_id}/events", summary="A job's events (server-sent events)",
             responses={200: {"content": {"text/event-stream": {}}}, **ERRORS})
    def job_events(job_id: str, request: Request):
        """Every engine event of the job, in order, as the page gets them (JobStarted, PhaseStarted, StepFinished,
        PreviewReady with its image in base64, ..., and one of JobFinished, JobFailed, JobCancelled last); the
        stream ends with the job. Last-Event-ID resumes after that event."""
        from starlette.responses import StreamingResponse

        job = jobs.get(job_id, _login(request))
        if job is None:
            return _no_job(job_id)
        resume = request.headers.get("last-event-id", "").strip()
        # An event's number: ASCII digits, at most 18 of them ("²" is a digit to Python, and 5000 digits no int)
        start = int(resume) + 1 if resume.isascii() and resume.isdigit() and len(resume) <= 18 else 0

        def lines():
            for index, event in job.stream(start):
                if event is None:
                    yield ": still going\n\n"
                else:
                    yield f"id: {index}\nevent: {event['type']}\ndata: {json.dumps(event, default=str)}\n\n"
            yield f"event: end\ndata: {json.dumps({'state': job.state()})}\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _no_job(job_id: str):
    return _answer(404, {"error": f"There is no job {job_id[:40]!r} of yours: it was never made with this login, or "
                                  "the app has restarted since (GET /api/v1/jobs lists yours).",
                         "problems": []})


def _job_files(app, ctx: AppContext, jobs: ApiJobs) -> None:

    def finished(job_id: str, request, index: int):
        """(the job's output path, its sidecar path) or an answer saying why there is none yet."""
        job = jobs.get(job_id, _login(request))
        if job is None:
            return _no_job(job_id)
        state, result = job.state(), job.view.result
        if result is None:
            said = job.status(ctx)
            return _answer(409, {"error": f"The job has no result: it is {state}" +
                                          (f" ({said.get('error') or said.get('ending')})" if state != "running"
                                           and state != "waiting" else "; try again when it is done") + ".",
                                 "problems": said.get("problems") or [], "state": state})
        paths, sidecars = list(result.paths), list(result.sidecars) or [result.sidecar]
        if not 0 <= index < len(paths):
            return _answer(404, {"error": f"The job made {len(paths)} output(s): use index 0 to {len(paths) - 1}.",
                                 "problems": []})
        return Path(paths[index]), Path(sidecars[min(index, len(sidecars) - 1)]), result

    @app.get("/v1/jobs/{job_id}/result", summary="A job's video or still", responses={
        200: {"content": {"video/mp4": {}, "image/png": {}, JSON: {}}}, 409: {"model": Problem}, **ERRORS})
    def job_result(job_id: str, request: Request, format: str = "file", index: int = 0):
        """The mp4 or png; ``format=base64``: {"video_base64" or "image_base64", "seed", "timings"}; ``index``: the
        output of a job of several (0 first)."""
        import base64

        from starlette.responses import FileResponse

        found = finished(job_id, request, index)
        if not isinstance(found, tuple):
            return found
        path, _, result = found
        if format == "base64":
            key = "video_base64" if path.suffix == ".mp4" else "image_base64"
            seeds = list(result.seeds) or [result.seed]
            return {key: base64.b64encode(path.read_bytes()).decode("ascii"), "file": path.name,
                    "seed": seeds[min(index, len(seeds) - 1)], "timings": dict(result.timings)}
        if format != "file":
            return _answer(422, {"error": f"format {format[:20]!r} is not one this app gives: leave it out for the "
                                          "file, or use base64", "problems": []})
        return FileResponse(path, media_type=MEDIA.get(path.suffix, "application/octet-stream"), filename=path.name)

    @app.get("/v1/jobs/{job_id}/sidecar", summary="A job's sidecar", responses={409: {"model": Problem}, **ERRORS})
    def job_sidecar(job_id: str, request: Request, index: int = 0):
        found = finished(job_id, request, index)
        if not isinstance(found, tuple):
            return found
        return json.loads(found[1].read_text(encoding="utf-8"))


def _reading_routes(app, ctx: AppContext) -> None:
    from starlette.concurrency import run_in_threadpool

    @app.get("/v1/presets", summary="The presets")
    def presets():
        """Every preset, built-in and saved: its name, title, mode, description, settings and negative prompt."""
        return [{"name": name, "title": preset.title, "mode": preset.settings.mode,
                 "description": getattr(preset, "description", ""), "settings": preset.settings.to_dict(),
                 "negative_prompt": preset.negative_prompt} for name, preset in dict(ctx.presets).items()]

    @app.get("/v1/models", summary="The models on disk")
    def models():
        """Every model in the Hugging Face cache and the models folder, as the Models tab lists them."""
        from engine.service.model_files import list_models

        folder = Path(ctx.models_dir or ctx.client.models_dir)
        return [{"key": entry.key, "name": entry.name, "kind": entry.kind, "size_bytes": entry.size_bytes,
                 "presets": list(entry.presets)} for entry in list_models(folder, dict(ctx.presets))]

    @app.get("/v1/history", summary="Past outputs, newest first")
    def history(limit: str | None = None):
        from engine.outputs.history import HistoryError, history_limit, scan_history

        try:
            count = history_limit(limit)   # read as the app reads it: "abc" gets its sentence
        except HistoryError as exc:
            return _problem(422, exc)
        return [_keyed(entry.to_dict()) for entry in scan_history(ctx.outputs_dir, limit=count)]

    def _keyed(entry: dict) -> dict:
        """A History entry as the API says it: its files as keys of the outputs folder, not the server's paths."""
        return {name: output_key(value, ctx.outputs_dir) if name in ENTRY_FILES else value
                for name, value in entry.items()}

    def plan_of(given: dict):
        from engine.service.ahead import plan_settings, predicted_job
        from engine.settings.draft import prepare

        body = read_body({name: value for name, value in given.items() if name not in ("prompt", "negative_prompt",
                                                                                        "seed")}, {}, plan=True)
        values = dict(body.values)
        preset = preset_named(ctx, values.pop("preset", None), body.mode)
        settings = prepare(values, preset.settings, body.mode, ctx.paths, ctx.client.catalog.limits)
        hardware = ctx.client.hardware_profile()
        plan = plan_settings(settings, hardware, ctx.client.catalog, ctx.client.engine_count())
        job = predicted_job(settings, plan, hardware, ctx.client.catalog, ctx.outputs_dir, ctx.client.models_dir)
        return {"settings": settings.to_dict(), "job_seconds": None if job is None else round(job.total, 1),
                "too_long": ctx.ceiling.refusal(job), **plan.to_dict()}

    @app.post("/v1/plan", summary="The memory plan for a job's settings", responses={422: {"model": Problem}},
              openapi_extra={"requestBody": {"content": {JSON: {"schema": job_schema()}}}})
    async def plan(request: Request):
        """Where each part of the model would be in each phase on this machine, the predicted peaks and why, for a
        body as POST /api/v1/jobs takes it (the prompt and the files are not needed)."""
        try:
            given, _ = await _given(request)
            return await run_in_threadpool(plan_of, given)
        except (InputError, ModelError, ValueError) as exc:
            return _problem(422, exc)

