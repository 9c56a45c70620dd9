"""What one model can make: the frame counts and sizes its transformer and VAE allow, checked before a run.

They come from the model's configs (its rotary position table and patch sizes, its VAE's scale factors),
so that a frame count the form accepts but the model cannot place is refused with a sentence, not a
shape error mid-run. The settings' checks (engine/settings/values.py, engine/settings/model_fit.py) take them
when they are known.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.models.spec import ModelSpec

# The most frames and pixels across the app asks of any model (the settings' bounds: engine/settings/values.py).
MIN_SIDE, MAX_SIDE = 32, 2048
MAX_FRAMES = 257
# Width and height are multiples of this for every Wan model (its VAE's 8x times its patch's 2); a model's own
# (32 for Wan2.2 TI2V-5B: 16x times 2) is its spec's ``size_multiple``, checked once the model is known.
SIDE_MULTIPLE = 16


@dataclass(frozen=True)
class Limits:
    name: str              # the model, as messages name it
    max_frames: int        # 4k+1
    max_side: int          # pixels, width and height alike
    size_multiple: int     # width and height are multiples of it
    position_rows: int     # rows of the transformer's position table (why the limits are what they are)
    experts: int = 1       # transformers taking turns (Wan2.2 A14B: 2): a low-noise guidance needs two

    @property
    def frames_hint(self) -> str:
        """For the form's frames label: '4k+1, at most 125'."""
        return f"4k+1, at most {self.max_frames}"


def limits_of(spec: ModelSpec) -> Limits:
    frames = min(MAX_FRAMES, spec.max_frames)
    side = min(MAX_SIDE, spec.max_side // spec.size_multiple * spec.size_multiple)
    return Limits(spec.name, frames, side, spec.size_multiple, spec.transformer.rope_max_seq_len, spec.experts)
