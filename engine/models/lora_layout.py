"""A LoRA file in Wan's original layer names, turned into what the app applies: low-rank factors in diffusers'
names, and the full-tensor differences.

Kijai's, ComfyUI's, lightx2v's and Wan2.2-Lightning's files name the layers as Wan's own checkpoints do
(``diffusion_model.blocks.0.self_attn.q.lora_down.weight``, with an ``.alpha``; some without the prefix). Beside
the factors, many carry whole-tensor differences: ``<layer>.diff`` (a weight: norms, a head, an embedding),
``<layer>.diff_b`` (a bias), ``blocks.N.diff_m`` (a block's modulation) and ``head.modulation.diff``. ComfyUI adds
each ``.diff`` / ``.diff_b`` to its tensor times the strength (comfy/lora.py, comfy/lora.py calculate_weight), as
lightx2v does with ``.diff_m`` on ``.modulation`` (lightx2v/utils/lora_loader.py). diffusers' own converter drops
the norm and modulation differences, and fails on some files (an ``.alpha`` left over beside an embedding).

Here every key of such a file is read: the factors become diffusers' PEFT layout (``transformer.<layer>.lora_A``
/ ``lora_B``, the alpha / rank scale folded into the down factor), which diffusers loads as it is; the
differences are returned by diffusers' parameter name for the app to add itself (engine/run/lora_diffs.py).
A tensor of a kind the app does not apply (LoHa, LoKr, DoRA, a mid factor) refuses the file with a sentence.
Layers the model does not have are the caller's to report.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

ORIGINAL_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
DOWN, UP = (".lora_down.weight", ".lora_A.weight"), (".lora_up.weight", ".lora_B.weight")
ALPHA, DIFF, DIFF_BIAS, DIFF_MODULATION = ".alpha", ".diff", ".diff_b", ".diff_m"
# Wan's top-level layers -> diffusers' (diffusers/loaders/single_file_utils.py convert_wan_transformer_to_diffusers).
_TOP = {
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
    "img_emb.proj.0": "condition_embedder.image_embedder.norm1",
    "img_emb.proj.1": "condition_embedder.image_embedder.ff.net.0.proj",
    "img_emb.proj.3": "condition_embedder.image_embedder.ff.net.2",
    "img_emb.proj.4": "condition_embedder.image_embedder.norm2",
    "img_emb.emb_pos": "condition_embedder.image_embedder.pos_embed",
    "head.head": "proj_out",
    "head.modulation": "scale_shift_table",
    "patch_embedding": "patch_embedding",
}
# Inside a block (Wan's norm3, the cross-attention norm, is diffusers' norm2; Wan's norm1 and norm2 hold no weights).
_ATTENTION = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0", "k_img": "add_k_proj", "v_img": "add_v_proj",
              "norm_q": "norm_q", "norm_k": "norm_k", "norm_k_img": "norm_added_k"}
_BLOCK = {"ffn.0": "ffn.net.0.proj", "ffn.2": "ffn.net.2", "norm3": "norm2", "modulation": "scale_shift_table"}
_BLOCK_NAME = re.compile(r"blocks\.(\d+)\.(.+)")
# Tensor kinds of other adapter methods: the file is refused rather than applied in part.
OTHER_KINDS = {".hada_": "LoHa", ".lokr_": "LoKr", ".dora_scale": "DoRA", ".lora_mid.": "a LoCon mid factor",
               ".a1.weight": "GLoRA", ".w_norm": "a norm weight", ".set_weight": "a weight replacement"}


def is_original_layout(keys) -> bool:
    """Whether ``keys`` name Wan's own layers (with or without ``diffusion_model.``), not diffusers' or musubi's."""
    return any(_strip(key) != key or key.startswith("blocks.") for key in keys) and \
        not any(key.startswith(("transformer.", "lora_unet_")) for key in keys)


