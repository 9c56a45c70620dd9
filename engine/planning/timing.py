"""How long each phase of a run will take, said before it runs, as the memory plan says its memory.

A pure function (no torch, no files) of the model's shapes, the request, the memory plan and the rates this
machine measured once (engine/device/calibrate.py). Every phase is an amount of work over a measured rate:

- denoise: steps x passes (2 with guidance) x one transformer pass, where a pass is the FLOPs of its linear
  layers over the matmul rate, plus self-attention (4 x tokens^2 x heads x head_dim x layers) and
  cross-attention (512 text tokens, plus 257 image tokens for Wan2.1 I2V) over the SDPA rate at that length,
  plus its elementwise work (norms, modulation, RoPE, activations) over the device's memory rate; offloading
  adds the weights it streams each pass over the copy rate, partly hidden behind the compute;
- text_encode / image_encode: the encoder's FLOPs per prompt (and its copies when it visits the device);
- vae_decode: the FLOPs of the Wan VAE decoder's convolutions, derived from its layer widths, over the
  measured conv3d rate at each width in the VAE's dtype, plus copying and converting the frames;
- export: frame pixels over the measured H.264 rate; load: weight bytes over the disk's rate; transfer:
  bytes to the device over the copy rate (and page-locking for streamed parts).

The coefficients that are not rates (what fraction of a copy is hidden, how many passes over memory the
elementwise work makes) were fitted on an H200 with real-size random-weight models (the raw figures are in
docs/data/timing-h200.json) and are named below with where each comes from. ``learn`` corrects a prediction
with the runs this machine really made.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Sequence

from engine.device.calibrate import Calibration
from engine.device.hardware import DECIMAL_GB
from engine.models.spec import TEXT_TOKENS, UMT5_XXL_PARAMS, VAE21_PARAMS, VAE22_PARAMS, ModelSpec
from engine.planning.memory import FP8_KEPT_FRACTION
from engine.planning.planner import Plan
from engine.planning.speed import DECODERS

# The phases predicted, in the order a run passes through them (engine/events.py PHASES, less those that are
# not the run itself: the engine's start, a download, building a self-test model).
PHASES = ("load", "transfer", "text_encode", "image_encode", "denoise", "expert_swap", "vae_decode", "export")

# ----- the transformer ----------------------------------------------------------------------------------
# Norms, modulation, RoPE, gates and residual adds read and write the activations many times: per pass their
# time is ELEMENTWISE_PASSES x tokens x width x layers x (bytes per element) over the device's memory rate.
# Fitted on an H200 (docs/data/timing-h200.json): the time a pass took beyond its matmul and attention FLOPs
# at the calibrated rates was 220-258 such passes for 1.3B and 14B at 8k-76k tokens (about a quarter of a
# 1.3B pass, a fifth of a 14B one).
ELEMENTWISE_PASSES = 230.0
# Wan2.2-5B modulates every token with its own timestep (expand_timesteps): 311-337 passes measured.
ELEMENTWISE_PASSES_EXPAND_TIMESTEPS = 90.0
# CLIP ViT-H's image tokens that Wan2.1 I2V attends to beside the 512 text tokens (256 patches + class).
IMAGE_TOKENS = 257
# torch.compile of the repeated blocks fuses the elementwise work: 1.07 s instead of 1.23 s for a 1.3B step on
# an H200 (docs/reference-figures.md), which is half of that step's elementwise time (2 x 0.16 s).
COMPILED_ELEMENTWISE = 0.5
# Its one-off cost at each new size: 11 s for 1.3B on an H200 (docs/reference-figures.md); charged when not yet
# compiled.
COMPILE_FIRST_S = 11.0
# Attention backends against the calibrated SDPA default ("native"), attention time only: a 1.3B step on an
# H200 took 1.28 / 1.68 / 2.78 s with _native_cudnn / _native_flash / _native_efficient against 1.23 s, of
# which 0.65 s is attention (docs/reference-figures.md). Backends not listed are taken as fast as SDPA (not measured).
ATTENTION_BACKEND_FACTOR = {"native": 1.0, "_native_cudnn": 1.08, "_native_flash": 1.69, "_native_efficient": 3.4}
# Group offload (block level, pinned RAM, a copy stream) hides only part of its copies behind the compute:
# a pass takes max(compute, copy) + GROUP_EXPOSED x min(compute, copy). Measured on an H200: 14B at
# 832x480x81 7.32 s a step against 6.40 (0.77 of the copies exposed), 14B I2V at 480x480x33 0.88, 1.3B at
# 480x480x33 0.9 and at 832x480x81 0.48 (docs/data/timing-h200.json, docs/speed.md, docs/reference-figures.md).
GROUP_EXPOSED = 0.8
# Leaf offload (and a streamed text encoder) copies one layer at a time and waits for it: compute plus
# LEAF_EXPOSED x the copies. Measured 1.0 (1.3B, 832x480x81) and 1.7 (480x480x33) on an H200: the many
# small copies cost more than their bytes at short passes; a streamed UMT5 encode, 0.57 s for two prompts
# against 0.07 s of compute and 0.42 s of copies, gives 1.2.
LEAF_EXPOSED = 1.3

# ----- the encoders --------------------------------------------------------------------------------------
# UMT5-XXL: 24 layers of width 4096, 512 tokens. Its attention FLOPs beside the dense layers' (2 x params x
# tokens): 4 x 512^2 x 4096 x 24.
UMT5_ATTENTION_FLOPS = 4 * TEXT_TOKENS ** 2 * 4096 * 24
# Per prompt, on a GPU, beyond its FLOPs: each of the 24 layers computes its own position bias in many small
# kernels. An H200 took 0.036 s a prompt warm for 0.007 s of FLOPs (docs/data/timing-h200.json).
ENCODE_LAUNCH_S = 0.029
# The first encode after a load takes longer (kernels loaded on first use, tokenizer and text clean-up set up),
# about this much more per prompt: 0.70 s for prompt and negative in plain diffusers (0.83 s in the engine)
# and 0.4 s for a prompt alone, against 0.036 s a prompt warm (docs/reference-figures.md, docs/speed.md).
FIRST_ENCODE_S = 0.3
# CLIP ViT-H on one image (Wan2.1 I2V): 32 layers, like UMT5's launches per layer. Not measured.
IMAGE_ENCODE_LAUNCH_S = 0.02

# ----- the VAE -------------------------------------------------------------------------------------------


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
# cudnn.benchmark (the plan's "benchmark" convolution set-up) speeds up Wan2.1's whole decode although none
# of its convolutions timed alone gains (docs/data/timing-h200.json, "conv_variants"): 2.80 -> 2.16 s in
# float32 and 1.83 -> 1.71 s in bfloat16 (832x480x81 on an H200); Wan2.2's decode gains nothing (1.41 -> 1.38
# and 0.91 -> 0.91 s). A measured factor on the decode's time, per VAE and dtype.
BENCHMARK_DECODE_FACTOR = {("wan21", "float32"): 0.77, ("wan21", "bfloat16"): 0.94}
# The encoder (image to video) is counted by its FLOPs per pixel at the 96-channel conv3d rate, times this
# for its other work: 0.408 s measured for a Wan2.1 encode of 480x480x33 in float32 on an H200, 1.3x that.
VAE_ENCODE_OVERHEAD = 1.3
# Tiles overlap by a quarter (engine/run/apply_plan.py) and are blended row by row in Python: beyond the
# extra area they decode, each tile costs this share of its own decode again (fitted: a 256-pixel tiled
# float32 decode of 832x480x81 took 5.39 s on an H200 against 2.80 s untiled, for 1.66x the area).
TILE_OVERHEAD = 0.16
# After the decode the frames come to the host in float32 and are converted to uint8; the conversion
# calibrate.py times (engine.outputs.export.to_uint8) is one of about this many passes over them (the
# permute into a NumPy array, the clip and scale): fitted to the engine's vae_decode phase, 3.7-4.2 s on an
# H200 against 2.8 s for the decode alone (docs/reference-figures.md).
POSTPROCESS_PASSES = 3
# The fast approximate decoder (TAEHV-shaped: 2-D convolutions at widths 256, 128, 64, 64, three stages of
# three MemBlocks, a frame memory) does about 87 MFLOP per latent pixel-frame (its layer widths), at a lower
# share of the conv3d rate: 0.103 s for 81 frames at 832x480 on an H200 in bf16 (docs/reference-figures.md).
FAST_DECODER_FLOPS_PER_LATENT = 87.2e6
FAST_DECODER_EFFICIENCY = 0.5
# A streamed export (engine/outputs/export.Mp4Stream) encodes while the decoder works; what is left after the
# last frame, against the whole clip's encode: 0.47-0.55 s of 0.74 s on an H200 (docs/data/speed-1.3b-h200.json).
STREAMED_EXPORT_SHARE = 0.7

# ----- copies, disk and export ---------------------------------------------------------------------------
# The rate weights are read at when no load has been measured yet: a conservative local SSD (the engine's
# load of 14.7 GB took 10.9 s on the H200 machine, 1.35 GB/s, docs/reference-figures.md).
DEFAULT_DISK_GBPS = 1.5
# Page-locking a model tensor by tensor is slower than pinning one large buffer as calibrate.py does:
# 0.91 GB/s for the 14B transformer and 1.16 GB/s for UMT5 against 1.45 GB/s calibrated (docs/speed.md).
PIN_EFFICIENCY = 0.7
# H.264 export when the encoder could not be measured here: 81 frames of 832x480 took 2.1 s on the H200
# machine's 16 cores (docs/reference-figures.md), about 15 megapixels a second.
DEFAULT_ENCODE_MPS = 15.0
DEFAULT_ENCODE_FIXED_S = 0.1


@dataclass(frozen=True)
class PhaseTimes:
    """Predicted seconds of each phase of one run (only the phases it will go through), with a line per
    phase saying what the figure rests on."""
    seconds: dict            # phase -> seconds, in PHASES order
    how: dict                # phase -> one line: the work and the rate behind the figure
    step_seconds: float      # one denoising step, all its passes
    steps: int
    passes: int              # transformer passes per step (2 with guidance)
    tokens: int              # the transformer's sequence length
    pixels: int              # output pixels: width x height x frames
    total: float
    loaded: bool = False     # predicted for a pipeline already loaded (no load, transfer, first-use costs)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PassTime:
    """One transformer pass, split by the kind of work (seconds)."""
    linear: float
    attention: float
    elementwise: float
    copies: float = 0.0       # offload's copies left visible after overlapping them with the compute

    @property
    def compute(self) -> float:
        return self.linear + self.attention + self.elementwise

    @property
    def total(self) -> float:
        return self.compute + self.copies


# ----- rates ---------------------------------------------------------------------------------------------

def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Linear in log(x) between measured points, the nearest end outside them (no extrapolation)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("no measured points")
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            share = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + share * (y1 - y0)
    return pts[-1][1]


@dataclass(frozen=True)
class _Rates:
    """The rates a plan computes at (device or CPU), in FLOP/s and bytes/s, and where they come from."""
    matmul: Sequence[tuple[float, float]]
    attention: Sequence[tuple[float, float]]
    memory: float
    note: str = ""

    def matmul_at(self, dim: int) -> float:
        return _interpolate(self.matmul, dim) * 1e12

    def attention_at(self, tokens: int) -> float:
        return _interpolate(self.attention, tokens) * 1e12


def _device_rates(plan: Plan, cal: Calibration) -> _Rates:
    if plan.device == "cpu" and cal.backend != "cpu":
        # A CPU plan with a GPU's calibration: only the CPU's matmul rate is known; use it throughout.
        cpu = ((1, cal.cpu_matmul_tflops),)
        return _Rates(cpu, cpu, cal.memory_gbps * DECIMAL_GB / 20, "CPU rates guessed from its matmul rate")
    return _Rates(cal.matmul_tflops, cal.attention_tflops, cal.memory_gbps * DECIMAL_GB)


def _copy_gbps(cal: Calibration, pinned: bool) -> tuple[float, str]:
    """Host -> device rate; without a measured one (unified memory, Apple), a copy within memory."""
    rate = cal.h2d_pinned_gbps if pinned else cal.h2d_pageable_gbps
    if rate:
        return rate, ("pinned" if pinned else "pageable")
    return cal.memory_gbps / 2, "in memory"


def _bytes_per(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


# ----- the transformer -----------------------------------------------------------------------------------

def transformer_pass(spec: ModelSpec, tokens: int, image_tokens: int, rates: _Rates, act_bytes: int,
                     attention_factor: float = 1.0, compiled: bool = False) -> PassTime:
    """One forward pass of the transformer over ``tokens`` video tokens, computed on the device."""
    shape = spec.transformer
    dim = shape.dim
    context = TEXT_TOKENS + image_tokens
    # The cross-attention's keys and values project the text (and image) tokens, not the video's: their
    # weights are left out of the per-token linear work and counted on the context instead.
    context_kv = 2 * (dim * dim + dim) * (2 if image_tokens else 1)
    token_params = shape.layers * (shape.block_params - context_kv)
    patch_params = (shape.in_channels + spec.vae_z) * shape.patch ** 2 * shape.patch_t * dim   # in and out
    linear = 2.0 * tokens * (token_params + patch_params) + 2.0 * context * context_kv * shape.layers
    self_attention = 4.0 * tokens ** 2 * dim * shape.layers
    cross_attention = 4.0 * tokens * context * dim * shape.layers
    passes = ELEMENTWISE_PASSES + (ELEMENTWISE_PASSES_EXPAND_TIMESTEPS if spec.expand_timesteps else 0.0)
    elementwise = passes * tokens * dim * shape.layers * act_bytes / rates.memory
    if compiled:
        elementwise *= COMPILED_ELEMENTWISE
    attention = (self_attention / rates.attention_at(tokens)
                 + cross_attention / rates.attention_at(context)) * attention_factor
    return PassTime(linear / rates.matmul_at(dim), attention, elementwise)


def _offloaded(pass_: PassTime, copy: float, how: str) -> PassTime:
    """A pass whose weights stream in (``copy`` seconds of copies) under the plan's offload ``how``."""
    if how == "group":
        visible = max(pass_.compute, copy) + GROUP_EXPOSED * min(pass_.compute, copy) - pass_.compute
    elif how == "leaf":
        visible = LEAF_EXPOSED * copy
    else:
        visible = copy    # no copy stream: nothing overlaps
    return replace(pass_, copies=visible)


