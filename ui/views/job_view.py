"""What the page shows about one job, folded from its events (pure; no gradio).

The generate handlers feed each event into ``JobView.apply`` and render the
view; tests use the same class to check what a user would see.
"""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field, replace

from engine.events import (
    INSIDE,
    PHASES,
    DownloadProgress,
    Ending,
    Event,
    Info,
    JobCancelled,
    JobEnding,
    JobFailed,
    JobFinished,
    JobStarted,
    PhaseFinished,
    PhaseStarted,
    PlanReady,
    PostProgress,
    PreviewReady,
    StepFinished,
    VideoStarted,
    WindowDone,
)
from engine.planning.explain import strategy_words
from engine.words import plural
from ui.views.text import plain
from ui.views.timing_chart import timing_chart_html

# How the page and the command line name each phase of events.PHASES (which gives their order).
PHASE_LABELS = {
    "engine_start": "Engine start (libraries)", "calibrate": "Measure this machine (once)", "download": "Download", "build_model": "Build self-test model",
    "load": "Load (disk to RAM)", "transfer": "Transfer (to device)", "lora": "LoRAs", "text_encode": "Text encode",
    "image_encode": "Image encode", "video_encode": "Video encode (the input)", "denoise": "Denoise", "expert_swap": "Expert swap (high to low noise)",
    "save_latents": "Saving latents", "vae_decode": "VAE decode", "export": "Export",
    "interpolate": "Smoother (frames between)", "upscale": "Larger (upscale)",
    "join": "Join (the new part after the video)",
}


# On a CPU-only machine nothing moves to a device: the engine's "transfer" only applies the plan.
CPU_PHASE_LABELS = {"transfer": "Apply the plan"}


def phase_label(phase: str, device: str | None = None) -> str:
    """A phase as the page and the command line name it (``device``: the plan's, "cpu" on a CPU-only machine)."""
    if device == "cpu" and phase in CPU_PHASE_LABELS:
        return CPU_PHASE_LABELS[phase]
    return PHASE_LABELS.get(phase, phase)


# The status's headline of a job that never started, by its JobFailed.kind (events.NOT_STARTED_KINDS) ...
NOT_STARTED_HEADLINES = {"input": "Not started: the settings need a change.",
                         "model": "Not started: the model cannot be used.", "queue": "Not started: the queue is full."}
# ... and the few words every visitor's system panel shows for it.
NOT_STARTED_WORDS = {"input": "not started (settings)", "model": "not started (model)",
                     "queue": "not started: the queue is full"}


def _during(ending: JobEnding) -> str:
    return f" during {phase_label(ending.phase, ending.device)}" if ending.phase else ""


# The phases after the denoise that a cancel stops part way (between frames): a cancel is said to stop in them.
STOPPED_INSIDE = ("vae_decode", "export", "interpolate", "upscale", "join")


def where_it_stopped(ending: JobEnding) -> str:
    """Where a cancelled job stopped: in a phase after the denoising, in the denoising after a step, after a phase,
    or before it started."""
    if ending.phase in STOPPED_INSIDE:
        steps = f", after all {ending.total} denoising steps" if ending.step and ending.step == ending.total else ""
        return f"during {phase_label(ending.phase, ending.device)}{steps}"
    if ending.step:
        return f"during the denoising, after step {ending.step} of {ending.total}"
    if ending.phase:
        return f"after {phase_label(ending.phase, ending.device)}"
    return "before it started"


def cancelled_kept(event: JobCancelled) -> str:
    """What a cancel left: nothing new, or the outputs a job of several wrote before it."""
    if event.videos > 1:
        done = len(event.written)
        return (f"it stopped in video {event.video} of {event.videos}; the {plural(done, 'output')} made before it "
                f"{'is' if done == 1 else 'are'} kept (in History), nothing else was saved." if done else
                f"it stopped in video {event.video} of {event.videos}; nothing new was saved, and the earlier result "
                "is kept.")
    return "nothing new was saved, and the earlier result is kept."


def failure_headline(ending: JobEnding) -> str:
    """The status's first line for a job that was refused or failed (its message and hint follow)."""
    if ending.kind is Ending.REFUSED:
        return NOT_STARTED_HEADLINES.get(ending.cause, "Not started.")
    return f"Failed{_during(ending)}."


