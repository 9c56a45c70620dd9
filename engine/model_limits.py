"""What one model can make: the frame counts and sizes its transformer and VAE allow, checked before a run.

The request's own checks (engine/request.py) hold for every model; these come from the model's
configs (its rotary position table and patch sizes, its VAE's scale factors), so that a frame count
the form accepts but the model cannot place is refused with a sentence, not a shape error mid-run.
"""
from __future__ import annotations

from dataclasses import dataclass

from .modelspec import ModelSpec
from .request import MAX_FRAMES, MAX_SIDE, InputError


@dataclass(frozen=True)
class Limits:
    name: str              # the model, as messages name it
    max_frames: int        # 4k+1
    max_side: int          # pixels, width and height alike
    size_multiple: int     # width and height are multiples of it
    position_rows: int     # rows of the transformer's position table (why the limits are what they are)

    @property
    def frames_hint(self) -> str:
        """For the form's frames label: '4k+1, at most 125'."""
        return f"4k+1, at most {self.max_frames}"


def limits_of(spec: ModelSpec) -> Limits:
    frames = min(MAX_FRAMES, spec.max_frames)
    side = min(MAX_SIDE, spec.max_side // spec.size_multiple * spec.size_multiple)
    return Limits(spec.name, frames, side, spec.size_multiple, spec.transformer.rope_max_seq_len)


def limit_problems(limits: Limits, width: int, height: int, frames: int) -> list[str]:
    """What in (width, height, frames) this model cannot make, each with what to use instead."""
    problems = []
    if frames > limits.max_frames:
        problems.append(f"frames {frames} is more than {limits.name} can make (its position table has "
                        f"{limits.position_rows} rows for the frames): use at most {limits.max_frames}")
    for side, value in (("width", width), ("height", height)):
        if value > limits.max_side:
            problems.append(f"{side} {value} is more than {limits.name} can take (its position table has "
                            f"{limits.position_rows} rows across): use at most {limits.max_side}")
        elif value % limits.size_multiple:
            lower = max(limits.size_multiple, value // limits.size_multiple * limits.size_multiple)
            problems.append(f"{side} {value} is not a multiple of {limits.size_multiple}, which {limits.name} "
                            f"needs: try {lower} or {lower + limits.size_multiple}")
    return problems


def check_model_limits(spec: ModelSpec, width: int, height: int, frames: int) -> None:
    """Raise InputError listing what this model cannot make (see limit_problems)."""
    problems = limit_problems(limits_of(spec), width, height, frames)
    if problems:
        raise InputError(problems)