def _transformer_bytes(spec: ModelSpec, nbytes: int, fp8: bool) -> float:
    """Bytes of one expert's transformer weights (fp8 storage keeps norms and biases in 16-bit)."""
    params = spec.transformer.params
    return params * (1 + FP8_KEPT_FRACTION * (nbytes - 1)) if fp8 else params * nbytes


def _denoise(spec: ModelSpec, size: tuple[int, int, int], image_to_video: bool, steps: int, passes: int,
             plan: Plan, cal: Calibration, compiled: bool) -> tuple[float, float, str]:
    """(phase seconds, step seconds, how) of the denoising loop."""
    tokens = spec.tokens(*size)
    rates = _device_rates(plan, cal)
    act_bytes = _bytes_per(plan.dtype)
    backend = plan.attention_backend
    factor = ATTENTION_BACKEND_FACTOR.get(backend, 1.0)
    image_tokens = IMAGE_TOKENS if image_to_video and spec.image_encoder_params else 0
    compile_on = bool(plan.compile)
    one = transformer_pass(spec, tokens, image_tokens, rates, act_bytes, factor, compile_on)
    nbytes = _bytes_per(plan.dtype)
    cast = ""
    if plan.fp8:
        # Layerwise casting reads each fp8 weight and writes it in 16-bit once per pass.
        extra = spec.transformer.params * (1 + nbytes) / rates.memory
        one = replace(one, elementwise=one.elementwise + extra)
        cast = ", fp8 weights cast each pass"
    offload = ""
    if plan.transformer in ("group", "leaf", "disk") and plan.device != "cpu":
        blocks = spec.transformer.layers * spec.transformer.block_params
        block_bytes = blocks * (1 if plan.fp8 else nbytes)
        gbps, kind = _copy_gbps(cal, plan.pin_memory)
        if plan.transformer == "disk":   # every block read from its file at every pass: the disk sets the pace
            disk = cal.disk_gbps or DEFAULT_DISK_GBPS
            if disk < gbps:
                gbps, kind = disk, ("from disk, measured by the last load" if cal.disk_gbps else
                                    "from disk, a conservative default: no load measured yet")
        copy = block_bytes / (gbps * DECIMAL_GB)
        one = _offloaded(one, copy, {"disk": "group"}.get(plan.transformer, plan.transformer)
                         if plan.use_stream else "none")
        offload = (f", +{one.copies:.2f} s of {block_bytes / DECIMAL_GB:.1f} GB streamed ({kind}, {gbps:.0f} GB/s, "
                   f"{plan.transformer} offload)")
    step = one.total * passes
    seconds = step * steps
    condition = ""
    if image_to_video:
        encode = _vae_encode_seconds(spec, *size, plan, cal)
        seconds += encode
        condition = f"; +{encode:.2f} s to VAE-encode the image condition"
    first_compile = ""
    if compile_on and not compiled:
        seconds += COMPILE_FIRST_S
        first_compile = f"; +{COMPILE_FIRST_S:.0f} s compiling at this size"
    how = (f"{steps} steps x {passes} pass{'es' if passes > 1 else ''} x {one.total:.3f} s: linear {one.linear:.3f} s, "
           f"attention {one.attention:.3f} s ({tokens} tokens, {backend}), elementwise {one.elementwise:.3f} s"
           f"{cast}{offload}{condition}{first_compile}" + (f" ({rates.note})" if rates.note else ""))
    return seconds, step, how


