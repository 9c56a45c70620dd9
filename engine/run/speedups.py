"""The denoising step's speed-ups, each one a feature of diffusers: attention backends, regional compilation and
step caches.

- Attention: which of diffusers' backends can run here (its own requirement checks), how long each takes on the
  job's shape (measure, don't guess), and setting one on every transformer of a pipeline, or back to the default.
- Compilation: whether torch.compile can build kernels here, and compiling each transformer's repeated blocks
  (``compile_repeated_blocks``) once.
- Step caches (approximate: the output changes): First Block Cache, MagCache and TaylorSeer, through
  ``enable_cache`` / ``disable_cache``. MagCache needs ratios measured on the model: a first run with no ratios
  calibrates (it computes every step, like an uncached run) and records them; they are kept per model and step
  count in a small JSON file.

Step caches and fullgraph compilation exclude each other: every cache's hooks decide on the data (or are marked
``torch.compiler.disable``) inside the blocks that would be compiled, which a full graph cannot hold (torch._dynamo
raises at the first step). So a cache goes on before compiling, and then compilation is without fullgraph; both
functions refuse the other order.
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from engine.device.hardware import can_compile  # noqa: F401 (the runtime check lives with the probing)
from engine.device.runtime import synchronize
from engine.models.spec import TRANSFORMERS
from engine.atomic import write_atomically

# ---- attention ------------------------------------------------------------------------------------------

DEFAULT_ATTENTION = "native"
# Backends worth timing on a CUDA or ROCm GPU, by diffusers' names; each is offered only where diffusers' own
# requirement check passes (its package imports, at a version it accepts). Left out: every "*_hub" backend
# (it downloads its kernel), "_native_math" (the reference kernel: never faster, and on a GPU it holds the whole
# attention matrix), "flex" (meant to be compiled, slow and hungry as diffusers calls it), the single
# SageAttention kernels (the "sage" backend picks among them for the GPU), NPU and XLA.
GPU_ATTENTION = ("_native_cudnn", "_native_flash", "_native_efficient", "flash", "flash_varlen", "_flash_3",
                 "_flash_varlen_3", "sage", "sage_varlen", "xformers")
_NOT_ON_ROCM = ("_native_cudnn",)   # cuDNN is NVIDIA's


def _device_kind(device: str) -> str:
    """"cuda", "rocm", "mps" or "cpu", from a hardware backend name or a torch device string ("cuda:0")."""
    kind = device.split(":")[0].lower()
    if kind == "cuda":
        import torch

        return "rocm" if torch.version.hip else "cuda"
    if kind not in ("rocm", "mps", "cpu"):
        raise ValueError(f"unknown device {device!r}: expected cuda, rocm, mps or cpu")
    return kind


def usable_attention_backends(device: str) -> tuple[str, ...]:
    """diffusers attention backends that can run on ``device`` ("cuda", "rocm", "mps", "cpu" or a torch device
    string), "native" first. A name here may still fail on a shape or dtype: ``measure_attention`` tells."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    kind = _device_kind(device)
    names = [DEFAULT_ATTENTION]
    if kind in ("cuda", "rocm"):
        names += [name for name in GPU_ATTENTION if not (kind == "rocm" and name in _NOT_ON_ROCM)]
    usable = []
    for name in names:
        try:
            _check_attention_backend_requirements(AttentionBackendName(name))
        except (RuntimeError, ValueError):
            continue
        usable.append(name)
    return tuple(usable)


def _named_transformers(pipe) -> list[tuple[str, object]]:
    return [(name, model) for name in TRANSFORMERS if (model := getattr(pipe, name, None)) is not None]


