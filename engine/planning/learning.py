"""A prediction of the time model (engine/planning/timing.py) corrected by the runs this machine really made for
the same model and plan: each phase takes the nearest run's measured seconds, scaled to the new request. The steps
after the video (smoother, larger) do not depend on the model: they learn from any run that used the same method."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Sequence

from engine.planning.post_time import method_fixed
from engine.planning.timing import PhaseTimes

# How a pass's time grows with its tokens when only one run is known: between 1 (linear layers) and 2
# (attention). Measured on an H200 from 8k to 33k tokens: 1.28 (14B, 5B) to 1.38 (1.3B), and 1.65 for 1.3B
# from 33k to 76k tokens (docs/data/timing-h200.json).
STEP_TOKEN_EXPONENT = 1.4
# From one run, a step is taken to be at most this many times the time model's work (the rest a fixed cost a
# pass): the model counts this machine's calibrated rates, which real kernels reach within a few times.
MOST_SLOWER = 3.0
# A decode measured in the other state (right after a load, or not) stands in for the model's figure only when
# they differ by more than this factor: within it, the difference is the first decode's one-off costs.
OTHER_STATE_OFF = 2.0


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
    model_step: float | None = None    # the time model's step for this run (all its passes), before any learning
    prompts: int = 0                   # prompts encoded; 0: as many as ``passes`` (a run from before windows)
    # The steps after the video it ran, as the time model counts them: phase -> PostWork.to_dict()
    post: dict = field(default_factory=dict)
    model_seconds: dict = field(default_factory=dict)   # the time model's own seconds of each phase for this run

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MeasuredRun":
        return cls(**{k: v for k, v in data.items() if k in _RUN_FIELDS})

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
    (tokens'/tokens)^a, a video-to-video input's encode, the decode, the export and the join by the work, the text
    encode by prompts). Phases no run measured (or measured in another state: first run after a load or not) keep
    the model's figure."""
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
        fitted = _affine_step(runs, run, prediction)
        if fitted is not None:
            step, words = fitted
        else:   # runs from before the model's own step was kept: scaled by tokens alone
            step = run.step / run.passes * (prediction.tokens / run.tokens) ** a * prediction.passes
            words = f"{run.step:.3f} s a step x (tokens ratio)^{a:.2f} x passes ratio"
        rest = max(run.seconds.get("denoise", 0.0) - run.step * run.steps, 0.0) * prediction.pixels / run.pixels
        # The runs kept their steady steps; a compile this run still has to make is the model's figure.
        seconds["denoise"] = step * prediction.steps + rest + prediction.compile_seconds
        compiling = f", +{prediction.compile_seconds:.0f} s compiling at this size" if prediction.compile_seconds else ""
        how["denoise"] = f"{said}: {words}{compiling}"
    for phase in ("video_encode", "vae_decode", "export", "join"):
        # The first decode after a load pays one-off costs (1.80 s later, 3.01 s first on an H200): a decode is
        # learned from the nearest run in the same state; from one in the other state only when the model's
        # figure is off from it by more than OTHER_STATE_OFF times (a model it has no measured rates of: the
        # self-test VAE's decode was predicted at 0.04 s and took 0.8).
        usable = [r for r in runs if phase in r.seconds and r.tokens and r.pixels]
        same = [r for r in usable if phase != "vae_decode" or r.loaded == prediction.loaded]
        source = min(reversed(same or usable), key=lambda r: round(distance(r), 6), default=None)
        if source is not None and phase in seconds and not same:
            scaled = source.seconds[phase] * prediction.pixels / source.pixels
            if max(scaled, seconds[phase]) <= OTHER_STATE_OFF * max(min(scaled, seconds[phase]), 1e-6):
                source = None
        if source is not None and phase in seconds:
            seconds[phase], words = _scaled(phase, source, prediction)
            how[phase] = f"learned from a run of {source.tokens} tokens, {source.steps} steps: {words}"
    if "text_encode" in run.seconds and run.loaded == prediction.loaded:
        seconds["text_encode"] = run.seconds["text_encode"] * (prediction.prompts or prediction.passes) / \
            (run.prompts or run.passes)
        how["text_encode"] = f"{said}: {run.seconds['text_encode']:.2f} s x prompts ratio"
    for phase in ("load", "transfer", "image_encode"):
        if phase in run.seconds and phase in seconds:
            seconds[phase] = run.seconds[phase]
            how[phase] = f"{said}: as measured"
    seconds = {k: round(v, 3) for k, v in seconds.items()}
    return replace(prediction, seconds=seconds, how=how, step_seconds=round(step, 4),
                   total=round(sum(seconds.values()), 2))


