"""One job: what a run has done so far, written only through its own methods, and its life to one terminal event.

The Engine makes a ``Job`` for every run and every decode again; everything the run learns (its phases' seconds,
its steps, its step-downs, where its latents went, how it decoded) is recorded here, and every phase goes through
``in_phase``, which names the phase a failure or a cancel happens in. ``run_to_end`` turns whatever the work
raises into the job's one terminal event.
"""
from __future__ import annotations

import traceback
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from engine.device.runtime import RamPeakSampler, clock, peak_vram_gb, synchronize
from engine.events import (
    Event,
    Info,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    LatentsSaved,
    Phase,
    PhaseFinished,
    PhaseStarted,
    PlanReady,
    PostProgress,
    StepFinished,
    VideoStarted,
    WindowDone,
)
from engine.outputs.latents import DECODE_AGAIN_HINT
from engine.planning.planner import Plan
from engine.run.failures import failure_event
from engine.run.faults import NO_FAULTS, PhaseHook
from engine.run.parallel import GateCancelled, PeerStopped

Emit = Callable[[Event], None]


class Cancelled(Exception):
    """The user asked to stop; raised at a step or phase boundary."""


@dataclass
class PhaseNote:
    """What a phase did, for its row on the page: words, or a function of the phase's seconds that gives them."""
    detail: str | Callable[[float], str] = ""


