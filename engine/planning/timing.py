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
- export: frame pixels over the measured H.264 rate (engine/planning/export_time.py); load: weight bytes over the
  disk's rate; transfer: bytes to the device over the copy rate (and page-locking for streamed parts);
- interpolate / upscale (the steps after the video is written): each by the method the users' files make it run,
  its frames' megapixels over that method's measured rate (engine/planning/post_time.py).

The rates are read from the calibration in engine/planning/rates.py, the VAE's work is counted in
engine/planning/vae_time.py, and engine/planning/learning.py corrects a prediction with the runs this machine
really made.

The coefficients that are not rates (what fraction of a copy is hidden, how many passes over memory the
elementwise work makes) were fitted on an H200 with real-size random-weight models (the raw figures are in
docs/data/timing-h200.json) and are named beside the work they count, with where each comes from.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from engine.device.calibrate import Calibration
from engine.device.hardware import DECIMAL_GB
from engine.models.spec import TEXT_TOKENS, UMT5_XXL_PARAMS, ModelSpec
from engine.models.windows import OVERLAP_FRAMES, model_windows
from engine.planning.memory import FP8_KEPT_FRACTION, pass_frames, stored_bytes
from engine.planning.places import TransformerPlace
from engine.planning.plan import Plan
from engine.planning.export_time import export_seconds, join_seconds, still_seconds, streamed_export
from engine.planning.post_time import PostFiles, post_seconds, post_works
from engine.planning.fp8_time import FP8_COMPILE_FIRST_S, fp8_linears
from engine.planning.rates import Rates, bytes_per, copy_gbps, device_rates
from engine.planning.small_work import SmallRun, small_seconds
from engine.planning.small_work import step_seconds as small_step
from engine.planning.speed import DECODERS
from engine.planning.vae_time import decode_seconds, vae_encode_seconds, video_encode_seconds
from engine.settings.choices import TextEncoderPlace


# The phases predicted, in the order a run passes through them (engine/events.py PHASES, less those that are
# not the run itself: the engine's start, a download, building a self-test model).
PHASES = ("load", "transfer", "text_encode", "image_encode", "video_encode", "denoise", "expert_swap", "vae_decode",
          "export", "interpolate", "upscale", "join")

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
# Guidance in one batch (engine/run/guidance_batch.py): one pass of batch 2 against two passes, compiled, 1.3B at
# 832x480x81 on an H100: 1.071 s a step against 1.096 s (docs/data/speed-past-bf16-long-h100.json).
GUIDANCE_BATCH_FACTOR = 0.977
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


# ----- the frames ---------------------------------------------------------------------------------------
# After the decode the frames come to the host in float32 and are converted to uint8; the conversion the
# calibration times (engine/outputs/export_rates.py) is one of about this many passes over them (the
# permute into a NumPy array, the clip and scale): fitted to the engine's vae_decode phase, 3.7-4.2 s on an
# H200 against 2.8 s for the decode alone (docs/reference-figures.md).
POSTPROCESS_PASSES = 3

# ----- copies, disk and export ---------------------------------------------------------------------------
# The rate weights are read at when no load has been measured yet: a conservative local SSD (the engine's
# load of 14.7 GB took 10.9 s on the H200 machine, 1.35 GB/s, docs/reference-figures.md).
DEFAULT_DISK_GBPS = 1.5
# Page-locking a model tensor by tensor is slower than pinning one large buffer as calibrate.py does:
# 0.91 GB/s for the 14B transformer and 1.16 GB/s for UMT5 against 1.45 GB/s calibrated (docs/speed.md).
PIN_EFFICIENCY = 0.7


