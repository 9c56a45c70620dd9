"""The memory planner: a pure function of (model spec, request, hardware) -> Plan.

It walks a ladder of strategies, fastest first, predicts the device and host
memory of every phase for each, and picks the first that fits the budget with
a safety margin. Every choice comes with a sentence saying why.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import PurePath

from engine.device.hardware import HardwareProfile
from engine.models.spec import ModelSpec
from engine.planning import memory as mem
from engine.planning.speed import ATTENTION_BACKENDS, VAE_DTYPES, SpeedRequest, choose_speed, vae_dtype_for
from engine.planning.split import CONTEXT_PARALLEL_BACKENDS, NO_COLLECTIVES, Split, choose_split
from engine.settings.choices import LADDER, TEXT_ENCODER_PLACES
from engine.words import plural

# Rungs of the ladder, fastest (and highest quality) first: LADDER (engine/settings/choices.py, where settings
# are checked against it).
# Rungs only a model with two experts (Wan2.2 A14B) has.
TWO_EXPERT_RUNGS = ("expert_swap",)
RUNG_TEXT = {
    "all_on_device": "everything on the device",
    "text_encoder_offload": "text encoder kept off the device except while it encodes (whole or streamed)",
    "expert_swap": "one expert on the device at a time: the high-noise one, swapped for the low-noise one at "
                   "the boundary",
    "group_offload": "transformer streamed block by block from RAM (group offload)",
    "fp8_storage": "transformer weights stored in fp8 on the device",
    "fp8_group_offload": "fp8 transformer weights streamed block by block from RAM",
    "leaf_offload": "transformer streamed layer by layer from RAM (least device memory)",
    "disk_offload": "transformer streamed block by block from files on disk (slowest: for when RAM cannot hold it)",
}
# Room left on the disk beside a disk rung's copy of the transformer.
DISK_MARGIN_GB = 2.0
CPU_ONLY = "CPU only"
CPU_ONLY_TEXT = "everything in RAM, computed on the CPU"


def plan_request_for(settings) -> "PlanRequest":
    """What the memory planner needs of a job's Settings (engine/settings/values.py)."""
    return PlanRequest(settings.width, settings.height, settings.frames, settings.mode == "i2v",
                       SpeedRequest(settings.steps, settings.guidance, settings.step_cache))


def override_for(settings) -> "Override":
    """The memory and speed choices a job's Settings force on the planner."""
    return Override(settings.strategy, settings.text_encoder, settings.vae_tiling, settings.vae_dtype,
                    settings.compile, settings.attention)


def strategy_words(strategy: str, device: str) -> tuple[str, str]:
    """(the strategy's name, what it does) as the page and the command line say them: a CPU-only machine's
    plan is "CPU only" (its rung is all_on_device, and the device is the CPU)."""
    if device == "cpu":
        return (CPU_ONLY if strategy == "all_on_device" else f"{strategy} (on the CPU)"), CPU_ONLY_TEXT
    return strategy, RUNG_TEXT.get(strategy, strategy)


# Where the text (and image) encoder lives: TEXT_ENCODER_PLACES (engine/settings/choices.py).
# Device memory kept free for the desktop, the driver and the allocator's slack.
DEVICE_MARGIN_FRACTION = 0.05
DEVICE_MARGIN_MIN_GB = 0.75
# Host memory kept free for the OS and the desktop.
RAM_MARGIN_FRACTION = 0.05
RAM_MARGIN_MIN_GB = 1.5


@dataclass(frozen=True)
class PlanRequest:
    width: int
    height: int
    frames: int
    image_to_video: bool = False
    speed: SpeedRequest = SpeedRequest()    # steps, guidance, step cache: what the speed choices read
    # GPUs sharing the denoise (context parallel): each holds the whole model and 1/ranks of the activations.
    ranks: int = 1


@dataclass(frozen=True)
class Override:
    """What the user forces; None leaves the choice to the planner."""
    strategy: str | None = None
    text_encoder: str | None = None       # one of TEXT_ENCODER_PLACES
    vae_tiling: bool | None = None
    vae_dtype: str | None = None          # one of speed.VAE_DTYPES
    compile: bool | None = None
    attention: str | None = None          # one of speed.ATTENTION_BACKENDS

    def __post_init__(self):
        if self.strategy is not None and self.strategy not in LADDER:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(LADDER)}")
        if self.text_encoder is not None and self.text_encoder not in TEXT_ENCODER_PLACES:
            raise ValueError(f"text encoder place must be one of {', '.join(TEXT_ENCODER_PLACES)}")
        if self.vae_dtype is not None and self.vae_dtype not in VAE_DTYPES:
            raise ValueError(f"VAE precision must be one of {', '.join(VAE_DTYPES)}")
        if self.attention is not None and self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}")


@dataclass(frozen=True)
class PhasePlan:
    phase: str
    placement: dict            # component -> "device", "cpu", "streamed" or "absent"
    peak_vram_gb: float
    peak_ram_gb: float


