"""Faults the tests inject into the engine's phases, through its one hook (engine/run/faults.py).

Kept apart from conftest.py: a hook given to a WorkerClient is unpickled in the engine process, which then
imports this small module only.
"""
from __future__ import annotations

import os
import signal
from collections import Counter
from dataclasses import dataclass, field


class InjectedOutOfMemory(RuntimeError):
    """An injected fault; its message says "out of memory", so the engine handles it like a real one."""


@dataclass(frozen=True)
class InjectedFaults:
    """A PhaseHook that makes chosen phases fail.

    ``out_of_memory``: phase -> how many times entering it raises an out-of-memory error (counted over the
    engine's life, across runs). ``crash_in``: a phase whose start kills the whole engine process (SIGKILL),
    as a driver fault would.
    """
    out_of_memory: dict[str, int] = field(default_factory=dict)
    crash_in: str | None = None
    entered: Counter = field(default_factory=Counter, init=False, compare=False, repr=False)

    def before_phase(self, phase: str) -> None:
        if phase == self.crash_in:
            os.kill(os.getpid(), signal.SIGKILL)
        self.entered[phase] += 1
        if self.entered[phase] <= self.out_of_memory.get(phase, 0):
            raise InjectedOutOfMemory(f"out of memory (injected into {phase} for a test)")


@dataclass(frozen=True)
class CrashWhenAsked:
    """A PhaseHook for every engine process of a client (``every_process``): the start of the phase named in the
    file ``order`` kills the engine process (SIGKILL), once: the file is removed first. The tests crash one engine
    in each phase in turn this way, each fresh engine serving on, instead of starting two engines per phase."""
    order: str
    every_process = True

    def before_phase(self, phase: str) -> None:
        from pathlib import Path

        order = Path(self.order)
        if order.is_file() and order.read_text() == phase:
            order.unlink()
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class NoteVariable:
    """A PhaseHook for every engine process of a client: at each phase's start it writes the process id and the
    engine's value of the variable ``name`` ("<unset>" when it has none) to the file ``into``, as "PID VALUE"."""
    name: str
    into: str
    every_process = True

    def before_phase(self, phase: str) -> None:
        from pathlib import Path

        Path(self.into).write_text(f"{os.getpid()} {os.environ.get(self.name, '<unset>')}")
