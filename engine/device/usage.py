"""What the engine process holds right now: device memory, its own RAM, the loaded model.

Read by a small thread in the engine process, so the page can show it while a job runs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.device.hardware import GIB


@dataclass(frozen=True)
class EngineMemory:
    backend: str                   # cuda, rocm, mps or cpu
    device_name: str
    vram_total_gb: float | None    # None without a separate device memory to report
    vram_used_gb: float | None     # in use on the whole device, by every process
    vram_engine_gb: float | None   # held by this engine's tensors (allocated, not cached)
    vram_cached_gb: float | None   # reserved by this engine's allocator
    engine_ram_gb: float           # resident memory of the engine process
    model: str | None              # the loaded model's reference, if any
    strategy: str | None           # the plan it was loaded with

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EngineStarting:
    """The engine process is loading its libraries (torch, diffusers) and cannot take a job yet."""
    seconds: float                 # since it started


@dataclass(frozen=True)
class EngineSilent:
    """The engine process runs but answers nothing (stopped, or hung in a driver call)."""


def _round(value: float | None) -> float | None:
    return None if value is None else round(value / GIB, 2)


def engine_memory(backend: str, device_name: str, model: str | None, strategy: str | None) -> EngineMemory:
    """A snapshot of the calling (engine) process; touches the device only if torch already uses it."""
    import psutil
    import torch

    total = used = allocated = reserved = None
    if backend in ("cuda", "rocm") and torch.cuda.is_available() and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info(0)
        used = total - free
        allocated, reserved = torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0)
    elif backend == "mps" and torch.backends.mps.is_available():
        allocated = torch.mps.current_allocated_memory()
        reserved = torch.mps.driver_allocated_memory()
    return EngineMemory(backend, device_name, _round(total), _round(used), _round(allocated), _round(reserved),
                        _round(psutil.Process().memory_info().rss), model, strategy)
