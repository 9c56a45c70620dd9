"""The names a setting may take: the memory strategies, where the text encoder lives, the VAE's precision,
the attention backends, the step caches and the decoders. Settings are checked against them here; the planner
(engine/planning/) gives each its meaning and its order.
"""
from __future__ import annotations

from engine.events import Named

# The memory plan's rungs, fastest (and highest quality) first: the planner's ladder (engine/planning/planner.py
# says what each does).
class Strategy(Named):
    """A rung of the ladder. Each equals its string (plans, sidecars and presets say "group_offload" as before)."""
    ALL_ON_DEVICE = "all_on_device"
    TEXT_ENCODER_OFFLOAD = "text_encoder_offload"
    EXPERT_SWAP = "expert_swap"
    GROUP_OFFLOAD = "group_offload"
    FP8_STORAGE = "fp8_storage"
    FP8_GROUP_OFFLOAD = "fp8_group_offload"
    LEAF_OFFLOAD = "leaf_offload"
    DISK_OFFLOAD = "disk_offload"


LADDER = tuple(Strategy)
# Where the text (and image) encoder lives: always on the device; moved there whole to encode; streamed
# through it layer by layer to encode; or run on the CPU.
class TextEncoderPlace(Named):
    DEVICE = "device"
    OFFLOAD = "offload"
    STREAMED = "streamed"
    CPU = "cpu"


TEXT_ENCODER_PLACES = tuple(TextEncoderPlace)
VAE_DTYPES = ("float32", "bfloat16")
# diffusers' attention backends the app offers ("native" is torch's SDPA, which picks flash or
# memory-efficient kernels by itself); the *_hub ones download kernels and are never offered. "flash" (FlashAttention
# 2), "sage" (SageAttention 2.1.1 or newer) and "_flash_3" (FlashAttention 3's flash_attn_interface) run where
# their packages are installed: the calibration measures them there (engine/run/speedups.py).
ATTENTION_BACKENDS = ("native", "_native_cudnn", "_native_flash", "_native_efficient", "flash", "sage", "_flash_3")
STEP_CACHES = ("first_block", "mag", "taylor")
DECODERS = ("vae", "vae_fast", "vae_light", "fast")
# The transformer's block linears: in the model's precision, or in float8 through torchao (approximate).
COMPUTES = ("exact", "fp8")
