"""The JSON API's jobs: each one admitted to the page's queue (ui/generate.py ``admit``) while its POST waits, then
followed in a thread of its own exactly as a page's job is (``follow``), every engine event kept for its status,
its event stream and its result.

A job belongs to the login that made it (ui/guard/api_login.py): another login is told there is no such job. The
store keeps the newest KEPT_JOBS jobs that have ended (and every one that has not).
"""
from __future__ import annotations

import base64
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

from engine.events import Event, PreviewReady
from engine.service.jobqueue import Ticket
from ui.context import AppContext
from ui.generate import EngineWork, follow
from ui.rest.bodies import JobBody
from ui.views.job_view import JobView, ending_words

KEPT_JOBS = 200
STATES = ("waiting", "running", "done", "failed", "cancelled")


# The fields of the engine's events that name files: the API says them as keys of the outputs folder.
FILE_FIELDS = ("paths", "sidecar", "latents", "written", "path")


def output_key(path: str | None, outputs_dir: str | Path) -> str | None:
    """A file as the API names it: its place in the outputs folder ('2026-01-31/120000_t2v_fox_1.mp4', the History's
    key), or its name alone for a file elsewhere; never a path of the server's disk."""
    if not path:
        return path
    try:
        return Path(path).resolve().relative_to(Path(outputs_dir).resolve()).as_posix()
    except ValueError:
        return Path(path).name


def event_dict(event: Event, outputs_dir: str | Path = "outputs") -> dict:
    """An engine event as the API says it: its type, then its fields (a preview's image in base64, files as keys of
    the outputs folder)."""
    values = asdict(event)
    if isinstance(event, PreviewReady):
        values["image"] = base64.b64encode(event.image).decode("ascii")
    for name in FILE_FIELDS:
        if isinstance(values.get(name), str):
            values[name] = output_key(values[name], outputs_dir)
        elif isinstance(values.get(name), (list, tuple)):
            values[name] = [output_key(path, outputs_dir) for path in values[name]]
    return {"type": type(event).__name__, **values}


class _Failed(Exception):
    """How follow() ends a failed job; its failure is in the job's view already."""


@dataclass(eq=False)
class ApiJob:
    """One job of the API, from its POST to its end."""
    id: str
    owner: str
    what: str                  # "text to video", as the queue names it
    mode: str
    ticket: Ticket
    body: JobBody
    created: float = field(default_factory=time.time)
    view: JobView = field(default_factory=JobView)
    events: list = field(default_factory=list)   # every engine event, as event_dict made them
    crashed: str | None = None                    # the app's own error, if following the job failed
    over: bool = False
    ended: float | None = None                    # when it ended (time.monotonic)
    changed: threading.Condition = field(default_factory=threading.Condition)
    outputs_dir: str = "outputs"                  # what its files are named in (output_key)

    def state(self) -> str:
        view = self.view
        if view.result is not None:
            return "done"
        if view.failure is not None or self.crashed:
            return "failed"
        if view.cancelled is not None or view.left_queue or self.ticket.withdrawn or self.over:
            return "cancelled"
        return "running" if self.ticket.started is not None else "waiting"

    def note(self, event: Event) -> None:
        with self.changed:
            self.events.append(event_dict(event, self.outputs_dir))
            self.changed.notify_all()

    def show(self, view: JobView, event) -> dict:
        with self.changed:
            self.view = view
            self.changed.notify_all()
        return {}

    def end(self) -> None:
        with self.changed:
            self.over, self.ended = True, time.monotonic()
            self.changed.notify_all()

    def status(self, ctx: AppContext) -> dict:
        """What the job is doing, as GET /api/v1/jobs/{id} answers."""
        view, ticket, state = self.view, self.ticket, self.state()
        ran = ((self.ended or time.monotonic()) - ticket.started) if ticket.started is not None else 0.0
        left = view.seconds_left() if state == "running" else None
        said = {"id": self.id, "mode": self.mode, "state": state, "place": ctx.jobs.place(ticket),
                "wait_s": _round(ctx.jobs.estimate(ticket)) if state == "waiting" else None,
                "phase": view.running_phase, "step": view.step, "steps": view.total_steps,
                "seconds": round(ran, 2), "predicted_s": _round(ran + left) if left is not None else None,
                "status": view.status, "notes": list(view.notes)}
        ending = view.ending
        if ending is not None and state != "running":
            said["ending"] = ending_words(ending)
        if view.result is not None:
            said |= {"outputs": [output_key(path, self.outputs_dir) for path in view.result.paths], "seed": view.result.seed,
                     "seeds": list(view.result.seeds) or [view.result.seed], "timings": dict(view.result.timings)}
        if view.failure is not None:
            said |= {"error": view.failure.text, "problems": list(view.failure.problems),
                     "kind": str(view.failure.kind)}
        if self.crashed:
            said["error"] = self.crashed
        if view.cancelled is not None:
            said["kept"] = [output_key(path, self.outputs_dir) for path in view.cancelled.written]
        return said

    def stream(self, start: int = 0, keep_alive_s: float = 15.0) -> Iterator[tuple[int, dict | None]]:
        """(index, event) as they come from ``start`` on, until the job has ended and each one was given; (index,
        None) after ``keep_alive_s`` without one."""
        index = start
        while True:
            with self.changed:
                if index >= len(self.events) and not self.over:
                    self.changed.wait(keep_alive_s)
                fresh, over = self.events[index:], self.over
            for event in fresh:
                yield index, event
                index += 1
            if over and index >= len(self.events):
                return
            if not fresh:
                yield index, None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