@dataclass(frozen=True)
class Plan:
    strategy: str
    fits: bool
    device: str
    dtype: str
    vae_dtype: str
    attention: str             # "flash" (no tokens^2 buffer) or "math"
    text_encoder: str          # one of TEXT_ENCODER_PLACES
    transformer: str           # "device", "group" or "leaf"
    fp8: bool
    vae_tile: int | None       # tile size in pixels, None = untiled
    load: str                  # "cpu" (through RAM) or "device_map" (straight to the device)
    pin_memory: bool
    use_stream: bool
    budget_vram_gb: float
    budget_ram_gb: float
    predicted_peak_vram_gb: float
    predicted_peak_ram_gb: float
    phases: tuple[PhasePlan, ...] = ()
    decisions: tuple[str, ...] = ()
    suggestions: tuple[str, ...] = ()
    vae_tiled: bool = False    # the decode really runs in tiles (a frame no larger than one tile decodes whole)
    conv: str = "default"      # the decode's convolution set-up: one of speed.CONV_MODES
    compile: bool = False      # the transformer's repeated blocks are compiled
    attention_backend: str = "native"   # diffusers' attention backend for the transformer
    # Each expert's single transformer file as (path, bytes, modification time in ns), None for the model's own;
    # empty when every transformer is the model's own. Another file (or the same one rewritten) is another load.
    transformer_files: tuple = ()
    split: Split | None = None   # how the job uses several GPUs (None: one)

    @property
    def swaps_experts(self) -> bool:
        """One expert on the device at a time, swapped at the boundary (the engine's expert_swap phase)."""
        return self.strategy == "expert_swap"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["phases"] = {p["phase"]: {k: v for k, v in p.items() if k != "phase"} for p in data["phases"]}
        return data

    @property
    def reload_key(self) -> tuple:
        """What cannot change on a loaded pipeline without loading it again."""
        return (self.strategy, self.device, self.dtype, self.transformer, self.fp8, self.load, self.vae_dtype,
                self.transformer_files)


def _round(x: float) -> float:
    """Round up to 0.01 GiB: a prediction must not drop below what it stands for."""
    return math.ceil(x * 100 - 1e-9) / 100


def budgets(hw: HardwareProfile) -> tuple[float, float]:
    """(device GiB, RAM GiB) a run may use, after the safety margins."""
    ram = hw.ram_available_gb - max(RAM_MARGIN_MIN_GB, RAM_MARGIN_FRACTION * hw.ram_total_gb)
    if hw.device == "cpu":
        return 0.0, max(ram, 0.0)
    vram = hw.vram_free_gb - max(DEVICE_MARGIN_MIN_GB, DEVICE_MARGIN_FRACTION * hw.vram_total_gb)
    return max(vram, 0.0), max(ram, 0.0)


def _dtypes(hw: HardwareProfile) -> tuple[str, int]:
    if hw.backend in ("cuda", "rocm"):
        return "bfloat16", 2
    if hw.backend == "mps":
        return "float16", 2
    return "float32", 4


def _copy_streams(hw: HardwareProfile) -> bool:
    """Offloaded weights are pinned in RAM and copied on a side stream: discrete CUDA and ROCm cards."""
    return not hw.unified_memory and hw.backend in ("cuda", "rocm")


def _attention(hw: HardwareProfile) -> str:
    # CUDA SDPA picks flash / memory-efficient kernels for 16-bit inputs; ROCm does too once
    # AOTriton is enabled (the engine process sets it). MPS falls back to math attention.
    # On the CPU torch's flash kernel runs for float32 as well.
    return "math" if hw.backend == "mps" else "flash"


@dataclass(frozen=True)
class _Rung:
    name: str
    text_encoder: str
    transformer: str
    fp8: bool
    vae_tile: int | None
    load: str
    vae_bytes: int = 4

    @property
    def swap(self) -> bool:
        return self.name == "expert_swap"


def rungs_for(spec: ModelSpec) -> tuple[str, ...]:
    """Every rung this model can run on, fastest first: the rungs that swap experts need two (Wan2.2 A14B); fp8
    storage has nothing to add to transformers that stay quantised. The one list that the planner's choice, the
    engine's step-down on out of memory and the settings check all go by."""
    ladder = tuple(name for name in LADDER if spec.experts > 1 or name not in TWO_EXPERT_RUNGS)
    if spec.quantized_transformer:
        ladder = tuple(name for name in ladder if not name.startswith("fp8"))
    return ladder


def ladder_for(spec: ModelSpec, hw: HardwareProfile) -> tuple[str, ...]:
    """The rungs the planner chooses from on this machine: a CPU-only machine has one (its "device" is its RAM),
    any other every rung of the model (``rungs_for``)."""
    if hw.device == "cpu":
        return ("all_on_device",)
    return rungs_for(spec)


def rungs_below(spec: ModelSpec, strategy: str) -> tuple[str, ...]:
    """The rungs an out-of-memory run may step down to from ``strategy``, next first (none from a strategy the
    model has no rung for)."""
    ladder = rungs_for(spec)
    return ladder[ladder.index(strategy) + 1:] if strategy in ladder else ()


def _weights_gb(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, rung: _Rung) -> dict[str, float]:
    """GiB of each component's weights under ``rung``."""
    _, nbytes = _dtypes(hw)
    return {"transformer": mem.transformer_weights_gb(spec, nbytes, rung.fp8),
            "text_encoder": spec.text_encoder_params * nbytes / mem.GIB,
            "image_encoder": spec.image_encoder_params * nbytes / mem.GIB if req.image_to_video else 0.0,
            "vae": spec.vae_params * rung.vae_bytes / mem.GIB + (_encoder_in_float32_gb(spec, rung.vae_bytes)
                                                                  if req.image_to_video else 0.0)}