# ----- the encoders --------------------------------------------------------------------------------------

def _encode(flops: float, launch_s: float, weights: float, place: str, plan: Plan, cal: Calibration,
            prompts: int) -> tuple[float, str]:
    """Seconds and how of running an encoder ``prompts`` times where the plan keeps it."""
    if place == "cpu" or plan.device == "cpu":
        rate = cal.cpu_matmul_tflops if cal.backend != "cpu" else max(v for _, v in cal.matmul_tflops)
        seconds = prompts * flops / (rate * 1e12)
        return seconds, f"{prompts} x {flops / 1e12:.2f} TFLOP on the CPU at {rate:.2f} TFLOP/s"
    rate = max(v for _, v in cal.matmul_tflops)
    compute = flops / (rate * 1e12) + launch_s
    seconds = prompts * compute
    how = f"{prompts} x ({flops / 1e12:.2f} TFLOP at {rate:.0f} TFLOP/s + {launch_s:.3f} s of launches)"
    if place == "offload":
        gbps, kind = _copy_gbps(cal, False)
        seconds += weights / (gbps * DECIMAL_GB)
        how += f", +{weights / DECIMAL_GB:.1f} GB moved to the device ({kind}, {gbps:.1f} GB/s)"
    elif place == "streamed":
        gbps, kind = _copy_gbps(cal, plan.pin_memory)
        copy = weights / (gbps * DECIMAL_GB)
        seconds += prompts * (LEAF_EXPOSED if plan.use_stream else 1.0) * copy
        how += f", streamed layer by layer each time ({weights / DECIMAL_GB:.1f} GB, {kind}, {gbps:.0f} GB/s)"
    return seconds, how


