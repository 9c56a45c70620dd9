"""The names a setting may take: the memory strategies, where the text encoder lives, the VAE's precision,
the attention backends, the step caches and the decoders. Settings are checked against them here; the planner
(engine/planning/) gives each its meaning and its order.
"""
from __future__ import annotations

# The memory plan's rungs, fastest (and highest quality) first: the planner's ladder (engine/planning/planner.py
# says what each does).
LADDER = ("all_on_device", "text_encoder_offload", "expert_swap", "group_offload", "fp8_storage",
          "fp8_group_offload", "leaf_offload", "disk_offload")
# Where the text (and image) encoder lives: always on the device; moved there whole to encode; streamed
# through it layer by layer to encode; or run on the CPU.
TEXT_ENCODER_PLACES = ("device", "offload", "streamed", "cpu")
VAE_DTYPES = ("float32", "bfloat16")
# diffusers' attention backends the app offers ("native" is torch's SDPA, which picks flash or
# memory-efficient kernels by itself); the *_hub ones download kernels and are never offered.
ATTENTION_BACKENDS = ("native", "_native_cudnn", "_native_flash", "_native_efficient", "flash", "sage")
STEP_CACHES = ("first_block", "mag", "taylor")
DECODERS = ("vae", "fast")
