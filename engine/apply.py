"""Applying a memory plan to a loaded pipeline with diffusers' own mechanisms.

Placement of each component, group offloading, fp8 layerwise casting and VAE
tiling are all hooks or moves that diffusers provides; this module only
decides which to call, from the Plan.
"""
from __future__ import annotations

from .planner import Plan

TRANSFORMERS = ("transformer", "transformer_2")
ENCODERS = ("text_encoder", "image_encoder")


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def from_pretrained_kwargs(plan: Plan) -> dict:
    """Keyword arguments for loading the pipeline under ``plan``."""
    kwargs = {"dtype": {"default": torch_dtype(plan.dtype), "vae": torch_dtype(plan.vae_dtype)}}
    if plan.load == "device_map":
        kwargs["device_map"] = plan.device
    return kwargs


def place_components(pipe, plan: Plan) -> None:
    """Move every component where ``plan`` keeps it between phases, with its hooks."""
    import torch

    compute = torch_dtype(plan.dtype)
    for name in TRANSFORMERS:
        model = getattr(pipe, name, None)
        if model is None:
            continue
        if plan.fp8:
            # Only the transformer: UMT5 casts activations to its weights' dtype and breaks in fp8.
            model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=compute)
        if plan.transformer == "device":
            model.to(plan.device)
        else:
            model.enable_group_offload(
                onload_device=plan.device, offload_device="cpu",
                offload_type="block_level" if plan.transformer == "group" else "leaf_level",
                num_blocks_per_group=1 if plan.transformer == "group" else None,
                use_stream=plan.use_stream, low_cpu_mem_usage=not plan.pin_memory)
    for name in ENCODERS:
        model = getattr(pipe, name, None)
        if model is None:
            continue
        model.to(plan.device if plan.text_encoder == "device" else "cpu")
    pipe.vae.to(plan.device)
    set_vae_tiling(pipe.vae, plan.vae_tile)


def set_vae_tiling(vae, tile: int | None) -> None:
    if tile is None:
        vae.disable_tiling()
        return
    stride = tile * 3 // 4
    vae.enable_tiling(tile_sample_min_height=tile, tile_sample_min_width=tile,
                      tile_sample_stride_height=stride, tile_sample_stride_width=stride)


def encoder_device(plan: Plan) -> str:
    """Where the text and image encoders compute."""
    return "cpu" if plan.text_encoder == "cpu" else plan.device


def bring_encoder(pipe, name: str, plan: Plan) -> None:
    """Before encoding: an offloaded encoder comes to the device."""
    model = getattr(pipe, name, None)
    if model is not None and plan.text_encoder == "offload":
        model.to(plan.device)


def send_encoder_back(pipe, name: str, plan: Plan) -> None:
    """After encoding: an offloaded encoder leaves the device again."""
    model = getattr(pipe, name, None)
    if model is not None and plan.text_encoder == "offload":
        model.to("cpu")
