"""The errors the app's own checks raise, and what each becomes. The two a person fixes live here, below every
package that raises them; the others live where they are raised. engine/run/failures.py turns any of them into
the one JobFailed event a job ends with (its ``kind``: engine/events.py FailureKind):

    ValueError
    ├── InputError        a setting, prompt or image (this module)            → "input": not started
    │   └── ImageError    (engine/settings/images.py)
    └── ModelError        a model reference, folder or download (this module) → "model": not started
        ├── DownloadError a download that cannot start or did not finish (this module): its own sentence
        └── DeleteRefused (engine/service/model_files.py)
    QueueFull             the queue is full (engine/service/jobqueue.py)       → "queue": not started
    OSError
    └── DiskFull          an output the disk has no room for (engine/outputs/export.py)   → "disk"
    RuntimeError
    ├── NonFiniteValues   NaN or infinity in a file or a phase (engine/run/nonfinite.py)  → "values"
    └── PeerStopped       another GPU of a split job failed (engine/run/parallel.py)      → "peer"
    torch's out of memory one rung down the ladder and again (engine/run/generation.py); the decode tiled,
                          then on the CPU; past the last rung → "runtime"
    anything else         → "runtime", its first paragraph said, the traceback in the engine's log
    the engine process dying or going silent (engine/service/worker.py)                 → "crash", "hung"
"""
from __future__ import annotations

from engine.words import sentence


class InputError(ValueError):
    """The request cannot run; each problem says what is wrong and what to change.

    Built from one problem or a list of them (short clauses such as "width 70 is not a multiple of 16:
    try 64 or 80"); ``problems`` holds them as sentences, and ``str()`` is those sentences in a row.
    """

    def __init__(self, problems: str | list[str] | tuple[str, ...]):
        listed = [problems] if isinstance(problems, str) else list(problems)
        self.problems = tuple(sentence(p) for p in listed if p.strip())
        super().__init__(" ".join(self.problems))


class ModelError(ValueError):
    """The model reference cannot be used; the message says what to change."""


class DownloadError(ModelError):
    """A download that cannot start or did not finish (no network, no room, an unknown repo); the message says
    what to do, in one sentence."""
