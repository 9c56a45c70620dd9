"""The engine in its own process, and the client the app uses to drive it.

The worker owns the Engine (and so the GPU). The app talks to it over a pipe:
it sends a request and reads typed events until a terminal one. If the
worker dies (segfault, driver fault, kill -9), the client reports which phase
was running, starts a fresh worker, and the next job runs there.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import threading
import time
import uuid
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Iterator

from engine.device.hardware import HardwareProfile
from engine.device.usage import EngineMemory, EngineSilent, EngineStarting
from engine.events import Event, Info, JobFailed, LatentsSaved, Phase, PhaseFinished, PhaseStarted, is_terminal
from engine.models.catalog import ModelCatalog
from engine.service.ahead import plan_settings
from engine.service.model_files import LoadedFiles
from engine.errors import ModelError
from engine.atomic import discard_temporary
from engine.outputs.bundle import Bundle
from engine.outputs.latents import DECODE_AGAIN_HINT
from engine.run.failures import exit_reason, failure_event
from engine.run.faults import NO_FAULTS, PhaseHook
from engine.service.commands import PONG, Ask, DecodeSaved, PostOutput, Ready, RunJob, Stop, Unload, Unloaded
from engine.service.engine_process import run_engine_process
from engine.service.starts import engine_context, environment
from engine.service.watchdog import Silence, Watchdog
from engine.settings.model_fit import check_model_fits
from engine.settings.request import GenerationRequest, check_request_with_notes
from engine.settings.values import InputError

_SPAWN = mp.get_context("spawn")   # the job-cancel flag and the pipes (the process itself: starts.py)
# How often a running job's watchdog looks at the engine when no event comes, in seconds.
WATCH_TICK_S = 0.5
# A new engine process that has not loaded its libraries after this long is stopped and started again.
STARTUP_LIMIT_S = 600.0
# How long a closing client waits for its engine process to end its job (asked to stop at its next step) and exit
# before it stops it: a person who pressed Ctrl-C waits no longer than this for the engine.
CLOSE_WAIT_S = 3.0


def checked(check, request: GenerationRequest, job_id: str, run) -> Iterator[Event]:
    """``check(request)`` then ``run(request, notes)``'s events; bad input ends in a JobFailed event instead, before
    any engine does anything (a lone engine's and the EnginePool's ``submit``)."""
    try:
        request, notes = check(request)
    except (InputError, ModelError) as exc:
        yield failure_event(job_id, exc, None)
        return
    yield from run(request, notes)


@dataclass
class _Worker:
    process: object
    conn: object
    status: object    # a second pipe, answered by a thread in the engine process even during a job
    ready: bool = False   # it has said that its libraries are loaded


class WorkerClient:
    """Owns the worker process; runs one job at a time; restarts the worker when it dies."""

    def __init__(self, models_dir: Path | str = "models", hardware: HardwareProfile | None = None,
                 latents_hours: float | None = None, preview_seconds: float | None = None,
                 faults: PhaseHook = NO_FAULTS, env: dict[str, str] | None = None,
                 outputs_dir: Path | str | None = None, silence: Silence = Silence()):
        """``latents_hours``: how long finished runs' latents are kept; ``preview_seconds``: the least time
        between live previews (0: every step; negative: none); ``faults``: the engine's phase hook in the
        first engine process (tests inject faults with it, such as a crash in a phase), NO_FAULTS after, unless
        the hook says ``every_process`` (engine/run/faults.py);
        ``env``: variables every engine process of this client starts with (its GPU: engine/service/pool.py);
        ``hardware``: the profile the engine plans for instead of probing its device (a described machine);
        ``outputs_dir``: the app's outputs folder, where the engine finds this machine's measured rates;
        ``silence``: how long a running engine may answer nothing before it is declared hung."""
        self.models_dir = str(models_dir)
        self.env = dict(env or {})
        self.catalog = ModelCatalog()   # the models' specs and checks, read once per version of their files
        # The Engine's keyword arguments, sent to each new engine process (so they must pickle).
        self.options = {"faults": faults}
        if latents_hours is not None:
            self.options["latents_hours"] = latents_hours
        if preview_seconds is not None:
            self.options["preview_seconds"] = preview_seconds
        if outputs_dir is not None:
            self.options["outputs_dir"] = str(outputs_dir)
        self.given_hardware = hardware
        self.silence = silence
        self._cancel = _SPAWN.Event()
        self._job_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._ready_lock = threading.Lock()
        self._status_lock = threading.Lock()
        self._worker: _Worker | None = None
        self._closed = False   # closed for good (the app stops): no engine process starts after it
        self._process_starting: float | None = None   # when the engine process now starting was asked for
        self._ids = itertools.count(1)
        self.restarts = 0
        self.hung = 0     # engine processes stopped because they stopped answering
        self._hardware_profile: HardwareProfile | None = None
        # The settings of the job that runs now (None: none runs): the Models tab deletes none of its models.
        self.running_settings = None

    # ----- process management -------------------------------------------
    def _ensure_worker(self) -> _Worker:
        with self._start_lock:
            if self._closed:
                raise OSError("the engine is closed: the app is stopping")
            if self._worker is None or not self._worker.process.is_alive():
                if self._worker is not None:
                    self._worker.conn.close()
                    self._worker.status.close()
                    self.restarts += 1
                parent, child = _SPAWN.Pipe()
                status_parent, status_child = _SPAWN.Pipe()
                self._process_starting = time.monotonic()
                process = engine_context().Process(
                    target=run_engine_process, args=(child, status_child, self._cancel, self.models_dir,
                                               self.given_hardware, self.options, environment(self.env)),
                    name="wan-engine", daemon=True)
                try:
                    process.start()   # the first one forked waits for the fork server's load
                finally:
                    self._process_starting = None
                child.close()
                status_child.close()
                self._worker = _Worker(process, parent, status_parent)
                # Injected faults apply to the first engine process only: the one started after a fault runs clean
                # (unless the hook acts on every process: engine/run/faults.py).
                if not getattr(self.options["faults"], "every_process", False):
                    self.options = {**self.options, "faults": NO_FAULTS}
            return self._worker

    @property
    def pid(self) -> int | None:
        return self._worker.process.pid if self._worker and self._worker.process.is_alive() else None

    def start(self) -> None:
        """Start the engine process now, in the background (the first forked from a new fork server waits for the
        libraries' load: engine/service/starts.py); otherwise it starts with the first job. OSError once closed."""
        if self._closed:
            raise OSError("the engine is closed: the app is stopping")
        worker = self._worker
        if worker is None or not worker.process.is_alive():
            self._process_starting = time.monotonic()
        threading.Thread(target=self._start_in_background, name="engine-start", daemon=True).start()

    def _start_in_background(self) -> None:
        try:
            self._ensure_worker()
        except OSError:   # closed meanwhile: the app stops
            pass
        finally:
            self._process_starting = None

    def close(self) -> None:
        """Stop the engine process for good: a running job is asked to stop at its next step, the process is
        stopped if it has not ended within CLOSE_WAIT_S, and no engine process starts after this (a job thread
        that finds its engine gone gets an OSError rather than a new process while the app stops)."""
        with self._start_lock:
            self._closed = True
            worker, self._worker = self._worker, None
        if worker is None:
            return
        self._cancel.set()
        try:
            if worker.ready:   # still loading its libraries: it would hear the stop only once they are in
                worker.conn.send(Stop())
        except (BrokenPipeError, OSError):
            pass
        worker.process.join(timeout=CLOSE_WAIT_S if worker.ready else 0)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.conn.close()
        worker.status.close()

    def cancel(self, slots=None) -> None:
        """Ask the running job to stop at its next step boundary (``slots``: for the EnginePool's callers; one
        engine has one job)."""
        self._cancel.set()

    def kill(self) -> None:
        """Stop the engine process at once (one stuck in a split job's collective); its job fails saying so and
        the next job starts a fresh process."""
        worker = self._worker
        if worker is not None and worker.process.is_alive():
            worker.process.kill()

    @property
    def busy(self) -> bool:
        return self._job_lock.locked()

    def _wait_ready(self, worker: _Worker) -> bool:
        """Wait until a new engine process has loaded its libraries; False if it died first, or did not get
        there within STARTUP_LIMIT_S (it is stopped then)."""
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while not worker.ready:
            ready = wait([worker.conn, worker.process.sentinel], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                worker.process.kill()
                worker.process.join(timeout=10)
                return False
            if worker.conn not in ready:
                return False
            try:
                reply = worker.conn.recv()
            except (EOFError, OSError):
                return False
            worker.ready = isinstance(reply, Ready)
        return True

    def _ready_worker(self) -> _Worker:
        """The engine process once it has loaded its libraries (a fresh one if it died while starting).

        Waiting reads the job pipe (its first message says "ready"): one caller at a time does, and a caller
        that finds the engine ready reads nothing, so a status question never takes a running job's events."""
        with self._ready_lock:
            worker = self._ensure_worker()
            if not self._wait_ready(worker):
                worker = self._ensure_worker()
                self._wait_ready(worker)
            return worker

    def _call(self, command, expect: type, timeout: float = 120.0):
        """Ask the engine for something quick between jobs; an engine that does not answer within ``timeout``
        seconds is stopped (OSError says so, and the next job starts a fresh one)."""
        with self._job_lock:
            worker = self._ready_worker()
            worker.conn.send(command)
            if not wait([worker.conn, worker.process.sentinel], timeout=timeout) or not worker.conn.poll():
                worker.process.kill()
                worker.process.join(timeout=10)
                raise OSError(f"the engine process did not answer {type(command).__name__} within {timeout:.0f} s; it was "
                              "stopped, and the next job starts a fresh one")
            reply = worker.conn.recv()
            assert isinstance(reply, expect), reply
            return reply

    def unload(self) -> None:
        self._call(Unload(), Unloaded)

    def hardware(self, timeout: float = 30.0) -> HardwareProfile:
        """The engine process's hardware profile, answered on its status channel: never behind a running job
        (it waits only for a starting engine to load its libraries). OSError when it does not answer."""
        self._ready_worker()
        reply = self._ask_status(Ask.HARDWARE, timeout)
        if not isinstance(reply, HardwareProfile):
            raise OSError(f"the engine process did not say what hardware it runs on within {timeout:.0f} s")
        return reply

    def _ask_status(self, question: Ask, timeout: float):
        """The engine process's answer to ``question`` on its status channel; EngineSilent when it runs but
        does not answer in time, None when no engine process runs."""
        with self._status_lock:
            worker = self._worker
            if worker is None or not worker.process.is_alive():
                return None
            try:
                while worker.status.poll(0):   # a late answer to a question that timed out
                    worker.status.recv()
                worker.status.send(question)
                if not worker.status.poll(timeout):
                    return EngineSilent()
                return worker.status.recv()
            except (EOFError, OSError):
                return None

    def memory(self, timeout: float = 5.0) -> EngineMemory | EngineStarting | EngineSilent | None:
        """What the engine process holds now (device memory, its RAM, the loaded model), that it is still
        loading its libraries, or that it does not answer; answered during a job too. None when no engine
        process is running."""
        asked = self._process_starting
        if asked is not None:   # its libraries load before the process exists (a fork server's first engine)
            return EngineStarting(round(time.monotonic() - asked, 1))
        reply = self._ask_status(Ask.MEMORY, timeout)
        return reply if isinstance(reply, (EngineMemory, EngineStarting, EngineSilent)) else None

    def memories(self, timeout: float = 2.0) -> list:
        """[what the engine process holds now]: the EnginePool's question, for one engine."""
        return [self.memory(timeout=timeout)]

    def loaded_files(self, timeout: float = 2.0) -> LoadedFiles | EngineSilent | None:
        """The files the loaded pipeline holds (its folder, transformer files, LoRAs, fast decoders), answered during
        a job too (no engine process, or one still starting, holds none); EngineSilent when the engine does not
        answer, None when it answered that it could not tell."""
        reply = self._ask_status(Ask.LOADED, timeout)
        if reply is None or isinstance(reply, EngineStarting):
            return LoadedFiles(None, ())
        return reply if isinstance(reply, (LoadedFiles, EngineSilent)) else None

    def all_loaded_files(self, timeout: float = 2.0) -> list:
        """[the files the loaded pipeline holds]: the EnginePool's question, for one engine."""
        return [self.loaded_files(timeout=timeout)]

    def all_running_settings(self) -> list:
        """The settings of the job that runs now, if any (as a list, as the EnginePool answers)."""
        return [] if self.running_settings is None else [self.running_settings]

    def alive(self, timeout: float = 1.0) -> bool:
        """Whether the engine process answers its status channel within ``timeout`` seconds."""
        return self._ask_status(Ask.PING, timeout) == PONG

    def hardware_profile(self) -> HardwareProfile:
        """The engine process's hardware as its plans see it, asked once and kept until the next job ends (the app
        never probes the GPU itself)."""
        if self._hardware_profile is None:
            self._hardware_profile = self.hardware()
        return self._hardware_profile

    # ----- jobs ----------------------------------------------------------
    def new_job_id(self) -> str:
        return f"job-{next(self._ids)}-{uuid.uuid4().hex[:6]}"

    def check(self, request: GenerationRequest) -> tuple[GenerationRequest, list[str]]:
        """``request`` checked as a run checks it before anything heavy (settings, images, the model and what
        it can make), with notes for the user; raises InputError or ModelError saying what to change."""
        ref = request.settings.model
        request, notes = check_request_with_notes(request, self.catalog.limits(ref))
        self.catalog.check_folder(ref)
        if self.catalog.known_spec(ref) is not None:
            # Known before any download (a known Hub model): a model of another kind, or a transformer file
            # that does not fit it, is refused now.
            check_model_fits(self.catalog.info(request.settings), request.settings, bool(request.last_image))
            self._check_it_fits(request)
        return request, notes

    def _check_it_fits(self, request: GenerationRequest) -> None:
        """InputError, with what would fit, when the job's plan does not fit this machine and no strategy is forced:
        before a download or a load. Only once the engine has said what hardware it runs on (never waits)."""
        hardware = self._hardware_profile
        if hardware is None or request.settings.strategy:
            return
        plan = plan_settings(request.settings, hardware, self.catalog)
        if not plan.fits:
            raise InputError(f"{request.settings.model}: {plan.refusal}")

    def run(self, request: GenerationRequest, notes: list[str] | tuple = (),
            job_id: str | None = None, group=None, slots=()) -> Iterator[Event]:
        """Run a request that ``check`` passed, yielding its events; the last one is terminal.

        ``group``: this engine's rank in a job split across several engines (engine/run/parallel.py RankGroup);
        ``slots``: for the EnginePool's callers (one engine runs every job). The engine stays reserved for this
        job until the iterator ends: a caller that stops early must close() it, which cancels the job at its
        next step and waits for the engine to finish it.
        """
        job_id = job_id or self.new_job_id()
        for note in notes:   # cleaned prompts, converted images: said before the job starts
            yield Info(job_id, note)
        self.running_settings = request.settings   # the models it uses may not be deleted meanwhile
        try:
            yield from self._exchange(lambda timings: RunJob(request, job_id, timings, group), job_id)
        finally:
            self.running_settings = None
            # A job may have measured the machine (its fastest attention backend is the plan's from now on):
            # the page's next plan asks the engine again.
            self._hardware_profile = None

    def engine_count(self, timeout: float = 0.0) -> int:
        return 1

    def engines_for(self, request: GenerationRequest) -> int:
        """One: a lone engine runs every job whole (the EnginePool splits jobs across several)."""
        return 1

    def submit(self, request: GenerationRequest, job_id: str | None = None) -> Iterator[Event]:
        """``check`` then ``run``: bad input ends in a JobFailed event, before the engine does anything."""
        job_id = job_id or self.new_job_id()
        yield from checked(self.check, request, job_id, lambda checked_request, notes: self.run(
            checked_request, notes, job_id))

    def decode(self, latents: str, tiled: bool = False, on_cpu: bool = False,
               job_id: str | None = None, slots=()) -> Iterator[Event]:
        """Decode saved latents again (tiled, or on the CPU) into a new video, without denoising."""
        job_id = job_id or self.new_job_id()
        yield from self._exchange(lambda timings: DecodeSaved(str(latents), job_id, tiled, on_cpu, timings), job_id)

    def post(self, path: str, step: str, factor: int, job_id: str | None = None, slots=()) -> Iterator[Event]:
        """Smoother or larger (``step`` "interpolate" or "upscale", by ``factor``) on the output ``path``: a new
        output beside it."""
        job_id = job_id or self.new_job_id()
        yield from self._exchange(lambda timings: PostOutput(str(path), step, int(factor), job_id, timings), job_id)

    def _starting(self, job_id: str) -> Iterator[Event]:
        """While a new engine process loads its libraries, the job says so and times it (phase engine_start);
        returns the engine, ready, and the job's timings so far."""
        worker = self._worker
        if worker is not None and worker.ready and worker.process.is_alive():
            return worker, {}
        # Said before the process starts: the first one forked waits for its fork server's load (starts.py).
        yield PhaseStarted(job_id, Phase.ENGINE_START)
        start = time.monotonic()
        worker = self._ready_worker()
        waited = time.monotonic() - start
        yield PhaseFinished(job_id, Phase.ENGINE_START, waited)
        return worker, {"engine_start": round(waited, 4)}

    def _exchange(self, command, job_id: str) -> Iterator[Event]:
        """Run one job in the engine: ``command(timings)`` is what to send it, with the timings so far."""
        with self._job_lock:
            self._cancel.clear()
            worker, timings = yield from self._starting(job_id)
            try:
                worker.conn.send(command(timings))
            except (BrokenPipeError, OSError):
                worker, timings = yield from self._starting(job_id)
                worker.conn.send(command(timings))
            events = self._read_events(worker, job_id)
            finished = False
            try:
                for event in events:
                    finished = is_terminal(event)
                    yield event
            finally:
                if not finished:
                    # The caller stopped listening (a closed page, a cancelled request): stop the
                    # job and wait for its end, so the engine is free and in step for the next one.
                    self._cancel.set()
                    for event in events:
                        pass

    def _read_events(self, worker: _Worker, job_id: str) -> Iterator[Event]:
        watch = Watchdog(time.monotonic(), silence=self.silence)
        latents = None
        while True:
            ready = wait([worker.conn, worker.process.sentinel], timeout=WATCH_TICK_S)
            if not ready:   # nothing came: is the engine still alive, and still moving?
                reason = self._check_on(watch)
                if reason:
                    yield from self._replace_hung(worker, job_id, watch.phase, latents, reason)
                    return
                continue
            if worker.conn in ready:
                try:
                    event = worker.conn.recv()
                except (EOFError, OSError):
                    event = None
                if event is not None:
                    watch.saw(event, time.monotonic())
                    if isinstance(event, LatentsSaved):
                        latents = event.path
                    yield event
                    if is_terminal(event):
                        return
                    continue
            # The pipe closed or the process ended without a terminal event: it died.
            worker.process.join(timeout=5)
            reason = exit_reason(worker.process.exitcode)
            where = f" during {watch.phase.replace('_', ' ')}" if watch.phase else ""
            yield from self._failed(job_id, f"The engine process stopped unexpectedly{where} ({reason}).",
                                    watch.phase, "crash", latents)
            return

    def _check_on(self, watch: Watchdog) -> str | None:
        """Why the engine of the running job is hung, or None: asks its status channel when it has been quiet."""
        now = time.monotonic()
        if self._cancel.is_set():
            watch.cancel_asked(now)
        if watch.should_ask(now):
            watch.answered(self.alive(timeout=1.0), time.monotonic())
        return watch.hung(time.monotonic())

    def _replace_hung(self, worker: _Worker, job_id: str, phase: str | None, latents: str | None,
                      reason: str) -> Iterator[Event]:
        """Kill an engine process that stopped answering (a stopped process dies too) and fail its job."""
        worker.process.kill()
        worker.process.join(timeout=10)
        self.hung += 1
        where = f" during {phase.replace('_', ' ')}" if phase else ""
        yield from self._failed(job_id, f"The engine stopped answering{where} ({reason}), so it was stopped.",
                                phase, "hung", latents)

    def _failed(self, job_id: str, message: str, phase: str | None, kind: str,
                latents: str | None) -> Iterator[Event]:
        """A fresh engine process for the next job, and the end of this one (without the video its dead engine
        was streaming: the encoder outlives it)."""
        if latents:
            discard_temporary(Bundle.from_latents(latents).video)
        self._ensure_worker()
        yield Info(job_id, "A fresh engine process was started.")
        hint = ("Nothing else was lost; the next job runs in a fresh engine process. If it happens again, "
                "lower the size or frames and run 'python app.py doctor'.")
        if latents:
            hint += f" {DECODE_AGAIN_HINT}"
        yield JobFailed(job_id, message, hint, phase, kind, latents)