@dataclass(frozen=True)
class PhaseTimes:
    """Predicted seconds of each phase of one run (only the phases it will go through), with a line per
    phase saying what the figure rests on."""
    seconds: dict            # phase -> seconds, in PHASES order
    how: dict                # phase -> one line: the work and the rate behind the figure
    step_seconds: float      # one denoising step, all its passes
    steps: int
    passes: int              # transformer passes per step (2 with guidance; times the windows of a long video)
    tokens: int              # the transformer's sequence length
    pixels: int              # output pixels: width x height x frames
    total: float
    loaded: bool = False     # predicted for a pipeline already loaded (no load, transfer, first-use costs)
    # The time model's own step, before runs corrected it (engine/planning/learning.py): what a finished run's
    # measured step is compared with.
    model_step_seconds: float | None = None
    prompts: int = 0         # prompts encoded (2 with guidance); 0: as many as ``passes`` (before windows)
    # The steps after the video, as the time model counted them: phase -> PostWork.to_dict() (how, how much).
    post: dict = field(default_factory=dict)
    compile_seconds: float = 0.0   # the one-off compile inside the denoise (a first compiled run at this size)
    # The time model's own seconds of each phase, before runs corrected them: what a finished run's are compared with.
    model_seconds: dict = field(default_factory=dict)

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


# ----- the transformer -----------------------------------------------------------------------------------

