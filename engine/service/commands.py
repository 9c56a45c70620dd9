"""What the app says to its engine process and what the process answers outside a job's events: typed values,
as the events are (engine/events.py), pickled across the pipes.

The job pipe carries one command at a time (``RunJob``, ``DecodeSaved``, ``PostOutput``, ``Unload``, ``Stop``) and the job's
events back; the process says ``Ready`` once its libraries are loaded and ``Unloaded`` after an unload. The
status channel, answered by a thread of its own during a job too, takes an ``Ask`` and answers it with a typed
value (the hardware as a HardwareProfile, what the engine holds, the files it has loaded, ``PONG``).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from engine.settings.request import GenerationRequest


@dataclass(frozen=True)
class RunJob:
    request: GenerationRequest
    job_id: str
    timings: dict                 # the phases timed before the engine had the job (its start)
    group: object = None          # this engine's rank in a job split across several (engine/run/parallel.py)


@dataclass(frozen=True)
class DecodeSaved:
    path: str                     # saved latents
    job_id: str
    tiled: bool
    on_cpu: bool
    timings: dict


@dataclass(frozen=True)
class PostOutput:
    path: str                     # an output's media file
    step: str                     # "interpolate" (smoother) or "upscale" (larger)
    factor: int
    job_id: str
    timings: dict


@dataclass(frozen=True)
class Unload:
    pass


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Ready:
    seconds: float                # how long the process took to load its libraries


@dataclass(frozen=True)
class Unloaded:
    pass


class Ask(str, Enum):
    """A question on the status channel."""
    PING = "ping"                 # is the process alive? (answered PONG)
    HARDWARE = "hardware"         # its HardwareProfile
    LOADED = "loaded"             # the files the loaded pipeline holds
    MEMORY = "memory"             # what the engine holds now


PONG = "pong"