def _text_encode(spec: ModelSpec, plan: Plan, cal: Calibration, prompts: int, loaded: bool) -> tuple[float, str]:
    dense = max(spec.text_encoder_params - spec.text_encoder_largest_params, 0)   # the embedding is a lookup
    flops = 2.0 * dense * TEXT_TOKENS + UMT5_ATTENTION_FLOPS * spec.text_encoder_params / UMT5_XXL_PARAMS
    weights = spec.text_encoder_params * _bytes_per(plan.dtype)
    seconds, how = _encode(flops, ENCODE_LAUNCH_S, weights, plan.text_encoder, plan, cal, prompts)
    if not loaded and plan.device != "cpu" and plan.text_encoder != "cpu":
        seconds += prompts * FIRST_ENCODE_S
        how += f", +{FIRST_ENCODE_S} s a prompt on first use after a load"
    return seconds, how


def _image_encode(spec: ModelSpec, plan: Plan, cal: Calibration) -> tuple[float, str]:
    flops = 2.0 * spec.image_encoder_params * IMAGE_TOKENS
    weights = spec.image_encoder_params * _bytes_per(plan.dtype)
    return _encode(flops, IMAGE_ENCODE_LAUNCH_S, weights, plan.text_encoder, plan, cal, 1)


# ----- the VAE -------------------------------------------------------------------------------------------

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


