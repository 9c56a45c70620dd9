"""When an engine that stopped answering is declared hung (pure: the client feeds it events and the clock).

Two signs, checked while a job runs:
- silence: the engine process answers no question on its status channel (a stopped or frozen process
  answers nothing) for ``SILENCE_LIMIT_S``, or ``CANCEL_SILENCE_S`` once the job's owner has cancelled;
- no progress: it answers, but the job's phase has gone on without an event for longer than that phase
  is allowed, from the plan's sizes and the steps seen so far (a long load or decode gets its time).
A hung engine is killed and started again by the client (engine/service/worker.py); the job fails saying so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import Event, JobCancelled, PhaseStarted, PlanReady, StepFinished

# The engine must answer its status channel within this many seconds of the first unanswered question.
SILENCE_LIMIT_S = 15.0
# ... and within this many once the owner has pressed Cancel (the step in progress may still finish later).
CANCEL_SILENCE_S = 5.0
# Ask the status channel after this long without an event.
QUIET_BEFORE_ASKING_S = 2.0
# How long a phase may go without any event while the engine answers, in seconds: a base, plus per GiB of
# weights for the phases that read or move them (a slow disk reads ~35 MB/s, so 30 s per GiB).
PHASE_BASE_S = {"download": 1800.0, "build_model": 600.0, "load": 300.0, "transfer": 300.0, "text_encode": 1800.0,
                "image_encode": 900.0, "denoise": 1800.0, "expert_swap": 300.0, "vae_decode": 3600.0, "export": 900.0}
PER_WEIGHT_GIB_S = {"load": 30.0, "transfer": 10.0, "expert_swap": 10.0}
OTHER_PHASE_S = 1800.0
# Between denoising steps: this many times the slowest step so far, and never less than the floor.
STEP_FACTOR = 20.0
STEP_FLOOR_S = 600.0


@dataclass(frozen=True)
class Silence:
    """How long an engine may stay silent: the defaults above (tests shorten them rather than wait them out)."""
    limit_s: float = SILENCE_LIMIT_S
    after_cancel_s: float = CANCEL_SILENCE_S
    ask_after_s: float = QUIET_BEFORE_ASKING_S


@dataclass
class Watchdog:
    """What the client knows of the running job: when it last heard of it and where it is."""
    started: float
    last_event: float = 0.0
    phase: str | None = None
    weights_gib: float = 0.0
    slowest_step: float = 0.0
    silent_since: float | None = None      # the first status question left unanswered, if any
    cancelled_at: float | None = None
    said: list = field(default_factory=list)
    silence: Silence = Silence()

    def __post_init__(self):
        self.last_event = self.started

    def saw(self, event: Event, now: float) -> None:
        """An event of the job arrived: the engine lives and the job moved."""
        self.last_event = now
        self.silent_since = None
        if isinstance(event, PhaseStarted):
            self.phase = event.phase
        elif isinstance(event, StepFinished):
            self.slowest_step = max(self.slowest_step, event.seconds)
        elif isinstance(event, PlanReady):
            load = next((phase for phase in event.plan.phases if phase.phase == "load"), None)
            self.weights_gib = max(load.peak_ram_gb, load.peak_vram_gb) if load else 0.0
        elif isinstance(event, JobCancelled):
            self.cancelled_at = None

    def cancel_asked(self, now: float) -> None:
        if self.cancelled_at is None:
            self.cancelled_at = now

    def should_ask(self, now: float) -> bool:
        """Whether to ask the engine's status channel now (it has been quiet a while)."""
        return now - self.last_event >= self.silence.ask_after_s

    def answered(self, alive: bool, now: float) -> None:
        """What the status question got: an answer, or nothing in time."""
        if alive:
            self.silent_since = None
        elif self.silent_since is None:
            self.silent_since = now

    def allowance(self) -> float:
        """Seconds the current phase may go without an event while the engine answers."""
        phase = self.phase or "load"
        allowed = PHASE_BASE_S.get(phase, OTHER_PHASE_S) + PER_WEIGHT_GIB_S.get(phase, 0.0) * self.weights_gib
        if phase == "denoise":
            allowed = max(STEP_FLOOR_S, STEP_FACTOR * self.slowest_step)
        elif phase == "expert_swap":   # inside the denoise: its steps go on after it, under its name
            allowed = max(allowed, STEP_FLOOR_S, STEP_FACTOR * self.slowest_step)
        return allowed

    def hung(self, now: float) -> str | None:
        """Why the engine is hung now, as the end of a sentence; None while it is not."""
        if self.silent_since is not None:
            limit = self.silence.after_cancel_s if self.cancelled_at is not None else self.silence.limit_s
            if now - self.silent_since >= limit:
                return f"it answered nothing for {now - self.silent_since:.0f} s"
        quiet = now - self.last_event
        if quiet >= self.allowance():
            return f"it answered but made no progress for {quiet:.0f} s"
        return None