class ApiJobs:
    """The API's jobs by id, and the threads that follow them."""

    def __init__(self, ctx: AppContext, kept: int = KEPT_JOBS):
        self.ctx, self.kept = ctx, kept
        self._jobs: dict[str, ApiJob] = {}
        self._lock = threading.Lock()

    def start(self, owner: str, what: str, mode: str, work: EngineWork, ticket: Ticket, body: JobBody) -> ApiJob:
        """Follow an admitted job in a thread of its own; the job."""
        job = ApiJob(uuid.uuid4().hex[:16], owner, what, mode, ticket, body, outputs_dir=str(self.ctx.outputs_dir))
        with self._lock:
            self._jobs[job.id] = job
            self._prune()
        start = work.start
        work = replace(work, start=lambda slots: self._teed(job, start(slots)))
        threading.Thread(target=self._follow, args=(job, work), name=f"api job {job.id}", daemon=True).start()
        return job

    @staticmethod
    def _teed(job: ApiJob, events: Iterator[Event]) -> Iterator[Event]:
        for event in events:
            job.note(event)
            yield event

    def _follow(self, job: ApiJob, work: EngineWork) -> None:
        try:
            for _ in follow(self.ctx, work, job.ticket, job.show, lambda view, failure: _Failed()):
                pass
        except _Failed:
            pass
        except Exception as exc:   # the app's own error: said as the job's, never lost in a thread
            job.crashed = f"The app failed while following the job: {exc}"
        finally:
            job.body.discard()
            job.end()

    def get(self, job_id: str, owner: str) -> ApiJob | None:
        """The job ``job_id`` of ``owner`` (None: no such job, or another login's)."""
        with self._lock:
            job = self._jobs.get(job_id)
        return job if job is not None and job.owner == owner else None

    def of(self, owner: str) -> list[ApiJob]:
        with self._lock:
            return [job for job in self._jobs.values() if job.owner == owner]

    def cancel(self, job: ApiJob) -> str:
        """Take a waiting job out of the queue, or stop a running one at its next step; what was done."""
        state = job.state()
        if state == "waiting" and self.ctx.jobs.withdraw_ticket(job.ticket):
            return "taken out of the queue: it will not run"
        if job.ticket.started is not None and state == "running":
            self.ctx.client.cancel(job.ticket.slots)
            return "cancelling at the end of its current step"
        return f"nothing to cancel: it has {'finished' if state == 'done' else 'ended'} ({state})"

    def _prune(self) -> None:
        ended = [job for job in self._jobs.values() if job.over]
        for job in ended[:max(0, len(ended) - self.kept)]:
            del self._jobs[job.id]