def _conv_rate(cal: Calibration, mode: str, dtype: str, width: int, taps: int = 27) -> float:
    """TFLOP/s of a decoder convolution at ``width`` channels: a 3x3 one (taps 9) at the measured conv2d rate
    when there is one, the others at the conv3d rate; the set-up and dtype asked for, else the nearest."""
    tables = ([cal.conv2d_tflops] if taps == 9 and cal.conv2d_tflops else []) + [cal.conv3d_tflops]
    for table in tables:
        for want in ((mode, dtype), ("default", dtype), (mode, cal.dtype), ("default", cal.dtype),
                     ("default", "float32")):
            points = [(c, v) for m, d, c, v in table if (m, d) == want]
            if points:
                return _interpolate(points, width)
    raise ValueError("the calibration has no convolution rates")


def _decoder_call(vae: VaeShape, cal: Calibration, mode: str, dtype: str, first: bool) -> tuple[float, float]:
    """(convolution seconds, output elements) per latent pixel of one decoder call, each convolution at the
    measured rate of its kind and width."""
    layers = decoder_layers(vae, first)
    return (sum(f / (_conv_rate(cal, mode, dtype, w, taps) * 1e12) for w, f, _, taps in layers),
            sum(e for _, _, e, _ in layers))


def _tiled_area(width: int, height: int, spatial: int, tile: int) -> float:
    """Latent area decoded when tiling (overlapping tiles: diffusers' tiled_decode, 3/4 stride)."""
    lw, lh = width // spatial, height // spatial
    size, stride = tile // spatial, max(tile * 3 // 4 // spatial, 1)
    cols = sum(min(size, lw - j) for j in range(0, lw, stride))
    rows = sum(min(size, lh - i) for i in range(0, lh, stride))
    return cols * rows


