"""A prediction of the time model (engine/planning/timing.py) corrected by the runs this machine really made for
the same model and plan: each phase takes the nearest run's measured seconds, scaled to the new request."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from engine.planning.timing import PhaseTimes

# How a pass's time grows with its tokens when only one run is known: between 1 (linear layers) and 2
# (attention). Measured on an H200 from 8k to 33k tokens: 1.28 (14B, 5B) to 1.38 (1.3B), and 1.65 for 1.3B
# from 33k to 76k tokens (docs/data/timing-h200.json).
STEP_TOKEN_EXPONENT = 1.4


@dataclass(frozen=True)
class MeasuredRun:
    """A finished run of the same model and plan family, as the engine stores it."""
    seconds: dict                      # phase -> measured seconds
    tokens: int
    steps: int
    passes: int                        # per step
    pixels: int                        # width x height x frames
    step_seconds: float | None = None  # the mean step; None: the denoise phase over the steps
    loaded: bool = False               # the pipeline was already loaded (no load, no first-use costs)

    @property
    def step(self) -> float | None:
        if self.step_seconds:
            return self.step_seconds
        return self.seconds["denoise"] / self.steps if self.steps and "denoise" in self.seconds else None


def token_exponent(runs: Sequence[MeasuredRun]) -> float:
    """How a pass's seconds grow with tokens: fitted (log-log) to runs at two or more lengths, else the
    default; kept between 1 and 2, the linear layers' and attention's own exponents."""
    points = [(math.log(r.tokens), math.log(r.step / r.passes)) for r in runs if r.step and r.tokens and r.passes]
    xs = {x for x, _ in points}
    if len(xs) < 2:
        return STEP_TOKEN_EXPONENT
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    slope = (sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points))
    return min(max(slope, 1.0), 2.0)


def learn(prediction: PhaseTimes, runs: Sequence[MeasuredRun]) -> PhaseTimes:
    """``prediction`` corrected by what this machine really did for the same model and plan: each phase
    takes the nearest run's measured seconds, scaled to the new request (a step by passes and
    (tokens'/tokens)^a, the decode and export by pixels, the text encode by prompts). Phases no run
    measured (or measured in another state: first run after a load or not) keep the model's figure."""
    if not runs:
        return prediction
    a = token_exponent(runs)

    def distance(run: MeasuredRun) -> float:
        return abs(math.log(run.tokens / prediction.tokens)) + abs(math.log(run.pixels / prediction.pixels))

    # The nearest in size; among equals, one in the same state (first run after a load or not: the first
    # pays one-off costs in its decode), then the newest.
    run = min((r for r in reversed(runs) if r.tokens and r.pixels),
              key=lambda r: (round(distance(r), 6), r.loaded != prediction.loaded), default=None)
    if run is None:
        return prediction
    seconds, how = dict(prediction.seconds), dict(prediction.how)
    said = f"learned from a run of {run.tokens} tokens, {run.steps} steps"
    step = prediction.step_seconds
    if run.step and "denoise" in seconds:
        step = run.step / run.passes * (prediction.tokens / run.tokens) ** a * prediction.passes
        rest = max(run.seconds.get("denoise", 0.0) - run.step * run.steps, 0.0) * prediction.pixels / run.pixels
        seconds["denoise"] = step * prediction.steps + rest
        how["denoise"] = f"{said}: {run.step:.3f} s a step x (tokens ratio)^{a:.2f} x passes ratio"
    for phase in ("vae_decode", "export"):
        # The first decode after a load pays one-off costs (1.80 s later, 3.01 s first on an H200): a decode is
        # learned only from a run in the same state.
        if phase in run.seconds and phase in seconds and (phase != "vae_decode" or run.loaded == prediction.loaded):
            seconds[phase] = run.seconds[phase] * prediction.pixels / run.pixels
            how[phase] = f"{said}: {run.seconds[phase]:.2f} s x pixels ratio"
    if "text_encode" in run.seconds and run.loaded == prediction.loaded:
        seconds["text_encode"] = run.seconds["text_encode"] * prediction.passes / run.passes
        how["text_encode"] = f"{said}: {run.seconds['text_encode']:.2f} s x prompts ratio"
    for phase in ("load", "transfer", "image_encode"):
        if phase in run.seconds and phase in seconds:
            seconds[phase] = run.seconds[phase]
            how[phase] = f"{said}: as measured"
    seconds = {k: round(v, 3) for k, v in seconds.items()}
    return replace(prediction, seconds=seconds, how=how, step_seconds=round(step, 4),
                   total=round(sum(seconds.values()), 2))
