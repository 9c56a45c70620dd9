"""The memory model: bytes each part of a run needs, from shapes alone.

Every constant is named, says where it comes from, and is calibrated by
``bench/calibrate_memory.py`` on a GPU (results in docs/memory.md).
"""
from __future__ import annotations

from engine.device.hardware import GIB
from engine.models.spec import TEXT_TOKENS, ModelSpec

# The planner speaks GiB throughout, as torch reports memory (engine/device/hardware.py's one definition).

# Calibrated on an H200 with real-size random-weight models (bench/calibrate_memory.py,
# raw figures in docs/data/calibration-h200.json). Each constant is rounded up a few
# percent so that predictions stay at or above what is measured.

# Transformer activations of one forward pass, bytes per token = 2 x (ACT_DIM x width + ACT_FFN x FFN width).
# Fitted to 1.3B (48.8 KB/token) and 14B (114 KB/token) with SDPA flash attention; cond and uncond run
# one after the other, so guidance does not double it.
ACT_DIM = 7.3
ACT_FFN = 1.6
# Wan2.2-5B modulates every token with its own timestep (expand_timesteps): about 36.5 more bytes
# per token per unit of width (measured 199 KB/token against 87 KB predicted without it).
ACT_EXPAND_TIMESTEPS = 38.0
# Math (non-flash) attention materialises fp32 scores: heads x tokens^2 x 4 bytes.
# (832x480x33 on a 14B model: 40 x 14040^2 x 4 B = 29.4 GiB, as seen on ROCm without AOTriton.)
MATH_ATTENTION_BYTES = 4
# Encoder activations: UMT5-XXL, 512 tokens, prompt and negative prompt (measured 0.26 GiB);
# CLIP ViT-H on one 224px image (measured 0.03 GiB).
TEXT_ENCODE_ACT_GB = 0.3
IMAGE_ENCODE_ACT_GB = 0.05
# VAE decode working set at fp32, bytes per output pixel of the frame (untiled) or of the tile:
# the decoder works a few frames at a time, so this does not grow with the clip's length.
# Measured 22,560 B/px (Wan2.1 VAE) and 23,590 B/px (Wan2.2 VAE, untiled), 21,640 B/px (Wan2.2 tiles).
VAE21_PIXEL_BYTES = 23000.0
VAE22_PIXEL_BYTES = 24000.0
VAE22_TILE_PIXEL_BYTES = 22000.0
# ... plus the decoded clip and its copies, bytes per output pixel per frame: 12.2 untiled (the fp32
# output), 16.3 tiled (tiles are kept and blended), 24.8 for Wan2.2 tiles, which also never go below
# 56.1 B per pixel-frame (the blend of all its tiles).
VAE_OUTPUT_BYTES = 12.5
VAE21_TILED_OUTPUT_BYTES = 16.5
VAE22_TILED_OUTPUT_BYTES = 25.0
VAE22_TILED_FLOOR_BYTES = 57.0
VAE_TILES = (512, 384, 256, 192, 128)   # largest first; diffusers' default tile is 256
# Group offload (block level, with a copy stream) holds the shared layers and the blocks in flight
# while the transformer runs: measured 2.5 blocks for 1.3B and 2.0 for 14B (the calibration file's
# "resident_gb" also counts 1.39 GB of an earlier model the script still held). Between forward passes
# everything goes back to RAM, so nothing of the transformer stays on the device during decode.
# Leaf level holds next to nothing (measured < 0.07 blocks).
GROUP_RESIDENT_BLOCKS = 2.5
LEAF_RESIDENT_BLOCKS = 0.15
LEAF_RESIDENT_MIN_GB = 0.1
# A streamed text encoder (leaf-level group offload) holds the layer it runs and the next one in flight:
# its largest tensor dominates (UMT5-XXL: the 2 GB token embedding). Measured 1.005x that tensor with and
# without a copy stream (bench/text_encoder_places.py, docs/data/text-encoder-places-h200.json).
STREAMED_TEXT_ENCODER_LEAVES = 1.1
# Latents, prompt embeddings, timesteps and the image condition beside the big tensors.
RUN_OVERHEAD_GB = 0.05
# Host memory of the Python process with torch and the libraries loaded.
BASE_RAM_GB = 1.5
BASE_RAM_CPU_ONLY_GB = 0.8
# fp8 layerwise casting keeps norms, embeddings and biases in 16-bit (measured 1.8% of 14B, 5% of 1.3B).
FP8_KEPT_FRACTION = 0.05


