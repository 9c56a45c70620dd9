"""Real-size Wan components with random weights, built on the GPU (no download needed).

Used by the memory calibration and validation scripts on a lent GPU. The
shapes are the released models' (engine/models/spec.py); only the weights are random.
"""
from __future__ import annotations

import torch

TRANSFORMER_BASE = dict(patch_size=(1, 2, 2), attention_head_dim=128, text_dim=4096, freq_dim=256,
                        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
TRANSFORMERS = {
    "wan21-1.3b": dict(num_attention_heads=12, ffn_dim=8960, num_layers=30, in_channels=16, out_channels=16),
    "wan21-t2v-14b": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=16, out_channels=16),
    "wan21-i2v-14b": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=36, out_channels=16,
                          image_dim=1280, added_kv_proj_dim=5120),
    "wan22-5b": dict(num_attention_heads=24, ffn_dim=14336, num_layers=30, in_channels=48, out_channels=48),
}
VAE22 = dict(base_dim=160, decoder_base_dim=256, z_dim=48, in_channels=12, out_channels=12, patch_size=2,
             scale_factor_spatial=16, is_residual=True, latents_mean=[0.0] * 48, latents_std=[1.0] * 48)


def _on_gpu(build, dtype):
    """Construct on the GPU directly in ``dtype`` (fast random init, no full-precision copy)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            module = build()
    finally:
        torch.set_default_dtype(previous)
    return module.to(dtype).eval().requires_grad_(False)


def transformer(name: str, dtype=torch.bfloat16):
    from diffusers import WanTransformer3DModel
    return _on_gpu(lambda: WanTransformer3DModel(**TRANSFORMER_BASE, **TRANSFORMERS[name]), dtype)


def vae(wan22: bool = False, dtype=torch.float32):
    from diffusers import AutoencoderKLWan
    return _on_gpu(lambda: AutoencoderKLWan(**VAE22) if wan22 else AutoencoderKLWan(), dtype)


def text_encoder(dtype=torch.bfloat16):
    from transformers import UMT5Config, UMT5EncoderModel
    config = UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                        feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    model = _on_gpu(lambda: UMT5EncoderModel(config), dtype)
    model.encoder.embed_tokens = model.shared   # one embedding table, as in the released checkpoint
    return model


def image_encoder(dtype=torch.bfloat16):
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel
    config = CLIPVisionConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                              patch_size=14, image_size=224, projection_dim=1024)
    return _on_gpu(lambda: CLIPVisionModel(config), dtype), CLIPImageProcessor()


def tokenizer():
    from engine.models.selftest import _tokenizer
    return _tokenizer()


def latent_shape(width, height, frames, z=16, spatial=8):
    return (1, z, (frames - 1) // 4 + 1, height // spatial, width // spatial)


# How the published repositories store each component (tests/fixtures/published/ holds their headers): the dtype of
# each component, in shards of at most 5 GB (diffusers' conversion script) with an index file beside them.
PUBLISHED_SHARD_SIZE = "5GB"
PUBLISHED_DTYPES = {
    "wan21": {"transformer": "float32", "text_encoder": "float32", "vae": "float32", "image_encoder": "bfloat16"},
    "fastwan": {"transformer": "bfloat16", "text_encoder": "float32", "vae": "float32"},
    "wan22": {"transformer": "float32", "transformer_2": "float32", "text_encoder": "bfloat16", "vae": "float32"},
}


def save_as_published(pipe, folder, family: str | None = "wan21", shard_size: str = PUBLISHED_SHARD_SIZE) -> None:
    """Save ``pipe`` as its published repository stores it: each component in the published dtype of ``family`` (None:
    as they are), in shards of ``shard_size`` with index files (a load then reads what users download: twice the bytes
    of bf16 for Wan2.1's float32 files)."""
    for name, dtype in PUBLISHED_DTYPES.get(family, {}).items():
        component = getattr(pipe, name, None)
        if component is not None:
            component.to(getattr(torch, dtype))
    pipe.save_pretrained(folder, max_shard_size=shard_size)


# FastVideo's name for the gate of FastWan's sparse attention: a linear layer in every block.
FASTWAN_GATE = "to_gate_compress"


def with_gate(pipe, gate: str = FASTWAN_GATE, seed: int = 7):
    """``pipe`` with a transformer of the same weights and a random gate in every block, as FastWan's has."""
    from engine.run.gated import gated_transformer_class

    plain = pipe.transformer
    with torch.device(plain.device):
        gated = gated_transformer_class(gate)(**plain.config).to(plain.dtype)
    missing, unexpected = gated.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(gate in name for name in missing)
    generator = torch.Generator(plain.device.type).manual_seed(seed)
    with torch.no_grad():
        for name, tensor in gated.named_parameters():
            if gate in name:
                tensor.copy_(torch.randn(tensor.shape, generator=generator, device=plain.device) * 0.02)
    pipe.transformer = gated.eval().requires_grad_(False)
    return pipe


def save_as_fastwan(pipe, folder, family: str | None = "fastwan", shard_size: str = PUBLISHED_SHARD_SIZE) -> None:
    """Save ``pipe`` as FastVideo publishes FastWan: its transformer with the sparse attention's gate (with_gate),
    the pipeline named as FastVideo names it (name_as_fastwan)."""
    save_as_published(with_gate(pipe), folder, family, shard_size)
    name_as_fastwan(folder)


def name_as_fastwan(folder) -> None:
    """FastWan's names in a saved folder: ``WanDMDPipeline`` in model_index.json, and diffusers' transformer class in
    it and in the transformer's config (a gated transformer saves its own class's name)."""
    import json
    from pathlib import Path

    index_file, config_file = Path(folder) / "model_index.json", Path(folder) / "transformer" / "config.json"
    index = json.loads(index_file.read_text())
    index.update(_class_name="WanDMDPipeline", transformer=["diffusers", "WanTransformer3DModel"])
    index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    config = json.loads(config_file.read_text())
    config["_class_name"] = "WanTransformer3DModel"
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