def vae_decode_seconds(spec: ModelSpec, width: int, height: int, frames: int, vae_dtype: str, tile: int | None,
                       cal: Calibration, conv: str = "default") -> tuple[float, str]:
    """The Wan VAE's decode alone (no frame conversion), on the calibrated device: seconds and how."""
    vae = VAE22 if spec.wan22_vae else VAE21
    latent_frames = (frames - 1) // spec.vae_temporal + 1
    area = (width // spec.vae_spatial) * (height // spec.vae_spatial)
    flops = decoder_flops(vae, latent_frames, area)
    first_s, first_e = _decoder_call(vae, cal, conv, vae_dtype, True)
    rest_s, rest_e = _decoder_call(vae, cal, conv, vae_dtype, False)
    conv_s = area * (first_s + (latent_frames - 1) * rest_s)
    memory_s = area * (first_e + (latent_frames - 1) * rest_e) * vae.elementwise_bytes / (cal.memory_gbps * DECIMAL_GB)
    # A VAE smaller than the released one (the self-test models'): its work shrinks with its weights.
    released = VAE22_PARAMS if spec.wan22_vae else VAE21_PARAMS
    seconds = (conv_s + memory_s) * min(1.0, spec.vae_params / released) if spec.vae_params else conv_s + memory_s
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
    rate = _conv_rate(cal, "default", dtype, 96) * FAST_DECODER_EFFICIENCY
    return flops / (rate * 1e12), f"{flops / 1e12:.1f} TFLOP of 2-D convolutions at {rate:.0f} TFLOP/s (fast decoder)"


def _vae_encode_seconds(spec: ModelSpec, width: int, height: int, frames: int, plan: Plan,
                       cal: Calibration) -> float:
    """Image to video: the condition clip goes through the VAE's encoder inside the pipeline's call (so in
    the denoise phase): Wan2.1 I2V and A14B encode the image followed by empty frames, the whole clip;
    Wan2.2-5B encodes the image alone."""
    vae = VAE22 if spec.wan22_vae else VAE21
    encoded = 1 if spec.expand_timesteps else frames
    flops = width * height * (vae.encode_first_flops_per_pixel + (encoded - 1) * vae.encode_flops_per_pixel)
    return flops / (_conv_rate(cal, "default", plan.vae_dtype, 96) * 1e12) * VAE_ENCODE_OVERHEAD


def _postprocess(pixels: int, plan: Plan, cal: Calibration, streamed: bool = False) -> float:
    """Frames to the host: a streamed decode converts each chunk to uint8 on the device and copies that;
    a whole decode brings float32 frames over and converts them there (engine/run/decoding.py)."""
    nbytes = pixels * 3 * (1 if streamed else 4)
    copy = nbytes / (cal.d2h_gbps * DECIMAL_GB) if cal.d2h_gbps and plan.device != "cpu" else 0.0
    return copy + (0.0 if streamed else POSTPROCESS_PASSES * nbytes / (cal.to_uint8_gbps * DECIMAL_GB))


# ----- load, transfer, export ----------------------------------------------------------------------------

def _weights(spec: ModelSpec, plan: Plan) -> dict[str, float]:
    """Bytes of each component's weights as the plan holds them (the image encoder where the model has one)."""
    nbytes = _bytes_per(plan.dtype)
    return {"transformer": _transformer_bytes(spec, nbytes, plan.fp8) * spec.experts,
            "encoders": (spec.text_encoder_params + spec.image_encoder_params) * nbytes,
            "vae": spec.vae_params * _bytes_per(plan.vae_dtype)}


def _swaps_experts(spec: ModelSpec, plan: Plan) -> bool:
    """One expert on the device at a time (a plan from before the expert_swap rung existed never swaps)."""
    return plan.strategy == "expert_swap" and spec.experts > 1


def _on_device_bytes(spec: ModelSpec, weights: dict[str, float], plan: Plan) -> float:
    """Bytes that are copied to the device once, when the pipeline is placed."""
    if plan.device == "cpu":
        return 0.0
    on_device = weights["transformer"] / (spec.experts if _swaps_experts(spec, plan) else 1)   # one expert at a time
    return (weights["vae"] + (on_device if plan.transformer == "device" else 0.0)
            + (weights["encoders"] if plan.text_encoder == "device" else 0.0))


def _load(spec: ModelSpec, plan: Plan, cal: Calibration, weight_bytes: int | None) -> tuple[float, str]:
    weights = _weights(spec, plan)
    nbytes = float(weight_bytes) if weight_bytes else sum(weights.values())
    disk = cal.disk_gbps or DEFAULT_DISK_GBPS
    source = "measured by the last load" if cal.disk_gbps else "a conservative default: no load measured yet"
    seconds = nbytes / (disk * DECIMAL_GB)
    how = f"{nbytes / DECIMAL_GB:.1f} GB of weights read at {disk:.1f} GB/s ({source})"
    if plan.load == "device_map" and plan.device != "cpu":
        gbps, kind = _copy_gbps(cal, False)
        moved = _on_device_bytes(spec, weights, plan)
        seconds += moved / (gbps * DECIMAL_GB)
        how += f", {moved / DECIMAL_GB:.1f} GB of it straight to the device ({kind}, {gbps:.1f} GB/s)"
    return seconds, how


def _transfer(spec: ModelSpec, plan: Plan, cal: Calibration) -> tuple[float, str]:
    """Placing the components: copies to the device (unless loaded there), page-locking what streams."""
    weights = _weights(spec, plan)
    moved = _on_device_bytes(spec, weights, plan) if plan.load != "device_map" else 0.0
    pinned = 0.0
    if plan.pin_memory and plan.device != "cpu":
        pinned = ((weights["transformer"] if plan.transformer != "device" or _swaps_experts(spec, plan) else 0.0)
                  + (weights["encoders"] if plan.text_encoder == "streamed" else 0.0))
    gbps, kind = _copy_gbps(cal, False)
    seconds = moved / (gbps * DECIMAL_GB)
    how = f"{moved / DECIMAL_GB:.1f} GB to the device ({kind}, {gbps:.1f} GB/s)" if moved else "nothing to copy"
    if pinned:
        pin = (cal.pin_gbps or 1.0) * PIN_EFFICIENCY
        seconds += pinned / (pin * DECIMAL_GB)
        how += f"; {pinned / DECIMAL_GB:.1f} GB page-locked for streaming at {pin:.2f} GB/s"
    return seconds, how


def _expert_swap(spec: ModelSpec, plan: Plan, cal: Calibration, swaps: int) -> tuple[float, str]:
    """Copying the low-noise expert to the device at the boundary (the high-noise one's RAM copy is kept, so
    dropping its device copy costs nothing); ``swaps``: 2 when the pipeline is loaded with the low-noise expert
    still on the device from the last run, which goes back first."""
    expert = _transformer_bytes(spec, _bytes_per(plan.dtype), plan.fp8)
    if plan.device == "cpu":
        return 0.0, "from RAM to RAM: nothing to copy"
    gbps, kind = _copy_gbps(cal, plan.pin_memory)
    how = f"{expert / DECIMAL_GB:.1f} GB expert to the device ({kind}, {gbps:.1f} GB/s)"
    twice = ", twice (the high-noise expert goes back first)" if swaps > 1 else ""
    return swaps * expert / (gbps * DECIMAL_GB), how + twice


def _export(pixels: int, cal: Calibration) -> tuple[float, str]:
    if cal.encode_megapixels_per_s:
        rate, fixed, source = cal.encode_megapixels_per_s, cal.encode_fixed_s or 0.0, "measured here"
    else:
        rate, fixed, source = DEFAULT_ENCODE_MPS, DEFAULT_ENCODE_FIXED_S, "not measured here: a 16-core CPU's rate"
    return pixels / (rate * 1e6) + fixed, f"{pixels / 1e6:.0f} megapixels of H.264 at {rate:.1f} MP/s ({source}) + {fixed:.2f} s"


# ----- the prediction ------------------------------------------------------------------------------------

def predict_times(spec: ModelSpec, width: int, height: int, frames: int, steps: int, guidance: float, plan: Plan,
                  calibration: Calibration, decoder: str = "vae", *, image_to_video: bool = False,
                  loaded: bool = False, compiled: bool = False, weight_bytes: int | None = None) -> PhaseTimes:
    """Seconds of each phase of one run under ``plan`` on the calibrated machine.

    ``loaded``: the pipeline is already loaded under this plan (no load or transfer phase, no first-use cost
    of the text encoder). ``compiled``: a compiled transformer has already run at this size.
    ``weight_bytes``: the bytes of the model's weight files, when known (else its parameters in the plan's
    dtype). The plan's ``attention_backend``, ``compile`` and ``conv`` are read with defaults, so a plan from
    before they existed still predicts.
    """
    if decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}; one of {', '.join(DECODERS)}")
    passes = 2 if guidance > 1.0 else 1
    tokens = spec.tokens(width, height, frames)
    pixels = width * height * frames
    seconds: dict[str, float] = {}
    how: dict[str, str] = {}
    if not loaded:
        seconds["load"], how["load"] = _load(spec, plan, calibration, weight_bytes)
        seconds["transfer"], how["transfer"] = _transfer(spec, plan, calibration)
    seconds["text_encode"], how["text_encode"] = _text_encode(spec, plan, calibration, passes, loaded)
    if image_to_video and spec.image_encoder_params:
        seconds["image_encode"], how["image_encode"] = _image_encode(spec, plan, calibration)
    seconds["denoise"], step, how["denoise"] = _denoise(spec, (width, height, frames), image_to_video, steps, passes,
                                                        plan, calibration, compiled)
    if _swaps_experts(spec, plan):
        seconds["expert_swap"], how["expert_swap"] = _expert_swap(spec, plan, calibration, 2 if loaded else 1)
    if decoder == "fast":
        decode, decode_how = fast_decode_seconds(spec, width, height, frames, plan.dtype, calibration)
    else:
        decode, decode_how = vae_decode_seconds(spec, width, height, frames, plan.vae_dtype, plan.vae_tile,
                                                calibration, plan.conv)
    tiled = plan.vae_tile is not None and (plan.vae_tile < width or plan.vae_tile < height)
    streamed = frames > 1 and (decoder == "fast" or not tiled)
    post = _postprocess(pixels, plan, calibration, streamed)
    seconds["vae_decode"] = decode + post
    how["vae_decode"] = f"{decode_how}; +{post:.2f} s to bring the frames to the host as uint8"
    seconds["export"], how["export"] = _export(pixels, calibration)
    if streamed:   # the encoder works while the decoder does: only its tail is left after the last frame
        seconds["export"] *= STREAMED_EXPORT_SHARE
        how["export"] += f"; streamed beside the decode, x{STREAMED_EXPORT_SHARE} left after the last frame"
    seconds = {k: round(v, 3) for k, v in seconds.items()}
    return PhaseTimes(seconds, how, round(step, 4), steps, passes, tokens, pixels, round(sum(seconds.values()), 2),
                      loaded)


