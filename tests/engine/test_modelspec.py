"""Model specs: known shapes match what diffusers builds; files give sizes without loading weights."""
from __future__ import annotations

import pytest

from engine.models.spec import KNOWN_MODELS, VAE21_PARAMS, VAE22_PARAMS, spec_for, spec_from_folder

SHAPES = {
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": dict(num_attention_heads=12, ffn_dim=8960, num_layers=30, in_channels=16),
    "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40,
                                                 in_channels=36, image_dim=1280, added_kv_proj_dim=5120),
    "Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40,
                                                   in_channels=36, image_dim=1280, added_kv_proj_dim=5120,
                                                   pos_embed_seq_len=514),
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": dict(num_attention_heads=24, ffn_dim=14336, num_layers=30, in_channels=48,
                                            out_channels=48),
}


@pytest.mark.parametrize("ref", SHAPES)
def test_known_transformer_sizes_match_a_meta_build(ref):
    from accelerate import init_empty_weights
    from diffusers import WanTransformer3DModel

    config = dict(patch_size=(1, 2, 2), attention_head_dim=128, text_dim=4096, freq_dim=256, cross_attn_norm=True,
                  qk_norm="rms_norm_across_heads", **{"out_channels": 16, **SHAPES[ref]})
    with init_empty_weights():
        model = WanTransformer3DModel(**config)
    spec = KNOWN_MODELS[ref].transformer
    assert spec.params == sum(p.numel() for p in model.parameters())
    assert spec.block_params == sum(p.numel() for p in model.blocks[0].parameters())


def test_known_vae_sizes_match_a_meta_build():
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLWan

    with init_empty_weights():
        wan21 = AutoencoderKLWan()
        wan22 = AutoencoderKLWan(base_dim=160, decoder_base_dim=256, z_dim=48, in_channels=12, out_channels=12,
                                 patch_size=2, scale_factor_spatial=16, is_residual=True)
    assert VAE21_PARAMS == sum(p.numel() for p in wan21.parameters())
    assert VAE22_PARAMS == sum(p.numel() for p in wan22.parameters())


def test_the_text_encoders_largest_tensor_is_its_token_embedding():
    """What a streamed text encoder holds on the device at once (UMT5-XXL, as Wan ships it)."""
    from accelerate import init_empty_weights
    from transformers import UMT5Config, UMT5EncoderModel

    from engine.models.spec import UMT5_XXL_EMBEDDING_PARAMS

    config = UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                        feed_forward_proj="gated-gelu")
    with init_empty_weights():
        model = UMT5EncoderModel(config)
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    assert max(sizes, key=sizes.get) == "shared.weight" and max(sizes.values()) == UMT5_XXL_EMBEDDING_PARAMS
    assert KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"].text_encoder_largest_params == UMT5_XXL_EMBEDDING_PARAMS


def test_token_count():
    spec = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
    assert spec.tokens(832, 480, 81) == 32760   # 21 latent frames x 30 x 52
    assert KNOWN_MODELS["Wan-AI/Wan2.2-TI2V-5B-Diffusers"].tokens(1280, 704, 121) == 31 * 22 * 40


def test_spec_from_files_reads_headers_and_configs(model_dirs):
    import torch
    from diffusers import WanTransformer3DModel

    spec = spec_from_folder(model_dirs["tiny-i2v"])
    model = WanTransformer3DModel.from_pretrained(model_dirs["tiny-i2v"] / "transformer")
    assert spec.transformer.params == sum(p.numel() for p in model.parameters())
    assert spec.transformer.block_params == sum(p.numel() for p in model.blocks[0].parameters())
    assert spec.transformer.in_channels == 36 and spec.image_encoder_params > 0 and spec.vae_spatial == 8
    from transformers import UMT5EncoderModel
    text_encoder = UMT5EncoderModel.from_pretrained(model_dirs["tiny-i2v"] / "text_encoder")
    assert spec.text_encoder_largest_params == max(p.numel() for p in text_encoder.parameters())
    assert spec_for("tiny", model_dirs["tiny-t2v"]).image_encoder_params == 0
    assert spec_for("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") == KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
    assert spec_for("someone/unknown") is None
    assert torch.is_tensor(next(model.parameters()))


@pytest.mark.parametrize("ref", ["selftest-t2v", "selftest-i2v"])
def test_selftest_specs_match_the_built_models(ref, selftest_models_dir):
    from engine.models.spec import SELFTEST_SPECS

    built = spec_for(ref, selftest_models_dir / ref)   # the built files, and the clip length the table knows
    assert SELFTEST_SPECS[ref] == built and built.window_frames == 125


@pytest.mark.process
def test_two_processes_building_the_selftest_model_at_once(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = "import sys; from engine.models.selftest import ensure_selftest_model; ensure_selftest_model('selftest-t2v', sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["selftest-t2v"]
    assert (tmp_path / "selftest-t2v" / "model_index.json").is_file()
