"""The components of a Wan pipeline by their diffusers names: the subfolders of a model folder, the keys of a
memory plan's placements (engine/planning/plan.py) and the parts whose weights the planner counts."""
from __future__ import annotations

from engine.events import Named


class Component(Named):
    """A component of a Wan pipeline. Each equals its string (folders, plans and sidecars say "vae" as before)."""
    TRANSFORMER = "transformer"        # the model's transformer (Wan2.2 A14B: its high-noise expert)
    TRANSFORMER_2 = "transformer_2"    # Wan2.2 A14B's low-noise expert
    TEXT_ENCODER = "text_encoder"      # UMT5-XXL
    IMAGE_ENCODER = "image_encoder"    # CLIP ViT-H (Wan2.1 I2V and FLF2V)
    VAE = "vae"
