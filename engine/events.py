"""Typed progress events streamed from the engine to the page and the CLI.

Every event is a small frozen dataclass that crosses the worker-process
boundary by pickling. Consumers dispatch on the class.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

class Named(str, Enum):
    """A str-Enum whose members are their strings everywhere: equal, hashed, in str() and format() alike, so
    events, sidecars, presets and the API read "denoise" or "group_offload" as before."""

    __str__ = str.__str__
    __format__ = str.__format__


# Phase names, in the order a run passes through them. "engine_start" is the time a job waited for a new
# engine process to load its libraries; "build_model" builds a self-test model the first time it is used; "lora"
# puts a job's LoRAs on the loaded model (reading the files it has not read yet); "expert_swap" (Wan2.2 A14B with
# one expert on the device at a time) puts the low-noise expert on the device at the boundary: it runs inside
# the denoise phase, whose seconds leave it out.
class Phase(Named):
    """A phase of a job. Each equals its string (events, sidecars and timings say "denoise" as before)."""
    ENGINE_START = "engine_start"
    CALIBRATE = "calibrate"
    DOWNLOAD = "download"
    BUILD_MODEL = "build_model"
    LOAD = "load"
    TRANSFER = "transfer"
    LORA = "lora"
    TEXT_ENCODE = "text_encode"
    IMAGE_ENCODE = "image_encode"
    VIDEO_ENCODE = "video_encode"   # video to video: the input video through the VAE's encoder
    DENOISE = "denoise"
    EXPERT_SWAP = "expert_swap"
    SAVE_LATENTS = "save_latents"   # never timed: named so that a failure while the latents are written is its own
    VAE_DECODE = "vae_decode"
    EXPORT = "export"
    INTERPOLATE = "interpolate"     # smoother: frames made between the video's (engine/post/)
    UPSCALE = "upscale"             # larger: the frames upscaled (engine/post/)
    JOIN = "join"                   # an extension: its new part colour-matched and joined after its video


PHASES = tuple(Phase)
# The phases that run inside another one: it goes on when they finish.
INSIDE = {Phase.EXPERT_SWAP: Phase.DENOISE}


class FailureKind(Named):
    """Why a job failed (JobFailed.kind). Each equals its string, so sidecars, logs and the API say "input" as
    before; str() and format() give the string too."""
    INPUT = "input"          # its settings
    MODEL = "model"          # its model reference or files
    QUEUE = "queue"          # the queue was full
    RUNTIME = "runtime"      # an error while it ran
    DISK = "disk"            # the disk filled up
    CRASH = "crash"          # the engine process died
    HUNG = "hung"            # the engine process stopped answering
    PEER = "peer"            # another GPU of a split job failed first
    VALUES = "values"        # a file or a phase gave NaN or infinite numbers


# The kinds of JobFailed that mean the job never started: its settings, its model, or a full queue.
NOT_STARTED_KINDS = (FailureKind.INPUT, FailureKind.MODEL, FailureKind.QUEUE)


class Ending(str, Enum):
    """How a job ended, as a kind every layer compares; the page and the command line choose the words."""
    DONE = "done"
    FAILED = "failed"
    REFUSED = "refused"        # never started (JobFailed of a kind in NOT_STARTED_KINDS)
    CANCELLED = "cancelled"
    WITHDRAWN = "withdrawn"    # taken out of the queue by its owner before it ran
    STOPPED = "stopped"        # no terminal event came (the page went away, the app's own error)


@dataclass(frozen=True)
class JobEnding:
    """How one job ended and where it stopped, without any user text: the job queue keeps the last one and
    every visitor's system panel words it (ui/views/job_view.py), so nothing is parsed back from words."""
    kind: Ending
    phase: str | None = None        # the phase it stopped in (or, cancelled between phases, after)
    step: int = 0                   # denoising steps done when it stopped
    total: int = 0                  # denoising steps asked for
    seconds: float | None = None    # a finished job's phases, summed
    cause: str | None = None        # a failed or refused job's JobFailed.kind
    device: str | None = None       # the plan's device: "cpu" names some phases differently
    what: str | None = None         # short engine work done in the queue's turn ("unload"), not a job


@dataclass(frozen=True)
class Event:
    job_id: str


@dataclass(frozen=True)
class JobStarted(Event):
    description: str


@dataclass(frozen=True)
class Info(Event):
    """A sentence the user should read (a plan decision, a warning, a note)."""
    message: str


@dataclass(frozen=True)
class PlanReady(Event):
    """The memory plan chosen for this run, before anything heavy runs, with the seconds it predicts for each
    phase and in all (None until this machine has been measured)."""
    plan: "Plan"                                # engine/planning/plan.py (a layer above: named, not imported)
    predicted_seconds: dict | None = None
    predicted_total: float | None = None


@dataclass(frozen=True)
class PhaseStarted(Event):
    phase: str


@dataclass(frozen=True)
class PhaseFinished(Event):
    phase: str
    seconds: float
    detail: str = ""     # what the phase did, in a few words ("12.3 GB read at 4.1 GB/s")


@dataclass(frozen=True)
class DownloadProgress(Event):
    done: float
    total: float | None
    unit: str          # what is counted: "B" for bytes, "it" for files