def ending_words(ending: JobEnding) -> str:
    """How a job ended, in the few words every visitor's system panel shows: no prompt, no message text."""
    if ending.kind is Ending.DONE:
        if ending.seconds is not None:
            return f"done in {ending.seconds:.1f} s"
        return f"{ending.what} done" if ending.what else "done"
    if ending.kind is Ending.CANCELLED:
        return "cancelled " + where_it_stopped(ending)
    if ending.kind is Ending.REFUSED:
        return NOT_STARTED_WORDS.get(ending.cause, "not started")
    if ending.kind is Ending.WITHDRAWN:
        return "taken out of the queue"
    if ending.kind is Ending.STOPPED and ending.phase:   # it ran, and no ending came: its page went away
        return "stopped" + _during(ending) + " (its page was closed or reloaded)"
    if ending.kind is Ending.STOPPED:
        return "stopped"
    return "failed" + _during(ending)


def _seconds(value: float) -> str:
    """'0.4 s', '12 s', '3 min': tenths below ten seconds, so a short job never reads '0 s'."""
    if value < 10:
        return f"{value:.1f} s"
    return f"{value:.0f} s" if value < 90 else f"{value / 60:.0f} min"


def queue_status(place: int, estimate: float | None) -> str:
    """What a waiting job shows: its place and how long it may wait."""
    when = f"about {_seconds(estimate)} until it starts" if estimate is not None else \
        "no estimate until a job has finished"
    return f"Waiting in the queue: {plural(place, 'job')} ahead of yours, {when}."
TIMING_HEADERS = ["Phase", "Seconds", "Detail"]
# The phases a job of several videos goes through once, or nearly (the engine and the model are ready, the prompt's
# encoding kept): not counted again for each video after the first.
ONCE_PHASES = ("engine_start", "calibrate", "download", "build_model", "load", "transfer", "lora", "text_encode")


