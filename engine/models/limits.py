"""What one model can make: the frame counts and sizes its transformer and VAE allow, checked before a run.

They come from the model's configs (its rotary position table and patch sizes, its VAE's scale factors),
so that a frame count the form accepts but the model cannot place is refused with a sentence, not a
shape error mid-run. The settings' checks (engine/settings/values.py, engine/settings/model_fit.py) take them
when they are known.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.models.spec import ModelSpec
from engine.models.windows import LONGEST_FRAMES

# The most frames and pixels across the app asks of any model (the settings' bounds: engine/settings/values.py):
# a video of more frames than one window is denoised in windows (engine/models/windows.py), each at most
# MAX_WINDOW_FRAMES long.
MIN_SIDE, MAX_SIDE = 32, 2048
MAX_FRAMES = LONGEST_FRAMES
MAX_WINDOW_FRAMES = 257
# Width and height are multiples of this for every Wan model (its VAE's 8x times its patch's 2); a model's own
# (32 for Wan2.2 TI2V-5B: 16x times 2) is its spec's ``size_multiple``, checked once the model is known.
SIDE_MULTIPLE = 16


@dataclass(frozen=True)
class Limits:
    name: str              # the model, as messages name it
    max_frames: int        # 4k+1, the longest video (in windows past ``window``)
    max_side: int          # pixels, width and height alike
    size_multiple: int     # width and height are multiples of it
    position_rows: int     # rows of the transformer's position table (why the limits are what they are)
    experts: int = 1       # transformers taking turns (Wan2.2 A14B: 2): a low-noise guidance needs two
    window: int = 81       # frames the transformer sees at once unless the settings say otherwise
    max_window: int = MAX_WINDOW_FRAMES   # the most frames in one window: what the position table covers

    @property
    def frames_hint(self) -> str:
        """For the form's frames label: '4k+1, at most 1025; in windows past 81'."""
        return f"4k+1, at most {self.max_frames}; in windows past {self.window}"


def limits_of(spec: ModelSpec) -> Limits:
    side = min(MAX_SIDE, spec.max_side // spec.size_multiple * spec.size_multiple)
    return Limits(spec.name, MAX_FRAMES, side, spec.size_multiple, spec.transformer.rope_max_seq_len, spec.experts,
                  window=spec.window_frames, max_window=min(MAX_WINDOW_FRAMES, spec.max_frames))
