"""What the planner needs to know about a model, before or after it is downloaded.

Known Wan models carry their shapes and parameter counts (derived from their
configs; tests re-derive them on the meta device). When the files are on
disk, sizes and shapes come from the safetensors headers and configs instead,
without loading a weight.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from engine.models.weights import Headers, component_headers, stored_bytes_per_param, tensor_params

# Parameter counts as the published files hold them (tests/fixtures/published/: each repository's headers).
UMT5_XXL_PARAMS = 5_680_910_336     # 24 layers, d_model 4096, gated FFN 10240, 256k vocab (the embedding stored once)
UMT5_XXL_EMBEDDING_PARAMS = 256_384 * 4096   # its largest tensor: the token embedding
CLIP_VIT_H_PARAMS = 632_076_800     # image encoder of Wan2.1 I2V and FLF2V: ViT-H/14 with its 1280x1024 projection
VAE21_PARAMS = 126_892_531
VAE22_PARAMS = 704_688_668
TEXT_TOKENS = 512   # Wan's pipelines encode 512 tokens; the I2V transformer needs exactly that
# A pipeline's transformers, by component name: the one of every model, and Wan2.2 A14B's two experts (the
# high-noise ``transformer`` first, the low-noise ``transformer_2``).
TRANSFORMERS = ("transformer", "transformer_2")
# The transformer's input channels of an image-to-video model: 16 of noise, 4 of the first frame's mask and 16 of
# its latents.
I2V_IN_CHANNELS = 36


@dataclass(frozen=True)
class TransformerShape:
    layers: int
    heads: int
    head_dim: int
    ffn: int
    in_channels: int
    params: int
    block_params: int            # one transformer block
    patch: int = 2               # spatial patch size
    patch_t: int = 1             # temporal patch size
    # Rows of the rotary position table along each axis (frames, height, width, in patches): the
    # largest latent grid the transformer can place. 1024 for every published Wan model.
    rope_max_seq_len: int = 1024
    # FLF2V's: a position embedding for the tokens of its two images (first and last frame).
    first_last: bool = False
    # FastWan's: each block has the gate of the sparse attention it was trained with, a dim x dim linear layer
    # counted in ``params`` and ``block_params``; this is its path inside a block as the files name it
    # ("to_gate_compress" in FastVideo's published layout), "" for a transformer without one.
    gate: str = ""

    @property
    def gated(self) -> bool:
        return bool(self.gate)

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def shared_params(self) -> int:
        """Parameters outside the repeated blocks (embeddings, head): always resident."""
        return self.params - self.layers * self.block_params


@dataclass(frozen=True)
class TransformerWeights:
    """One transformer's weights taken from a single file (engine/models/single_file.py), as memory counts them.

    ``quantized_bytes`` stay as stored once loaded (GGUF's quantised tensors, dequantised layer by layer as
    they compute); the other ``params - quantized_params`` are held at the compute dtype (every tensor of a
    safetensors file, a GGUF file's F32/F16 norms and biases). ``staging_bytes``: RAM the load holds on top of
    the loaded weights while it converts them (a safetensors file is read whole, then cast and renamed).
    """
    source: tuple[str, int, int]     # (path, bytes, modification time in ns): another file is another load
    quantization: str                # "Q8_0", "Q4_K", "bf16", "fp8_e4m3fn scaled", ...
    params: int
    quantized_params: int = 0
    quantized_bytes: int = 0
    staging_bytes: int = 0

    @property
    def quantized(self) -> bool:
        return self.quantized_bytes > 0

    def loaded_bytes(self, bytes_per_param: float) -> float:
        return self.quantized_bytes + (self.params - self.quantized_params) * bytes_per_param


@dataclass(frozen=True)
class SmallWork:
    """What a model too small for its arithmetic to count costs, phase by phase, in this machine's small operations
    (the calibration's ``small_op_seconds``): its calls, and its narrow layers' work per pixel, which the rates
    measured at the released widths do not tell (engine/planning/small_work.py turns it into seconds)."""
    load: float            # reading and building it
    transfer: float        # placing it
    prompt: float          # a prompt's first encode after a load
    image: float           # the image's encode (image to video)
    pass_fixed: float      # a transformer pass
    pass_token: float      # ... and per token of it
    encode_pixel: float    # the VAE's encoder, per pixel of each frame it encodes (image to video's condition)
    video_fixed: float     # a video-to-video input read and encoded
    video_pixel: float     # ... per pixel of each of its frames
    decode_fixed: float    # the VAE's decode
    decode_latent: float   # ... per latent frame
    decode_pixel: float    # ... and per output pixel of each latent frame


@dataclass(frozen=True)
class ModelSpec:
    name: str
    transformer: TransformerShape
    text_encoder_params: int = UMT5_XXL_PARAMS
    text_encoder_largest_params: int = UMT5_XXL_EMBEDDING_PARAMS   # its biggest tensor (what streaming holds)
    image_encoder_params: int = 0
    vae_params: int = VAE21_PARAMS
    vae_spatial: int = 8
    vae_temporal: int = 4
    vae_z: int = 16
    experts: int = 1                     # Wan2.2 A14B has two transformers of the same shape
    expand_timesteps: bool = False       # Wan2.2-5B: a timestep (and modulation) per token
    # The clip length the model was trained on (its window for longer videos: engine/models/windows.py); 0: by
    # its kind, 121 frames for Wan2.2 TI2V-5B and 81 for the others.
    clip_frames: int = 0
    # Single files in place of the model's own transformers, one entry per expert (None: the model's own).
    transformer_files: tuple[TransformerWeights | None, ...] = ()
    # How wide each component is stored, (component, bytes per parameter) from its files' headers (the published
    # Wan2.1 repositories keep their transformers and text encoder in float32: 4); () when the files are not known.
    stored: tuple[tuple[str, float], ...] = ()
    # A model too small for its arithmetic to count (the self-test models); None: the time model's work over rates.
    small_work: SmallWork | None = None

    def stored_width(self, component: str) -> float:
        """Bytes per parameter ``component`` is stored in; 0 when not known."""
        return dict(self.stored).get(component, 0.0)

    def transformer_file(self, expert: int) -> TransformerWeights | None:
        return self.transformer_files[expert] if expert < len(self.transformer_files) else None

    @property
    def quantized_transformer(self) -> bool:
        """Every transformer stays quantised once loaded (GGUF files): fp8 storage has nothing to add."""
        return all((file := self.transformer_file(e)) is not None and file.quantized for e in range(self.experts))

    @property
    def size_multiple(self) -> int:
        return self.vae_spatial * self.transformer.patch

    @property
    def image_to_video(self) -> bool:
        """An image-to-video-only model: its transformer takes the image's latents beside the noise (36 input
        channels: Wan2.1 I2V and FLF2V, Wan2.2 I2V A14B), so it needs a first frame."""
        return self.transformer.in_channels == I2V_IN_CHANNELS and not self.expand_timesteps

    @property
    def takes_image(self) -> bool:
        """It can start from an image: an image-to-video model, or Wan2.2 TI2V-5B (text or image)."""
        return self.image_to_video or self.expand_timesteps

    @property
    def first_last(self) -> bool:
        """A first-and-last-frame model (FLF2V): it needs a last frame, and no other model can take one."""
        return self.transformer.first_last

    @property
    def wan22_vae(self) -> bool:
        return self.vae_z == 48

    @property
    def max_frames(self) -> int:
        """The most video frames the transformer's position table covers (in one pass: a window's most)."""
        latent_frames = self.transformer.rope_max_seq_len * self.transformer.patch_t
        return (latent_frames - 1) * self.vae_temporal + 1

    @property
    def window_frames(self) -> int:
        """The frames the transformer sees at once in a longer video, unless the settings give a window."""
        own = self.clip_frames or (121 if self.expand_timesteps else 81)
        return min(own, self.max_frames)

    @property
    def max_side(self) -> int:
        """The widest (or tallest) frame in pixels the transformer's position table covers."""
        return self.transformer.rope_max_seq_len * self.transformer.patch * self.vae_spatial

    def tokens(self, width: int, height: int, frames: int) -> int:
        latent_frames = (frames - 1) // self.vae_temporal + 1
        cell = self.vae_spatial * self.transformer.patch
        return latent_frames * (height // cell) * (width // cell)


_T13 = TransformerShape(30, 12, 128, 8960, 16, 1_418_996_800, 46_440_704)
# FastWan 1.3B: the 1.3B with a 1536 x 1536 gate and its bias in each of its 30 blocks.
GATE_PARAMS_13 = 1536 * 1536 + 1536
_T13_GATED = replace(_T13, params=_T13.params + 30 * GATE_PARAMS_13, block_params=_T13.block_params + GATE_PARAMS_13,
                     gate="to_gate_compress")
_T14 = TransformerShape(40, 40, 128, 13824, 16, 14_288_491_584, 351_394_304)
_T14_I2V = TransformerShape(40, 40, 128, 13824, 36, 16_394_878_784, 403_838_464)
_T5B = TransformerShape(30, 24, 128, 14336, 48, 4_999_787_712, 163_656_704)
# FLF2V: the I2V transformer with a position embedding for its two images' tokens (2 x 257 rows of 1280).
_T14_FLF = replace(_T14_I2V, params=_T14_I2V.params + 514 * 1280, first_last=True)
_TA14_I2V = TransformerShape(40, 40, 128, 13824, 36, 14_288_901_184, 351_394_304)

def stored_widths(**widths: float) -> tuple[tuple[str, float], ...]:
    """``ModelSpec.stored`` from bytes per parameter by component name, in the order a folder's headers give it."""
    return tuple(sorted(widths.items()))


# How the published repositories store their weights (tests/fixtures/published/: the headers of each): Wan2.1's
# transformers, text encoder and VAE in float32, its CLIP in bf16; FastWan's transformer in bf16; Wan2.2's transformers
# and VAE in float32, its text encoder in bf16.
_WAN21 = stored_widths(transformer=4.0, text_encoder=4.0, vae=4.0)
_WAN21_I2V = stored_widths(transformer=4.0, text_encoder=4.0, vae=4.0, image_encoder=2.0)
_FASTWAN = stored_widths(transformer=2.0, text_encoder=4.0, vae=4.0)
_WAN22 = stored_widths(transformer=4.0, text_encoder=2.0, vae=4.0)
_WAN22_A14B = stored_widths(transformer=4.0, transformer_2=4.0, text_encoder=2.0, vae=4.0)

KNOWN_MODELS: dict[str, ModelSpec] = {
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": ModelSpec("Wan2.1 T2V 1.3B", _T13, stored=_WAN21),
    "FastVideo/FastWan2.1-T2V-1.3B-Diffusers": ModelSpec("FastWan2.1 T2V 1.3B", _T13_GATED, stored=_FASTWAN),
    "Wan-AI/Wan2.1-T2V-14B-Diffusers": ModelSpec("Wan2.1 T2V 14B", _T14, stored=_WAN21),
    "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers": ModelSpec("Wan2.1 I2V 14B 480P", _T14_I2V, image_encoder_params=CLIP_VIT_H_PARAMS,
                                                      stored=_WAN21_I2V),
    "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers": ModelSpec("Wan2.1 I2V 14B 720P", _T14_I2V, image_encoder_params=CLIP_VIT_H_PARAMS,
                                                      stored=_WAN21_I2V),
    "Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers": ModelSpec("Wan2.1 FLF2V 14B 720P", _T14_FLF,
                                                        image_encoder_params=CLIP_VIT_H_PARAMS, stored=_WAN21_I2V),
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": ModelSpec("Wan2.2 TI2V 5B", _T5B, vae_params=VAE22_PARAMS, vae_spatial=16, vae_z=48,
                                                 expand_timesteps=True, stored=_WAN22),
    "Wan-AI/Wan2.2-T2V-A14B-Diffusers": ModelSpec("Wan2.2 T2V A14B", _T14, experts=2, stored=_WAN22_A14B),
    "Wan-AI/Wan2.2-I2V-A14B-Diffusers": ModelSpec("Wan2.2 I2V A14B", _TA14_I2V, experts=2, stored=_WAN22_A14B),
}


