"""A whole job's predicted time, and the ceiling a shared server puts on it (pure: no torch, no files).

One run's phases are predicted by engine/planning/timing.py; a job makes ``count`` videos one after the other on
the loaded model, each with its windows and its steps after the video. ``JobTime`` adds them up, and
``JobCeiling`` refuses a job whose whole time is past the operator's limit (serve --max-job-minutes), saying the
numbers and what would bring it under.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.planning.timing import PhaseTimes
from engine.words import plural

# What the refusal names of a video's time, by phase.
PHASE_WORDS = {"load": "loading", "denoise": "denoising", "vae_decode": "decoding", "interpolate": "smoother",
               "upscale": "larger", "join": "joining"}


def videos_seconds(first: PhaseTimes, loaded: PhaseTimes, count: int) -> float:
    """A job of ``count`` videos (Settings.count): the first as predicted (``first``), each of the others as on
    the loaded model (``loaded``) less the prompt's encoding, which is done once for them all."""
    return first.total + (count - 1) * (loaded.total - loaded.seconds.get("text_encode", 0.0))


def duration_words(seconds: float) -> str:
    """'45 s', '12 min', '2 h 5 min': a job's length as a person says it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


@dataclass(frozen=True)
class JobTime:
    """A job's predicted time: its first video (``first``, the model loaded or not as it is now), each other one
    on the loaded model (``loaded``), and how many videos it makes."""
    first: PhaseTimes
    loaded: PhaseTimes
    videos: int = 1

    @property
    def total(self) -> float:
        return videos_seconds(self.first, self.loaded, max(1, self.videos))

    def parts(self) -> str:
        """What the total is made of: '16 videos of about 80 s each (denoising 40 s in 3 windows, decoding 10 s,
        smoother 20 s)'."""
        times = self.first if self.videos == 1 else self.loaded
        windows = times.passes // max(1, times.prompts or 1)
        said = []
        for phase, words in PHASE_WORDS.items():
            if phase in times.seconds and (phase != "load" or self.videos == 1):
                part = f"{words} {duration_words(times.seconds[phase])}"
                said.append(part + (f" in {windows} windows" if phase == "denoise" and windows > 1 else ""))
        each = f"{plural(self.videos, 'video')} of about {duration_words(times.total)} each" if self.videos > 1 else \
            "one video"
        return f"{each} ({', '.join(said)})"


@dataclass(frozen=True)
class JobCeiling:
    """The most one job may take on this server, in seconds (None: no ceiling, as on one's own machine)."""
    seconds: float | None = None

    @classmethod
    def minutes(cls, minutes: float | None) -> "JobCeiling":
        return cls(minutes * 60.0 if minutes else None)

    def refusal(self, time: JobTime | None) -> str | None:
        """The sentence refusing a job predicted past the ceiling, with its numbers and what to change; None when
        it is under, when there is no ceiling, or when there is no prediction (a machine not measured yet)."""
        if self.seconds is None or time is None or time.total <= self.seconds:
            return None
        fewer = ["fewer videos (count)"] if time.videos > 1 else []
        fewer.append("fewer frames, steps or pixels")
        after = [words for phase, words in (("interpolate", "the smoother"), ("upscale", "the larger"))
                 if phase in time.first.seconds]
        tip = ", ".join(fewer) + (f", or leave out {' and '.join(after)}" if after else "")
        return (f"This job is predicted to take about {duration_words(time.total)}: {time.parts()}. One job may take "
                f"at most {duration_words(self.seconds)} on this server (its --max-job-minutes): ask for {tip}.")