# The Wan VAE's encoder holds this share of its weights; an image-to-video run keeps it in float32 when the
# decoder runs in bfloat16 (engine/run/apply_plan.py's keep_encoder_exact).
VAE_ENCODER_SHARE = 0.42   # Wan2.1 VAE: 53.6 of 126.9 M parameters


def _encoder_in_float32_gb(spec: ModelSpec, vae_bytes: int) -> float:
    return spec.vae_params * VAE_ENCODER_SHARE * (4 - vae_bytes) / mem.GIB


def _cpu_phases(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, rung: _Rung) -> tuple[PhasePlan, ...]:
    """A CPU-only machine: every weight sits in RAM from the load on and nothing moves, so each phase
    needs the weights plus its own working memory, and there is no transfer phase."""
    _, nbytes = _dtypes(hw)
    weights = mem.BASE_RAM_CPU_ONLY_GB + sum(_weights_gb(spec, req, hw, rung).values())
    tokens = spec.tokens(req.width, req.height, req.frames)
    frames_ram = mem.frames_ram_gb(req.width, req.height, req.frames)
    names = ["text_encoder", "transformer", "vae"]
    if req.image_to_video and spec.image_encoder_params:
        names.insert(1, "image_encoder")
    places = {name: "cpu" for name in names}
    phases = [("load", mem.staging_gb(spec)), ("text_encode", mem.text_encode_gb(spec))]
    if "image_encoder" in places:
        phases.append(("image_encode", mem.IMAGE_ENCODE_ACT_GB))
    phases.append(("denoise", mem.denoise_activations_gb(spec, tokens, nbytes, False) / req.ranks
                   + mem.RUN_OVERHEAD_GB))
    if rung.swap and spec.experts > 1:
        phases.append(("expert_swap", mem.RUN_OVERHEAD_GB))   # from RAM to RAM: the step only runs its code
    phases += [
        ("vae_decode", mem.vae_decode_gb(spec, req.width, req.height, req.frames, rung.vae_tile, rung.vae_bytes)
         + mem.RUN_OVERHEAD_GB + frames_ram),
        ("export", frames_ram)]
    return tuple(PhasePlan(name, places, 0.0, _round(weights + extra)) for name, extra in phases)