# The built-in self-test models (engine/models/selftest.py), so a plan needs no build; a test checks
# these against the built folders (saved in float32).
_TINY = TransformerShape(2, 2, 12, 32, 16, 28_328, 6_680, rope_max_seq_len=32)
# Their window: all that their 32-row position table covers, so that a long self-test video has few windows.
SELFTEST_CLIP_FRAMES = 125
# Their phases in small operations, fitted on the project's 2-core CPU by bench/small_work.py
# (docs/data/small-work-cpu.json); the decode's fixed part there (4340, 0.05 s) is the streamed export's encoder
# starting, which the time model counts for every model (engine/planning/export_time.py STREAM_START_FIXED).
SELFTEST_WORK = SmallWork(load=4240, transfer=810, prompt=1440, image=640, pass_fixed=193, pass_token=0.53,
                          encode_pixel=0.052, video_fixed=5870, video_pixel=0.040, decode_fixed=0,
                          decode_latent=161, decode_pixel=0.27)
SELFTEST_SPECS: dict[str, ModelSpec] = {
    "selftest-t2v": ModelSpec("selftest-t2v", _TINY, text_encoder_params=23_872,
                              text_encoder_largest_params=3_168, vae_params=13_861, clip_frames=SELFTEST_CLIP_FRAMES,
                              stored=_WAN21, small_work=SELFTEST_WORK),
    "selftest-i2v": ModelSpec("selftest-i2v", replace(_TINY, in_channels=36, params=30_444),
                              text_encoder_params=23_872, clip_frames=SELFTEST_CLIP_FRAMES,
                              text_encoder_largest_params=3_168, image_encoder_params=4_620, vae_params=13_861,
                              stored=stored_widths(transformer=4.0, text_encoder=4.0, vae=4.0, image_encoder=4.0),
                              small_work=SELFTEST_WORK),
}