def transformer_weights_gb(spec: ModelSpec, bytes_per_param: float, fp8: bool = False) -> float:
    """GiB of the transformers' weights once loaded: each expert's own parameters at ``bytes_per_param`` (most
    in fp8 with ``fp8``), or its single file's as it holds them (a GGUF file's quantised tensors as stored)."""
    return sum(expert_weights_gb(spec, bytes_per_param, fp8))


def expert_weights_gb(spec: ModelSpec, bytes_per_param: float, fp8: bool = False) -> list[float]:
    """GiB of each expert's weights once loaded (one entry for a model with one transformer)."""
    sizes = []
    for expert in range(spec.experts):
        file = spec.transformer_file(expert)
        if file is not None and file.quantized:   # stays quantised: fp8 storage does not apply to it
            sizes.append(file.loaded_bytes(bytes_per_param) / GIB)
            continue
        params = file.params if file is not None else spec.transformer.params
        sizes.append((params * (1 + FP8_KEPT_FRACTION * (bytes_per_param - 1)) if fp8 else params * bytes_per_param)
                     / GIB)
    return sizes


def _bytes_per_param(spec: ModelSpec, bytes_per_param: float, fp8: bool) -> list[float]:
    """Each expert's bytes per parameter once loaded: a quantised file's own, else the compute dtype's (fp8's)."""
    per_expert = []
    for expert in range(spec.experts):
        file = spec.transformer_file(expert)
        quantized = file is not None and file.quantized
        per_expert.append(file.loaded_bytes(bytes_per_param) / file.params if quantized
                          else 1.0 if fp8 else bytes_per_param)
    return per_expert


def block_gb(spec: ModelSpec, bytes_per_param: float, fp8: bool = False) -> float:
    """One block of the transformer that runs (A14B's experts take turns: the larger one's)."""
    return spec.transformer.block_params * max(_bytes_per_param(spec, bytes_per_param, fp8)) / GIB


def shared_gb(spec: ModelSpec, bytes_per_param: float) -> float:
    """The layers outside the blocks (embeddings, head) of every expert: always resident."""
    return spec.transformer.shared_params * sum(_bytes_per_param(spec, bytes_per_param, False)) / GIB


def staging_gb(spec: ModelSpec) -> float:
    """RAM a load holds beside the loaded weights while it converts single transformer files."""
    return sum(file.staging_bytes for file in spec.transformer_files if file is not None) / GIB


def mapped_gb(spec: ModelSpec, bytes_per_param: float, vae_bytes: float) -> float:
    """GiB of weight files a load reads through memory maps beside the weights it makes of them. A component stored
    in another width than it loads in (the published Wan2.1 repositories' float32 files, loaded in bf16) is cast from
    its files' pages, which stay mapped while it loads: each component's until its own load ends (the engine loads
    such transformers one by one and makes each let go of its files: engine/run/apply_plan.py). Those pages are the
    system's page cache, not the process's own memory: they show in its resident memory, and the system drops them
    when it needs the room, so they are said but never make a plan not fit. A component stored as it loads is its
    files' pages: its weights."""
    def cast(component: str, params: float, width: float) -> float:
        stored = spec.stored_width(component)
        return params * stored if stored and stored != width else 0.0

    parts = [cast(name, spec.transformer.params, bytes_per_param)
             for expert, name in enumerate(("transformer", "transformer_2")[:spec.experts])
             if spec.transformer_file(expert) is None]
    parts += [cast("text_encoder", spec.text_encoder_params, bytes_per_param),
              cast("image_encoder", spec.image_encoder_params, bytes_per_param),
              cast("vae", spec.vae_params, vae_bytes)]
    return max(parts) / GIB


def stored_bytes(spec: ModelSpec) -> float:
    """Bytes of the model's weight files as its repository stores them (0 when its widths are not known)."""
    if not spec.stored:
        return 0.0
    params = {"transformer": spec.transformer.params, "transformer_2": spec.transformer.params if spec.experts > 1
              else 0, "text_encoder": spec.text_encoder_params, "image_encoder": spec.image_encoder_params,
              "vae": spec.vae_params}
    return sum(params.get(component, 0) * width for component, width in spec.stored)