def _phases(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, rung: _Rung) -> tuple[PhasePlan, ...]:
    # Longer than most functions here, on purpose: one run's memory, phase by phase, reads top to bottom
    # with every term beside the phase that pays it (split, the terms would be passed around by name).
    if hw.device == "cpu":
        return _cpu_phases(spec, req, hw, rung)
    dtype, nbytes = _dtypes(hw)
    weights = _weights_gb(spec, req, hw, rung)
    te, ie, vae, tr_full = (weights[k] for k in ("text_encoder", "image_encoder", "vae", "transformer"))
    if rung.swap and spec.experts > 1:
        # One expert on the device (the larger bounds it); both stay in RAM, so the swap only copies one in.
        tr_dev, tr_ram = max(mem.expert_weights_gb(spec, nbytes, rung.fp8)), tr_full
    elif rung.transformer == "device":
        tr_dev, tr_ram = tr_full, 0.0
    elif rung.transformer == "group":
        # The shared layers plus the blocks in flight (current, prefetched, being released).
        tr_dev = mem.shared_gb(spec, nbytes) + mem.GROUP_RESIDENT_BLOCKS * mem.block_gb(spec, nbytes, rung.fp8)
        tr_ram = tr_full
    elif rung.transformer == "disk":
        # As group offload on the device; in RAM only the blocks in flight, read from their files as they come.
        tr_dev = mem.shared_gb(spec, nbytes) + mem.GROUP_RESIDENT_BLOCKS * mem.block_gb(spec, nbytes, rung.fp8)
        tr_ram = mem.GROUP_RESIDENT_BLOCKS * mem.block_gb(spec, nbytes, rung.fp8)
    else:  # leaf: one layer at a time, the next one prefetched
        tr_dev = max(mem.LEAF_RESIDENT_MIN_GB, mem.LEAF_RESIDENT_BLOCKS * mem.block_gb(spec, nbytes, rung.fp8))
        tr_ram = tr_full
    te_dev_always = te if rung.text_encoder == "device" else 0.0
    te_ram_idle = te if rung.text_encoder != "device" else 0.0
    ie_dev_always = ie if rung.text_encoder == "device" else 0.0
    ie_ram_idle = ie if rung.text_encoder != "device" else 0.0
    base_ram = mem.BASE_RAM_GB
    tokens = spec.tokens(req.width, req.height, req.frames)
    act = mem.denoise_activations_gb(spec, tokens, nbytes, _attention(hw) == "math") / req.ranks
    decode = mem.vae_decode_gb(spec, req.width, req.height, req.frames, rung.vae_tile, rung.vae_bytes)
    frames_ram = mem.frames_ram_gb(req.width, req.height, req.frames)
    # A streamed transformer is on the device only while it runs (denoise); a resident one always.
    tr_idle = tr_dev if rung.transformer == "device" else 0.0
    resident = tr_idle + vae + te_dev_always + ie_dev_always     # on the device between phases
    idle_ram = base_ram + tr_ram + te_ram_idle + ie_ram_idle     # in RAM between phases
    te_place = {"device": "device", "offload": "device", "streamed": "streamed", "cpu": "cpu"}[rung.text_encoder]
    tr_place = {"device": "device", "group": "streamed", "leaf": "streamed", "disk": "streamed"}[rung.transformer]
    places = {"text_encoder": te_place, "transformer": tr_place, "vae": "device"}
    if rung.swap and spec.experts > 1:
        places["transformer_2"] = "cpu"
    if req.image_to_video and spec.image_encoder_params:
        places["image_encoder"] = te_place

    if rung.load == "device_map":
        # Straight to the device; an fp8 transformer is briefly held in 16-bit while it is cast.
        load_dev = max(resident, resident - tr_full + mem.transformer_weights_gb(spec, nbytes)) if rung.fp8 else resident
        load_ram = base_ram + tr_ram + te_ram_idle + ie_ram_idle
    elif rung.transformer == "disk":
        # The transformer loads alone and is written to its files, then the rest loads beside its blocks in flight.
        load_dev = 0.0
        load_ram = base_ram + max(tr_full, te + ie + vae + tr_ram) + mem.staging_gb(spec)
    else:
        load_dev = 0.0
        load_ram = base_ram + te + ie + vae + tr_full + mem.staging_gb(spec)
    phases = [PhasePlan("load", {k: ("cpu" if rung.load == "cpu" else v) for k, v in places.items()},
                        load_dev, load_ram)]
    if rung.load == "cpu":
        # Pinning a streamed text encoder holds one of its tensors twice for a moment.
        pinning = (spec.text_encoder_largest_params * nbytes / mem.GIB
                   if rung.text_encoder == "streamed" and _copy_streams(hw) else 0.0)
        phases.append(PhasePlan("transfer", places, resident, idle_ram + pinning))

    # What comes to the device to encode: the whole encoder, or the layers in flight of a streamed one.
    te_visit = {"offload": te, "streamed": mem.streamed_text_encoder_gb(spec, nbytes)}.get(rung.text_encoder, 0.0)
    encode_dev = resident + te_visit
    encode_ram = idle_ram - (te if rung.text_encoder == "offload" else 0.0)
    if rung.text_encoder != "cpu":
        encode_dev += mem.text_encode_gb(spec)
    else:
        encode_ram += mem.text_encode_gb(spec)
    phases.append(PhasePlan("text_encode", {**places, "text_encoder": te_place}, encode_dev, encode_ram))
    if "image_encoder" in places:
        # (a streamed image encoder is charged whole: it is small, and its layers are not known here)
        img_dev = resident + (ie if rung.text_encoder in ("offload", "streamed") else 0.0) + mem.IMAGE_ENCODE_ACT_GB
        phases.append(PhasePlan("image_encode", places, img_dev, idle_ram))
    denoise_places = {**places, "text_encoder": "cpu" if rung.text_encoder != "device" else "device"}
    if "image_encoder" in places:
        denoise_places["image_encoder"] = denoise_places["text_encoder"]
    phases.append(PhasePlan("denoise", denoise_places, resident - tr_idle + tr_dev + act + mem.RUN_OVERHEAD_GB,
                            idle_ram))
    if "transformer_2" in places:
        # The high-noise expert's device copy is dropped (its RAM copy stays), then the low-noise one copied in.
        denoise_places = {**denoise_places, "transformer": "cpu", "transformer_2": "device"}
        phases.append(PhasePlan("expert_swap", denoise_places, resident + mem.RUN_OVERHEAD_GB, idle_ram))
    phases.append(PhasePlan("vae_decode", denoise_places, resident + decode + mem.RUN_OVERHEAD_GB,
                            idle_ram + frames_ram))
    phases.append(PhasePlan("export", denoise_places, resident, idle_ram + frames_ram))
    return tuple(PhasePlan(p.phase, p.placement, _round(p.peak_vram_gb), _round(p.peak_ram_gb)) for p in phases)


def _rung(name: str, text_encoder: str, vae_tile: int | None, load: str, vae_bytes: int = 4) -> _Rung:
    transformer = {"group_offload": "group", "fp8_group_offload": "group", "leaf_offload": "leaf",
                   "disk_offload": "disk"}.get(name, "device")
    return _Rung(name, text_encoder, transformer, name.startswith("fp8"), vae_tile, load, vae_bytes)


def _vae_bytes(hw: HardwareProfile, override: Override) -> int:
    return 2 if vae_dtype_for(hw.backend, hw.arch, override.vae_dtype) == "bfloat16" else 4


def _fits(phases, vram_budget: float, ram_budget: float, hw: HardwareProfile) -> bool:
    if hw.unified_memory and hw.backend == "mps":
        # One pool: what sits on the "device" and in "RAM" comes from the same memory.
        return all(p.peak_vram_gb + p.peak_ram_gb <= ram_budget for p in phases)
    return all(p.peak_vram_gb <= vram_budget and p.peak_ram_gb <= ram_budget for p in phases)


