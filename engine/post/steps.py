"""The steps after a video is written, as data: smoother (frame interpolation) and larger (upscaling).

A step is asked for as a factor (Settings.interpolate, Settings.upscale: 1 is off, 2 or 4), run on the written file
(engine/post/apply.py) and recorded in the sidecar as a ``PostRecord``: what ran, how, what it made and how long it
took. Interpolation runs first: it works on the smaller frames, and the upscaler then sees the frames it made.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.events import Phase
from engine.words import quoted

FACTORS = (1, 2, 4)
# What a step may make: H.264 (the app's video codec) takes frames of at most 8192 pixels a side, and a player
# shows at most a few hundred frames a second.
MAX_POST_SIDE = 8192
MAX_POST_FPS = 240
# The folders under the models folder that hold a user's own files for each step.
INTERPOLATORS_FOLDER = "interpolators"
UPSCALERS_FOLDER = "upscalers"


@dataclass(frozen=True)
class PostStep:
    """One step after the video is written: ``kind`` "interpolate" or "upscale", by ``factor`` (2 or 4)."""
    kind: str
    factor: int

    @property
    def phase(self) -> Phase:
        return Phase.INTERPOLATE if self.kind == "interpolate" else Phase.UPSCALE

    @property
    def title(self) -> str:
        """As the page names it: "Smoother (2x frames)", "Larger (4x size)"."""
        return (f"Smoother ({self.factor}x frames)" if self.kind == "interpolate"
                else f"Larger ({self.factor}x size)")

    def shape_after(self, frames: int, width: int, height: int, fps: int | None) -> tuple[int, int, int, int | None]:
        """(frames, width, height, fps) of what this step makes from a video (a still: ``frames`` 1, no fps)."""
        if self.kind == "interpolate":
            return (frames - 1) * self.factor + 1, width, height, fps * self.factor if fps else fps
        return frames, width * self.factor, height * self.factor, fps


def post_steps(interpolate: int = 1, upscale: int = 1) -> tuple[PostStep, ...]:
    """The steps asked for, in the order they run: interpolation, then upscaling (a factor of 1 is none)."""
    steps = [PostStep("interpolate", interpolate)] if interpolate > 1 else []
    return tuple(steps + ([PostStep("upscale", upscale)] if upscale > 1 else []))


def post_problems(interpolate, upscale, mode: str, frames: int, width: int, height: int, fps: int | None) -> list[str]:
    """What is wrong with asking for these steps on such an output, one sentence each (none: they can run).
    ``interpolate`` and ``upscale`` are checked to be 1, 2 or 4 first; the rest only then."""
    problems = [f"{name} {quoted(value)} is not a factor this app makes: use 1 (off), 2 or 4"
                for name, value in (("interpolate", interpolate), ("upscale", upscale))
                if isinstance(value, bool) or value not in FACTORS]
    if problems:
        return problems
    if interpolate > 1 and (mode == "t2i" or frames < 2):
        problems.append("a still has no frames to put others between: leave interpolate at 1 (off) for an image")
    if interpolate > 1 and fps and fps * interpolate > MAX_POST_FPS:
        problems.append(f"{fps} fps made {interpolate}x smoother is {fps * interpolate} fps, more than a player shows "
                        f"(at most {MAX_POST_FPS}): use a lower factor or a lower fps")
    if upscale > 1 and max(width, height) * upscale > MAX_POST_SIDE:
        problems.append(f"{width}x{height} made {upscale}x larger is {width * upscale}x{height * upscale}, more than "
                        f"a video holds ({MAX_POST_SIDE} pixels a side at most): use a lower factor or a smaller size")
    return problems


@dataclass(frozen=True)
class PostRecord:
    """One step as it ran, for the sidecar's "post" list: what it made and how long it took."""
    step: str            # "interpolate" or "upscale"
    factor: int
    method: str          # what did it: "RIFE 4.7 (rife47.pth)", "ffmpeg minterpolate", "Lanczos", an upscaler file
    seconds: float
    frames: int          # what the step made
    width: int
    height: int
    fps: int | None
    source: str = ""     # the file it read (a step on an earlier output: that output's name)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "PostRecord":
        """A record as a sidecar holds it; TypeError or KeyError when it is not one."""
        fps = data.get("fps")
        return cls(str(data["step"]), int(data["factor"]), str(data["method"]), float(data["seconds"]),
                   int(data["frames"]), int(data["width"]), int(data["height"]), None if fps is None else int(fps),
                   str(data.get("source", "")))
