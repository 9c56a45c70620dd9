"""Values that are no numbers (NaN) or infinite where a phase should make numbers: the latents, the frames.

A video encoder writes them as black pixels, so a run that makes them stops with a sentence instead
(``NonFiniteValues``, which engine/run/failures.py turns into the job's failure).
"""
from __future__ import annotations

from engine.models.finite import nonfinite
from engine.words import share, value_kinds


class NonFiniteValues(RuntimeError):
    """A phase made NaN or infinite values where numbers belong (the latents, the decoded frames): the job stops
    there rather than write a black video. The message says where and with which files; ``hint`` what to do."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


def refuse_nonfinite(values, what: str, among: str, after: str = "", hint: str = "") -> None:
    """NonFiniteValues ('<what> produced NaN values (in 12% of <among>)<after>.') unless every value is finite."""
    found = nonfinite(values)
    if found is not None:
        fraction, nan, inf = found
        raise NonFiniteValues(f"{what} produced {value_kinds(nan, inf)} values (in {share(fraction)} of {among})"
                              f"{after}", hint)