def _candidates(name: str, override: Override, hw: HardwareProfile, spec: ModelSpec):
    """Text-encoder places, tiles and load methods to try for one rung, best first."""
    if name == "all_on_device":
        # On a CPU-only machine the "device" is the CPU: say so.
        te_places = ["cpu" if hw.device == "cpu" else "device"]
    elif name == "leaf_offload":
        te_places = ["streamed", "cpu"]
    else:
        te_places = ["offload", "streamed", "cpu"] if name == "text_encoder_offload" else list(TEXT_ENCODER_PLACES)
    if not _copy_streams(hw):
        # Without a copy stream diffusers copies every streamed layer back to RAM: slower than the CPU.
        te_places = [place for place in te_places if place != "streamed"]
    if override.text_encoder:
        te_places = [override.text_encoder]
    if override.vae_tiling is True:
        tiles = list(mem.VAE_TILES)
    elif override.vae_tiling is False:
        tiles = [None]
    else:
        tiles = [None, *mem.VAE_TILES]
    loads = ["cpu"] if hw.device == "cpu" else ["cpu", "device_map"]
    if name in ("expert_swap", "group_offload", "fp8_group_offload", "leaf_offload", "disk_offload") or \
            spec.transformer_files:
        loads = ["cpu"]   # offloaded weights live in RAM anyway; a single transformer file is read into RAM whole
    for te in te_places:
        for tile in tiles:
            for load in loads:
                yield te, tile, load


def _choose(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, override: Override):
    """(rung, phases, fits): the first rung and settings that fit, else the closest miss."""
    vram_budget, ram_budget = budgets(hw)
    ladder = (override.strategy,) if override.strategy else ladder_for(spec, hw)
    chosen = None
    first = None
    vae_bytes = _vae_bytes(hw, override)
    for name in ladder:
        if name == "disk_offload" and not _disk_room(spec, hw):
            continue
        for te, tile, load in _candidates(name, override, hw, spec):
            rung = _rung(name, te, tile, load, vae_bytes)
            phases = _phases(spec, req, hw, rung)
            first = first or (rung, phases)
            if _fits(phases, vram_budget, ram_budget, hw):
                chosen = (rung, phases)
                break
        if chosen:
            break
    if chosen:
        return (*chosen, True)
    return (*(_fallback(spec, req, hw, ladder, override) or first), False)


def disk_copy_gb(spec: ModelSpec, hw: HardwareProfile) -> float:
    """GiB a disk rung writes: the transformer's weights (every expert's)."""
    return mem.transformer_weights_gb(spec, _dtypes(hw)[1])


def _disk_room(spec: ModelSpec, hw: HardwareProfile) -> bool:
    """Whether the disk can take a disk rung's copy of the transformer (not known: assumed, the engine checks)."""
    return hw.disk_free_gb < 0 or hw.disk_free_gb >= disk_copy_gb(spec, hw) + DISK_MARGIN_GB


def fits(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, override: Override = Override()) -> bool:
    return _choose(spec, req, hw, override)[2]


def plan_memory(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, override: Override = Override()) -> Plan:
    """Choose the fastest strategy whose every phase fits the budgets."""
    vram_budget, ram_budget = budgets(hw)
    dtype, _ = _dtypes(hw)
    rung, phases, fits_ = _choose(spec, req, hw, override)
    peak_vram = max(p.peak_vram_gb for p in phases)
    peak_ram = max(p.peak_ram_gb for p in phases)
    speed = choose_speed(hw, req.speed, rung.transformer, rung.fp8, override.vae_dtype, override.compile,
                         override.attention)
    split, split_said = _split(spec, req, hw, speed.attention_backend, override)
    if split is not None and split.possible:
        speed = replace(speed, attention_backend=split_backend(split, speed.attention_backend))
    plan = Plan(
        strategy=rung.name, fits=fits_, device=hw.device, dtype=dtype,
        vae_dtype=speed.vae_dtype, attention=_attention(hw), text_encoder=rung.text_encoder,
        transformer=rung.transformer, fp8=rung.fp8, vae_tile=rung.vae_tile, load=rung.load,
        pin_memory=_copy_streams(hw), use_stream=_copy_streams(hw),
        budget_vram_gb=_round(vram_budget), budget_ram_gb=_round(ram_budget),
        predicted_peak_vram_gb=_round(peak_vram), predicted_peak_ram_gb=_round(peak_ram), phases=phases,
        vae_tiled=rung.vae_tile is not None and (rung.vae_tile < req.width or rung.vae_tile < req.height),
        conv=speed.conv, compile=speed.compile, attention_backend=speed.attention_backend,
        transformer_files=tuple(file.source if file else None for file in spec.transformer_files), split=split)
    decisions = (_explain(spec, req, hw, plan, override) + _explain_files(spec, hw, plan) + list(speed.decisions)
                 + split_said)
    suggestions = () if fits_ else _suggest(spec, req, hw, override)
    if not fits_ and not suggestions:
        decisions.append("Neither fewer frames, a smaller size nor a smaller known model makes it fit this "
                         "machine" + (": it needs more RAM, or a GPU." if hw.device == "cpu" else "."))
    return replace(plan, decisions=tuple(decisions), suggestions=tuple(suggestions))


