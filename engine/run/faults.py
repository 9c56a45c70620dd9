"""The one place where something outside the engine may disturb a run: a hook called as each phase starts.

The app passes ``NO_FAULTS``, which does nothing. The reliability tests pass a hook of their own that
raises an out-of-memory error or kills the engine process in a chosen phase, so that the recovery paths
(stepping down the ladder, retrying the decode, a fresh engine process) run for real. The hook crosses
to the engine process by pickling, so it must be picklable (a frozen dataclass is). A client gives its hook to its
first engine process only, unless the hook says ``every_process = True`` (one that decides when to act from outside,
so that a fresh process does not repeat the fault that killed the one before).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class PhaseHook(Protocol):
    def before_phase(self, phase: str) -> None:
        """Called once the engine has announced ``phase`` (PhaseStarted) and before the phase's clock starts;
        whatever it raises is handled as if the phase had raised it."""


@dataclass(frozen=True)
class NoFaults:
    """The hook of every real run: entering a phase changes nothing."""

    def before_phase(self, phase: str) -> None:
        return None


NO_FAULTS = NoFaults()
