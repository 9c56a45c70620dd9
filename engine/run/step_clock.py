"""Where a denoise's first step starts: at the transformers' first pass, not at the pipeline's call.

Before its first step a pipeline prepares the latents; image-to-video encodes its conditioning frames with the
VAE there (0.45 s for a Wan 14B 480p video on an H200). Counted in the first step, that made the mean step 10%
slower than the transformer's (four steps), and the remaining-time estimate with it; it stays in the denoise
phase, and the phase's detail says how long it took.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

from engine.device.runtime import synchronize

# Below this the preparation goes unmentioned.
SAID_FROM_S = 0.05


def transformers_of(pipe) -> list:
    """The pipeline's transformers: the one, or A14B's two experts."""
    return [model for model in (pipe.transformer, getattr(pipe, "transformer_2", None)) if model is not None]


class FirstPass:
    """The step clock of one denoise: ``mark[0]`` (where the step callback measures each step from) is set now,
    and again when a watched transformer first runs, after the device has finished what came before."""

    def __init__(self, device: str, clock: Callable[[], float], mark: list):
        self.device, self.clock, self.mark = device, clock, mark
        self.started = mark[0] = clock()
        self.seconds: float | None = None   # from the start to the first pass

    @contextmanager
    def watching(self, models: list):
        handles = [model.register_forward_pre_hook(self._first_pass) for model in models]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _first_pass(self, *_) -> None:
        if self.seconds is None:
            synchronize(self.device)
            self.mark[0] = self.clock()
            self.seconds = self.mark[0] - self.started

    def detail(self, _phase_seconds: float = 0.0) -> str:
        """The denoise phase's word on it ("" when it took next to nothing)."""
        if self.seconds is None or self.seconds < SAID_FROM_S:
            return ""
        return f"{self.seconds:.2f} s before the first step (the pipeline preparing the latents)"