def spec_from_folder(folder: Path, name: str | None = None, headers: dict[str, Headers] | None = None) -> ModelSpec:
    """Read shapes from the configs and sizes from the safetensors headers (no weights loaded); ``headers``: the
    weight files' headers by component when they are not in the folder (a Hub repo's, fetched before its weights:
    engine/models/hub_metadata.py)."""
    folder = Path(folder)
    config = json.loads((folder / "transformer" / "config.json").read_text())
    index = json.loads((folder / "model_index.json").read_text())
    vae = json.loads((folder / "vae" / "config.json").read_text())
    headers = component_headers(folder) if headers is None else headers
    tensors = {part: tensor_params(files) for part, files in headers.items()}
    params = {part: sum(counts.values()) for part, counts in tensors.items()}
    block_params = _block_params(tensors.get("transformer", {}), config["num_layers"])
    patch = config.get("patch_size") or [1, 2, 2]
    shape = TransformerShape(
        layers=config["num_layers"], heads=config["num_attention_heads"], head_dim=config["attention_head_dim"],
        ffn=config["ffn_dim"], in_channels=config["in_channels"], params=params.get("transformer", 0),
        block_params=block_params, patch=int(patch[-1]), patch_t=int(patch[0]),
        rope_max_seq_len=int(config.get("rope_max_seq_len", 1024)),
        first_last=bool(config.get("pos_embed_seq_len")), gate=gate_module(tensors.get("transformer", {})))
    return ModelSpec(
        name=name or folder.name, transformer=shape,
        text_encoder_params=params.get("text_encoder", 0),
        text_encoder_largest_params=max(tensors.get("text_encoder", {}).values(), default=0), image_encoder_params=params.get("image_encoder", 0),
        vae_params=params.get("vae", 0), vae_spatial=int(vae.get("scale_factor_spatial", 8)),
        vae_temporal=int(vae.get("scale_factor_temporal", 4)), vae_z=int(vae.get("z_dim", 16)),
        experts=2 if "transformer_2" in index and index["transformer_2"] and index["transformer_2"][0] else 1,
        expand_timesteps=bool(index.get("expand_timesteps", False)),
        stored=tuple(sorted((part, round(stored_bytes_per_param(files), 3)) for part, files in headers.items())))


