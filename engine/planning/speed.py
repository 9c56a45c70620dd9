"""The plan's speed choices: VAE precision, convolution settings, compiling the transformer, attention.

A pure function of the hardware, the request and the user's overrides (no torch), beside the memory plan
and explained the same way: every choice comes with a sentence saying why. What each choice is worth was
measured on an H200 (docs/speed.md); the rules here only say where a choice works and where it pays.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.planning.memory import pass_frames
from engine.planning.places import TransformerPlace
from engine.settings.choices import ATTENTION_BACKENDS, DECODERS, STEP_CACHES, VAE_DTYPES  # noqa: F401

# How the decode's convolutions are set up, per backend:
#   benchmark:  cuDNN tries its algorithms once per shape and keeps the fastest. Not chosen on CUDA: on an
#               H200 it gained nothing once tuned (a Wan2.1 decode of 832x480x81 in 2.42 s against 2.38 s in
#               bfloat16, 3.55 against 3.53 s in float32) and the tuning cost the first decode after every load
#               or new size 1.2-2.8 s (docs/speed.md);
#   no_miopen:  MIOpen off for the decode (ROCm): it picks naive kernels for the Wan VAE's 3-D convolutions
#               (the source article's decode took 86% of the run); torch's own convolutions run instead;
#   default:    the backend's defaults (CUDA, CPU, Apple).
CONV_MODES = ("benchmark", "no_miopen", "default")
# A compiled transformer earns its one-off compile (about 11-16 s on an H200 for the 1.3B model,
# docs/reference-figures.md) back at about 0.15 s a pass: compiling by itself pays from this many transformer
# passes in one run.
COMPILE_MIN_PASSES = 80
# With the kernels of an earlier process in the app's compile cache (engine/device/compile_cache.py) compiling
# costs about a quarter of that (17.3 s -> 4.2 s on an H100 for the 1.3B at 832x480x81,
# docs/data/compile-cache-h100.json), so it pays from a quarter of the passes.
COMPILE_MIN_PASSES_CACHED = 20
COMPILE_GAIN = "about 12% faster steps (1.07 s instead of 1.21 s on an H200, 1.3B)"


@dataclass(frozen=True)
class SpeedRequest:
    """What the speed choices read of a request: its steps and guidance (passes per step) and its options."""
    steps: int = 0
    guidance: float = 1.0
    step_cache: str | None = None
    compile_cached: bool = False   # this size was compiled on this machine before (its kernels are in the cache)

    @property
    def passes(self) -> int:
        return self.steps * (2 if self.guidance > 1.0 else 1)


@dataclass(frozen=True)
class SpeedChoices:
    vae_dtype: str
    conv: str
    compile: bool
    attention_backend: str
    decisions: tuple[str, ...] = ()


def fast_bf16(backend: str, arch: str) -> bool:
    """Does this device compute bfloat16 at full speed? CUDA from compute capability 8 (Ampere) on; AMD's
    RDNA3/RDNA4, Strix Halo and Instinct cards; not RDNA2 (gfx10) and older, not Apple or the CPU."""
    if backend == "cuda":
        if arch.startswith("sm_") and arch[3:].isdigit():
            return int(arch[3:]) >= 80
        return True
    if backend == "rocm":
        return not arch.startswith(("gfx10", "gfx8"))
    return False


def vae_dtype_for(backend: str, arch: str, forced: str | None = None) -> str:
    """bfloat16 where the device computes it at full speed (about 0.65x the fp32 decode's time and half its
    memory), float32 elsewhere; ``forced`` wins."""
    if forced:
        return forced
    return "bfloat16" if fast_bf16(backend, arch) else "float32"


def conv_mode_for(backend: str) -> str:
    return "no_miopen" if backend == "rocm" else "default"


def compile_possible(backend: str, os_name: str, triton: bool) -> tuple[bool, str]:
    """(whether the transformer can be compiled on a machine so described, why not): the planner's reading of
    the hardware profile, whose ``triton`` the engine process set with hardware.can_compile."""
    if backend not in ("cuda", "rocm"):
        return False, "compiling needs a CUDA or ROCm GPU"
    if backend == "rocm" and os_name == "windows":
        return False, "ROCm on Windows has no Triton, which compiling needs"
    if not triton:
        return False, "Triton is not installed, which compiling needs"
    return True, ""


def choose_speed(hw, speed: SpeedRequest, transformer: TransformerPlace, fp8: bool,
                 forced_vae_dtype: str | None = None, forced_compile: bool | None = None,
                 forced_attention: str | None = None) -> SpeedChoices:
    """The speed choices for a plan that holds its transformer as ``transformer`` says."""
    said = []
    vae_dtype = vae_dtype_for(hw.backend, hw.arch, forced_vae_dtype)
    if forced_vae_dtype:
        said.append(f"The VAE decodes in {vae_dtype} (your choice).")
    elif vae_dtype == "bfloat16":
        said.append("The VAE decodes in bfloat16: about a third faster than float32 and half its memory, "
                    "frames within a few levels of 255 of the float32 decode.")
    elif hw.backend in ("cuda", "rocm"):
        said.append(f"The VAE decodes in float32: {hw.arch or 'this GPU'} has no fast bfloat16.")
    conv = conv_mode_for(hw.backend)
    if conv == "benchmark":
        said.append("cuDNN picks the fastest convolution for the decode once per size (cudnn.benchmark).")
    elif conv == "no_miopen":
        said.append("MIOpen is off for the decode: its kernels for the VAE's 3-D convolutions are the slow "
                    "path on AMD; torch's own convolutions run instead.")
    compile_ = _compile(hw, speed, transformer, fp8, forced_compile, said)
    attention = forced_attention or hw.attention or "native"
    if forced_attention:
        said.append(f"Attention runs on the '{attention}' backend (your choice).")
    elif hw.attention and hw.attention != "native":
        said.append(f"Attention runs on the '{attention}' backend: the fastest measured on this machine.")
    return SpeedChoices(vae_dtype, conv, compile_, attention, tuple(said))


def _compile(hw, speed: SpeedRequest, transformer: TransformerPlace, fp8: bool, forced: bool | None,
             said: list) -> bool:
    possible, why_not = compile_possible(hw.backend, hw.os, hw.triton)
    streams = transformer != TransformerPlace.DEVICE
    blocker = (why_not if not possible else
               "the transformer streams from RAM (offload hooks and compiling don't mix)" if streams
               else "its weights are stored in fp8 (layerwise casting hooks)" if fp8
               else "a step cache is on (its hooks and compiling don't mix)" if speed.step_cache else "")
    if forced is False:
        said.append("The transformer is not compiled (your choice).")
        return False
    if blocker:
        if forced:
            said.append(f"The transformer is not compiled although you asked: {blocker}.")
        elif possible:
            said.append(f"The transformer is not compiled: {blocker}.")
        return False
    if forced:
        said.append(f"The transformer's repeated blocks are compiled (your choice): the first run at each size "
                    f"compiles them (seconds), then {COMPILE_GAIN}.")
        return True
    if speed.compile_cached and speed.passes >= COMPILE_MIN_PASSES_CACHED:
        said.append(f"The transformer's repeated blocks are compiled: this size was compiled here before and its "
                    f"kernels are in the compile cache (seconds to load), which {speed.passes} passes earn back; "
                    f"then {COMPILE_GAIN}.")
        return True
    if speed.passes >= COMPILE_MIN_PASSES:
        said.append(f"The transformer's repeated blocks are compiled: {speed.passes} passes earn back the one-off "
                    f"compile at each size; then {COMPILE_GAIN}.")
        return True
    least = COMPILE_MIN_PASSES_CACHED if speed.compile_cached else COMPILE_MIN_PASSES
    cached = " from the compile cache" if speed.compile_cached else ""
    said.append(f"The transformer is not compiled: {speed.passes} passes would not earn back compiling{cached} "
                f"(it pays from {least}); turn Compile on to pay it once for many videos.")
    return False


def compile_key(spec, width: int, height: int, frames: int, window: int, image_to_video: bool,
                device_name: str, torch_version: str) -> str:
    """One compiled size as the compile cache's index names it: the transformer's shape, the tokens of a pass,
    image to video or not, the GPU and the torch version (what the kernels depend on)."""
    shape = spec.transformer
    tokens = spec.tokens(width, height, pass_frames(spec, frames, window))
    return (f"{shape.layers}x{shape.heads}x{shape.head_dim}x{shape.ffn}x{shape.in_channels}/{tokens}/"
            f"{'i2v' if image_to_video else 't2v'}/{device_name}/{torch_version}")


# The GPUs whose tensor cores multiply float8 and torchao's float8 linears support: NVIDIA from compute capability
# 8.9 (Ada, Hopper, Blackwell), AMD's MI300 and MI350 (torchao/float8/inference.py checks the same).
FP8_MIN_CUDA_CAPABILITY = 89
FP8_ROCM_ARCHS = ("gfx942", "gfx950")
FP8_GPUS = "NVIDIA from Ada and Hopper on (RTX 40xx, L4, L40, H100, H200), AMD MI300"


def fp8_compute_missing(hw) -> str | None:
    """Why this machine cannot compute the transformer's linears in float8 (None: it can)."""
    capable = (hw.backend == "rocm" and hw.arch in FP8_ROCM_ARCHS) or (
        hw.backend == "cuda" and hw.arch.startswith("sm_") and hw.arch[3:].isdigit()
        and int(hw.arch[3:]) >= FP8_MIN_CUDA_CAPABILITY)
    if not capable:
        where = "the CPU" if hw.backend == "cpu" else f"{hw.device_name or 'this GPU'}"
        return f"{where} has no float8 tensor cores (they are on {FP8_GPUS})"
    if not hw.torchao:
        return "torchao is not installed (pip install torchao)"
    if not hw.triton:
        return "it runs compiled, and Triton is not available here"
    return None


def speed_line(plan) -> str:
    """The plan's speed choices in one line: "VAE bfloat16, convolutions: cuDNN benchmark, compiled, attention
    native" (a CPU plan: its precision only)."""
    conv = {"benchmark": "cuDNN benchmark", "no_miopen": "MIOpen off", "default": "defaults"}[plan.conv]
    if plan.device == "cpu":
        return f"VAE {plan.vae_dtype}" + (", guidance in one batch" if getattr(plan, "guidance_batch", False) else "")
    layout = ""
    if getattr(plan, "channels_last", False):
        frames = f", {plan.decode_window} latent frames a call" if plan.decode_window > 1 else ""
        layout = f" (channels-last{frames}, approximate)"
    batch = ", guidance in one batch" if getattr(plan, "guidance_batch", False) else ""
    batch += ", float8 linears (approximate)" if getattr(plan, "fp8_compute", False) else ""
    return (f"VAE {plan.vae_dtype}, convolutions: {conv}{layout}, transformer "
            f"{'compiled' if plan.compile else 'not compiled'}, attention: {plan.attention_backend}{batch}")
