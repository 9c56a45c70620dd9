"""Long videos: the latent frames of a video longer than the model's window, as overlapping windows.

A Wan transformer is trained on clips of one length (81 frames for Wan2.1 and A14B, 121 for Wan2.2 TI2V-5B). A
longer video is denoised whole at every step: the transformer runs on windows of that length, each with its own
positions (the model's rotary table is never asked for more rows than one window has), and the windows'
predictions are blended where they overlap, each weighing less toward its edge, so neighbours hand over
gradually and the joins are not seams. The last window ends on the video's last frame, so every window has the
same shape (a compiled transformer compiles once).

Pure arithmetic: the planner counts one window's activations and the windows' passes from it, the run
(engine/run/windows.py) slices and blends by it, the sidecar records it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# The longest video the app makes (4k+1 frames): 257 latent frames of Wan2.1's VAE.
LONGEST_FRAMES = 1025
# Frames neighbouring windows share by default: 4 latent frames (16 video frames).
OVERLAP_FRAMES = 16
# The shortest window that leaves room for an overlap on both sides: 3 latent frames.
SHORTEST_WINDOW_FRAMES = 9


def latent_frames(frames: int, temporal: int = 4) -> int:
    """Latent frames of ``frames`` video frames (4k+1) under a VAE of this temporal factor."""
    return (frames - 1) // temporal + 1


def video_frames(latent: int, temporal: int = 4) -> int:
    """Video frames of ``latent`` latent frames."""
    return (latent - 1) * temporal + 1


@dataclass(frozen=True)
class Windows:
    """Overlapping windows over ``latent`` latent frames: each ``size`` long, starting at ``starts``."""
    latent: int
    size: int
    starts: tuple[int, ...]
    temporal: int = 4

    @property
    def count(self) -> int:
        return len(self.starts)

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        """(first, end) latent frames of each window, end exclusive."""
        return tuple((start, start + self.size) for start in self.starts)

    def shared(self, index: int) -> tuple[int, int]:
        """(latent frames window ``index`` shares with the one before it, with the one after it)."""
        start, end = self.spans[index]
        before = self.spans[index - 1][1] - start if index > 0 else 0
        after = end - self.spans[index + 1][0] if index + 1 < self.count else 0
        return before, after

    def weights(self, index: int) -> tuple[float, ...]:
        """Window ``index``'s weight at each of its latent frames: 1 inside, rising over the frames it shares with
        the window before it and falling over those it shares with the one after (never 0: every frame has a
        weight), 1 up to the video's own ends."""
        before, after = self.shared(index)
        weights = []
        for frame in range(self.size):
            rise = (frame + 1) / (before + 1) if frame < before else 1.0
            fall = (self.size - frame) / (after + 1) if frame >= self.size - after else 1.0
            weights.append(min(rise, fall))
        return tuple(weights)

    def frames_of(self, index: int) -> tuple[int, int]:
        """(first, last) video frames window ``index`` covers, 0-based and inclusive."""
        start, end = self.spans[index]
        first = 0 if start == 0 else (start - 1) * self.temporal + 1
        return first, (end - 1) * self.temporal

    @property
    def window_frames(self) -> int:
        return video_frames(self.size, self.temporal)

    def describe(self) -> str:
        """'7 windows of 81 frames, each sharing at least 16 with the next'."""
        least = min(self.shared(i)[1] for i in range(self.count - 1))
        return (f"{self.count} windows of {self.window_frames} frames, each sharing at least "
                f"{least * self.temporal} with the next")

    def to_dict(self) -> dict:
        """What the sidecar records: the windows' video frames and latent frames."""
        return {"count": self.count, "window_frames": self.window_frames,
                "latent_frames": self.latent, "latent_spans": [list(span) for span in self.spans],
                "frames": [list(self.frames_of(i)) for i in range(self.count)]}


def windows_for(frames: int, window: int, overlap: int, temporal: int = 4) -> Windows | None:
    """The windows over a video of ``frames`` frames, each ``window`` frames long, neighbours sharing at least
    ``overlap`` frames; None when the video fits in one window (it is denoised as it always was)."""
    total, size = latent_frames(frames, temporal), latent_frames(window, temporal)
    shared = max(1, math.ceil(overlap / temporal))
    if total <= size:
        return None
    # As few windows as share at least ``shared`` frames, spread evenly: the first starts on the first frame, the
    # last ends on the last one.
    count = math.ceil((total - shared) / (size - shared))
    starts = tuple(round(i * (total - size) / (count - 1)) for i in range(count))
    return Windows(total, size, starts, temporal)


def model_windows(spec, frames: int, window: int = 0, overlap: int = OVERLAP_FRAMES) -> Windows | None:
    """The windows a video of ``frames`` frames on the model of ``spec`` (engine/models/spec.py) is denoised in:
    ``window`` frames each, or the model's own (0); None for one window (or a still)."""
    if frames <= 1:
        return None
    return windows_for(frames, window or spec.window_frames, overlap, spec.vae_temporal)


def job_windows(spec, settings) -> Windows | None:
    """The windows of a job of ``settings`` (engine/settings/values.py)."""
    return model_windows(spec, settings.frames, settings.window, settings.overlap)


def window_count(spec, settings) -> int:
    """How many windows each pass of a job's denoise runs (1: the ordinary run)."""
    windows = job_windows(spec, settings)
    return 1 if windows is None else windows.count
