"""The server that ``python app.py`` serves, made from its arguments: the engines, the page, and what gradio's server
is made with besides the page (the guard in front of every request, the JSON API and /metrics). app.py launches it;
the tests make the same server as an object in their own process (``asgi_app``) to send it requests with no port and
no engine started."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Server:
    demo: object          # the page (gradio Blocks)
    engines: object       # the EnginePool, not started yet
    auth: tuple | None    # (user, password) of the page's login, if any
    launch: dict          # demo.launch's keyword arguments but the address and the browser's


def presets_with_user_folder(folder: str):
    """The built-in presets and the user's own from ``folder``; a bad user file is reported and skipped."""
    from engine.settings.presets import PresetError, UserPresets, load_presets

    try:
        user = UserPresets(Path(folder), load_presets())
    except PresetError as exc:
        raise SystemExit(f"error: --user-presets: {exc}") from None
    for problem in user.load():
        print(f"warning: {problem}", file=sys.stderr, flush=True)
    return user.presets, user


def make_server(args, served: Path, auth: tuple | None, tokens: tuple[str, ...], throttle=None) -> Server:
    """The server of ``args`` (app.py's parsed serve arguments), its uploads and results kept in ``served``;
    ``throttle``: the wrong-password counter, a LoginThrottle (the tests give one on a clock of their own)."""
    from engine.service.jobqueue import JobQueue
    from engine.service.metrics import ServiceMetrics
    from engine.service.pool import EnginePool
    from ui.app_ui import MAX_QUEUE, PAGE_CSS, PAGE_JS, STATE_SESSIONS, build_app, server_threads
    from ui.context import AppContext
    from ui.guard.throttle import LoginThrottle
    from ui.startup import job_ceiling

    presets, user_presets = presets_with_user_folder(args.user_presets)
    max_queue = args.max_queue or MAX_QUEUE
    jobs = JobQueue(max_queue, engines=args.gpus.known or 1, share=args.queue_share)
    engines = EnginePool(args.models_dir, args.gpus, latents_hours=args.latents_hours,
                         preview_seconds=args.preview_every, on_resize=jobs.resize, outputs_dir=args.outputs)
    ctx = AppContext(engines, presets, args.outputs, args.model, allow_model_paths=args.allow_model_paths,
                     models_dir=args.models_dir, user_presets=user_presets, jobs=jobs, served_dir=str(served),
                     metrics=ServiceMetrics(jobs, engines, presets=[(p.settings.mode, p.settings.model)
                                                                    for p in presets.values()]),
                     ceiling=job_ceiling(args.max_job_minutes, bool(auth or tokens)))
    launch = dict(share=args.share, auth=auth, allowed_paths=[str(Path(args.outputs).resolve())],
                  max_file_size="50mb", footer_links=["api"], css=PAGE_CSS, js=PAGE_JS,
                  max_threads=server_threads(max_queue),
                  quiet=True, run_history=False,   # runs kept in the browser grow the page (and keep prompts)
                  prevent_thread_lock=True, state_session_capacity=STATE_SESSIONS,
                  app_kwargs=_server_parts(args, ctx, served, tokens, throttle or LoginThrottle()))
    return Server(_calm(build_app(ctx)), engines, auth, launch)


# gradio's queue looks for work every millisecond while it has none, and for progress every 10 ms (on Windows
# every 50 and 100 ms): an idle app kept 4% of a core busy (0.3% after). The Windows pace everywhere: a job waits at
# most 50 ms more to start.
QUEUE_IDLE_POLL_S = 0.05
PROGRESS_IDLE_POLL_S = 0.1


def _calm(demo):
    """``demo`` with its queue polling at QUEUE_IDLE_POLL_S and PROGRESS_IDLE_POLL_S while idle."""
    queue = getattr(demo, "_queue", None)
    if queue is not None:
        queue.sleep_when_free = max(getattr(queue, "sleep_when_free", 0.0), QUEUE_IDLE_POLL_S)
        queue.progress_update_sleep_when_free = max(getattr(queue, "progress_update_sleep_when_free", 0.0),
                                                     PROGRESS_IDLE_POLL_S)
    return demo


def _server_parts(args, ctx, served: Path, tokens: tuple[str, ...], throttle) -> dict:
    """What gradio's server is made with besides the page: the guard in front of every request, the API callers'
    trailing inputs, and the JSON API and /metrics as routes of its own (behind the same guard)."""
    from starlette.middleware import Middleware

    from ui.api_defaults import TrailingDefaults
    from ui.guard import Guard, HostAllowList
    from ui.guard.api_login import ApiLogins
    from ui.guard.routes import RouteTable
    from ui.rest.mount import service_routes
    from ui.status_clock import tracker_route

    hosts = HostAllowList.for_server(args.host, args.listen, args.share, args.allowed_host)
    guard = Middleware(Guard, hosts=hosts, throttle=throttle, uploads_folder=served,
                       api_logins=ApiLogins(tokens), routes=RouteTable.with_api(args.metrics_public))
    return {"middleware": [guard, Middleware(TrailingDefaults)], "routes": [*service_routes(ctx), tracker_route()]}


def asgi_app(server: Server):
    """The server as the ASGI application that ``demo.launch`` would serve (no port, no queue worker, no engine
    started): for requests sent in process, such as through ``httpx.ASGITransport``."""
    from gradio.routes import App

    demo = server.demo
    demo.auth = [server.auth] if server.auth else None
    demo.max_file_size = server.launch["max_file_size"]
    demo.allowed_paths = server.launch["allowed_paths"]
    return App.create_app(demo, app_kwargs=server.launch["app_kwargs"])


# How long Ctrl+C waits for the open pages' streams (a page keeps one open while it is shown) before cutting them;
# gradio alone waits 5 s.
STOP_GRACE_S = 1


class _CutStreams:
    """A logging filter: the streams that Ctrl+C cuts are not errors worth a traceback on the console."""

    def filter(self, record) -> bool:
        import asyncio

        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError) and "graceful shutdown exceeded" not in record.getMessage()


def stop_quickly(demo) -> None:
    """Ctrl+C stops the launched ``demo`` within about STOP_GRACE_S: open pages' streams are cut, quietly."""
    import logging

    demo.server.config.timeout_graceful_shutdown = STOP_GRACE_S
    logging.getLogger("uvicorn.error").addFilter(_CutStreams())