@dataclass(frozen=True)
class StepFinished(Event):
    step: int          # 1-based
    total: int
    seconds: float     # this step's wall time, device synchronised
    eta_seconds: float
    peak_vram_gb: float | None = None   # the run's peaks so far (None: no device memory to report)
    peak_ram_gb: float | None = None


@dataclass(frozen=True)
class WindowDone(Event):
    """Inside a step of a long video: the transformer has run on window ``window`` of ``windows``
    (engine/models/windows.py); with guidance the windows go round twice a step."""
    step: int          # 1-based: the step it is part of
    total: int
    window: int        # 1-based
    windows: int


@dataclass(frozen=True)
class PostProgress(Event):
    """A step after the video is written (``step``: "interpolate" or "upscale") has made ``done`` of ``total``
    frames."""
    step: str
    done: int
    total: int


@dataclass(frozen=True)
class PreviewReady(Event):
    """A live preview while denoising: the model's current guess of the clean video, as a small image."""
    step: int          # 1-based step after which it was made
    total: int
    image: bytes       # an animated image (a still for one latent frame), tens of KB
    mime: str          # "image/webp" (or "image/gif" where Pillow lacks WebP)
    width: int
    height: int
    frames: int        # latent frames shown, (frames - 1) // 4 + 1 of the video (identical neighbours may
                       # share one frame of the image)
    source: str        # colour map: "known" (Wan2.1 factors) or "derived" (fitted to this model's VAE)
    seconds: float = 0.0   # what making this preview cost, wall time


@dataclass(frozen=True)
class LatentsSaved(Event):
    """The denoised latents are safe on disk; a failed decode can start again from them."""
    path: str


@dataclass(frozen=True)
class VideoStarted(Event):
    """A job of several videos (the settings' ``count``) starts its video ``video`` of ``videos`` (1-based)."""
    video: int
    videos: int


@dataclass(frozen=True)
class JobFinished(Event):
    paths: tuple[str, ...]       # what it wrote: one video or still, or each of a job of several, in order
    sidecar: str                 # the (last) output's sidecar
    seed: int                    # the (last) output's seed
    timings: dict = field(default_factory=dict)   # seconds by phase (summed over a job of several)
    peak_vram_gb: float | None = None
    peak_ram_gb: float | None = None
    note: str = ""
    seeds: tuple[int, ...] = ()      # a job of several: each output's seed, in order (else empty)
    sidecars: tuple[str, ...] = ()   # and each one's sidecar

    @property
    def ending(self) -> JobEnding:
        """Done, in the time its phases took."""
        return JobEnding(Ending.DONE, seconds=sum(self.timings.values()))


@dataclass(frozen=True)
class JobCancelled(Event):
    at_step: int                 # denoising steps done (0: stopped before the denoising)
    total: int
    phase: str | None = None     # the phase it stopped in (or after)
    model_loaded: bool = False   # a model is loaded now, so the next run needs no load
    video: int = 1               # a job of several: the video it stopped in (1-based), of ``videos``
    videos: int = 1
    written: tuple[str, ...] = ()   # and the outputs of the videos before it, which are kept

    @property
    def ending(self) -> JobEnding:
        """Cancelled, in or after its phase, after its denoising steps."""
        return JobEnding(Ending.CANCELLED, self.phase, self.at_step, self.total)


@dataclass(frozen=True)
class JobFailed(Event):
    message: str            # what went wrong, as sentences
    hint: str               # what to do about it ("" when every problem already says so)
    phase: str | None = None
    kind: FailureKind = FailureKind.RUNTIME   # given as a FailureKind or its string; unknown ones are refused
    latents: str | None = None   # saved latents to decode again, when the denoising had finished
    problems: tuple[str, ...] = ()   # kind "input": one sentence per problem, each saying what to change

    def __post_init__(self):
        object.__setattr__(self, "kind", FailureKind(self.kind))

    @property
    def ending(self) -> JobEnding:
        """Refused before it started (settings, model, a full queue), or failed in its phase."""
        kind = Ending.REFUSED if self.kind in NOT_STARTED_KINDS else Ending.FAILED
        return JobEnding(kind, self.phase, cause=self.kind)

    @property
    def text(self) -> str:
        """The message and the hint in one line (for the command line and API callers)."""
        return " ".join(part for part in (self.message, self.hint) if part)


@dataclass(frozen=True)
class RankDone(Event):
    """A split job's rank other than 0 finished its share of the denoise; rank 0 decodes, writes and ends the job
    (its JobFinished is the job's outcome). A rank that fails or is cancelled ends with JobFailed or JobCancelled."""
    rank: int
    size: int
    steps: int                   # denoising steps done
    timings: dict = field(default_factory=dict)
    peak_vram_gb: float | None = None

    @property
    def ending(self) -> JobEnding:
        """Done with its share, in the time its phases took."""
        return JobEnding(Ending.DONE, "denoise", self.steps, self.steps, seconds=sum(self.timings.values()))


TERMINAL_EVENTS = (JobFinished, JobCancelled, JobFailed, RankDone)


def is_terminal(event: Event) -> bool:
    return isinstance(event, TERMINAL_EVENTS)
