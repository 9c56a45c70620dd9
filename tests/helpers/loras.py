"""LoRA files for the tiny self-test transformer, in each layout diffusers reads for Wan, and the quickest run."""
from __future__ import annotations

import torch

BLOCKS, WIDTH, FFN, RANK = 2, 24, 32, 4
ATTENTION = ("q", "k", "v", "o")
DIFFUSERS_NAMES = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0"}
# A still from one step without guidance: the quickest run that goes through the transformer.
FAST = dict(mode="t2i", width=32, height=32, frames=1, steps=1, guidance=1.0, seed=5)


def _pair(generator, rows: int, columns: int) -> tuple:
    """(down, up) factors of a rank-RANK LoRA for a rows x columns layer (out x in)."""
    return (0.5 * torch.randn(RANK, columns, generator=generator), 0.5 * torch.randn(rows, RANK, generator=generator))


def _layers():
    """(block, Wan's name, diffusers' name, out, in) of every layer a Wan LoRA adapts."""
    for block in range(BLOCKS):
        for attention, ours in (("self_attn", "attn1"), ("cross_attn", "attn2")):
            for part in ATTENTION:
                yield block, f"{attention}.{part}", f"{ours}.{DIFFUSERS_NAMES[part]}", WIDTH, WIDTH
        yield block, "ffn.0", "ffn.net.0.proj", FFN, WIDTH
        yield block, "ffn.2", "ffn.net.2", WIDTH, FFN


def diffusers_lora(seed: int = 1) -> dict:
    generator, tensors = torch.Generator().manual_seed(seed), {}
    for block, _, name, rows, columns in _layers():
        down, up = _pair(generator, rows, columns)
        tensors[f"transformer.blocks.{block}.{name}.lora_A.weight"] = down
        tensors[f"transformer.blocks.{block}.{name}.lora_B.weight"] = up
    return tensors


def original_lora(seed: int = 2) -> dict:
    """Kijai's, ComfyUI's and lightx2v's layout: Wan's own layer names, lora_down/lora_up, an alpha, a bias diff."""
    generator, tensors = torch.Generator().manual_seed(seed), {}
    for block, name, _, rows, columns in _layers():
        key = f"diffusion_model.blocks.{block}.{name}"
        tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = _pair(generator, rows, columns)
        tensors[f"{key}.alpha"] = torch.tensor(float(RANK) / 2)
        tensors[f"{key}.diff_b"] = 0.1 * torch.randn(rows, generator=generator)
    return tensors


def musubi_lora(seed: int = 3) -> dict:
    generator, tensors = torch.Generator().manual_seed(seed), {}
    for block, name, _, rows, columns in _layers():
        key = f"lora_unet_blocks_{block}_{name.replace('.', '_')}"
        tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = _pair(generator, rows, columns)
        tensors[f"{key}.alpha"] = torch.tensor(float(RANK))
    return tensors

