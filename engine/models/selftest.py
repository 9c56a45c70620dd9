"""Built-in self-test models: tiny random-weight Wan pipelines built locally.

They let a fresh install exercise every mode offline. Their output is noise,
and every output made with them says so.
"""
from __future__ import annotations

from pathlib import Path

SELFTEST_T2V = "selftest-t2v"
SELFTEST_I2V = "selftest-i2v"
SELFTEST_REFS = (SELFTEST_T2V, SELFTEST_I2V)

# Seed for the random weights, so every install builds the same tiny model.
_WEIGHT_SEED = 0
# Tiny tokenizer vocabulary: enough pieces for any prompt to tokenize.
_VOCAB_PIECES = ["<pad>", "</s>", "<unk>"] + [chr(c) for c in range(32, 127)] + ["▁"]
_TEXT_DIM = 32


def _tokenizer():
    from transformers import T5Tokenizer

    vocab = [(piece, 0.0) for piece in _VOCAB_PIECES]
    return T5Tokenizer(vocab=vocab, extra_ids=0)


def _text_encoder():
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=len(_VOCAB_PIECES), d_model=_TEXT_DIM, d_kv=8, d_ff=64,
        num_layers=2, num_heads=4, relative_attention_num_buckets=8,
    )
    return UMT5EncoderModel(config)


def _vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )


# Tokens the tiny CLIP gives per image: a 32x32 image in 1-pixel patches, plus the class token.
_IMAGE_TOKENS = 32 * 32 + 1


def _transformer(image_to_video: bool, first_last: bool = False):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
        in_channels=36 if image_to_video else 16, out_channels=16,
        text_dim=_TEXT_DIM, freq_dim=256, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
        image_dim=4 if image_to_video else None,
        pos_embed_seq_len=2 * _IMAGE_TOKENS if first_last else None,
    )


def _image_encoder():
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(
        hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2,
        image_size=32, intermediate_size=16, patch_size=1,
    )
    processor = CLIPImageProcessor(crop_size=32, size=32)
    return CLIPVisionModel(config), processor


def build_selftest_pipeline(ref: str, first_last: bool = False):
    """Build the tiny pipeline named by ``ref`` in memory (random weights, fixed seed); ``first_last``
    makes the image-to-video one a first-and-last-frame model (it then needs a last frame)."""
    import torch
    from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline

    if ref not in SELFTEST_REFS:
        raise ValueError(f"unknown self-test model {ref!r}; choose one of {', '.join(SELFTEST_REFS)}")
    image_to_video = ref == SELFTEST_I2V
    torch.manual_seed(_WEIGHT_SEED)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    parts = dict(
        tokenizer=_tokenizer(), text_encoder=_text_encoder(), vae=_vae(),
        transformer=_transformer(image_to_video, first_last), scheduler=scheduler,
    )
    if image_to_video:
        image_encoder, image_processor = _image_encoder()
        return WanImageToVideoPipeline(image_encoder=image_encoder, image_processor=image_processor, **parts)
    return WanPipeline(**parts)


def write_selftest_fast_decoder(folder: Path) -> Path:
    """A fast decoder of the published layout with random weights, inside the self-test model's folder, so a
    fresh install can run "Fast decode" (and its previews) offline: noise, like everything the model makes."""
    import torch

    from engine.models.fast_decoder_file import MODEL_OWN_FOLDER, random_fast_decoder_state, write_fast_decoder

    path = Path(folder) / MODEL_OWN_FOLDER / "taew2_1.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_fast_decoder(path, random_fast_decoder_state(16, 1, seed=_WEIGHT_SEED, dtype=torch.float16))


# The self-test light VAE's width: the model's VAE (width 3) narrowed, as LightX2V's narrows Wan2.1's 96 to 24.
_LIGHT_VAE_WIDTH = 2


def _light_vae_path(folder: Path) -> Path:
    from engine.models.light_vae_file import LIGHT_VAE_FILES, MODEL_OWN_FOLDER

    return Path(folder) / MODEL_OWN_FOLDER / f"{LIGHT_VAE_FILES[16]}.safetensors"


def write_selftest_light_vae(folder: Path) -> Path:
    """A light VAE (engine/models/light_vae_file.py) for the self-test model's VAE, with random weights, in the
    model's folder, so "Light VAE" runs offline; written whole or not at all."""
    import json

    from engine.atomic import write_atomically
    from engine.models.light_vae_file import random_light_vae, write_light_vae

    config = json.loads((Path(folder) / "vae" / "config.json").read_text(encoding="utf-8"))
    path = _light_vae_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    light = random_light_vae(config, _LIGHT_VAE_WIDTH, seed=_WEIGHT_SEED)
    return write_atomically(path, lambda temporary: write_light_vae(temporary, light))


def selftest_built(ref: str, models_dir: Path) -> bool:
    """Whether the self-test model ``ref`` has been built in ``models_dir`` already."""
    return (Path(models_dir) / ref / "model_index.json").is_file()


def ensure_selftest_model(ref: str, models_dir: Path) -> Path:
    """Return the folder of a self-test model, building and saving it on first use."""
    import shutil
    import tempfile

    folder = Path(models_dir) / ref
    if selftest_built(ref, models_dir):
        if not _light_vae_path(folder).is_file():   # built before the light VAE was offered
            write_selftest_light_vae(folder)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Build in a private folder and rename it into place: two processes building at once
    # never see each other's half-written files; the loser's copy is discarded.
    tmp = Path(tempfile.mkdtemp(prefix=f".{ref}-", dir=folder.parent))
    try:
        build_selftest_pipeline(ref).save_pretrained(tmp)
        write_selftest_fast_decoder(tmp)
        write_selftest_light_vae(tmp)
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / "model_index.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
