"""The work done at the end of every denoising step, one small callback per job, composed in order.

diffusers calls ``callback_on_step_end(pipeline, step_index, timestep, tensors)`` after each step; WanPipeline and
WanImageToVideoPipeline (the two the engine runs) take a ``MultiPipelineCallbacks``, which calls its callbacks in
turn, each handing the tensors on, and asks the pipeline for the tensors they name. ``step_callbacks`` composes,
in this order: the step's time (StepTimes), the cancel (CancelAtStep, which interrupts the pipeline), the live
preview (PreviewAfterStep) and the A14B expert swap (ExpertSwapAt), both skipped once the pipeline is
interrupted, and last the step clock, restarted (StepClock): a preview's or a swap's cost is in its own event
and in the denoise phase, not in the step times.

The callbacks meet diffusers' ``PipelineCallback`` interface (``tensor_inputs`` and the call) without deriving
from it: this module is imported before any job (torch and diffusers load only when a job needs them, see
tests/test_architecture.py), and PipelineCallback's one addition, its cutoff config, is of no use here.
"""
from __future__ import annotations

from typing import Callable

from engine.device.runtime import clock, synchronize
from engine.run.job import Job
from engine.run.preview import LivePreview


class StepClock:
    """Where the next step is measured from: ``mark[0]``, set at the denoise's start, moved to the transformers'
    first pass by step_clock.FirstPass, and restarted (this callback, the last one) at the end of every step."""
    tensor_inputs: list[str] = []

    def __init__(self, device: str):
        self.device = device
        self.mark = [0.0]

    def lap(self) -> float:
        """Seconds since the mark, the device's work finished."""
        synchronize(self.device)
        return clock() - self.mark[0]

    def __call__(self, pipeline, step: int, timestep, tensors: dict) -> dict:
        self.mark[0] = clock()
        return tensors


class StepTimes:
    """Each step's seconds recorded and said (StepFinished, with the time left). ``settle`` runs between the
    measure and the news: the previous step's preview goes out before this step's."""
    tensor_inputs: list[str] = []

    def __init__(self, job: Job, total: int, step_clock: StepClock, settle: Callable[[], None]):
        self.job, self.total, self.clock, self.settle = job, total, step_clock, settle

    def __call__(self, pipeline, step: int, timestep, tensors: dict) -> dict:
        seconds = self.clock.lap()
        self.settle()
        self.job.step_finished(step, self.total, seconds)
        return tensors


class CancelAtStep:
    """The pipeline interrupted (no further step runs) when ``stops()`` says so."""
    tensor_inputs: list[str] = []

    def __init__(self, stops: Callable[[], bool]):
        self.stops = stops

    def __call__(self, pipeline, step: int, timestep, tensors: dict) -> dict:
        if self.stops():
            pipeline._interrupt = True   # diffusers' cancel flag, checked before every step
        return tensors


class PreviewAfterStep:
    """The step's live preview, when one is due (LivePreview decides and encodes it beside the next step)."""
    tensor_inputs = ["latents"]

    def __init__(self, previews: LivePreview, emit: Callable):
        self.previews, self.emit = previews, emit

    def __call__(self, pipeline, step: int, timestep, tensors: dict) -> dict:
        if not pipeline.interrupt:
            self.previews.emit_after_step(pipeline.scheduler, step, tensors["latents"], self.emit)
        return tensors


class ExpertSwapAt:
    """Before the first low-noise step (``switch``, its index), ``bring()`` puts the low-noise expert on the
    device (nothing when no step is the low-noise expert's)."""
    tensor_inputs: list[str] = []

    def __init__(self, switch: int | None, bring: Callable[[], None]):
        self.switch, self.bring = switch, bring

    def __call__(self, pipeline, step: int, timestep, tensors: dict) -> dict:
        if not pipeline.interrupt and step + 1 == self.switch:
            self.bring()
        return tensors


def step_callbacks(job: Job, total: int, step_clock: StepClock, previews: LivePreview, stops: Callable[[], bool],
                   switch: int | None, bring_low_noise: Callable[[], None]):
    """The step-end callbacks of one denoise, composed in their order (the module's docstring says why)."""
    from diffusers.callbacks import MultiPipelineCallbacks

    return MultiPipelineCallbacks([StepTimes(job, total, step_clock, previews.settle), CancelAtStep(stops),
                                   PreviewAfterStep(previews, job.emit), ExpertSwapAt(switch, bring_low_noise),
                                   step_clock])