# Where FastWan's gate sits in a block, by the name its weight has in the transformer's files: in the block itself
# (FastVideo's layout: ``blocks.0.to_gate_compress.weight``) or in its self-attention.
GATE = "to_gate_compress"


def gate_module(tensor_names) -> str:
    """The gate's module path inside a block ("to_gate_compress" or "attn1.to_gate_compress"), "" when the
    transformer has none."""
    prefix = "blocks.0."
    for name in tensor_names:
        if name.startswith(prefix) and name.endswith(f"{GATE}.weight"):
            return name[len(prefix):-len(".weight")]
    return ""


def _block_params(counts: dict[str, int], layers: int) -> int:
    """Parameters of block 0, from the transformer's tensors."""
    block = sum(n for name, n in counts.items() if name.startswith("blocks.0."))
    if block:
        return block
    return sum(counts.values()) // max(layers, 1)


def spec_for(ref: str, folder: Path | None = None, headers: dict[str, Headers] | None = None) -> ModelSpec | None:
    """The spec of a model reference: from its files when present (``headers``: its weight files' headers when
    they are not in the folder yet), else the known table."""
    known = KNOWN_MODELS.get(ref) or SELFTEST_SPECS.get(ref)
    if folder is not None and (Path(folder) / "transformer" / "config.json").is_file():
        spec = spec_from_folder(folder, ref, headers)   # its files say its shapes; its clip length and how
        # small it is, the table alone knows
        return replace(spec, clip_frames=known.clip_frames, small_work=known.small_work) if known else spec
    return replace(known) if known else None
