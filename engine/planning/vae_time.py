"""How long the VAE takes, and the fast decoder in its place: the work of the Wan VAE decoder's convolutions,
derived from its layer widths, over the calibrated conv3d (and conv2d) rate at each width in the VAE's dtype,
plus its memory work; the encoder's (image to video) by its FLOPs per pixel. Part of the time model
(engine/planning/timing.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.device.calibrate import Calibration
from engine.device.hardware import DECIMAL_GB
from engine.models.spec import VAE21_PARAMS, VAE22_PARAMS, ModelSpec
from engine.planning.plan import Plan
from engine.planning.rates import conv_rate


@dataclass(frozen=True)
class VaeShape:
    """What a Wan VAE decoder's work follows from: its widths, blocks and up-sampling (diffusers' config)."""
    decoder_dim: int
    z_dim: int
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_upsample: tuple[bool, ...] = (True, True, False)   # the decoder's order
    residual: bool = False           # Wan2.2: residual up-blocks, which keep their width when up-sampling
    out_channels: int = 3
    patch: int = 1                   # Wan2.2 un-patchifies 2x2 at the end
    # Encoder FLOPs per input pixel-frame (the first frame, then the rest), counted with torch's
    # FlopCounterMode on diffusers' AutoencoderKLWan (tests/engine/test_timing.py counts them again).
    encode_first_flops_per_pixel: float = 6.66e6
    encode_flops_per_pixel: float = 5.00e6
    # Beside its convolutions the decoder normalises, activates, up-samples and copies its causal caches:
    # memory work of about this many bytes per element each convolution writes, at the device's memory rate,
    # whatever the dtype (the norms compute in float32 either way). Fitted on an H200
    # (docs/data/timing-h200.json): Wan2.1's decode beyond its convolutions at the calibrated rates took
    # 133 bytes an element in float32 and 116-127 in bfloat16 (832x480x81 and 480x480x33); Wan2.2's, whose
    # wide layers are closer to compute-bound, 51 in float32 and 96 in bfloat16 (832x480x41).
    elementwise_bytes: float = 125.0


# Wan2.1's VAE (also Wan2.2 A14B's): base_dim 96, z 16. Wan2.2-5B's: decoder_base_dim 256, z 48, residual.
VAE21 = VaeShape(decoder_dim=96, z_dim=16)
VAE22 = VaeShape(decoder_dim=256, z_dim=48, residual=True, out_channels=12, patch=2,
                 encode_first_flops_per_pixel=4.64e6, encode_flops_per_pixel=3.49e6, elementwise_bytes=75.0)
# LightX2V's light VAE (decoder "vae_light", engine/models/light_vae_file.py): Wan2.1's at a quarter of the width.
LIGHT_VAE21 = VaeShape(decoder_dim=24, z_dim=16)
# Its narrow layers run far below the calibrated rates of the released widths (the smallest measured is 96
# channels): the modelled time times this, measured in bfloat16 at 832x480x81 on an H200 (bench/light_vae.py,
# docs/data/light-vae-h200.json): 0.667 s against 0.353 s modelled, and 1.930 s for the VAE (1.907 modelled).
LIGHT_VAE_DECODE_FACTOR = 1.89
# cudnn.benchmark (the plan's "benchmark" convolution set-up) speeds up Wan2.1's whole decode although none
# of its convolutions timed alone gains (docs/data/timing-h200.json, "conv_variants"): 2.80 -> 2.16 s in
# float32 and 1.83 -> 1.71 s in bfloat16 (832x480x81 on an H200); Wan2.2's decode gains nothing (1.41 -> 1.38
# and 0.91 -> 0.91 s). A measured factor on the decode's time, per VAE and dtype.
BENCHMARK_DECODE_FACTOR = {("wan21", "float32"): 0.77, ("wan21", "bfloat16"): 0.94}
# The faster, approximate decode (decoder "vae_fast": channels-last convolutions, several latent frames a call where
# the device has room) against the exact one, measured in bfloat16 on an H100 (bench/decode_windows.py,
# docs/data/decode-windows-h100.json): Wan2.1 at 832x480x81 2.27 s -> 1.99 s channels-last alone, 1.80 s with 20
# frames a call; Wan2.2-5B at 1280x704x121 6.60 s -> 6.08 s, 5.97 s with 2. By (wan22, several frames a call).
FAST_VAE_DECODE_FACTOR = {(False, False): 0.87, (False, True): 0.80, (True, False): 0.92, (True, True): 0.90}
# The encoder (image to video) is counted by its FLOPs per pixel at the 96-channel conv3d rate, times this
# for its other work: 0.408 s measured for a Wan2.1 encode of 480x480x33 in float32 on an H200, 1.3x that.
VAE_ENCODE_OVERHEAD = 1.3
# Tiles overlap by a quarter (engine/run/apply_plan.py) and are blended row by row in Python: beyond the
# extra area they decode, each tile costs this share of its own decode again (fitted: a 256-pixel tiled
# float32 decode of 832x480x81 took 5.39 s on an H200 against 2.80 s untiled, for 1.66x the area).
TILE_OVERHEAD = 0.16
# The fast approximate decoder (TAEHV-shaped: 2-D convolutions at widths 256, 128, 64, 64, three stages of
# three MemBlocks, a frame memory) does about 87 MFLOP per latent pixel-frame (its layer widths), at a lower
# share of the conv3d rate: 0.103 s for 81 frames at 832x480 on an H200 in bf16 (docs/reference-figures.md).
FAST_DECODER_FLOPS_PER_LATENT = 87.2e6
FAST_DECODER_EFFICIENCY = 0.5


def decoder_layers(vae: VaeShape, first: bool = False) -> tuple[tuple[int, float, float, int], ...]:
    """(width, FLOPs, output elements, kernel taps) per latent pixel of every convolution of one decoder call on one latent
    frame, as diffusers' WanDecoder3d runs it (the first frame skips the temporal up-sampling and gives one
    frame; every later one gives four). A layer from c_in to c_out channels has width sqrt(c_in x c_out)."""
    mult = vae.dim_mult
    dims = [vae.decoder_dim * m for m in (mult[-1], *mult[::-1])]
    frames, area = 1, 1     # output frames and area (in latent pixels) of the layers so far
    work: list[tuple[int, float, float, int]] = []

    def conv(c_in: int, c_out: int, taps: int) -> None:
        work.append((round(math.sqrt(c_in * c_out)), 2.0 * taps * c_in * c_out * frames * area,
                     float(c_out * frames * area), taps))

    def residual_block(c_in: int, c_out: int) -> None:
        conv(c_in, c_out, 27)
        conv(c_out, c_out, 27)
        if c_in != c_out:
            conv(c_in, c_out, 1)     # the shortcut

    conv(vae.z_dim, vae.z_dim, 1)    # post_quant_conv
    conv(vae.z_dim, dims[0], 27)
    residual_block(dims[0], dims[0])
    conv(dims[0], 3 * dims[0], 1)    # the middle attention's q, k, v and output projections
    conv(dims[0], dims[0], 1)
    residual_block(dims[0], dims[0])
    for i in range(len(mult)):
        c_in = dims[i] if i == 0 or vae.residual else dims[i] // 2
        c_out = dims[i + 1]
        for block in range(vae.num_res_blocks + 1):
            residual_block(c_in if block == 0 else c_out, c_out)
        if i != len(mult) - 1:
            if vae.temporal_upsample[i] and not first:
                conv(c_out, 2 * c_out, 3)    # time_conv: twice the channels, then twice the frames
                frames *= 2
            area *= 4
            conv(c_out, c_out if vae.residual else c_out // 2, 9)
    conv(dims[-1], vae.out_channels, 27)
    return tuple(work)


def decoder_flops(vae: VaeShape, latent_frames: int, latent_area: int) -> float:
    """FLOPs of the decoder's convolutions for a whole clip (the middle attention's own is below 1%)."""
    first = sum(layer[1] for layer in decoder_layers(vae, first=True))
    rest = sum(layer[1] for layer in decoder_layers(vae))
    return latent_area * (first + max(latent_frames - 1, 0) * rest)


def _decoder_call(vae: VaeShape, cal: Calibration, mode: str, dtype: str, first: bool) -> tuple[float, float]:
    """(convolution seconds, output elements) per latent pixel of one decoder call, each convolution at the
    measured rate of its kind and width."""
    layers = decoder_layers(vae, first)
    return (sum(f / (conv_rate(cal, mode, dtype, w, taps) * 1e12) for w, f, _, taps in layers),
            sum(e for _, _, e, _ in layers))


def _tiled_area(width: int, height: int, spatial: int, tile: int) -> float:
    """Latent area decoded when tiling (overlapping tiles: diffusers' tiled_decode, 3/4 stride)."""
    lw, lh = width // spatial, height // spatial
    size, stride = tile // spatial, max(tile * 3 // 4 // spatial, 1)
    cols = sum(min(size, lw - j) for j in range(0, lw, stride))
    rows = sum(min(size, lh - i) for i in range(0, lh, stride))
    return cols * rows


def vae_decode_seconds(spec: ModelSpec, width: int, height: int, frames: int, vae_dtype: str, tile: int | None,
                       cal: Calibration, conv: str = "default", shape: VaeShape | None = None) -> tuple[float, str]:
    """The Wan VAE's decode alone (no frame conversion), on the calibrated device: seconds and how. ``shape``: another
    decoder of the same kind in its place (the light VAE), else the model's own."""
    vae = shape or (VAE22 if spec.wan22_vae else VAE21)
    latent_frames = (frames - 1) // spec.vae_temporal + 1
    area = (width // spec.vae_spatial) * (height // spec.vae_spatial)
    flops = decoder_flops(vae, latent_frames, area)
    first_s, first_e = _decoder_call(vae, cal, conv, vae_dtype, True)
    rest_s, rest_e = _decoder_call(vae, cal, conv, vae_dtype, False)
    conv_s = area * (first_s + (latent_frames - 1) * rest_s)
    memory_s = area * (first_e + (latent_frames - 1) * rest_e) * vae.elementwise_bytes / (cal.memory_gbps * DECIMAL_GB)
    seconds = (conv_s + memory_s) * _smaller(spec)
    how = (f"{flops / 1e12:.0f} TFLOP of convolutions in {vae_dtype} ({conv} set-up) at "
           f"{flops / conv_s / 1e12:.0f} TFLOP/s, +{memory_s:.2f} s of memory work")
    if conv == "benchmark":
        factor = BENCHMARK_DECODE_FACTOR.get(("wan22" if spec.wan22_vae else "wan21", vae_dtype), 1.0)
        seconds *= factor
        how += f", x{factor:.2f} with cudnn.benchmark (measured)"
    tiled = tile is not None and (tile < width or tile < height)
    if tiled:
        ratio = _tiled_area(width, height, spec.vae_spatial, tile) / area
        seconds *= ratio * (1 + TILE_OVERHEAD)
        how += f"; {tile}px tiles: {ratio:.2f}x the area, +{TILE_OVERHEAD:.0%} per tile"
    return seconds, how


def fast_decode_seconds(spec: ModelSpec, width: int, height: int, frames: int, dtype: str,
                        cal: Calibration) -> tuple[float, str]:
    """The fast approximate decoder (engine/settings' decoder "fast"), in the compute dtype: seconds and how."""
    latent_frames = (frames - 1) // spec.vae_temporal + 1
    area = (width // spec.vae_spatial) * (height // spec.vae_spatial)
    flops = FAST_DECODER_FLOPS_PER_LATENT * latent_frames * area
    rate = conv_rate(cal, "default", dtype, 96) * FAST_DECODER_EFFICIENCY
    return flops / (rate * 1e12), f"{flops / 1e12:.1f} TFLOP of 2-D convolutions at {rate:.0f} TFLOP/s (fast decoder)"


def vae_encode_seconds(spec: ModelSpec, width: int, height: int, frames: int, plan: Plan,
                       cal: Calibration) -> float:
    """Image to video: the condition clip goes through the VAE's encoder inside the pipeline's call (so in
    the denoise phase): Wan2.1 I2V and A14B encode the image followed by empty frames, the whole clip;
    Wan2.2-5B encodes the image alone."""
    vae = VAE22 if spec.wan22_vae else VAE21
    encoded = 1 if spec.expand_timesteps else frames
    flops = width * height * (vae.encode_first_flops_per_pixel + (encoded - 1) * vae.encode_flops_per_pixel)
    return flops / (conv_rate(cal, "default", plan.vae_dtype, 96) * 1e12) * VAE_ENCODE_OVERHEAD * _smaller(spec)


def _smaller(spec: ModelSpec) -> float:
    """A VAE smaller than the released one (the self-test models'): its work shrinks with its weights."""
    released = VAE22_PARAMS if spec.wan22_vae else VAE21_PARAMS
    return min(1.0, spec.vae_params / released) if spec.vae_params else 1.0


# Encoding a video-to-video input takes this share of decoding the same frames: measured on an H200 at 832x480x81
# (bench/from_video_gpu.py, docs/data/from-video-h200.json): the Wan2.1 VAE 0.72 in float32 and 0.77 in bfloat16,
# Wan2.2 TI2V-5B's 0.48 (on this project's 2-core CPU the Wan2.1 VAE's was 0.56, at 17x256x256).
VIDEO_ENCODE_SHARE = 0.75
VIDEO_ENCODE_SHARE_WAN22 = 0.48


def video_encode_seconds(spec: ModelSpec, width: int, height: int, frames: int, plan: Plan,
                         cal: Calibration) -> tuple[float, str]:
    decode, _ = vae_decode_seconds(spec, width, height, frames, plan.vae_dtype, plan.vae_tile, cal, plan.conv)
    share = VIDEO_ENCODE_SHARE_WAN22 if spec.wan22_vae else VIDEO_ENCODE_SHARE
    return decode * share, f"the input's {frames} frames through the VAE's encoder: x{share} of decoding as many"


def decode_seconds(spec: ModelSpec, width: int, height: int, frames: int, plan: Plan, cal: Calibration,
                   decoder: str) -> tuple[float, str]:
    """The decode alone: the fast decoder's, the light VAE's, or the VAE's (exact, or faster and approximate: a
    measured factor)."""
    if decoder == "fast":
        return fast_decode_seconds(spec, width, height, frames, plan.dtype, cal)
    if decoder == "vae_light" and not spec.wan22_vae:
        decode, how = vae_decode_seconds(spec, width, height, frames, plan.vae_dtype, plan.vae_tile, cal, plan.conv,
                                         LIGHT_VAE21)
        return decode * LIGHT_VAE_DECODE_FACTOR, f"the light VAE (width 24): {how}; x{LIGHT_VAE_DECODE_FACTOR:.2f} (measured)"
    decode, how = vae_decode_seconds(spec, width, height, frames, plan.vae_dtype, plan.vae_tile, cal, plan.conv)
    if getattr(plan, "channels_last", False):
        factor = FAST_VAE_DECODE_FACTOR[(spec.wan22_vae, plan.decode_window > 1)]
        decode *= factor
        how += f"; x{factor:.2f} channels-last, {plan.decode_window} latent frames a call (measured)"
    return decode, how