# ----- learning from real runs ---------------------------------------------------------------------------

# How a pass's time grows with its tokens when only one run is known: between 1 (linear layers) and 2
# (attention). Measured on an H200 from 8k to 33k tokens: 1.28 (14B, 5B) to 1.38 (1.3B), and 1.65 for 1.3B
# from 33k to 76k tokens (docs/data/timing-h200.json).
STEP_TOKEN_EXPONENT = 1.4


@dataclass(frozen=True)
class MeasuredRun:
    """A finished run of the same model and plan family, as the engine stores it."""
    seconds: dict                      # phase -> measured seconds
    tokens: int
    steps: int
    passes: int                        # per step
    pixels: int                        # width x height x frames
    step_seconds: float | None = None  # the mean step; None: the denoise phase over the steps
    loaded: bool = False               # the pipeline was already loaded (no load, no first-use costs)

    @property
    def step(self) -> float | None:
        if self.step_seconds:
            return self.step_seconds
        return self.seconds["denoise"] / self.steps if self.steps and "denoise" in self.seconds else None


def token_exponent(runs: Sequence[MeasuredRun]) -> float:
    """How a pass's seconds grow with tokens: fitted (log-log) to runs at two or more lengths, else the
    default; kept between 1 and 2, the linear layers' and attention's own exponents."""
    points = [(math.log(r.tokens), math.log(r.step / r.passes)) for r in runs if r.step and r.tokens and r.passes]
    xs = {x for x, _ in points}
    if len(xs) < 2:
        return STEP_TOKEN_EXPONENT
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    slope = (sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points))
    return min(max(slope, 1.0), 2.0)


