"""How many tensors the published Wan files hold, and how long their safetensors headers are: the figures the
header limits of engine/models/weights.py are set from (about twice the largest).

    python bench/header_sizes.py docs/data/header-sizes.json

Every model is built on the "meta" device (shapes only, no memory, nothing downloaded) from the released
configs (bench/realsize.py, docs/reference-figures.md, "Real model shapes"); its tensors are counted and the header a
safetensors file of them would have is written out as the library writes it (compact JSON padded to 8 bytes),
in bf16: in diffusers' names, in the original Wan names under ComfyUI's ``model.diffusion_model.`` prefix (the
names checked by converting them back with diffusers' own converter), the same as ComfyUI's "fp8 scaled" (a
``scale_weight`` and a ``scale_input`` beside every 2-D weight), a LoRA on every linear layer of Wan2.1 I2V 14B
(``lora_down`` / ``lora_up`` / ``alpha`` / ``diff_b`` per linear layer, ``diff`` for every other tensor, rank
128), and the UMT5-XXL text encoder and CLIP ViT-H image encoder. The header estimate is checked against a real
file written by safetensors.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.realsize import TRANSFORMER_BASE, TRANSFORMERS  # noqa: E402

PREFIX = "model.diffusion_model."   # ComfyUI's checkpoints
LORA_PREFIX = "diffusion_model."      # Kijai's, ComfyUI's and lightx2v's LoRAs
LORA_RANK = 128                       # the largest rank lightx2v publishes
BF16 = 2
# Transformers beyond bench/realsize.py's: Wan2.1 FLF2V 14B (a position table for its two images' tokens) and
# Wan2.1 VACE 14B (8 extra blocks that read the control video).
MORE = {
    "wan21-flf2v-14b": {**TRANSFORMERS["wan21-i2v-14b"], "pos_embed_seq_len": 2 * 257},
    "wan21-vace-14b": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=16, out_channels=16,
                           vace_layers=list(range(0, 40, 5)), vace_in_channels=96),
}

# An original name diffusers 0.42's converter leaves as it is (FLF2V's position table), and the name it has in
# diffusers' model.
UNCONVERTED = {"img_emb.emb_pos": "condition_embedder.image_embedder.pos_embed"}


def header_bytes(shapes: dict[str, tuple[int, ...]], per_element: int = BF16, dtype: str = "BF16") -> int:
    """The length of a safetensors header for tensors of ``shapes`` (the 8-byte length not counted)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        count = 1
        for dim in shape:
            count *= dim
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + count * per_element]}
        offset += count * per_element
    length = len(json.dumps(header, separators=(",", ":")).encode())
    return length + (-length) % 8


def figures(shapes: dict[str, tuple[int, ...]]) -> dict:
    return {"tensors": len(shapes), "header_bytes": header_bytes(shapes)}


def on_meta(build):
    import torch

    with torch.device("meta"):
        return build()


def transformer_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    from diffusers import WanTransformer3DModel, WanVACETransformer3DModel

    kind = WanVACETransformer3DModel if "vace_layers" in config else WanTransformer3DModel
    model = on_meta(lambda: kind(**TRANSFORMER_BASE, **config))
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def original_names(config: dict) -> list[str]:
    """The original Wan checkpoint's tensor names for ``config`` (the Wan repo's WanModel)."""
    names = ["patch_embedding.weight", "patch_embedding.bias", "head.head.weight", "head.head.bias", "head.modulation"]
    names += [f"{part}.{end}" for part in ("text_embedding.0", "text_embedding.2", "time_embedding.0",
                                           "time_embedding.2", "time_projection.1") for end in ("weight", "bias")]
    image = config.get("image_dim") is not None
    if image:
        names += [f"img_emb.proj.{i}.{end}" for i in (0, 1, 3, 4) for end in ("weight", "bias")]
    if config.get("pos_embed_seq_len"):
        names.append("img_emb.emb_pos")
    for block in range(config["num_layers"]):
        names += _block_names(f"blocks.{block}", image)
    for number, _ in enumerate(config.get("vace_layers", ())):
        names += _block_names(f"vace_blocks.{number}", False)
        names += [f"vace_blocks.{number}.after_proj.{end}" for end in ("weight", "bias")]
        if number == 0:
            names += [f"vace_blocks.0.before_proj.{end}" for end in ("weight", "bias")]
    if config.get("vace_layers"):
        names += ["vace_patch_embedding.weight", "vace_patch_embedding.bias"]
    return names


def _block_names(block: str, image: bool) -> list[str]:
    linears = [f"self_attn.{p}" for p in "qkvo"] + [f"cross_attn.{p}" for p in "qkvo"] + ["ffn.0", "ffn.2", "norm3"]
    if image:
        linears += ["cross_attn.k_img", "cross_attn.v_img"]
    names = [f"{block}.{layer}.{end}" for layer in linears for end in ("weight", "bias")]
    norms = ["self_attn.norm_q", "self_attn.norm_k", "cross_attn.norm_q", "cross_attn.norm_k"]
    norms += ["cross_attn.norm_k_img"] if image else []
    return names + [f"{block}.{norm}.weight" for norm in norms] + [f"{block}.modulation"]