def transformer_pass(spec: ModelSpec, tokens: int, image_tokens: int, rates: Rates, act_bytes: int,
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


def _offloaded(pass_: PassTime, copy: float, how: TransformerPlace | None) -> PassTime:
    """A pass whose weights stream in (``copy`` seconds of copies) as group or leaf offload's do (``how``), or
    with no copy stream (None)."""
    if how == TransformerPlace.GROUP:
        visible = max(pass_.compute, copy) + GROUP_EXPOSED * min(pass_.compute, copy) - pass_.compute
    elif how == TransformerPlace.LEAF:
        visible = LEAF_EXPOSED * copy
    else:
        visible = copy    # no copy stream: nothing overlaps
    return replace(pass_, copies=visible)


def _transformer_bytes(spec: ModelSpec, nbytes: int, fp8: bool) -> float:
    """Bytes of one expert's transformer weights (fp8 storage keeps norms and biases in 16-bit)."""
    params = spec.transformer.params
    return params * (1 + FP8_KEPT_FRACTION * (nbytes - 1)) if fp8 else params * nbytes


def _denoise(spec: ModelSpec, size: tuple[int, int, int], tokens: int, image_to_video: bool, steps: int,
             passes: int, plan: Plan, cal: Calibration, compiled: bool) -> tuple[float, float, str, float]:
    """(phase seconds, step seconds, how, the one-off compile's seconds in them) of the denoising loop: ``passes`` transformer passes of ``tokens`` a
    step (a window's each, in a longer video), the video of ``size`` (width, height, frames)."""
    rates = device_rates(plan, cal)
    act_bytes = bytes_per(plan.dtype)
    backend = plan.attention_backend
    factor = ATTENTION_BACKEND_FACTOR.get(backend, 1.0)
    image_tokens = IMAGE_TOKENS if image_to_video and spec.image_encoder_params else 0
    compile_on = bool(plan.compile)
    one = transformer_pass(spec, tokens, image_tokens, rates, act_bytes, factor, compile_on)
    fp8_how = ""
    if getattr(plan, "fp8_compute", False):
        one, fp8_how = fp8_linears(one, spec, tokens, rates, cal)
    batched = bool(getattr(plan, "guidance_batch", False)) and passes == 2
    if batched:   # one pass of batch 2 a step: twice the compute, the weights read (and streamed) once
        one = PassTime(*(2 * GUIDANCE_BATCH_FACTOR * part for part in (one.linear, one.attention, one.elementwise)))
        passes = 1
    nbytes = bytes_per(plan.dtype)
    cast = ""
    if plan.fp8:
        # Layerwise casting reads each fp8 weight and writes it in 16-bit once per pass.
        extra = spec.transformer.params * (1 + nbytes) / rates.memory
        one = replace(one, elementwise=one.elementwise + extra)
        cast = ", fp8 weights cast each pass"
    offload = ""
    if plan.transformer != TransformerPlace.DEVICE and plan.device != "cpu":
        blocks = spec.transformer.layers * spec.transformer.block_params
        block_bytes = blocks * (1 if plan.fp8 else nbytes)
        gbps, kind = copy_gbps(cal, plan.pin_memory)
        if plan.transformer == TransformerPlace.DISK:   # every block read from its file at every pass: the disk's pace
            disk = cal.disk_gbps or DEFAULT_DISK_GBPS
            if disk < gbps:
                gbps, kind = disk, ("from disk, measured by the last load" if cal.disk_gbps else
                                    "from disk, a conservative default: no load measured yet")
        copy = block_bytes / (gbps * DECIMAL_GB)
        # A disk rung's blocks overlap as group offload's do.
        overlap = TransformerPlace.GROUP if plan.transformer == TransformerPlace.DISK else plan.transformer
        one = _offloaded(one, copy, overlap if plan.use_stream else None)
        offload = (f", +{one.copies:.2f} s of {block_bytes / DECIMAL_GB:.1f} GB streamed ({kind}, {gbps:.0f} GB/s, "
                   f"{plan.transformer} offload)")
    step = one.total * passes
    seconds = step * steps
    condition = ""
    if image_to_video:
        encode = vae_encode_seconds(spec, *size, plan, cal)
        seconds += encode
        condition = f"; +{encode:.2f} s to VAE-encode the image condition"
    first_compile, first = "", 0.0
    if compile_on and not compiled:
        first = FP8_COMPILE_FIRST_S if getattr(plan, "fp8_compute", False) else COMPILE_FIRST_S
        seconds += first
        first_compile = f"; +{first:.0f} s compiling at this size"
    shape = "1 batched pass of 2" if batched else f"{passes} pass{'es' if passes > 1 else ''}"
    how = (f"{steps} steps x {shape} x {one.total:.3f} s: linear {one.linear:.3f} s, "
           f"attention {one.attention:.3f} s ({tokens} tokens, {backend}), elementwise {one.elementwise:.3f} s"
           f"{fp8_how}{cast}{offload}{condition}{first_compile}" + (f" ({rates.note})" if rates.note else ""))
    return seconds, step, how, first


def _encode(flops: float, launch_s: float, weights: float, place: str, plan: Plan, cal: Calibration,
            prompts: int) -> tuple[float, str]:
    """Seconds and how of running an encoder ``prompts`` times where the plan keeps it."""
    if place == TextEncoderPlace.CPU or plan.device == "cpu":
        rate = cal.cpu_matmul_tflops if cal.backend != "cpu" else max(v for _, v in cal.matmul_tflops)
        seconds = prompts * flops / (rate * 1e12)
        return seconds, f"{prompts} x {flops / 1e12:.2f} TFLOP on the CPU at {rate:.2f} TFLOP/s"
    rate = max(v for _, v in cal.matmul_tflops)
    compute = flops / (rate * 1e12) + launch_s
    seconds = prompts * compute
    how = f"{prompts} x ({flops / 1e12:.2f} TFLOP at {rate:.0f} TFLOP/s + {launch_s:.3f} s of launches)"
    if place == TextEncoderPlace.OFFLOAD:
        gbps, kind = copy_gbps(cal, False)
        seconds += weights / (gbps * DECIMAL_GB)
        how += f", +{weights / DECIMAL_GB:.1f} GB moved to the device ({kind}, {gbps:.1f} GB/s)"
    elif place == TextEncoderPlace.STREAMED:
        gbps, kind = copy_gbps(cal, plan.pin_memory)
        copy = weights / (gbps * DECIMAL_GB)
        seconds += prompts * (LEAF_EXPOSED if plan.use_stream else 1.0) * copy
        how += f", streamed layer by layer each time ({weights / DECIMAL_GB:.1f} GB, {kind}, {gbps:.0f} GB/s)"
    return seconds, how


def _text_encode(spec: ModelSpec, plan: Plan, cal: Calibration, prompts: int, loaded: bool) -> tuple[float, str]:
    dense = max(spec.text_encoder_params - spec.text_encoder_largest_params, 0)   # the embedding is a lookup
    flops = 2.0 * dense * TEXT_TOKENS + UMT5_ATTENTION_FLOPS * spec.text_encoder_params / UMT5_XXL_PARAMS
    weights = spec.text_encoder_params * bytes_per(plan.dtype)
    seconds, how = _encode(flops, ENCODE_LAUNCH_S, weights, plan.text_encoder, plan, cal, prompts)
    if not loaded and plan.device != "cpu" and plan.text_encoder != TextEncoderPlace.CPU:
        seconds += prompts * FIRST_ENCODE_S
        how += f", +{FIRST_ENCODE_S} s a prompt on first use after a load"
    return seconds, how


def _image_encode(spec: ModelSpec, plan: Plan, cal: Calibration) -> tuple[float, str]:
    flops = 2.0 * spec.image_encoder_params * IMAGE_TOKENS
    weights = spec.image_encoder_params * bytes_per(plan.dtype)
    return _encode(flops, IMAGE_ENCODE_LAUNCH_S, weights, plan.text_encoder, plan, cal, 1)


def _postprocess(pixels: int, plan: Plan, cal: Calibration, streamed: bool = False) -> float:
    """Frames to the host: a streamed decode converts each chunk to uint8 on the device and copies that;
    a whole decode brings float32 frames over and converts them there (engine/run/decoding.py)."""
    nbytes = pixels * 3 * (1 if streamed else 4)
    copy = nbytes / (cal.d2h_gbps * DECIMAL_GB) if cal.d2h_gbps and plan.device != "cpu" else 0.0
    return copy + (0.0 if streamed else POSTPROCESS_PASSES * nbytes / (cal.to_uint8_gbps * DECIMAL_GB))


# ----- load, transfer, export ----------------------------------------------------------------------------

def _weights(spec: ModelSpec, plan: Plan) -> dict[str, float]:
    """Bytes of each component's weights as the plan holds them (the image encoder where the model has one)."""
    nbytes = bytes_per(plan.dtype)
    return {"transformer": _transformer_bytes(spec, nbytes, plan.fp8) * spec.experts,
            "encoders": (spec.text_encoder_params + spec.image_encoder_params) * nbytes,
            "vae": spec.vae_params * bytes_per(plan.vae_dtype)}


def _swaps_experts(spec: ModelSpec, plan: Plan) -> bool:
    """One expert on the device at a time (a plan from before the expert_swap rung existed never swaps)."""
    return plan.strategy == "expert_swap" and spec.experts > 1


def _on_device_bytes(spec: ModelSpec, weights: dict[str, float], plan: Plan) -> float:
    """Bytes that are copied to the device once, when the pipeline is placed."""
    if plan.device == "cpu":
        return 0.0
    on_device = weights["transformer"] / (spec.experts if _swaps_experts(spec, plan) else 1)   # one expert at a time
    return (weights["vae"] + (on_device if plan.transformer == TransformerPlace.DEVICE else 0.0)
            + (weights["encoders"] if plan.text_encoder == TextEncoderPlace.DEVICE else 0.0))


def _load(spec: ModelSpec, plan: Plan, cal: Calibration, weight_bytes: int | None) -> tuple[float, str]:
    weights = _weights(spec, plan)
    # The files' bytes: measured on disk, else as the repository stores them (Wan2.1's float32: twice bf16's).
    nbytes = float(weight_bytes) if weight_bytes else (stored_bytes(spec) or sum(weights.values()))
    disk = cal.disk_gbps or DEFAULT_DISK_GBPS
    source = "measured by the last load" if cal.disk_gbps else "a conservative default: no load measured yet"
    seconds = nbytes / (disk * DECIMAL_GB)
    how = f"{nbytes / DECIMAL_GB:.1f} GB of weights read at {disk:.1f} GB/s ({source})"
    if plan.load == "device_map" and plan.device != "cpu":
        gbps, kind = copy_gbps(cal, False)
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
        moves = plan.transformer != TransformerPlace.DEVICE or _swaps_experts(spec, plan)   # streams or swaps
        pinned = ((weights["transformer"] if moves else 0.0)
                  + (weights["encoders"] if plan.text_encoder == TextEncoderPlace.STREAMED else 0.0))
    gbps, kind = copy_gbps(cal, False)
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
    expert = _transformer_bytes(spec, bytes_per(plan.dtype), plan.fp8)
    if plan.device == "cpu":
        return 0.0, "from RAM to RAM: nothing to copy"
    gbps, kind = copy_gbps(cal, plan.pin_memory)
    how = f"{expert / DECIMAL_GB:.1f} GB expert to the device ({kind}, {gbps:.1f} GB/s)"
    twice = ", twice (the high-noise expert goes back first)" if swaps > 1 else ""
    return swaps * expert / (gbps * DECIMAL_GB), how + twice


# ----- the prediction ------------------------------------------------------------------------------------

def predict_times(spec: ModelSpec, width: int, height: int, frames: int, steps: int, guidance: float, plan: Plan,
                  calibration: Calibration, decoder: str = "vae", *, image_to_video: bool = False,
                  loaded: bool = False, compiled: bool = False, weight_bytes: int | None = None,
                  window: int = 0, overlap: int = OVERLAP_FRAMES, interpolate: int = 1, upscale: int = 1,
                  post_files: PostFiles = PostFiles(), video_input: bool = False, extends: bool = False) -> PhaseTimes:
    """Seconds of each phase of one run under ``plan`` on the calibrated machine.

    ``loaded``: the pipeline is already loaded under this plan (no load or transfer phase, no first-use cost
    of the text encoder). ``compiled``: a compiled transformer has already run at this size.
    ``weight_bytes``: the bytes of the model's weight files, when known (else its parameters in the plan's
    dtype). The plan's ``attention_backend``, ``compile`` and ``conv`` are read with defaults, so a plan from
    before they existed still predicts. ``window``, ``overlap``: a longer video's windows (engine/models/windows.py;
    window 0: the model's own): each pass runs the transformer once per window, on one window's tokens.
    ``interpolate``, ``upscale``: the steps after the video (1: none), run by the methods ``post_files`` (what the
    models folder holds) make them use, on the plan's device. ``video_input``: a video-to-video run encodes its input
    first (``steps``: the steps it runs); ``extends``: an extension joins its part after the video it continues.
    """
    if decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}; one of {', '.join(DECODERS)}")
    windows = model_windows(spec, frames, window, overlap)
    prompts = 2 if guidance > 1.0 else 1
    passes = prompts * (windows.count if windows else 1)
    tokens, pixels = spec.tokens(width, height, pass_frames(spec, frames, window)), width * height * frames
    seconds, how = {}, {}
    if not loaded:
        seconds["load"], how["load"] = _load(spec, plan, calibration, weight_bytes)
        seconds["transfer"], how["transfer"] = _transfer(spec, plan, calibration)
    seconds["text_encode"], how["text_encode"] = _text_encode(spec, plan, calibration, prompts, loaded)
    if image_to_video and spec.image_encoder_params:
        seconds["image_encode"], how["image_encode"] = _image_encode(spec, plan, calibration)
    if video_input:
        seconds["video_encode"], how["video_encode"] = video_encode_seconds(spec, width, height, frames, plan,
                                                                            calibration)
    seconds["denoise"], step, how["denoise"], compiling = _denoise(spec, (width, height, frames), tokens,
                                                                   image_to_video, steps, passes, plan, calibration,
                                                                   compiled)
    if _swaps_experts(spec, plan):
        seconds["expert_swap"], how["expert_swap"] = _expert_swap(spec, plan, calibration, 2 if loaded else 1)
    stream_start = _decode_and_export(spec, (width, height, frames), plan, calibration, decoder, seconds, how)
    after = _steps_after(width, height, frames, interpolate, upscale, plan, calibration, post_files, seconds, how)
    if extends:
        made = (frames - 1) * interpolate + 1, width * upscale, height * upscale
        seconds["join"], how["join"] = join_seconds(*made, calibration)
    if spec.small_work is not None and calibration.small_op_seconds:
        step = _at_least_small_work(spec, calibration, seconds, how, step, SmallRun(
            width, height, frames, steps, passes, tokens, prompts, loaded, image_to_video and
            bool(spec.image_encoder_params), video_input, (frames - 1) // spec.vae_temporal + 1))
    if stream_start:   # after the small work's floor: the encoder's start is beside the decode's own work
        seconds["vae_decode"] += stream_start
        how["vae_decode"] += f"; +{stream_start:.2f} s starting the streamed export's encoder"
    seconds = {k: round(v, 3) for k, v in seconds.items()}
    return PhaseTimes(seconds, how, round(step, 4), steps, passes, tokens, pixels, round(sum(seconds.values()), 2),
                      loaded, model_step_seconds=step, prompts=prompts, post=after, compile_seconds=compiling,
                      model_seconds=dict(seconds))


def _decode_and_export(spec: ModelSpec, size: tuple[int, int, int], plan: Plan, cal: Calibration, decoder: str,
                       seconds: dict, how: dict) -> float:
    """The decode's and the export's seconds and how put in ``seconds`` and ``how``; the seconds of the streamed
    export's start, which run inside the decode (0 when not streamed)."""
    width, height, frames = size
    pixels = width * height * frames
    decode, decode_how = decode_seconds(spec, width, height, frames, plan, cal, decoder)
    tiled = plan.vae_tile is not None and (plan.vae_tile < width or plan.vae_tile < height)
    streamed = frames > 1 and (decoder == "fast" or not tiled)
    post = _postprocess(pixels, plan, cal, streamed)
    seconds["vae_decode"] = decode + post
    how["vae_decode"] = f"{decode_how}; +{post:.2f} s to bring the frames to the host as uint8"
    seconds["export"], how["export"] = export_seconds(pixels, cal) if frames > 1 else still_seconds(pixels, cal)
    if not streamed:
        return 0.0
    # The encoder works while the decoder does: only its tail is left after the last frame.
    seconds["export"], how["export"], start = streamed_export(seconds["export"], how["export"], frames,
                                                              spec.vae_temporal, plan.device, cal)
    return start


def _at_least_small_work(spec: ModelSpec, cal: Calibration, seconds: dict, how: dict, step: float,
                         run: SmallRun) -> float:
    """Each phase at least what its small operations cost (a model too small for its arithmetic to count), in
    ``seconds`` and ``how``; the step, at least theirs."""
    for phase, (at_least, words) in small_seconds(spec.small_work, cal.small_op_seconds, run).items():
        if phase in seconds and at_least > seconds[phase]:
            seconds[phase], how[phase] = at_least, words
    return max(step, small_step(spec.small_work, cal.small_op_seconds, run))


def _steps_after(width: int, height: int, frames: int, interpolate: int, upscale: int, plan: Plan, cal: Calibration,
                 files: PostFiles, seconds: dict, how: dict) -> dict:
    """The smoother's and the larger's seconds and how put in ``seconds`` and ``how``; what each counted (phase ->
    PostWork.to_dict()), for learning from the run."""
    counted = {}
    for work in post_works(width, height, frames, interpolate, upscale, plan.device, files):
        seconds[work.phase], how[work.phase] = post_seconds(work, cal)
        counted[work.phase] = work.to_dict()
    return counted