def learn(prediction: PhaseTimes, runs: Sequence[MeasuredRun]) -> PhaseTimes:
    """``prediction`` corrected by what this machine really did for the same model and plan: each phase
    takes the nearest run's measured seconds, scaled to the new request (a step by passes and
    (tokens'/tokens)^a, the decode and export by pixels, the text encode by prompts). Phases no run
    measured (or measured in another state: first run after a load or not) keep the model's figure."""
    if not runs:
        return prediction
    a = token_exponent(runs)

    def distance(run: MeasuredRun) -> float:
        return abs(math.log(run.tokens / prediction.tokens)) + abs(math.log(run.pixels / prediction.pixels))

    # The nearest in size; among equals, one in the same state (first run after a load or not: the first
    # pays one-off costs in its decode), then the newest.
    run = min((r for r in reversed(runs) if r.tokens and r.pixels),
              key=lambda r: (round(distance(r), 6), r.loaded != prediction.loaded), default=None)
    if run is None:
        return prediction
    seconds, how = dict(prediction.seconds), dict(prediction.how)
    said = f"learned from a run of {run.tokens} tokens, {run.steps} steps"
    step = prediction.step_seconds
    if run.step and "denoise" in seconds:
        step = run.step / run.passes * (prediction.tokens / run.tokens) ** a * prediction.passes
        rest = max(run.seconds.get("denoise", 0.0) - run.step * run.steps, 0.0) * prediction.pixels / run.pixels
        seconds["denoise"] = step * prediction.steps + rest
        how["denoise"] = f"{said}: {run.step:.3f} s a step x (tokens ratio)^{a:.2f} x passes ratio"
    for phase in ("vae_decode", "export"):
        # The first decode after a load pays one-off costs (1.80 s later, 3.01 s first on an H200): a decode is
        # learned only from a run in the same state.
        if phase in run.seconds and phase in seconds and (phase != "vae_decode" or run.loaded == prediction.loaded):
            seconds[phase] = run.seconds[phase] * prediction.pixels / run.pixels
            how[phase] = f"{said}: {run.seconds[phase]:.2f} s x pixels ratio"
    if "text_encode" in run.seconds and run.loaded == prediction.loaded:
        seconds["text_encode"] = run.seconds["text_encode"] * prediction.passes / run.passes
        how["text_encode"] = f"{said}: {run.seconds['text_encode']:.2f} s x prompts ratio"
    for phase in ("load", "transfer", "image_encode"):
        if phase in run.seconds and phase in seconds:
            seconds[phase] = run.seconds[phase]
            how[phase] = f"{said}: as measured"
    seconds = {k: round(v, 3) for k, v in seconds.items()}
    return replace(prediction, seconds=seconds, how=how, step_seconds=round(step, 4),
                   total=round(sum(seconds.values()), 2))