def _split(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, backend: str,
           override: Override) -> tuple[Split | None, list[str]]:
    """(how ``req.ranks`` GPUs share the denoise, the sentences saying so); (None, []) for one GPU. An attention
    backend the planner chose that cannot run split gives way to plain SDPA ("native", Ulysses); one the user
    chose is kept, and may make the split impossible."""
    if req.ranks < 2:
        return None, []
    if not hw.collectives:
        split = Split(req.ranks, "", NO_COLLECTIVES)
        return split, [f"This job cannot be split across {req.ranks} GPUs: {split.reason}."]
    tokens = spec.tokens(req.width, req.height, req.frames)
    heads = spec.transformer.heads
    if backend not in CONTEXT_PARALLEL_BACKENDS and not override.attention:
        backend = "native"
    split = choose_split(req.ranks, heads, tokens, backend, req.speed.step_cache, on_gpus=hw.device != "cpu")
    if not split.possible:
        return split, [f"This job cannot be split across {req.ranks} GPUs: {split.reason}."]
    return split, [f"Split across {req.ranks} GPUs (context parallel, {split.kind}): {split.reason}. Each GPU holds "
                   f"the whole model and 1/{req.ranks} of the denoise's activations."]


def split_backend(split: Split, backend: str) -> str:
    """The attention backend a possible ``split`` runs with: the chosen one when it runs split, else "native"."""
    return backend if backend in CONTEXT_PARALLEL_BACKENDS else "native"


# The rungs that keep the transformer whole on the device: a plan on another one leaves the device to run (it
# streams or shrinks weights), which splitting the denoise across GPUs may avoid.
ON_DEVICE_RUNGS = ("all_on_device", "text_encoder_offload")


def gpus_for(settings, spec: ModelSpec, hw: HardwareProfile, engines: int | None = None) -> tuple[int, str]:
    """(how many GPUs, one engine each, the job of ``settings`` should use, why). ``settings.gpus`` N >= 1 asks
    for N (capped by the engines there are, with a note); 0 is automatic: one GPU unless the one-GPU plan must
    leave the device (stream or shrink the transformer, or does not fit) while a split one would fit on it (never
    on a CPU). ``engines``: how many engine processes the app runs (one per GPU it uses, ``--gpus``; on a machine
    without GPUs, CPU engines); None: one per GPU of the machine. The pool asks this before it sends the job; the
    split it then runs is checked again by each engine."""
    present = hw.gpu_count if engines is None else engines
    asked = getattr(settings, "gpus", 0) or 0
    if asked >= 1:
        if asked > max(present, 1):
            if engines is not None:
                has = f"the app runs {plural(engines, 'engine')} (one per GPU it uses: --gpus)"
            else:
                has = f"this machine has {plural(present, 'GPU')}" if present else "this machine has no GPU"
            return max(present, 1), f"{plural(asked, 'GPU')} asked for, but {has}: using {max(present, 1)}."
        return asked, f"{plural(asked, 'GPU')}, as the settings ask."
    if present < 2 or hw.gpu_count == 0:
        return 1, "One GPU: the machine has no other." if hw.gpu_count < 2 else "One GPU: the app runs one engine."
    if not hw.collectives:
        return 1, f"One GPU: {NO_COLLECTIVES}."
    req, override = plan_request_for(settings), override_for(settings)
    alone = plan_memory(spec, req, hw, override)
    if alone.fits and alone.strategy in ON_DEVICE_RUNGS:
        return 1, f"One GPU: the job fits on it with '{alone.strategy}'."
    for ranks in range(2, present + 1):
        split = plan_memory(spec, replace(req, ranks=ranks), smallest_gpu(hw, ranks), override)
        if split.fits and split.strategy in ON_DEVICE_RUNGS and split.split.possible:
            return ranks, (f"{ranks} GPUs: on one the job needs '{alone.strategy}'"
                           + ("" if alone.fits else " and still does not fit")
                           + f", split across {ranks} ({split.split.kind}) it fits with '{split.strategy}'.")
    return 1, (f"One GPU: splitting the denoise across up to {present} GPUs would not keep the transformer on the "
               "device (each GPU holds the whole model; only the activations are divided).")


def smallest_gpu(hw: HardwareProfile, ranks: int) -> HardwareProfile:
    """``hw`` as the smallest of the first ``ranks`` GPUs it lists (the engines a split job would run on, its own
    first): every rank holds the whole model, so the smallest card decides whether it fits."""
    if len(hw.devices) < ranks:
        return hw
    used = hw.devices[:ranks]
    return replace(hw, vram_total_gb=min(hw.vram_total_gb, *(d.total_gb for d in used)),
                   vram_free_gb=min(hw.vram_free_gb, *(d.free_gb for d in used)))


def _fallback(spec, req, hw, ladder, override):
    """When nothing fits, the last rung with its smallest settings (so the user sees the closest plan)."""
    name = ladder[-1]
    options = list(_candidates(name, override, hw, spec))
    if not options:
        return None
    te, tile, load = options[-1]
    rung = _rung(name, te, tile, load, _vae_bytes(hw, override))
    return rung, _phases(spec, req, hw, rung)