def set_attention(pipe, name: str | None) -> None:
    """Run every transformer of ``pipe`` on attention backend ``name``; None puts back the default.

    diffusers' ``set_attention_backend`` sets the backend on each attention processor and also makes it the
    process-wide default, which ``reset_attention_backend`` leaves in place: a reset model would go on using it.
    Here the process-wide default never changes (it is put back right away), and None also restores it to
    diffusers' own default (``native``, or the DIFFUSERS_ATTN_BACKEND environment variable).
    """
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry
    from diffusers.utils.constants import DIFFUSERS_ATTN_BACKEND

    models = [model for _, model in _named_transformers(pipe)]
    if name is None:
        for model in models:
            model.reset_attention_backend()
        _AttentionBackendRegistry.set_active_backend(AttentionBackendName(DIFFUSERS_ATTN_BACKEND))
        return
    if name.endswith("_hub"):
        raise ValueError(f"attention backend {name!r} downloads its kernel; choose one that runs offline")
    before = _AttentionBackendRegistry._active_backend
    try:
        for model in models:
            model.set_attention_backend(name)
    finally:
        _AttentionBackendRegistry.set_active_backend(before)


def attention_backend_of(pipe) -> str | None:
    """The backend set on the attention of ``pipe``'s transformers (None: the default)."""
    for _, model in _named_transformers(pipe):
        for module in model.modules():
            backend = getattr(getattr(module, "processor", None), "_attention_backend", None)
            if backend is not None:
                return getattr(backend, "value", str(backend))
    return None


