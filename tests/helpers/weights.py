"""The tiny model's transformer in the original Wan layout, as single files (GGUF) are written from it."""
from __future__ import annotations

from pathlib import Path

import numpy as np

# diffusers' names -> the original Wan names: the inverse of convert_wan_transformer_to_diffusers
# (diffusers/loaders/single_file_utils.py), applied in this order. Diffusers' norm2 is the original norm3
# (the cross-attention norm) and the other way round.
TO_ORIGINAL = (
    ("condition_embedder.image_embedder.pos_embed", "img_emb.emb_pos"),   # FLF2V's
    ("condition_embedder.time_embedder.linear_1.", "time_embedding.0."),
    ("condition_embedder.time_embedder.linear_2.", "time_embedding.2."),
    ("condition_embedder.text_embedder.linear_1.", "text_embedding.0."),
    ("condition_embedder.text_embedder.linear_2.", "text_embedding.2."),
    ("condition_embedder.time_proj.", "time_projection.1."),
    ("condition_embedder.image_embedder.norm1.", "img_emb.proj.0."),
    ("condition_embedder.image_embedder.ff.net.0.proj.", "img_emb.proj.1."),
    ("condition_embedder.image_embedder.ff.net.2.", "img_emb.proj.3."),
    ("condition_embedder.image_embedder.norm2.", "img_emb.proj.4."),
    (".attn1.", ".self_attn."), (".attn2.", ".cross_attn."),
    (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
    (".add_k_proj.", ".k_img."), (".add_v_proj.", ".v_img."), (".norm_added_k.", ".norm_k_img."),
    (".ffn.net.0.proj.", ".ffn.0."), (".ffn.net.2.", ".ffn.2."),
    (".norm2.", ".norm__swap."), (".norm3.", ".norm2."), (".norm__swap.", ".norm3."),
    (".scale_shift_table", ".modulation"),
)
# Steps and a still keep each run short; the files' weights go through every step all the same.
RUN = dict(mode="t2i", frames=1, steps=2)


def original_name(name: str) -> str:
    """A diffusers WanTransformer3DModel tensor name as the original Wan checkpoints (and GGUF files) name it."""
    if name == "scale_shift_table":
        return "head.modulation"
    if name.startswith("proj_out."):
        return "head.head." + name.removeprefix("proj_out.")
    for diffusers_part, original_part in TO_ORIGINAL:
        name = name.replace(diffusers_part, original_part)
    return name


def original_state(folder: Path) -> dict:
    """The tiny model's transformer in the original layout, with the tensors of its own files."""
    from safetensors.torch import load_file

    state = load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    return {original_name(name): tensor.contiguous() for name, tensor in state.items()}


def q8_rows(array: np.ndarray) -> bool:
    """Q8_0 quantises rows in blocks of 32: the 2-D weights whose rows are a whole number of blocks."""
    return array.ndim == 2 and array.shape[-1] % 32 == 0


def write_gguf(state: dict, path: Path) -> Path:
    """A GGUF as ComfyUI-GGUF's converter makes them for Wan: arch "wan", original names without a prefix, Q8_0
    for the weights it can quantise, F16 for the other 2-D weights, F32 for the rest (norms, biases,
    modulation, the 5-D patch embedding)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "wan")
    for name, tensor in state.items():
        array = tensor.float().numpy()
        if q8_rows(array):
            writer.add_tensor(name, gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array.astype(np.float16) if array.ndim == 2 else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
