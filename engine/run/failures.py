"""Turning an exception into a message a user can act on."""
from __future__ import annotations

import errno

from engine.events import FailureKind, JobFailed
from engine.errors import DownloadError, ModelError
from engine.outputs.export import DiskFull
from engine.run.nonfinite import NonFiniteValues
from engine.settings.values import InputError
from engine.words import sentence


def failure_event(job_id: str, exc: BaseException, phase: str | None) -> JobFailed:
    """The JobFailed event for an exception raised during ``phase``."""
    message, hint = describe_failure(exc, phase)
    kind = (FailureKind.INPUT if isinstance(exc, InputError) else FailureKind.MODEL if isinstance(exc, ModelError)
            else FailureKind.DISK if is_disk_full(exc) else FailureKind.VALUES if isinstance(exc, NonFiniteValues)
            else FailureKind.RUNTIME)
    return JobFailed(job_id, message, hint, phase, kind, problems=getattr(exc, "problems", ()))


OUT_OF_MEMORY_MARKERS = ("out of memory", "hip error: out of memory", "mps backend out of memory")


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, DiskFull) or getattr(exc, "errno", None) == errno.ENOSPC or \
        "no space left on device" in str(exc).lower()


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA, HIP and MPS out-of-memory errors (torch raises them under different classes)."""
    if exc.__class__.__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OUT_OF_MEMORY_MARKERS)


def describe_failure(exc: BaseException, phase: str | None) -> tuple[str, str]:
    """Return (message, what to do) for an exception raised during ``phase``."""
    where = f" during {phase.replace('_', ' ')}" if phase else ""
    if isinstance(exc, InputError):
        return str(exc), ""   # each problem says what to change
    if isinstance(exc, DownloadError):
        return sentence(str(exc)), ""   # it says what to do
    if isinstance(exc, ModelError):
        return sentence(f"the model cannot be used: {exc}"), "Pick another model or preset, or fix the model folder."
    if isinstance(exc, NonFiniteValues):
        return sentence(str(exc)), exc.hint
    text = str(exc) or exc.__class__.__name__
    if is_out_of_memory(exc):
        return (f"Out of device memory{where}.",
                "Lower the size or the number of frames, or pick a smaller model; then try again.")
    if isinstance(exc, DiskFull):
        return sentence(str(exc)), "Free some disk space or choose another outputs folder."
    if is_disk_full(exc):
        return f"The disk is full{where}.", "Free some disk space or choose another outputs folder."
    return (sentence(f"{exc.__class__.__name__}{where}: {shortened(text)}"),
            "Try again; if it repeats, run 'python app.py doctor' and report the error with its output.")


# The most of an unexpected error's text a user is shown (torch's "operator not available" errors list every
# dispatch key, pages long); the engine's log keeps the whole traceback.
MAX_ERROR_CHARS = 500


def shortened(text: str) -> str:
    """An error's first paragraph, cut at MAX_ERROR_CHARS."""
    first = text.strip().split("\n\n", 1)[0].strip()
    return first if len(first) <= MAX_ERROR_CHARS else first[:MAX_ERROR_CHARS].rstrip() + " …"


def exit_reason(exitcode: int | None) -> str:
    """How a process ended, in words ("killed by signal SIGKILL", "exit code 1")."""
    import signal

    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
