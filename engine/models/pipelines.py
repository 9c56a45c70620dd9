"""The pipeline classes a model folder's ``model_index.json`` may name, and how the app runs each.

A published folder names the class its makers run it with. diffusers has classes for Wan's own folders; FastVideo's
FastWan folders name ``WanDMDPipeline``, FastVideo's class for DMD-distilled models, which diffusers does not have:
its components are those of Wan's text to video (plus the gate weights of the sparse attention it was trained with,
engine/models/spec.py ``TransformerShape.gated``), so the app runs it on diffusers' ``WanPipeline`` with the sampler
it was distilled for (FastVideo's: three steps at the DMD timesteps 1000, 757 and 522, no guidance).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampler:
    """The steps a distilled model was trained to take (the settings a preset for it gives)."""
    scheduler: str                  # engine/settings/values.py SCHEDULERS
    steps: int
    guidance: float
    shift: float
    sigmas: tuple[float, ...] = ()

    def differs(self, scheduler: str, steps: int, guidance: float) -> bool:
        return scheduler != self.scheduler or steps != self.steps or guidance != self.guidance


# FastVideo samples FastWan at its DMD timesteps as written (engine/run/schedulers.py, flow_dmd).
DMD_SAMPLER = Sampler("flow_dmd", 3, 1.0, 1.0, (1.0, 0.757, 0.522))


@dataclass(frozen=True)
class PipelineKind:
    name: str                       # as model_index.json's ``_class_name`` says it
    mode: str                       # "t2v" or "i2v": what the folder makes
    runs_as: str                    # the diffusers pipeline class the app loads it with
    sampler: Sampler | None = None  # the sampler it was distilled for; None: any

    @property
    def image_to_video(self) -> bool:
        return self.mode == "i2v"


PIPELINE_KINDS: dict[str, PipelineKind] = {kind.name: kind for kind in (
    PipelineKind("WanPipeline", "t2v", "WanPipeline"),
    PipelineKind("WanImageToVideoPipeline", "i2v", "WanImageToVideoPipeline"),
    PipelineKind("WanDMDPipeline", "t2v", "WanPipeline", DMD_SAMPLER),
)}


def pipeline_kind(name: str) -> PipelineKind:
    """The kind of a checked folder's pipeline class (engine/models/refs.py refuses the others first)."""
    return PIPELINE_KINDS[name]