def _explain(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, plan: Plan, override: Override) -> list[str]:
    _, nbytes = _dtypes(hw)
    te_gb = spec.text_encoder_params * nbytes / mem.GIB
    tr_gb = mem.transformer_weights_gb(spec, nbytes)
    said = []
    if hw.device == "cpu":
        return _explain_cpu(spec, req, hw, plan, override)
    said.append(f"{hw.device_name} ({hw.backend.upper()}): {plan.budget_vram_gb:.1f} GB of device memory and "
                f"{plan.budget_ram_gb:.1f} GB of RAM may be used after the safety margins; computing in {plan.dtype}.")
    if override.strategy:
        said.append(f"Strategy forced to '{plan.strategy}': {RUNG_TEXT[plan.strategy]}.")
    elif not plan.fits:
        said.append(f"No rung fits; the closest is '{plan.strategy}' ({RUNG_TEXT[plan.strategy]}).")
    else:
        said.append(f"Chose '{plan.strategy}' ({RUNG_TEXT[plan.strategy]}): the fastest rung whose every phase "
                    f"fits, peaking at {plan.predicted_peak_vram_gb:.1f} GB on the device and "
                    f"{plan.predicted_peak_ram_gb:.1f} GB of RAM.")
    if plan.text_encoder == "offload":
        said.append(f"The text encoder ({te_gb:.1f} GB) moves to the device only to encode the prompt, then back to RAM, "
                    f"so it never sits beside the {tr_gb:.1f} GB transformer while it denoises.")
    elif plan.text_encoder == "streamed":
        said.append(f"The text encoder ({te_gb:.1f} GB) does not fit on the device whole beside the rest: it stays in "
                    f"RAM (pinned once when the model loads) and streams through the device layer by layer to encode "
                    f"each new prompt, many times faster than encoding on the CPU.")
    elif plan.text_encoder == "cpu":
        said.append(f"The text encoder ({te_gb:.1f} GB) runs on the CPU: it would not fit on the device beside the rest.")
    if plan.swaps_experts and spec.experts > 1:
        said.append(_explain_swap(spec, hw, plan, override))
    if plan.transformer == "disk":
        if plan.fits:
            said.append(f"Slow: the {tr_gb:.1f} GB transformer is written to files on disk as it loads and read back "
                        f"block by block at every step, so each step waits on the disk; it is the last rung, taken "
                        f"because no rung that keeps the transformer in RAM fits {plan.budget_ram_gb:.1f} GB of RAM.")
        if not _disk_room(spec, hw):
            said.append(f"The disk has {hw.disk_free_gb:.1f} GB free, and this needs {disk_copy_gb(spec, hw):.1f} GB "
                        f"plus {DISK_MARGIN_GB:.0f} GB to spare: free some space.")
    if plan.transformer in ("group", "leaf"):
        said.append(f"The {tr_gb:.1f} GB transformer stays in RAM and streams to the device "
                    f"{'block by block' if plan.transformer == 'group' else 'layer by layer'}"
                    + (" with pinned memory and a copy stream, overlapping copies with compute." if plan.use_stream
                       else " (no pinned memory or copy stream: memory is unified)."))
    if plan.fp8:
        said.append("Transformer weights are stored in fp8 and computed in 16-bit, halving their memory "
                    "at a small cost in quality.")
    if plan.load == "device_map":
        said.append("Weights load straight to the device: there is not enough RAM to stage them on the CPU first.")
    said.extend(_explain_tiles(req, plan, override))
    if plan.attention == "math":
        tokens = spec.tokens(req.width, req.height, req.frames)
        said.append(f"This backend uses math attention: its score buffer grows with tokens^2 ({tokens} tokens).")
    if hw.unified_memory and hw.backend == "rocm":
        said.append("Unified memory: the device carve-out and the RAM left to the OS are budgeted separately.")
    if not plan.fits:
        said.append(f"Nothing fits: even '{plan.strategy}' needs {plan.predicted_peak_vram_gb:.1f} GB on the device "
                    f"and {plan.predicted_peak_ram_gb:.1f} GB of RAM.")
    return said


def _explain_swap(spec: ModelSpec, hw: HardwareProfile, plan: Plan, override: Override) -> str:
    """Why one expert at a time: both do not fit on the device beside the rest, one does."""
    _, nbytes = _dtypes(hw)
    high, low = mem.expert_weights_gb(spec, nbytes, plan.fp8)[:2]
    why = ("" if override.strategy else
           f"both experts ({high + low:.1f} GB) do not fit on the device beside the rest, one does: ")
    return (f"{why[:1].upper()}{why[1:]}the high-noise expert ({high:.1f} GB) sits on the device for the "
            f"high-noise steps while the low-noise one ({low:.1f} GB) waits in RAM; at the boundary the engine swaps "
            f"them in its own timed phase (expert_swap), so the device never holds more than one expert. Both stay "
            f"in RAM all along: the swap copies one expert in and drops the other's device copy"
            + (", from pinned memory." if plan.pin_memory else "."))


