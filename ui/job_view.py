"""What the page shows about one job, folded from its events (pure; no gradio).

The generate handlers feed each event into ``JobView.apply`` and render the
view; tests use the same class to check what a user would see.
"""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field

from engine.events import (DownloadProgress, Event, Info, JobCancelled, JobFailed, JobFinished,
                           JobStarted, PhaseFinished, PhaseStarted, PlanReady, PreviewReady, StepFinished)

from .timing_chart import timing_chart_html

PHASE_LABELS = {
    "download": "Download", "load": "Load (disk to RAM)", "transfer": "Transfer (to device)",
    "text_encode": "Text encode", "image_encode": "Image encode", "denoise": "Denoise",
    "vae_decode": "VAE decode", "export": "Export",
}
TIMING_HEADERS = ["Phase", "Seconds", "Detail"]


@dataclass
class JobView:
    status: str = "Waiting for the engine..."
    phase: str | None = None
    phase_seconds: dict = field(default_factory=dict)
    running_phase: str | None = None
    step: int = 0
    total_steps: int = 0
    step_seconds: list = field(default_factory=list)
    eta: float | None = None
    notes: list = field(default_factory=list)
    download: str = ""
    plan: dict | None = None          # the engine's latest PlanReady (again after an out-of-memory step-down)
    peaks: tuple = (None, None)       # (VRAM, RAM) peaks so far, from the latest step
    preview: PreviewReady | None = None   # the latest live preview; dropped when the result arrives
    previews: int = 0
    result: JobFinished | None = None
    failure: JobFailed | None = None
    cancelled: JobCancelled | None = None

    def apply(self, event: Event) -> "JobView":
        if isinstance(event, JobStarted):
            self.status = "Started: " + event.description
        elif isinstance(event, Info):
            self.notes.append(event.message)
        elif isinstance(event, PlanReady):
            self.plan = event.plan
        elif isinstance(event, PhaseStarted):
            self.running_phase = event.phase
            self.status = PHASE_LABELS.get(event.phase, event.phase) + "..."
        elif isinstance(event, PhaseFinished):
            self.phase_seconds[event.phase] = event.seconds
            self.running_phase = None
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
            self.status = (f"Denoising: step {event.step}/{event.total}, {self.rate_text()}, "
                           f"about {event.eta_seconds:.0f} s left")
        elif isinstance(event, JobFinished):
            self.result = event
            self.preview = None
            self.status = f"Done in {sum(event.timings.values()):.1f} s. Seed used: {event.seed}."
            if event.note:
                self.status += " " + event.note
        elif isinstance(event, JobCancelled):
            self.cancelled = event
            self.status = f"Cancelled after step {event.at_step} of {event.total}. The model stays loaded."
        elif isinstance(event, JobFailed):
            self.failure = event
            self.status = f"Failed: {event.message} {event.hint}"
        return self

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

    def rate_text(self) -> str:
        """'0.52 s/step (1.92 steps/s)' from the mean of the steps so far."""
        if not self.step_seconds:
            return ""
        mean = sum(self.step_seconds) / len(self.step_seconds)
        rate = f"{1 / mean:.2f} steps/s" if mean > 0 else "instant"
        return f"{mean:.2f} s/step ({rate})"

    def chart_phases(self) -> list[tuple[str, str, float | None]]:
        """(phase, label, seconds; None while it runs) in run order, for the bar chart."""
        shown = [(p, PHASE_LABELS[p], self.phase_seconds[p]) for p in PHASE_LABELS if p in self.phase_seconds]
        if self.running_phase and self.running_phase not in self.phase_seconds:
            running = sum(self.step_seconds) if self.running_phase == "denoise" else None
            shown.append((self.running_phase, PHASE_LABELS.get(self.running_phase, self.running_phase), running))
        return shown

    def chart_html(self) -> str:
        return timing_chart_html(self.chart_phases(), self.step_seconds, self.total_steps)

    def preview_html(self) -> str:
        """The latest live preview as an inline animated image with its caption ('' when there is none)."""
        p = self.preview
        if p is None:
            return ""
        data = base64.b64encode(p.image).decode("ascii")
        source = "" if p.source == "known" else " (colours from a map derived from this model's VAE)"
        caption = (f"Live preview after step {p.step} of {p.total}: the model's current guess of the final "
                   f"video, {p.frames} latent frame{'s' if p.frames != 1 else ''}{source}.")
        return (f'<figure class="wan-preview" style="margin:0"><img alt="live preview" '
                f'src="data:{p.mime};base64,{data}" style="max-width:100%;image-rendering:auto"/>'
                f'<figcaption style="font-size:0.8em">{html.escape(caption)}</figcaption></figure>')

    def timing_rows(self) -> list[list]:
        rows = []
        for phase, label in PHASE_LABELS.items():
            if phase in self.phase_seconds:
                detail = ""
                if phase == "denoise" and self.step_seconds:
                    detail = f"{len(self.step_seconds)} steps, {self.rate_text()}"
                rows.append([label, round(self.phase_seconds[phase], 3), detail])
            elif phase == self.running_phase:
                detail = "running"
                if phase == "denoise" and self.total_steps:
                    detail = f"step {self.step}/{self.total_steps}, {self.rate_text()}, ETA {self.eta or 0:.0f} s"
                rows.append([label, None, detail])
        if self.result is not None:
            rows.append(["Total", round(sum(self.phase_seconds.values()), 3),
                         _memory_detail(self.result)])
        return rows

    def markdown(self) -> str:
        lines = [f"**{self.status}**"]
        if self.result is None and any(p is not None for p in self.peaks):
            vram, ram = self.peaks
            shown = ([f"VRAM {vram:.2f} GB"] if vram is not None else []) + ([f"RAM {ram:.2f} GB"] if ram else [])
            lines += ["", "Peak so far: " + ", ".join(shown)]
        if self.plan:
            lines += ["", plan_line(self.plan)]
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)


def plan_line(plan: dict) -> str:
    """'Plan: group_offload (predicted peak ...)' from a Plan.to_dict()."""
    ram = f"{plan.get('predicted_peak_ram_gb', 0):.2f} GB RAM"
    peak = ram if plan.get("device") == "cpu" else f"{plan.get('predicted_peak_vram_gb', 0):.2f} GB device, {ram}"
    fits = "" if plan.get("fits", True) else "; predicted not to fit"
    return f"Plan: {plan.get('strategy')} (predicted peak {peak}{fits})"


def _memory_detail(result: JobFinished) -> str:
    parts = []
    if result.peak_vram_gb is not None:
        parts.append(f"peak VRAM {result.peak_vram_gb:.2f} GB")
    if result.peak_ram_gb is not None:
        parts.append(f"peak RAM {result.peak_ram_gb:.2f} GB")
    return ", ".join(parts)