class Job:
    """What one run accumulates: its id, the emitter, its phases and their seconds, its steps, and the record its
    sidecar is made from. Read its attributes freely; they change only through its methods."""

    def __init__(self, job_id: str, emit: Emit, should_cancel: Callable[[], bool] = lambda: False,
                 faults: PhaseHook = NO_FAULTS, timings: dict | None = None, steps: int = 0):
        self.id = job_id
        self.emit = emit
        self.should_cancel = should_cancel
        self.steps = steps                   # denoising steps the job asks for (none for a decode again)
        self.device = "cpu"                  # where its phases are timed (the device synchronised)
        self.ram = RamPeakSampler()          # the run's RAM peak so far, reported with every step
        self._faults = faults
        self.video, self.videos = 1, 1       # a job of several videos: the one under way, of how many
        self.written: list[JobFinished] = []   # and the ones finished before it
        self._record(timings)

    def _record(self, timings: dict | None) -> None:
        """A fresh record of one output's run (each video of a job of several has its own sidecar)."""
        self.timings = dict(timings or {})   # seconds by phase, the phases before the engine's included
        self.step_seconds: list[float] = []
        self.step_downs: list[dict] = []
        self.decode_fallback: str | None = None
        self.latents: str | None = None      # its saved latents' file, once they are written
        self.inputs: dict | None = None      # input images kept beside the output: {field: file name or None}
        self.decoder = "vae"                 # what made the frames: "vae", "vae_light (<stem>)" or "fast (<stem>)"
        self.cache: str | None = None        # the step cache's own account of what it did, when one was on
        self.predicted = None                # the time plan's PhaseTimes for this run, when the machine is measured
        self.experts: dict | None = None     # Wan2.2 A14B: the steps each expert ran, the switch step (the sidecar's)
        self.windows: dict | None = None     # a long video: the windows each step ran in (the sidecar's)
        self.loras_beside = False            # its LoRAs compute beside the weights (not merged): uncompiled
        self._phase: Phase | None = None
        self._open: list[str] = []           # the phases running now, outermost first
        self._nested = 0.0                   # seconds of the phases run inside others, for those to leave out

    @property
    def phase(self) -> str | None:
        """The phase running now, or the last one to run (a failure or a cancel is said to happen in it)."""
        return self._phase

    # ----- its life ---------------------------------------------------------------
    def run_to_end(self, title: str, work: Callable[[], Event], model_loaded: Callable[[], bool],
                   decoding: str | None = None) -> Event:
        """From JobStarted to exactly one terminal event, emitted and returned: ``work``'s result, or the cancel or
        failure that ended it; the RAM peak is sampled all along. ``model_loaded``: whether a model is loaded
        (a cancel says so); ``decoding``: the saved latents a decode-again job decodes (a failure names them)."""
        self.emit(JobStarted(self.id, title))
        try:
            with self.ram.running():
                result = work()
        except (Cancelled, GateCancelled):
            result = JobCancelled(self.id, len(self.step_seconds), self.steps, self._phase, model_loaded(),
                                  self.video, self.videos, tuple(p for done in self.written for p in done.paths))
        except PeerStopped as exc:
            result = JobFailed(self.id, f"{exc}.", "See the other GPU's failure.", self._phase, "peer")
        except Exception as exc:  # every failure reaches the page as an event
            result = self._failed(exc, decoding)
        self.emit(result)
        return result

    def _failed(self, exc: Exception, decoding: str | None) -> JobFailed:
        result = failure_event(self.id, exc, self._phase)
        if result.kind == "runtime":   # a fault, not a user's mistake: its traceback goes to the console
            traceback.print_exc()
        if decoding:
            return replace(result, latents=decoding)
        if self.latents:   # saved before it failed: they can be decoded again
            return replace(result, latents=self.latents, hint=" ".join(filter(None, (result.hint, DECODE_AGAIN_HINT))))
        return result

    @contextmanager
    def in_phase(self, name: Phase, timed: bool = True):
        """Phase ``name`` of this job: announced, offered to the fault hook, then timed with the device
        synchronised. The block may say what the phase did by setting the yielded note's ``detail``. A phase run
        inside another (the expert swap, inside the denoise) is left out of that one's seconds, which then goes
        on. ``timed`` False: the job is only said to be in ``name`` (a failure there is that phase's), with no
        events, no fault hook and no seconds (the fast decoder's load before the decode, the latents' save)."""
        name = Phase(name)   # a name that is no phase is a programming error, found at once
        self._phase = name
        if not timed:
            yield PhaseNote()
            self._back_to_outer()
            return
        self.emit(PhaseStarted(self.id, name))
        self._faults.before_phase(name)
        synchronize(self.device)
        start, nested, note = clock(), self._nested, PhaseNote()
        self._open.append(name)
        try:
            yield note
        finally:
            self._open.pop()
        synchronize(self.device)
        elapsed = clock() - start
        seconds = elapsed - (self._nested - nested)
        self._nested = nested + elapsed
        self._back_to_outer()
        self.timings[name] = round(self.timings.get(name, 0.0) + seconds, 4)
        self.emit(PhaseFinished(self.id, name, seconds, note.detail(seconds) if callable(note.detail) else note.detail))

    def _back_to_outer(self) -> None:
        if self._open:
            self._phase = self._open[-1]

    def timed(self, phase: str, work: Callable):
        """``work()`` as phase ``phase``, its result returned."""
        with self.in_phase(phase):
            return work()

    def info(self, text: str) -> None:
        self.emit(Info(self.id, text))

    def check_cancel(self) -> None:
        if self.should_cancel():
            raise Cancelled()

    # ----- what it records --------------------------------------------------------
    def use_device(self, device: str) -> None:
        self.device = device

    def step_finished(self, index: int, total: int, seconds: float) -> None:
        """Step ``index`` (0-based) of ``total`` took ``seconds``: recorded, and said with the time left."""
        self.step_seconds.append(round(seconds, 4))
        mean = sum(self.step_seconds) / len(self.step_seconds)
        self.emit(StepFinished(self.id, index + 1, total, seconds, mean * (total - index - 1), peak_vram_gb(),
                               self.ram.peak_gb))

    def next_video(self, finished: JobFinished, video: int, videos: int) -> None:
        """Video ``video`` of ``videos`` starts, ``finished`` (the one before it) kept: said, and recorded afresh."""
        self.written.append(finished)
        self.video, self.videos = video, videos
        self._record(None)
        self.emit(VideoStarted(self.id, video, videos))

    def ran_windows(self, windows) -> None:
        """The denoise runs in ``windows`` (engine/models/windows.py): recorded for the sidecar (the plan's reasons
        say it already, once)."""
        self.windows = windows.to_dict()

    def window_done(self, window: int, windows: int, total: int) -> None:
        """The transformer ran on window ``window`` of ``windows`` in the step under way (of ``total``)."""
        self.emit(WindowDone(self.id, len(self.step_seconds) + 1, total, window, windows))

    def post_progress(self, step, done: int, total: int) -> None:
        """A step after the video is written (engine/post/steps.py's PostStep, or the name of its phase: "join") has
        made ``done`` of ``total`` frames."""
        self.emit(PostProgress(self.id, getattr(step, "kind", step), done, total))

    def stepped_down(self, strategy: str, lower: str) -> None:
        """Out of memory in the current phase with ``strategy``: said, recorded, the steps so far forgotten."""
        self.info(f"Out of memory during {self._phase.replace('_', ' ')} with '{strategy}': "
                  f"freeing memory and stepping down to '{lower}'.")
        self.step_downs.append({"phase": self._phase, "from": strategy, "to": lower})
        self.step_seconds.clear()

    def planned(self, plan: Plan, predicted=None) -> None:
        """The plan announced (PlanReady, then each of its decisions), with the seconds it predicts (None until
        this machine has been measured)."""
        self.predicted = predicted
        self.emit(PlanReady(self.id, plan, None if predicted is None else dict(predicted.seconds),
                            None if predicted is None else predicted.total))
        for sentence in plan.decisions:
            self.info(f"Plan: {sentence}")

    def ran_experts(self, record: dict) -> None:
        """Wan2.2 A14B: the steps each expert runs and where they switch (the sidecar's "experts")."""
        self.experts = record

    def applied_loras(self, sentences, beside: bool = False) -> None:
        """The LoRAs' set-up said; ``beside``: they compute beside the weights (not merged, so uncompiled)."""
        self.loras_beside = beside
        for line in sentences:
            self.info(line)

    def used_step_cache(self, detail: str) -> None:
        self.cache = detail
        self.info(f"Step cache (approximate): {detail}")

    def decoding_fast(self, name: str) -> None:
        self.decoder = f"fast ({name})"
        self.info(f"Decoding with the fast decoder {name}: approximate, softer than the model's VAE; choose the VAE "
                  "decoder for the final video.")

    def decoding_light(self, name: str) -> None:
        self.decoder = f"vae_light ({name})"
        self.info(f"Decoding with the light VAE {name}: the model's VAE pruned to a quarter of its channels, "
                  "approximate; choose the VAE decoder for the exact video.")

    def decode_fell_back(self, how: str) -> None:
        self.decode_fallback = how
        self.info(f"The VAE decode worked {how}.")

    def kept_inputs(self, inputs: dict | None, problems=()) -> None:
        """The input images kept beside the output, and what kept any from being kept."""
        self.inputs = inputs
        for problem in problems:
            self.info(problem)

    def saved_latents(self, path: Path) -> None:
        self.latents = str(path)
        self.emit(LatentsSaved(self.id, self.latents))

    def removed_latents(self) -> None:
        Path(self.latents).unlink(missing_ok=True)
        self.latents = None