def _explain_files(spec: ModelSpec, hw: HardwareProfile, plan: Plan) -> list[str]:
    """What each single transformer file costs once loaded, against the model's own transformer."""
    _, nbytes = _dtypes(hw)
    said = []
    for expert, file in enumerate(spec.transformer_files):
        if file is None:
            continue
        which = "low-noise transformer" if expert else ("high-noise transformer" if spec.experts > 1 else "transformer")
        name = PurePath(file.source[0]).name
        own = spec.transformer.params * nbytes / mem.GIB
        if file.quantized:
            held = (f"it stays quantised once loaded ({file.loaded_bytes(nbytes) / mem.GIB:.1f} GB, dequantised layer "
                    f"by layer as it computes) instead of the model's own {own:.1f} GB in {plan.dtype}")
            if plan.fp8:
                held += "; fp8 storage applies to the model's own transformer only"
        else:
            held = f"it loads in {plan.dtype} ({file.loaded_bytes(nbytes) / mem.GIB:.1f} GB), as the model's own would"
        said.append(f"The {which} comes from {name} ({file.quantization}): {held}.")
    return said


def _explain_tiles(req: PlanRequest, plan: Plan, override: Override) -> list[str]:
    if plan.vae_tile is None:
        return []
    if not plan.vae_tiled:
        return [f"VAE tiling is on, but a {req.width}x{req.height} frame is no larger than one {plan.vae_tile}px "
                "tile, so it decodes whole."]
    if override.vae_tiling:
        return [f"VAE tiling is on (your choice): it decodes in {plan.vae_tile}px tiles."]
    return [f"The VAE decodes in {plan.vae_tile}px tiles: an untiled decode of "
            f"{req.frames}x{req.height}x{req.width} would not fit."]


def _explain_cpu(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, plan: Plan,
                 override: Override) -> list[str]:
    """What a CPU-only plan means: everything in RAM, in float32; the overrides that change nothing here."""
    weights = _weights_gb(spec, req, hw, _rung(plan.strategy, plan.text_encoder, plan.vae_tile, plan.load))
    if plan.fits:
        said = [f"No GPU found: everything runs on the CPU in float32, in RAM: up to "
                f"{plan.predicted_peak_ram_gb:.1f} of the {plan.budget_ram_gb:.1f} GB that may be used. "
                "Slow, but it works."]
    else:
        said = [f"No GPU found: on the CPU everything is held in RAM in float32, which needs "
                f"{plan.predicted_peak_ram_gb:.1f} GB, but only {plan.budget_ram_gb:.1f} GB may be used; the "
                f"weights alone take {sum(weights.values()):.1f} GB (text encoder {weights['text_encoder']:.1f} GB, "
                f"transformer {weights['transformer']:.1f} GB)."]
    if override.strategy and override.strategy != "all_on_device":
        said.append(f"Strategy forced to '{plan.strategy}': on a CPU-only machine it changes no memory figure "
                    "(everything is in RAM either way); it only runs that strategy's offload hooks.")
    if override.text_encoder:
        said.append(f"Text encoder place forced to '{override.text_encoder}': on a CPU-only machine it runs on the "
                    "CPU wherever it is put.")
    if plan.fits:
        said.extend(_explain_tiles(req, plan, override))
    return said


def _smaller_model(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile) -> str | None:
    """A tip naming the largest known model smaller than ``spec`` that fits this request here, if any."""
    from engine.models.spec import KNOWN_MODELS

    def does(candidate: ModelSpec) -> bool:   # image to video: an I2V model (36 input channels) or Wan2.2-5B
        takes_image = candidate.transformer.in_channels == 36 or candidate.expand_timesteps
        makes_text_video = candidate.transformer.in_channels != 36
        return takes_image if req.image_to_video else makes_text_video

    size = spec.transformer.params * spec.experts
    smaller = sorted(((ref, known) for ref, known in KNOWN_MODELS.items()
                      if known.transformer.params * known.experts < size and does(known)),
                     key=lambda item: -item[1].transformer.params)
    for ref, known in smaller:
        sized = replace(req, width=req.width // known.size_multiple * known.size_multiple or known.size_multiple,
                        height=req.height // known.size_multiple * known.size_multiple or known.size_multiple)
        chosen = plan_memory(known, sized, hw) if fits(known, sized, hw) else None
        if chosen is not None:
            where = (f"{chosen.predicted_peak_ram_gb:.1f} GB RAM" if hw.device == "cpu" else
                     f"{chosen.predicted_peak_vram_gb:.1f} GB device memory, {chosen.predicted_peak_ram_gb:.1f} GB RAM")
            return f"Use a smaller model: {known.name} ({ref}) fits here at this size, peaking at {where}."
    return None


def _suggest(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, override: Override) -> list[str]:
    """Changes that make this request fit, each checked with the planner; none when nothing would."""
    tips = []
    for frames in range(req.frames - 4, 0, -4):
        if fits(spec, replace(req, frames=frames), hw, override):
            tips.append(f"Use {plural(frames, 'frame')} instead of {req.frames}.")
            break
    for scale in (0.75, 0.5):
        w = max(spec.size_multiple, int(req.width * scale) // spec.size_multiple * spec.size_multiple)
        h = max(spec.size_multiple, int(req.height * scale) // spec.size_multiple * spec.size_multiple)
        if fits(spec, replace(req, width=w, height=h), hw, override):
            tips.append(f"Use {w}x{h} instead of {req.width}x{req.height}.")
            break
    if (override.strategy or override.text_encoder or override.vae_tiling is not None) \
            and fits(spec, req, hw, Override()):
        tips.append("Set Strategy, Text encoder and VAE tiling back to Auto: the planner finds a plan that fits.")
    smaller = _smaller_model(spec, req, hw)
    if smaller:
        tips.append(smaller)
    return tips