def pass_frames(spec: ModelSpec, frames: int, window: int = 0) -> int:
    """The video frames one transformer pass sees: the whole video, or one window of a longer one
    (engine/models/windows.py; ``window`` 0: the model's own)."""
    return min(frames, window or spec.window_frames)


def denoise_tokens(spec: ModelSpec, width: int, height: int, frames: int, window: int = 0) -> int:
    """The tokens of one transformer pass (what its activations and its time grow with)."""
    return spec.tokens(width, height, pass_frames(spec, frames, window))


# A video in windows keeps its whole latents, the blended prediction and the scheduler's copy in float32 on the
# device beside one window's activations.
WINDOWED_LATENT_COPIES = 3


def windowed_latents_gb(spec: ModelSpec, width: int, height: int, frames: int, window: int = 0) -> float:
    """What a video in windows holds beyond one window's pass: its whole latents (0 for one window)."""
    if frames <= pass_frames(spec, frames, window):
        return 0.0
    latent = (frames - 1) // spec.vae_temporal + 1
    cells = (width // spec.vae_spatial) * (height // spec.vae_spatial)
    return WINDOWED_LATENT_COPIES * spec.vae_z * latent * cells * 4 / GIB


def denoise_activations_gb(spec: ModelSpec, tokens: int, act_bytes: int, math_attention: bool) -> float:
    shape = spec.transformer
    act = tokens * (ACT_DIM * shape.dim + ACT_FFN * shape.ffn) * act_bytes
    if spec.expand_timesteps:
        act += tokens * ACT_EXPAND_TIMESTEPS * shape.dim
    if math_attention:
        act += shape.heads * tokens ** 2 * MATH_ATTENTION_BYTES
    return act / GIB


# The faster decode (decoder "vae_fast") takes several latent frames a call of the decoder where the device has
# room for them (engine/run/decoding.py ``decode_stream``): each frame beyond the first adds about one frame's
# working set, measured at bfloat16 on an H100 (bench/decode_windows.py, docs/data/decode-windows-h100.json):
# +2.00 GiB a latent frame for Wan2.1's VAE at 832x480 (4.20 GiB for one, 16.22 for seven) and +5.59 GiB for
# Wan2.2-5B's at 1280x704, here per output pixel in float32 (half in bfloat16).
VAE21_WINDOW_PIXEL_BYTES = 10_800.0
VAE22_WINDOW_PIXEL_BYTES = 13_400.0
# Beyond this many frames a call the decode is no faster: Wan2.1's took 2.27 s one frame a call, 1.96 s seven,
# 1.83 s twenty; Wan2.2-5B's 6.60 s, 6.22 s two, 6.34 s seven.
MAX_DECODE_WINDOW = {False: 20, True: 2}   # by spec.wan22_vae


def vae_window_gb(spec: ModelSpec, width: int, height: int, vae_bytes: int = 4) -> float:
    """Device memory that each latent frame after the first of a decoder call adds to the decode's peak."""
    pixel_bytes = VAE22_WINDOW_PIXEL_BYTES if spec.wan22_vae else VAE21_WINDOW_PIXEL_BYTES
    return pixel_bytes * width * height * vae_bytes / 4 / GIB


def decode_window(spec: ModelSpec, width: int, height: int, frames: int, vae_bytes: int, room_gb: float) -> int:
    """Latent frames a call of the decoder takes: as many as ``room_gb`` of free device memory holds, up to the
    VAE's MAX_DECODE_WINDOW and the clip's frames after the first (1: one at a time, as diffusers decodes)."""
    latent = (frames - 1) // spec.vae_temporal + 1
    each = vae_window_gb(spec, width, height, vae_bytes)
    fits = 1 + int(max(0.0, room_gb) // each) if each > 0 else 1
    return max(1, min(MAX_DECODE_WINDOW[spec.wan22_vae], latent - 1, fits))


def vae_decode_gb(spec: ModelSpec, width: int, height: int, frames: int, tile: int | None,
                  vae_bytes: int = 4) -> float:
    """Peak extra memory of decoding: the working set (whole frame or one tile) plus the output."""
    clip = frames * width * height
    tiled = tile is not None and (tile < width or tile < height)
    if not tiled:
        pixel_bytes = VAE22_PIXEL_BYTES if spec.wan22_vae else VAE21_PIXEL_BYTES
        return (pixel_bytes * width * height * vae_bytes / 4 + VAE_OUTPUT_BYTES * clip) / GIB
    area = min(tile, width) * min(tile, height)
    if spec.wan22_vae:
        peak = max(VAE22_TILE_PIXEL_BYTES * area * vae_bytes / 4 + VAE22_TILED_OUTPUT_BYTES * clip,
                   VAE22_TILED_FLOOR_BYTES * clip)
    else:
        peak = VAE21_PIXEL_BYTES * area * vae_bytes / 4 + VAE21_TILED_OUTPUT_BYTES * clip
    return peak / GIB


# Encoding a video-to-video input, per pixel of a frame in float32 (half in bfloat16), on top of the clip itself:
# measured on an H200 at 832x480x81 (bench/from_video_gpu.py, docs/data/from-video-h200.json): the Wan2.1 VAE
# 6.77 GiB in float32 and 3.38 in bfloat16, Wan2.2 TI2V-5B's 1.95 in bfloat16 (its 2x2 patches halve the work).
VAE21_ENCODE_PIXEL_BYTES = 17_300
VAE22_ENCODE_PIXEL_BYTES = 9_500


def vae_encode_gb(spec: ModelSpec, width: int, height: int, frames: int, tile: int | None,
                  vae_bytes: int = 4) -> float:
    """Peak extra device memory of encoding a video-to-video input: the clip on the device in the VAE's precision,
    and the encoder's working set, which runs a few frames at a time with a cache (a tile of them when tiled)."""
    clip = frames * width * height * 3 * vae_bytes
    tiled = tile is not None and (tile < width or tile < height)
    area = min(tile, width) * min(tile, height) if tiled else width * height
    pixel = VAE22_ENCODE_PIXEL_BYTES if spec.wan22_vae else VAE21_ENCODE_PIXEL_BYTES
    return (clip + pixel * area * vae_bytes / 4) / GIB


def input_frames_ram_gb(width: int, height: int, frames: int) -> float:
    """A video-to-video input's frames on the host as they are read: uint8, then as one float32 clip."""
    return frames * width * height * 3 * (1 + 4) / GIB


# An extension's join holds two frames at a time in float64 for the colour match (CIE Lab), and ffmpeg's buffers.
JOIN_FRAME_BYTES = 3 * 8 * 4


def join_ram_gb(width: int, height: int) -> float:
    """The host memory of an extension's join: a few frames in Lab at the video's size; the rest streams."""
    return width * height * JOIN_FRAME_BYTES / GIB


def streamed_text_encoder_gb(spec: ModelSpec, bytes_per_param: float) -> float:
    """Device memory of the text encoder while it streams through the device (weights only)."""
    return STREAMED_TEXT_ENCODER_LEAVES * spec.text_encoder_largest_params * bytes_per_param / GIB


def text_encode_gb(spec: ModelSpec) -> float:
    return TEXT_ENCODE_ACT_GB * max(1, TEXT_TOKENS // 512)


# The steps after the video is written, measured on an H200 in float16 (bench/post_gpu.py,
# docs/data/post-h200.json): RIFE 4.7 between two frames took 0.12 GB at 832x480 and 0.26 GB at 1280x720, about
# 0.28 GB a megapixel; an ESRGAN of RealESRGAN_x4plus's size in 512-pixel tiles (engine/post/apply.py) 1.79 GB,
# whatever the frame's size. Float32 (the CPU) takes twice as much.
RIFE_GB_PER_MEGAPIXEL = 0.28
UPSCALE_TILE_GB = 1.8
UPSCALE_TILE_PIXELS = 512 * 512   # a frame smaller than a tile is one tile of its own size


def post_step_gb(step: str, width: int, height: int, nbytes: int) -> float:
    """The working memory of a step after the video is written (``step`` "interpolate" or "upscale") on frames
    of ``width`` x ``height``, computing with ``nbytes`` a value; its frames stream, so the length does not count.
    Larger is counted with an upscaler model (the planner does not look for the file): Lanczos needs less."""
    per_value = nbytes / 2
    if step == "interpolate":
        return RIFE_GB_PER_MEGAPIXEL * width * height / 1e6 * per_value
    return UPSCALE_TILE_GB * min(1.0, width * height / UPSCALE_TILE_PIXELS) * per_value


def frames_ram_gb(width: int, height: int, frames: int) -> float:
    """Decoded frames on the host: float32 from the VAE, then uint8 for the encoder."""
    return frames * width * height * 3 * (4 + 1) / GIB