def measure_attention(device: str, dtype, heads: int, head_dim: int, tokens: int,
                      backends: tuple[str, ...] | None = None, repeats: int = 3) -> dict[str, float]:
    """Seconds one attention call of ``tokens`` tokens (batch 1, ``heads`` x ``head_dim``, ``dtype``) takes with
    each backend (default: ``usable_attention_backends``), through diffusers' ``dispatch_attention_fn``: the
    median of ``repeats`` calls after one warm-up, the device synchronised around each. A backend that raises
    (missing package, unsupported dtype, shape or GPU, out of memory) or gives non-finite values is left out."""
    import torch
    from diffusers.models.attention_dispatch import (
        AttentionBackendName,
        _check_attention_backend_requirements,
        dispatch_attention_fn,
    )

    where = "cuda" if device.lower() == "rocm" else device   # ROCm's torch device is "cuda"
    names = usable_attention_backends(device) if backends is None else tuple(backends)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, tokens, heads, head_dim, generator=generator).to(where, dtype) for _ in range(3))
    seconds = {}
    for name in names:
        if name.endswith("_hub"):
            continue
        try:
            backend = AttentionBackendName(name)
            _check_attention_backend_requirements(backend)
            warm = dispatch_attention_fn(q, k, v, backend=backend)
            synchronize(where)
            if not bool(torch.isfinite(warm).all()):
                continue
            del warm
            times = []
            for _ in range(max(1, repeats)):
                start = time.perf_counter()
                dispatch_attention_fn(q, k, v, backend=backend)
                synchronize(where)
                times.append(time.perf_counter() - start)
        except Exception:   # noqa: BLE001 - any failure means "not this backend here"
            continue
        seconds[name] = sorted(times)[len(times) // 2]
    return seconds


def fastest_attention(seconds: dict[str, float]) -> str:
    """The quickest backend of a ``measure_attention`` result; the default when none was measured."""
    return min(seconds, key=seconds.get) if seconds else DEFAULT_ATTENTION


# ---- regional compilation -------------------------------------------------------------------------------

def _repeated_blocks(model) -> list:
    names = tuple(getattr(model, "_repeated_blocks", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]


def is_compiled(model) -> bool:
    """Whether ``model``'s repeated blocks are compiled. ``compile_repeated_blocks`` calls torch's
    ``nn.Module.compile`` on each block, which keeps the compiled call in the block's ``_compiled_call_impl``
    (None until then): that attribute is the record, so nothing else is kept."""
    blocks = _repeated_blocks(model)
    return bool(blocks) and all(getattr(block, "_compiled_call_impl", None) is not None for block in blocks)


def compile_transformer(pipe, fullgraph: bool = True) -> tuple[str, ...]:
    """Compile each transformer's repeated blocks with diffusers' ``compile_repeated_blocks`` (regional
    compilation: one block's graph serves them all); a transformer already compiled is left alone. Returns the
    names compiled by this call. Kernels are built lazily, at the first step after it (on an H200, Wan 1.3B at
    480x832x81: a first step of 17 s, then 1.05 s a step instead of 1.22 s).

    A full graph cannot take a step cache's hooks (they branch on the data inside the blocks): with a cache on,
    fullgraph is refused; ``fullgraph=False`` compiles around the hooks (breaking the graph there).
    """
    compiled = []
    for name, model in _named_transformers(pipe):
        if is_compiled(model):
            continue
        if fullgraph and getattr(model, "is_cache_enabled", False):
            raise ValueError(f"{name} has a step cache: its hooks break a full graph; compile with fullgraph=False "
                             "or remove the cache first")
        model.compile_repeated_blocks(fullgraph=fullgraph)
        compiled.append(name)
    return tuple(compiled)


FP8_LINEARS_MARK = "_wan_studio_fp8_linears"


def fp8_linears(pipe) -> tuple[str, ...]:
    """The linears of each transformer's repeated blocks computing in float8 through torchao (its dynamic
    activation and weight scaling, one scale a tensor: the kind every fp8 GPU runs): the weights are replaced by
    float8 ones for good, so only a fresh load undoes it (the plan's reload key says so). Returns the names
    changed by this call; a transformer done already is left alone. Approximate: about 2% relative difference on
    a 1.3B pass's output (docs/speed.md)."""
    import torch
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, quantize_

    done = []
    for name, model in _named_transformers(pipe):
        if getattr(model, FP8_LINEARS_MARK, False):
            continue
        for block in _repeated_blocks(model):
            quantize_(block, Float8DynamicActivationFloat8WeightConfig(),
                      filter_fn=lambda module, _name: isinstance(module, torch.nn.Linear))
        setattr(model, FP8_LINEARS_MARK, True)
        done.append(name)
    return tuple(done)


def uncompile_transformer(pipe) -> tuple[str, ...]:
    """Run each transformer's blocks uncompiled again (a plan without compiling, or a step cache that needs
    the plain blocks); torch keeps the kernels it built, so compiling again later costs nothing new."""
    undone = []
    for name, model in _named_transformers(pipe):
        if is_compiled(model):
            for block in _repeated_blocks(model):
                block._compiled_call_impl = None
            undone.append(name)
    return tuple(undone)


# ---- step caches ----------------------------------------------------------------------------------------

CACHE_KINDS = ("first_block", "mag", "taylor")
FIRST_BLOCK_THRESHOLD = 0.05   # diffusers' default: mean relative change of the first block's residual
MAG_THRESHOLD = 0.06           # diffusers' default: accumulated magnitude error allowed before computing again
TAYLOR_INTERVAL = 5            # TaylorSeer: a full computation, then this many steps minus one extrapolated
TAYLOR_WARMUP = 3              # TaylorSeer: steps always computed first, to fit the series
# TaylorSeer's own default patterns ("^blocks.*attn", matched whole) match no module of Wan, whose attentions
# are blocks.N.attn1 (self) and blocks.N.attn2 (cross, on the text): it would hook nothing and skip nothing.
# The self-attention is most of a Wan step's work (about 3/4 at 480p), so that is what is cached: each block's
# attn1 output is extrapolated on the skipped steps, the rest of the block still runs. The price is memory: see
# taylor_memory_bytes.
WAN_TAYLOR_IDENTIFIERS = (r"blocks\.\d+\.attn1",)
_MAG_RECORDER = "wan_studio_mag_calibration"   # our hook's name in diffusers' hook registry


@dataclass(frozen=True)
class CacheSetup:
    """What ``apply_step_cache`` set up: the kind, whether this run calibrates (MagCache without ratios: every
    step computed, nothing skipped), and a sentence for the job's log. Step caches are always approximate."""
    kind: str
    calibrating: bool
    detail: str
    approximate: bool = True


def steps_per_transformer(pipe, steps: int) -> dict[str, int]:
    """How many of ``steps`` each transformer runs: all on "transformer", unless the pipeline has a second
    expert (Wan2.2 A14B): then the steps whose timestep is at or above the boundary go to "transformer", the
    rest to "transformer_2", as the pipeline decides (from a copy of its scheduler, so call this after the
    job's scheduler is set)."""
    boundary = getattr(pipe.config, "boundary_ratio", None)
    if boundary is None or getattr(pipe, "transformer_2", None) is None:
        return {"transformer": steps}
    scheduler = copy.deepcopy(pipe.scheduler)
    scheduler.set_timesteps(steps, device="cpu")
    cut = boundary * scheduler.config.num_train_timesteps
    high = sum(1 for t in scheduler.timesteps[:steps] if float(t) >= cut)
    return {"transformer": high, "transformer_2": steps - high}


def _taylor_computed(count: int, interval: int) -> list[int]:
    """The steps (of one transformer) TaylorSeer computes fully; it extrapolates the others (its own rule)."""
    return [step for step in range(count)
            if step < TAYLOR_WARMUP or (step - TAYLOR_WARMUP - 1) % interval == 0]


def taylor_memory_bytes(num_layers: int, inner_dim: int, tokens: int, passes: int, max_order: int = 1) -> int:
    """Device memory TaylorSeer holds for one transformer: per block and per pass (2 with guidance), the self-
    attention output and its ``max_order`` differences, in 16-bit. For Wan 1.3B at 480x832x81 (32,760 tokens) with
    guidance that is 11.2 GiB (an H200 run peaked 11.3 GiB above the uncached one); for 14B, 50 GiB."""
    return (max_order + 1) * num_layers * passes * tokens * inner_dim * 2


def _factors_dtype(model):
    import torch

    return model.dtype if model.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


def _ratios_for(mag_ratios, counts: dict[str, int]) -> dict[str, list[float]] | None:
    """Per-transformer ratios from a mapping (by transformer name) or one list for all; None when any running
    transformer lacks them (then the run calibrates)."""
    if mag_ratios is None:
        return None
    if not isinstance(mag_ratios, dict):
        mag_ratios = {name: mag_ratios for name in counts}
    ratios = {name: [float(r) for r in mag_ratios.get(name) or ()] for name in counts if counts[name]}
    return ratios if all(ratios.values()) else None


def _cache_config(kind: str, model, count: int, ratios: list[float] | None, threshold: float | None,
                  interval: int | None):
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    if kind == "first_block":
        return FirstBlockCacheConfig(threshold=FIRST_BLOCK_THRESHOLD if threshold is None else threshold)
    if kind == "mag":
        if ratios is None:
            return MagCacheConfig(calibrate=True, num_inference_steps=count)
        return MagCacheConfig(threshold=MAG_THRESHOLD if threshold is None else threshold,
                              num_inference_steps=count, mag_ratios=ratios)
    return TaylorSeerCacheConfig(cache_interval=interval or TAYLOR_INTERVAL, disable_cache_before_step=TAYLOR_WARMUP,
                                 max_order=1, taylor_factors_dtype=_factors_dtype(model),
                                 cache_identifiers=list(WAN_TAYLOR_IDENTIFIERS))


def apply_step_cache(pipe, kind: str, steps: int, mag_ratios=None, threshold: float | None = None,
                     interval: int | None = None) -> CacheSetup:
    """Put step cache ``kind`` ("first_block", "mag" or "taylor") on every transformer of ``pipe`` for runs of
    ``steps`` steps, replacing any cache already there.

    ``threshold``: First Block Cache's or MagCache's (higher skips more); ``interval``: TaylorSeer's cache
    interval. ``mag_ratios``: MagCache's ratios, as ``calibration_ratios`` / ``load_mag_ratios`` give them (by
    transformer name) or one list; without them the run calibrates (computes every step and records the
    ratios: read them with ``calibration_ratios`` after the run, before ``remove_step_cache``).
    """
    if kind not in CACHE_KINDS:
        raise ValueError(f"unknown step cache {kind!r}; choose one of {', '.join(CACHE_KINDS)}")
    remove_step_cache(pipe)   # diffusers takes one cache at a time
    compiled = [name for name, model in _named_transformers(pipe) if is_compiled(model)]
    if compiled:
        raise ValueError(f"{', '.join(compiled)} is compiled: a step cache goes on before compiling (then with "
                         "fullgraph=False), since a full graph cannot take its hooks")
    counts = steps_per_transformer(pipe, steps)
    ratios = _ratios_for(mag_ratios, counts) if kind == "mag" else None
    calibrating = kind == "mag" and ratios is None
    for name, model in _named_transformers(pipe):
        count = counts.get(name, 0)
        if not count:
            continue
        model.enable_cache(_cache_config(kind, model, count, ratios and ratios[name], threshold, interval))
        if calibrating:
            _add_mag_recorder(model)
    return CacheSetup(kind, calibrating, _cache_detail(kind, counts, steps, calibrating, threshold, interval))


def _cache_detail(kind, counts, steps, calibrating, threshold, interval) -> str:
    if kind == "first_block":
        return (f"First Block Cache (threshold {FIRST_BLOCK_THRESHOLD if threshold is None else threshold}): "
                "a step whose first block changes little reuses the rest of the model's last change")
    if kind == "mag" and calibrating:
        return (f"MagCache is calibrating: no ratios yet for this model at {steps} steps, so this run computes "
                "every step and records them; later runs skip steps")
    if kind == "mag":
        return (f"MagCache (threshold {MAG_THRESHOLD if threshold is None else threshold}): steps whose change "
                "the model's ratios predict are skipped, at most 3 in a row, never in the first fifth")
    interval = interval or TAYLOR_INTERVAL
    skipped = {name: count - len(_taylor_computed(count, interval)) for name, count in counts.items() if count}
    if not any(skipped.values()):
        return f"TaylorSeer skips no step of {steps}: it needs more than {TAYLOR_WARMUP}"
    return (f"TaylorSeer: the self-attention is extrapolated on {sum(skipped.values())} of {steps} steps "
            f"(computed on the first {TAYLOR_WARMUP}, then every {interval}th)")


def remove_step_cache(pipe) -> None:
    """Take any step cache off every transformer of ``pipe``: its hooks go, each block's forward is its own
    again, and the transformer computes exactly as before the cache."""
    from diffusers.hooks import HookRegistry

    for _, model in _named_transformers(pipe):
        if not getattr(model, "is_cache_enabled", False):
            continue
        HookRegistry.check_if_exists_or_initialize(model).remove_hook(_MAG_RECORDER, recurse=True)
        model.disable_cache()


def step_cache_of(pipe) -> str | None:
    """The kind of step cache on ``pipe``'s transformers, or None."""
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    kinds = {FirstBlockCacheConfig: "first_block", MagCacheConfig: "mag", TaylorSeerCacheConfig: "taylor"}
    for _, model in _named_transformers(pipe):
        config = getattr(model, "_cache_config", None)
        if config is not None:
            return kinds.get(type(config), type(config).__name__)
    return None


# ---- MagCache calibration -------------------------------------------------------------------------------
# diffusers' calibrating MagCache keeps the ratios on its per-pass state only until the run's last step, where
# it prints them (and logs them at INFO), then empties the state; the pipeline resets the state at its end too.
# So a small hook of ours sits outside MagCache's on the last block and keeps, for each pass ("cond",
# "uncond"), the state's list of ratios, which the state lets go of but nothing empties.

def _mag_recorder(state_manager):
    from diffusers.hooks import ModelHook

    class MagCalibrationRecorder(ModelHook):
        def __init__(self):
            super().__init__()
            self.state_manager = state_manager
            self.passes = {}   # pass name -> the ratios list of that pass's MagCache state

        def pre_forward(self, module, *args, **kwargs):
            context = self.state_manager._context
            if context is not None:
                self.passes[context.name] = self.state_manager.get_state().calibration_ratios
            return args, kwargs

    return MagCalibrationRecorder()


def _mag_tail(model):
    from diffusers.hooks.mag_cache import _MAG_CACHE_BLOCK_HOOK

    for module in model.modules():
        hook = getattr(module, "_diffusers_hook", None)
        block_hook = hook and hook.get_hook(_MAG_CACHE_BLOCK_HOOK)
        if block_hook is not None and block_hook.is_tail:
            return module, block_hook
    raise ValueError("MagCache put no tail hook on this transformer")


def _add_mag_recorder(model) -> None:
    from diffusers.hooks import HookRegistry

    tail, block_hook = _mag_tail(model)
    registry = HookRegistry.check_if_exists_or_initialize(tail)
    registry.register_hook(_mag_recorder(block_hook.state_manager), _MAG_RECORDER)


def calibration_ratios(pipe) -> dict[str, list[float]]:
    """The MagCache ratios a calibrating run (``apply_step_cache(..., "mag")`` without ratios) measured, by
    transformer name: for each step the mean over the run's passes (with guidance, cond and uncond). Empty if
    no calibrating run has finished on this cache (a cancelled run leaves none)."""
    from diffusers import MagCacheConfig
    from diffusers.hooks.hooks import HookRegistry

    found = {}
    for name, model in _named_transformers(pipe):
        config = getattr(model, "_cache_config", None)
        if not isinstance(config, MagCacheConfig) or not config.calibrate:
            continue
        tail, _ = _mag_tail(model)
        recorder = HookRegistry.check_if_exists_or_initialize(tail).get_hook(_MAG_RECORDER)
        count = config.num_inference_steps
        passes = [ratios[:count] for ratios in recorder.passes.values() if len(ratios) >= count]
        if passes:
            found[name] = [sum(values) / len(values) for values in zip(*passes)]
    return found


def _ratios_file(folder: Path, model_key: str, steps: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_key).strip("._")[:80] or "model"
    digest = hashlib.sha1(model_key.encode()).hexdigest()[:8]
    return Path(folder) / f"{safe}-{digest}-{steps}steps.json"


def save_mag_ratios(folder: Path | str, model_key: str, steps: int, ratios: dict[str, list[float]]) -> Path:
    """Keep a model's MagCache ratios for runs of ``steps`` steps (one JSON file per model and step count,
    written whole or not at all); the file's path. ``model_key`` names the weights (and whatever else the
    ratios depend on that the caller varies: the scheduler, its shift)."""
    if not ratios or not all(ratios.values()):
        raise ValueError("no MagCache ratios to save: did the calibrating run finish?")
    data = {"schema": 1, "model": model_key, "steps": steps,
            "ratios": {name: [float(r) for r in values] for name, values in ratios.items()}}
    path = _ratios_file(Path(folder), model_key, steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1), encoding="utf-8"))


def load_mag_ratios(folder: Path | str, model_key: str, steps: int) -> dict[str, list[float]] | None:
    """The ratios saved for ``model_key`` at exactly ``steps`` steps, or None (none kept, or unreadable: the next
    run calibrates again). Ratios of another step count are not borrowed: each is the change over one step, and
    diffusers would only resample them (nearest neighbour), not rescale them."""
    path = _ratios_file(Path(folder), model_key, steps)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("model") != model_key or data.get("steps") != steps:
        return None
    ratios = data.get("ratios")
    if not isinstance(ratios, dict):
        return None
    valid = {name: values for name, values in ratios.items() if isinstance(values, list) and values
             and all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in values)}
    return valid if valid and len(valid) == len(ratios) else None