@dataclass
class JobView:
    status: str = "Waiting for the engine..."
    phase: str | None = None
    phase_seconds: dict = field(default_factory=dict)
    phase_details: dict = field(default_factory=dict)   # what a phase did, when it says ("14.3 GB read at ...")
    running_phase: str | None = None
    step: int = 0
    total_steps: int = 0
    step_seconds: list = field(default_factory=list)
    eta: float | None = None
    notes: list = field(default_factory=list)
    download: str = ""
    planned: PlanReady | None = None  # the engine's latest plan (again after an out-of-memory step-down)
    peaks: tuple = (None, None)       # (VRAM, RAM) peaks so far, from the latest step
    preview: PreviewReady | None = None   # the latest live preview; dropped when the result arrives
    previews: int = 0
    result: JobFinished | None = None
    failure: JobFailed | None = None
    cancelled: JobCancelled | None = None
    left_queue: bool = False          # taken out of the queue before it ran
    window: tuple | None = None       # (window, windows) of a long video's step under way
    video: tuple | None = None        # (video, videos) of a job of several, once the second starts
    videos: int = 1                   # how many videos the job makes (the request's count), known before it starts
    done_here: set = field(default_factory=set)       # the phases finished in the video under way
    video_began: dict = field(default_factory=dict)   # each phase's seconds over the videos before this one
    last_video: dict = field(default_factory=dict)    # the last finished video's seconds by phase
    planned_before: dict = field(default_factory=dict)   # a job of several: the earlier videos' predictions, summed

    def apply(self, event: Event) -> "JobView":
        self._apply(event)
        if self.video and not self.ended:   # a job of several: which one the status speaks of (said once)
            prefix = f"Video {self.video[0]} of {self.video[1]}: "
            if not self.status.startswith(prefix):
                self.status = prefix + self.status
        return self

    def _apply(self, event: Event) -> None:
        if isinstance(event, VideoStarted):
            self._next_video(event)
        elif isinstance(event, JobStarted):
            self.status = "Started: " + event.description + "."
        elif isinstance(event, Info):
            if event.message not in self.notes:   # the next video of a job says its plan's reasons again
                self.notes.append(event.message)
        elif isinstance(event, PlanReady):
            self.planned = event
        elif isinstance(event, PhaseStarted):
            self.running_phase = event.phase
            self.status = self.label(event.phase) + "..."
        elif isinstance(event, PhaseFinished):
            # A job of several: each phase's seconds over the videos so far (the table's total is the job's).
            self.phase_seconds[event.phase] = event.seconds + (self.phase_seconds.get(event.phase, 0.0)
                                                               if self.video else 0.0)
            if event.detail:
                self.phase_details[event.phase] = event.detail
            self.done_here.add(event.phase)
            self.running_phase = INSIDE.get(event.phase)   # a phase run inside another: that one goes on
        elif isinstance(event, DownloadProgress):
            total = f" of {event.total:,.0f}" if event.total else ""
            self.download = f"{event.done:,.0f}{total} {event.unit}"
            self.status = f"Downloading: {self.download}"
        elif isinstance(event, PreviewReady):
            self.preview = event
            self.previews += 1
        elif isinstance(event, StepFinished):
            self.step, self.total_steps = event.step, event.total
            self.step_seconds.append(event.seconds)
            self.peaks = (event.peak_vram_gb, event.peak_ram_gb)
            self.eta = event.eta_seconds
            windows = f" in {self.window[1]} windows" if self.window else ""
            self.status = (f"Denoising: step {event.step}/{event.total}{windows}, {self.rate_text()}, "
                           f"about {event.eta_seconds:.0f} s left")
        elif isinstance(event, WindowDone):
            self.window = (event.window, event.windows)
            rate = f", {self.rate_text()}" if self.step_seconds else ""
            self.status = f"Denoising: step {event.step}/{event.total}, window {event.window} of {event.windows}{rate}"
        elif isinstance(event, PostProgress):
            self.status = f"{PHASE_LABELS[event.step]}: frame {event.done} of {event.total}"
        elif isinstance(event, JobFinished):
            self.result = event
            self.preview = None
            self.status = f"Done in {sum(event.timings.values()):.1f} s. Seed used: {event.seed}."
            if len(event.paths) > 1:
                self.status = (f"Done in {sum(event.timings.values()):.1f} s: {len(event.paths)} outputs, seeds "
                               f"{', '.join(map(str, event.seeds))}; the first is shown, every one is in History.")
            if event.note:
                self.status += " " + event.note
        elif isinstance(event, JobCancelled):
            self.cancelled = event
            loaded = " The model stays loaded, so the next run starts without loading it." if event.model_loaded else ""
            self.status = f"Cancelled {where_it_stopped(self._ended(event))}: {cancelled_kept(event)}{loaded}"
        elif isinstance(event, JobFailed):
            self.failure = event
            self.status = failure_headline(self._ended(event))

    def _next_video(self, event: VideoStarted) -> None:
        """A job of several starts its next video: the last one's seconds by phase kept, the step count afresh."""
        self.last_video = {phase: seconds - self.video_began.get(phase, 0.0)
                           for phase, seconds in self.phase_seconds.items()}
        self.video_began, self.done_here = dict(self.phase_seconds), set()
        for phase, seconds in self.predicted().items():
            self.planned_before[phase] = self.planned_before.get(phase, 0.0) + seconds
        self.video = (event.video, event.videos)
        self.step, self.step_seconds, self.window, self.eta = 0, [], None, None
        self.status = "Starting..."

    def waiting(self, place: int, estimate: float | None) -> "JobView":
        self.status = queue_status(place, estimate)
        return self

    def withdrawn(self) -> "JobView":
        self.status = "Taken out of the queue: it did not run, and the earlier result is kept."
        self.left_queue = True
        return self

    @property
    def device(self) -> str | None:
        """The device of the job's plan, once known ("cpu" names some phases differently)."""
        return self.planned.plan.device if self.planned else None

    def label(self, phase: str) -> str:
        return phase_label(phase, self.device)

    def _ended(self, event: JobFinished | JobCancelled | JobFailed) -> JobEnding:
        return replace(event.ending, device=self.device)

    @property
    def ended(self) -> bool:
        return self.result is not None or self.cancelled is not None or self.failure is not None or self.left_queue

    @property
    def ending(self) -> JobEnding | None:
        """How the job ended, as data (the queue keeps it; the system panel words it with ``ending_words``);
        None while nothing has happened."""
        terminal = next((e for e in (self.result, self.cancelled, self.failure) if e is not None), None)
        if terminal is not None:
            return self._ended(terminal)
        if self.left_queue:
            return JobEnding(Ending.WITHDRAWN)
        if self.running_phase:
            return JobEnding(Ending.STOPPED, self.running_phase, device=self.device)
        return None

    @property
    def progress(self) -> float:
        """Overall fraction done: denoising steps dominate, decode and export finish it."""
        if self.result is not None:
            return 1.0
        if not self.total_steps:
            return 0.0
        done = 0.9 * self.step / self.total_steps
        if "vae_decode" in self.phase_seconds:
            done = 0.97
        return done

    def seconds_left(self) -> float | None:
        """Seconds the job still needs, all its videos counted (what the queue tells the jobs behind it): what is left
        of the video under way (its denoise at its steps' own pace, its phases still to come as planned), then each
        other video as the last one took, or as planned, less what a job of several does once (loading, the prompt's
        encoding); None when nothing says yet (the machine not measured, no step done)."""
        if self.ended:
            return 0.0
        current, videos = self.video if self.video else (1, 1)
        here = self._left_in_video(current)
        others = max(self.videos, videos) - current
        if others <= 0 or here is None:
            return here
        each = self._other_video_seconds()
        return None if each is None else here + others * each

    def _left_in_video(self, current: int) -> float | None:
        """Seconds left of the video under way (number ``current``): None without a plan's prediction or a step."""
        predicted = self.predicted()
        denoising = self.running_phase == "denoise" and bool(self.step_seconds) and self.eta is not None
        if not predicted:
            return self.eta if denoising else None
        to_come = [phase for phase in predicted if phase not in self.done_here and phase != self.running_phase
                   and not (current > 1 and phase in ONCE_PHASES)]
        left = sum(predicted[phase] for phase in to_come)
        if denoising:
            return left + self.eta
        return left + predicted.get(self.running_phase, 0.0) if self.running_phase not in self.done_here else left

    def _other_video_seconds(self) -> float | None:
        """Seconds of each video after the one under way: as the last finished one took, else as planned, less the
        phases a job of several does once."""
        seconds = self.last_video or self.predicted()
        return sum(s for phase, s in seconds.items() if phase not in ONCE_PHASES) if seconds else None

    def rate_text(self) -> str:
        """'0.52 s/step (1.92 steps/s)' from the mean of the steps so far."""
        if not self.step_seconds:
            return ""
        mean = sum(self.step_seconds) / len(self.step_seconds)
        rate = f"{1 / mean:.2f} steps/s" if mean > 0 else "instant"
        return f"{mean:.2f} s/step ({rate})"

    def chart_phases(self) -> list[tuple[str, str, float | None]]:
        """(phase, label, seconds; None while it runs) in run order, for the bar chart."""
        shown = [(p, self.label(p), self.phase_seconds[p]) for p in PHASES if p in self.phase_seconds]
        if self.running_phase and self.running_phase not in self.phase_seconds:
            running = sum(self.step_seconds) if self.running_phase == "denoise" else None
            shown.append((self.running_phase, self.label(self.running_phase), running))
        return shown

    def predicted(self) -> dict:
        """phase -> the seconds the plan predicted for it ({} when the machine is not measured yet)."""
        return dict(self.planned.predicted_seconds or {}) if self.planned else {}

    def chart_html(self) -> str:
        shown = self.chart_phases()
        seen = {phase for phase, _, _ in shown}
        upcoming = [] if self.ended else [(p, self.label(p)) for p in PHASES if p in self.predicted() and p not in seen]
        ended = {self.running_phase: self._running_detail(self.running_phase)} if self.ended and self.running_phase \
            else {}
        return timing_chart_html(shown, self.step_seconds, self.total_steps, self.predicted_so_far(), upcoming, ended)

    def predicted_so_far(self) -> dict:
        """phase -> the seconds predicted for it over the videos started so far (the chart's bars are the job's)."""
        now = self.predicted()
        return {phase: round(self.planned_before.get(phase, 0.0) + now.get(phase, 0.0), 3)
                for phase in {**self.planned_before, **now}}

    def preview_html(self) -> str:
        """The latest live preview as an inline animated image with its caption ('' when there is none)."""
        p = self.preview
        if p is None:
            return ""
        data = base64.b64encode(p.image).decode("ascii")
        source = {"known": "", "fast decoder": " (through the fast decoder)"}.get(
            p.source, " (colours from a map derived from this model's VAE)")
        caption = (f"Live preview after step {p.step} of {p.total}: the model's current guess of the final "
                   f"video, {p.frames} latent frame{'s' if p.frames != 1 else ''}{source}.")
        return (f'<figure class="wan-preview" style="margin:0"><img alt="live preview" '
                f'src="data:{p.mime};base64,{data}" style="max-width:100%;image-rendering:auto"/>'
                f'<figcaption style="font-size:0.8em">{html.escape(caption)}</figcaption></figure>')

    def timing_rows(self) -> list[list]:
        rows = []
        for phase in PHASES:
            label = self.label(phase)
            if phase in self.phase_seconds:
                detail = self.phase_details.get(phase, "")
                if phase == "denoise" and self.step_seconds:
                    detail = f"{len(self.step_seconds)} steps, {self.rate_text()}"
                    if self.video:
                        detail = f"video {self.video[0]} of {self.video[1]}: " + detail
                    if self.cancelled is not None and self.step < self.total_steps:
                        detail = f"cancelled after step {self.step}/{self.total_steps}, {self.rate_text()}"
                rows.append([label, round(self.phase_seconds[phase], 3), detail])
            elif phase == self.running_phase:
                rows.append([label, None, self._running_detail(phase)])
        if self.result is not None:
            rows.append(["Total", round(sum(self.phase_seconds.values()), 3),
                         _memory_detail(self.result)])
        return rows

    def _running_detail(self, phase: str) -> str:
        """The detail of the phase that was running when the last event came: still running, or how it ended."""
        steps = f"step {self.step}/{self.total_steps}" if phase == "denoise" and self.total_steps else ""
        if self.cancelled is not None:
            return f"cancelled at {steps}" if steps else "cancelled"
        if self.failure is not None:
            return f"failed at {steps}" if steps else "failed"
        if steps:
            return f"{steps}, {self.rate_text()}, ETA {self.eta or 0:.0f} s"
        return "running"

    def markdown(self) -> str:
        """The status as markdown. Its text may quote the user's own (a model name, a file name): it is shown
        as written, never as markdown or HTML."""
        if self.failure is not None:
            return self._failure_markdown()
        lines = [f"**{plain(self.status)}**"]
        if self.result is None and any(p is not None for p in self.peaks):
            vram, ram = self.peaks
            shown = ([f"VRAM {vram:.2f} GB"] if vram is not None else []) + ([f"RAM {ram:.2f} GB"] if ram else [])
            lines += ["", "Peak so far: " + ", ".join(shown)]
        return self._with_plan_and_notes(lines)

    def _failure_markdown(self) -> str:
        """The failure said once: a headline, then each problem (with what to change) or the message and hint."""
        failure = self.failure
        lines = [f"**{plain(self.status)}**"]
        if len(failure.problems) > 1:
            lines += ["", *(f"- {plain(problem)}" for problem in failure.problems)]
        else:
            lines += ["", plain(failure.text)]
        return self._with_plan_and_notes(lines)

    def _with_plan_and_notes(self, lines: list[str]) -> str:
        """The plan's line with its reasons under it ("Plan: ..." said once), then the other notes."""
        reasons = [note.removeprefix(PLAN_NOTE) for note in self.notes if note.startswith(PLAN_NOTE)]
        if self.planned:
            lines += ["", plan_line(self.planned)]
        lines += [f"- {plain(note)}" for note in reasons if self.planned]
        lines += [f"- {plain(note)}" for note in self.notes if not (self.planned and note.startswith(PLAN_NOTE))]
        return "\n".join(lines)


# How the engine's notes of the plan's reasons begin (engine/run/job.py Job.planned).
PLAN_NOTE = "Plan: "


def plan_line(planned: PlanReady) -> str:
    """'Plan: group_offload (predicted peak ...)' from the engine's PlanReady."""
    plan = planned.plan
    ram = f"{plan.predicted_peak_ram_gb:.2f} GB RAM"
    peak = ram if plan.device == "cpu" else f"{plan.predicted_peak_vram_gb:.2f} GB device, {ram}"
    fits = "" if plan.fits else "; predicted not to fit"
    name, _ = strategy_words(plan.strategy, plan.device)
    time = f"; about {_seconds(planned.predicted_total)} in all" if planned.predicted_total else ""
    return f"Plan: {name} (predicted peak {peak}{fits}{time})"


def _memory_detail(result: JobFinished) -> str:
    parts = []
    if result.peak_vram_gb is not None:
        parts.append(f"peak VRAM {result.peak_vram_gb:.2f} GB")
    if result.peak_ram_gb is not None:
        parts.append(f"peak RAM {result.peak_ram_gb:.2f} GB")
    return ", ".join(parts)