def _strip(key: str) -> str:
    for prefix in ORIGINAL_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def diffusers_layer(original: str) -> str | None:
    """diffusers' name for one of Wan's layers or parameters (``blocks.3.cross_attn.k`` -> ``blocks.3.attn2.to_k``);
    None for a name outside the Wan transformer's layout."""
    if original in _TOP:
        return _TOP[original]
    found = _BLOCK_NAME.fullmatch(original)
    if not found:
        return None
    block, rest = found.groups()
    for attention, ours in (("self_attn.", "attn1."), ("cross_attn.", "attn2.")):
        if rest.startswith(attention) and rest[len(attention):] in _ATTENTION:
            return f"blocks.{block}.{ours}{_ATTENTION[rest[len(attention):]]}"
    return f"blocks.{block}.{_BLOCK[rest]}" if rest in _BLOCK else None


@dataclass
class SplitLora:
    """An original-layout file as the app applies it: ``factors`` in diffusers' layout (for load_lora_weights),
    ``diffs`` by (diffusers' module name, parameter), and the layers it names that Wan's layout has not."""
    factors: dict = field(default_factory=dict)
    diffs: dict = field(default_factory=dict)       # (module name, "weight" | "bias" | parameter name) -> tensor
    unknown: list = field(default_factory=list)     # original key names no Wan layer has


def _diff_target(key: str) -> tuple[str, str] | None:
    """(Wan's layer or parameter, which tensor of it) a difference key changes, None when it is no difference."""
    if key.endswith(DIFF_MODULATION):
        return key[:-len(DIFF_MODULATION)] + ".modulation", ""
    if key.endswith(DIFF_BIAS):
        return key[:-len(DIFF_BIAS)], "bias"
    if key.endswith(DIFF):
        base = key[:-len(DIFF)]
        # ComfyUI's rule: a difference of a parameter that is no layer's weight (head.modulation.diff) is its own
        return (base, "") if base.endswith("modulation") or base.endswith("emb_pos") else (base, "weight")
    return None


def split_original_lora(state: dict, name: str) -> SplitLora:
    """``state`` (an original-layout LoRA's tensors) split into factors and differences; ValueError saying what
    to do when it holds tensors of a kind the app does not apply, or a factor without its other half."""
    import torch

    other = sorted({kind for key in state for marker, kind in OTHER_KINDS.items() if marker in key})
    if other:
        raise ValueError(f"LoRA {name} holds {', '.join(other)} tensors, which the app does not apply: use a plain "
                         "LoRA (lora_down/lora_up or lora_A/lora_B factors)")
    tensors = {_strip(key): value for key, value in state.items()}
    split = SplitLora()
    pairs: dict[str, dict] = {}
    for key, value in tensors.items():
        target = _diff_target(key)
        if target is not None:
            layer, part = target
            ours = diffusers_layer(layer)
            if ours is None:
                split.unknown.append(key)
                continue
            module, _, param = ours.rpartition(".") if not part else (ours, "", part)
            split.diffs[(module, param)] = value
            continue
        for kind, suffixes in (("down", DOWN), ("up", UP), ("alpha", (ALPHA,))):
            suffix = next((s for s in suffixes if key.endswith(s)), None)
            if suffix:
                pairs.setdefault(key[:-len(suffix)], {})[kind] = value
                break
        else:
            split.unknown.append(key)
    for layer, parts in pairs.items():
        if "down" not in parts or "up" not in parts:
            if set(parts) == {"alpha"}:
                continue   # an alpha of a layer the file trains no factors for: nothing to apply
            raise ValueError(f"LoRA {name} has a {'down' if 'down' in parts else 'up'} factor for {layer} without "
                             "its other half: the file is incomplete; download it again")
        ours = diffusers_layer(layer)
        if ours is None:
            split.unknown.append(layer)
            continue
        down, up = parts["down"].to(torch.float32), parts["up"].to(torch.float32)
        if "alpha" in parts:   # PEFT scales by lora_alpha / rank: the file's alpha goes into the factor instead
            down = down * (float(parts["alpha"]) / down.shape[0])
        split.factors[f"transformer.{ours}.lora_A.weight"] = down
        split.factors[f"transformer.{ours}.lora_B.weight"] = up
    return split