def original_shapes(config: dict, diffusers_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The original names with their tensors' shapes, found by running diffusers' own converter over them: each
    original name must land on a diffusers name, every diffusers name must be reached."""
    import torch
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    names = original_names(config)
    marked = {name: torch.empty(0, device="meta") for name in names}
    owner = {id(tensor): name for name, tensor in marked.items()}
    converted = convert_wan_transformer_to_diffusers(dict(marked))
    converted = {UNCONVERTED.get(name, name): tensor for name, tensor in converted.items()}
    if set(converted) != set(diffusers_shapes):
        missing, extra = set(diffusers_shapes) - set(converted), set(converted) - set(diffusers_shapes)
        raise SystemExit(f"original names do not convert onto the model's: missing {sorted(missing)[:5]}, "
                         f"extra {sorted(extra)[:5]}")
    return {owner[id(tensor)]: diffusers_shapes[name] for name, tensor in converted.items()}


def fp8_scaled(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """ComfyUI's "fp8 scaled" file of the same tensors: a scale_weight and a scale_input beside each 2-D weight."""
    scaled = {"scaled_fp8": (0,)}
    for name, shape in shapes.items():
        scaled[name] = shape
        if name.endswith(".weight") and len(shape) == 2:
            stem = name.removesuffix(".weight")
            scaled[f"{stem}.scale_weight"] = ()
            scaled[f"{stem}.scale_input"] = ()
    return scaled


def lora_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A LoRA of every linear layer of ``shapes`` (original names), with a difference for everything else."""
    lora = {}
    for name, shape in shapes.items():
        stem = name.removesuffix(".weight")
        if name.endswith(".weight") and len(shape) == 2:
            rows, columns = shape
            lora[f"{LORA_PREFIX}{stem}.lora_down.weight"] = (LORA_RANK, columns)
            lora[f"{LORA_PREFIX}{stem}.lora_up.weight"] = (rows, LORA_RANK)
            lora[f"{LORA_PREFIX}{stem}.alpha"] = ()
        elif name.endswith(".bias") and f"{name[:-5]}.weight" in shapes and len(shapes[f"{name[:-5]}.weight"]) == 2:
            lora[f"{LORA_PREFIX}{name.removesuffix('.bias')}.diff_b"] = shape
        else:
            lora[f"{LORA_PREFIX}{stem}.diff"] = shape
    return lora


def encoder_shapes(build) -> dict[str, tuple[int, ...]]:
    model = on_meta(build)
    return {name: tuple(tensor.shape) for name, tensor in model.named_parameters()}


def text_encoder():
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                                       num_heads=64, feed_forward_proj="gated-gelu", tie_word_embeddings=False))


def image_encoder():
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    return CLIPVisionModelWithProjection(CLIPVisionConfig(hidden_size=1280, intermediate_size=5120,
                                                          num_hidden_layers=32, num_attention_heads=16, patch_size=14,
                                                          image_size=224, projection_dim=1024))


def estimate_checked(folder: Path) -> dict:
    """The estimate against a real file: a small model saved by safetensors, its header length read back."""
    import struct

    import torch
    from safetensors.torch import save_file

    shapes = {f"blocks.{i}.self_attn.q.weight": (64, 32 + i) for i in range(40)}
    path = folder / "check.safetensors"
    save_file({name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in shapes.items()}, str(path))
    with open(path, "rb") as f:
        (real,) = struct.unpack("<Q", f.read(8))
    path.unlink()
    return {"estimated": header_bytes(shapes), "written_by_safetensors": real}


def main() -> None:
    import tempfile

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    results: dict = {"how": __doc__.split("\n\n")[2].replace("\n", " ")}
    configs = {**TRANSFORMERS, **MORE}
    for name, config in configs.items():
        shapes = transformer_shapes(config)
        original = {PREFIX + key: shape for key, shape in original_shapes(config, shapes).items()}
        results[name] = {"diffusers": figures(shapes), "original_prefixed": figures(original),
                         "original_prefixed_fp8_scaled": figures(fp8_scaled(original))}
        if name == "wan21-i2v-14b":
            results["lora-every-linear-wan21-i2v-14b"] = figures(
                lora_shapes(original_shapes(config, shapes)))
    results["umt5-xxl-text-encoder"] = figures(encoder_shapes(text_encoder))
    results["umt5-xxl-text-encoder"]["fp8_scaled"] = figures(fp8_scaled(encoder_shapes(text_encoder)))
    results["clip-vit-h-image-encoder"] = figures(encoder_shapes(image_encoder))
    with tempfile.TemporaryDirectory() as folder:
        results["estimate_check"] = estimate_checked(Path(folder))
    counted = [(where, value) for where, value in _walk(results)]
    results["largest"] = {"tensors": max(v["tensors"] for _, v in counted),
                          "header_bytes": max(v["header_bytes"] for _, v in counted),
                          "tensors_in": max(counted, key=lambda c: c[1]["tensors"])[0],
                          "header_bytes_in": max(counted, key=lambda c: c[1]["header_bytes"])[0]}
    text = json.dumps(results, indent=2)
    if out:
        out.write_text(text + "\n")
    print(text)


def _walk(node, where: str = ""):
    """(path, figures) of every {"tensors", "header_bytes"} in the results."""
    if isinstance(node, dict):
        if "tensors" in node and "header_bytes" in node:
            yield where, {"tensors": node["tensors"], "header_bytes": node["header_bytes"]}
        for key, value in node.items():
            if isinstance(value, dict):
                yield from _walk(value, f"{where}/{key}" if where else key)


if __name__ == "__main__":
    main()
