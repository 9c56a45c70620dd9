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