def _scaled(phase: str, run: MeasuredRun, prediction: PhaseTimes) -> tuple[float, str]:
    """(seconds, how) of ``phase`` from ``run``'s measured seconds: as measured = k x the model's + c, k from this run
    (at most MOST_SLOWER, c the rest: a cost that does not grow with the work, such as the first decode's one-off
    costs, is not scaled up as work); by the pixels when the run did not keep the model's figure."""
    measured, then, now = run.seconds[phase], run.model_seconds.get(phase), prediction.model_seconds.get(phase)
    if not then or now is None:
        return measured * prediction.pixels / run.pixels, f"{measured:.2f} s x pixels ratio"
    k = min(measured / then, MOST_SLOWER)
    c = measured - k * then
    return k * now + c, f"{measured:.2f} s as {k:.2f} x the model's {then:.3f} s + {c:.3f} s, at the model's {now:.3f} s"


def learn_post(prediction: PhaseTimes, runs: Sequence[MeasuredRun]) -> PhaseTimes:
    """``prediction``'s steps after the video (smoother, larger) from the runs that ran the same method (of any model
    and plan: a step reads the written file alone): the one nearest in work, its seconds beyond the method's fixed
    cost scaled by the work. A step no run made by that method keeps the model's figure."""
    seconds, how = dict(prediction.seconds), dict(prediction.how)
    for phase, counted in prediction.post.items():
        source = _nearest_post(runs, phase, counted) if counted["megapixels"] > 0 else None
        if source is None or phase not in seconds:
            continue
        measured, then = source.seconds[phase], source.post[phase]["megapixels"]
        fixed = min(method_fixed(counted["method"]), measured)
        seconds[phase] = fixed + (measured - fixed) * counted["megapixels"] / then
        how[phase] = (f"learned from a run of the same method ({counted['method']}): {measured:.2f} s for "
                      f"{then:.1f} MP, scaled to {counted['megapixels']:.1f} MP beyond its {fixed:.2f} s fixed")
    if seconds == prediction.seconds:
        return prediction
    seconds = {k: round(v, 3) for k, v in seconds.items()}
    return replace(prediction, seconds=seconds, how=how, total=round(sum(seconds.values()), 2))


def _nearest_post(runs: Sequence[MeasuredRun], phase: str, counted: dict) -> MeasuredRun | None:
    """The run whose ``phase`` ran by ``counted``'s method with the work nearest to it (the newest among equals)."""
    usable = [r for r in runs if phase in r.seconds and isinstance(r.post.get(phase), dict)
              and r.post[phase].get("method") == counted["method"] and r.post[phase].get("megapixels", 0) > 0]
    return min(reversed(usable), default=None,
               key=lambda r: round(abs(math.log(r.post[phase]["megapixels"] / counted["megapixels"])), 6))


def _affine_step(runs: Sequence[MeasuredRun], nearest: MeasuredRun, prediction: PhaseTimes):
    """(the step's seconds, how) as measured = k x the model's + c, a pass each: a cost that grows with the work as
    the model's does (k: how this machine's kernels compare with its calibrated rates) and one that does not (c:
    launching the layers' kernels, the Python around them). Fitted to the runs at two or more model steps; from
    one run, k is at most MOST_SLOWER and c takes the rest, so a small run's overhead is not scaled up as work
    (a tiny model's 256x256 run was once predicted at 100 times what it took). None without the model's steps."""
    model_now = prediction.model_step_seconds
    points = [(r.model_step / r.passes, r.step / r.passes) for r in runs if r.model_step and r.step and r.passes]
    if not model_now or not points or not nearest.model_step:
        return None
    if len({round(m, 9) for m, _ in points}) >= 2:
        k, c = _fit(points)
        how = f"fitted to {len(points)} runs: {k:.2f} x the model's step + {c:.3f} s a pass"
    else:
        m, measured = nearest.model_step / nearest.passes, nearest.step / nearest.passes
        k = min(measured / m, MOST_SLOWER)
        c = measured - k * m
        how = f"{k:.2f} x the model's step + {c:.3f} s a pass, from one run of {measured:.3f} s a pass"
    return (k * model_now / prediction.passes + c) * prediction.passes, how


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares of measured = k x model + c with k, c >= 0."""
    n = len(points)
    mx = sum(m for m, _ in points) / n
    my = sum(y for _, y in points) / n
    spread = sum((m - mx) ** 2 for m, _ in points)
    k = sum((m - mx) * (y - my) for m, y in points) / spread if spread else 0.0
    c = my - k * mx
    if k < 0:
        return 0.0, my
    if c < 0:
        return sum(m * y for m, y in points) / sum(m * m for m, _ in points), 0.0
    return k, c


_RUN_FIELDS = {f.name for f in fields(MeasuredRun)}
