"""The phase table: under one rung of the ladder, where each component sits in every phase of a run and the
device and RAM peak that phase reaches. Pure, like the planner that walks the ladder with it
(engine/planning/planner.py); the terms themselves are in engine/planning/memory.py."""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.device.hardware import HardwareProfile
from engine.models.components import Component
from engine.models.spec import ModelSpec
from engine.planning import memory as mem
from engine.planning.places import ComponentPlace, TransformerPlace
from engine.planning.plan import PhasePlan, PlanRequest
from engine.settings.choices import Strategy, TextEncoderPlace

# Room left on the disk beside a disk rung's copy of the transformer.
DISK_MARGIN_GB = 2.0
# The Wan VAE's encoder holds this share of its weights; an image-to-video run keeps it in float32 when the
# decoder runs in bfloat16 (engine/run/apply_plan.py's keep_encoder_exact).
VAE_ENCODER_SHARE = 0.42   # Wan2.1 VAE: 53.6 of 126.9 M parameters
# Where each component is said to be, by the rung's text-encoder place and transformer place.
TEXT_ENCODER_PLACE = {TextEncoderPlace.DEVICE: ComponentPlace.DEVICE, TextEncoderPlace.OFFLOAD: ComponentPlace.DEVICE,
                      TextEncoderPlace.STREAMED: ComponentPlace.STREAMED, TextEncoderPlace.CPU: ComponentPlace.CPU}
TRANSFORMER_PLACE = {TransformerPlace.DEVICE: ComponentPlace.DEVICE, TransformerPlace.GROUP: ComponentPlace.STREAMED,
                     TransformerPlace.LEAF: ComponentPlace.STREAMED, TransformerPlace.DISK: ComponentPlace.STREAMED}
# How the rungs that do not keep the transformer whole on the device hold it.
RUNG_TRANSFORMER = {Strategy.GROUP_OFFLOAD: TransformerPlace.GROUP, Strategy.FP8_GROUP_OFFLOAD: TransformerPlace.GROUP,
                    Strategy.LEAF_OFFLOAD: TransformerPlace.LEAF, Strategy.DISK_OFFLOAD: TransformerPlace.DISK}


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder with the settings tried on it: what a phase table is computed for."""
    name: str
    text_encoder: str           # one of TEXT_ENCODER_PLACES
    transformer: TransformerPlace
    fp8: bool
    vae_tile: int | None
    load: str
    vae_bytes: int = 4

    @classmethod
    def named(cls, name: str, text_encoder: str, vae_tile: int | None, load: str, vae_bytes: int = 4) -> "Rung":
        """The rung called ``name``: how it holds the transformer and whether in fp8 follow from its name."""
        transformer = RUNG_TRANSFORMER.get(name, TransformerPlace.DEVICE)
        return cls(name, text_encoder, transformer, name.startswith("fp8"), vae_tile, load, vae_bytes)

    @property
    def swap(self) -> bool:
        return self.name == "expert_swap"


def round_up(x: float) -> float:
    """Round up to 0.01 GiB: a prediction must not drop below what it stands for."""
    return math.ceil(x * 100 - 1e-9) / 100


def compute_dtype(hw: HardwareProfile) -> tuple[str, int]:
    """(the dtype this machine computes in, its bytes per element)."""
    if hw.backend in ("cuda", "rocm"):
        return "bfloat16", 2
    if hw.backend == "mps":
        return "float16", 2
    return "float32", 4


def copy_streams(hw: HardwareProfile) -> bool:
    """Offloaded weights are pinned in RAM and copied on a side stream: discrete CUDA and ROCm cards."""
    return not hw.unified_memory and hw.backend in ("cuda", "rocm")


def attention_kind(hw: HardwareProfile) -> str:
    # CUDA SDPA picks flash / memory-efficient kernels for 16-bit inputs; ROCm does too once
    # AOTriton is enabled (the engine process sets it). MPS falls back to math attention.
    # On the CPU torch's flash kernel runs for float32 as well.
    return "math" if hw.backend == "mps" else "flash"


def disk_copy_gb(spec: ModelSpec, hw: HardwareProfile) -> float:
    """GiB a disk rung writes: the transformer's weights (every expert's)."""
    return mem.transformer_weights_gb(spec, compute_dtype(hw)[1])


def disk_room(spec: ModelSpec, hw: HardwareProfile) -> bool:
    """Whether the disk can take a disk rung's copy of the transformer (not known: assumed, the engine checks)."""
    return hw.disk_free_gb < 0 or hw.disk_free_gb >= disk_copy_gb(spec, hw) + DISK_MARGIN_GB


def weights_gb(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, rung: Rung) -> dict[Component, float]:
    """GiB of each component's weights under ``rung`` (every expert's under Component.TRANSFORMER)."""
    _, nbytes = compute_dtype(hw)
    image_encoder = spec.image_encoder_params * nbytes / mem.GIB if req.image_to_video else 0.0
    vae = spec.vae_params * rung.vae_bytes / mem.GIB + (_encoder_in_float32_gb(spec, rung.vae_bytes)
                                                       if req.image_to_video else 0.0)
    return {Component.TRANSFORMER: mem.transformer_weights_gb(spec, nbytes, rung.fp8),
            Component.TEXT_ENCODER: spec.text_encoder_params * nbytes / mem.GIB,
            Component.IMAGE_ENCODER: image_encoder, Component.VAE: vae}


def _encoder_in_float32_gb(spec: ModelSpec, vae_bytes: int) -> float:
    return spec.vae_params * VAE_ENCODER_SHARE * (4 - vae_bytes) / mem.GIB


def phase_table(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, rung: Rung) -> tuple[PhasePlan, ...]:
    """Every phase of one run under ``rung``, in the order the run goes through them: where each component is
    and the device and RAM peak, rounded up to 0.01 GiB."""
    if hw.device == "cpu":
        return _cpu_phases(spec, req, hw, rung)
    held = _held(spec, req, hw, rung)
    places = _places(spec, req, rung)
    phases = [*_load_phases(spec, hw, rung, held, places), *_encode_phases(spec, req, hw, rung, held, places),
              *_run_phases(spec, req, hw, rung, held, places)]
    return tuple(PhasePlan(p.phase, p.placement, round_up(p.peak_vram_gb), round_up(p.peak_ram_gb),
                           round_up(p.mapped_gb)) for p in phases)


def _cpu_phases(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, rung: Rung) -> tuple[PhasePlan, ...]:
    """A CPU-only machine: every weight sits in RAM from the load on and nothing moves, so each phase
    needs the weights plus its own working memory, and there is no transfer phase."""
    _, nbytes = compute_dtype(hw)
    weights = mem.BASE_RAM_CPU_ONLY_GB + sum(weights_gb(spec, req, hw, rung).values())
    tokens = mem.denoise_tokens(spec, req.width, req.height, req.frames, req.window)
    frames_ram = mem.frames_ram_gb(req.width, req.height, req.frames)
    names = [Component.TEXT_ENCODER, Component.TRANSFORMER, Component.VAE]
    if req.image_to_video and spec.image_encoder_params:
        names.insert(1, Component.IMAGE_ENCODER)
    places = {name: ComponentPlace.CPU for name in names}
    phases = [("load", mem.staging_gb(spec)), ("text_encode", mem.text_encode_gb(spec))]
    if Component.IMAGE_ENCODER in places:
        phases.append(("image_encode", mem.IMAGE_ENCODE_ACT_GB))
    if req.video_input:
        phases.append(("video_encode", mem.vae_encode_gb(spec, req.width, req.height, req.frames, rung.vae_tile,
                                                         rung.vae_bytes)
                       + mem.input_frames_ram_gb(req.width, req.height, req.frames) + mem.RUN_OVERHEAD_GB))
    phases.append(("denoise", mem.denoise_activations_gb(spec, tokens, nbytes, False) / req.ranks
                   + mem.windowed_latents_gb(spec, req.width, req.height, req.frames, req.window) + mem.RUN_OVERHEAD_GB))
    if rung.swap and spec.experts > 1:
        phases.append(("expert_swap", mem.RUN_OVERHEAD_GB))   # from RAM to RAM: the step only runs its code
    phases += [
        ("vae_decode", mem.vae_decode_gb(spec, req.width, req.height, req.frames, rung.vae_tile, rung.vae_bytes)
         + mem.RUN_OVERHEAD_GB + frames_ram),
        ("export", frames_ram)]
    phases += [(name, gb) for name, gb in _post_phases(req, nbytes)]
    mapped = round_up(mem.mapped_gb(spec, nbytes, rung.vae_bytes))
    return tuple(PhasePlan(name, places, 0.0, round_up(weights + extra), mapped if name == "load" else 0.0)
                 for name, extra in phases)


def _join_phase(req: PlanRequest) -> list[tuple[str, float]]:
    """An extension's join: on the host, a few frames at the size the video is (its part made larger, if so)."""
    if not req.extends:
        return []
    return [("join", mem.join_ram_gb(req.width * req.upscale, req.height * req.upscale) + mem.RUN_OVERHEAD_GB)]


def _post_phases(req: PlanRequest, nbytes: int) -> list[tuple[str, float]]:
    """(phase, working memory) of each step after the video is written: smoother on the video's frames, then
    larger (on the CPU as on the device, the frames stream through)."""
    steps = [("interpolate", req.interpolate)] if req.interpolate > 1 else []
    steps += [("upscale", req.upscale)] if req.upscale > 1 else []
    return [(name, mem.post_step_gb(name, req.width, req.height, nbytes) + mem.RUN_OVERHEAD_GB)
            for name, _ in steps] + _join_phase(req)


@dataclass(frozen=True)
class _Held:
    """GiB that one rung holds where between the phases, and the weights behind them: what every phase adds
    its own work to."""
    text_encoder: float
    image_encoder: float
    vae: float
    transformer: float          # all its weights
    transformer_device: float   # on the device while it runs
    transformer_idle: float     # on the device between phases (a streamed one: nothing)
    transformer_ram: float
    resident: float             # on the device between phases
    idle_ram: float             # in RAM between phases


def _held(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, rung: Rung) -> _Held:
    _, nbytes = compute_dtype(hw)
    weights = weights_gb(spec, req, hw, rung)
    te, ie, vae, tr_full = (weights[k] for k in (Component.TEXT_ENCODER, Component.IMAGE_ENCODER, Component.VAE,
                                                 Component.TRANSFORMER))
    tr_dev, tr_ram = _transformer_gb(spec, nbytes, rung, tr_full)
    encoders_on_device = rung.text_encoder == TextEncoderPlace.DEVICE
    te_dev_always = te if encoders_on_device else 0.0
    te_ram_idle = te if not encoders_on_device else 0.0
    ie_dev_always = ie if encoders_on_device else 0.0
    ie_ram_idle = ie if not encoders_on_device else 0.0
    # A streamed transformer is on the device only while it runs (denoise); a resident one always.
    tr_idle = tr_dev if rung.transformer == TransformerPlace.DEVICE else 0.0
    return _Held(te, ie, vae, tr_full, tr_dev, tr_idle, tr_ram,
                 resident=tr_idle + vae + te_dev_always + ie_dev_always,
                 idle_ram=mem.BASE_RAM_GB + tr_ram + te_ram_idle + ie_ram_idle)


def _transformer_gb(spec: ModelSpec, nbytes: int, rung: Rung, tr_full: float) -> tuple[float, float]:
    """(GiB of the transformer on the device while it runs, GiB of it in RAM) under ``rung``."""
    if rung.swap and spec.experts > 1:
        # One expert on the device (the larger bounds it); both stay in RAM, so the swap only copies one in.
        return max(mem.expert_weights_gb(spec, nbytes, rung.fp8)), tr_full
    if rung.transformer == TransformerPlace.DEVICE:
        return tr_full, 0.0
    in_flight = mem.GROUP_RESIDENT_BLOCKS * mem.block_gb(spec, nbytes, rung.fp8)
    if rung.transformer == TransformerPlace.GROUP:
        # The shared layers plus the blocks in flight (current, prefetched, being released).
        return mem.shared_gb(spec, nbytes) + in_flight, tr_full
    if rung.transformer == TransformerPlace.DISK:
        # As group offload on the device; in RAM only the blocks in flight, read from their files as they come.
        return mem.shared_gb(spec, nbytes) + in_flight, in_flight
    # leaf: one layer at a time, the next one prefetched
    return max(mem.LEAF_RESIDENT_MIN_GB, mem.LEAF_RESIDENT_BLOCKS * mem.block_gb(spec, nbytes, rung.fp8)), tr_full


def _places(spec: ModelSpec, req: PlanRequest, rung: Rung) -> dict[Component, ComponentPlace]:
    """Where each component is between the phases: on the device, in RAM or streamed."""
    te_place = TEXT_ENCODER_PLACE[rung.text_encoder]
    places = {Component.TEXT_ENCODER: te_place, Component.TRANSFORMER: TRANSFORMER_PLACE[rung.transformer],
              Component.VAE: ComponentPlace.DEVICE}
    if rung.swap and spec.experts > 1:
        places[Component.TRANSFORMER_2] = ComponentPlace.CPU
    if req.image_to_video and spec.image_encoder_params:
        places[Component.IMAGE_ENCODER] = te_place
    return places


def _load_phases(spec: ModelSpec, hw: HardwareProfile, rung: Rung, held: _Held, places: dict) -> list[PhasePlan]:
    """Reading the weights (load), then, when they came through RAM, placing them (transfer)."""
    _, nbytes = compute_dtype(hw)
    if rung.load == "device_map":
        # Straight to the device; an fp8 transformer is briefly held in 16-bit while it is cast.
        load_dev = (max(held.resident, held.resident - held.transformer + mem.transformer_weights_gb(spec, nbytes))
                    if rung.fp8 else held.resident)
        load_ram = held.idle_ram
    elif rung.transformer == TransformerPlace.DISK:
        # The transformer loads alone and is written to its files, then the rest loads beside its blocks in flight.
        load_dev = 0.0
        load_ram = mem.BASE_RAM_GB + max(held.transformer, held.text_encoder + held.image_encoder + held.vae
                                         + held.transformer_ram) + mem.staging_gb(spec)
    else:
        load_dev = 0.0
        load_ram = (mem.BASE_RAM_GB + held.text_encoder + held.image_encoder + held.vae + held.transformer
                    + mem.staging_gb(spec))
    phases = [PhasePlan("load", {k: (ComponentPlace.CPU if rung.load == "cpu" else v) for k, v in places.items()},
                        load_dev, load_ram, mem.mapped_gb(spec, nbytes, rung.vae_bytes))]
    if rung.load == "cpu":
        # Pinning a streamed text encoder holds one of its tensors twice for a moment.
        pinning = (spec.text_encoder_largest_params * nbytes / mem.GIB
                   if rung.text_encoder == TextEncoderPlace.STREAMED and copy_streams(hw) else 0.0)
        phases.append(PhasePlan("transfer", places, held.resident, held.idle_ram + pinning))
    return phases


def _encode_phases(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, rung: Rung, held: _Held,
                   places: dict) -> list[PhasePlan]:
    """Encoding the prompt (text_encode) and, for image to video, the image (image_encode); for video to video,
    its input (video_encode)."""
    _, nbytes = compute_dtype(hw)
    te, ie = held.text_encoder, held.image_encoder
    # What comes to the device to encode: the whole encoder, or the layers in flight of a streamed one.
    te_visit = {TextEncoderPlace.OFFLOAD: te,
                TextEncoderPlace.STREAMED: mem.streamed_text_encoder_gb(spec, nbytes)}.get(rung.text_encoder, 0.0)
    encode_dev = held.resident + te_visit
    encode_ram = held.idle_ram - (te if rung.text_encoder == TextEncoderPlace.OFFLOAD else 0.0)
    if rung.text_encoder != TextEncoderPlace.CPU:
        encode_dev += mem.text_encode_gb(spec)
    else:
        encode_ram += mem.text_encode_gb(spec)
    phases = [PhasePlan("text_encode", dict(places), encode_dev, encode_ram)]
    if Component.IMAGE_ENCODER in places:
        # (a streamed image encoder is charged whole: it is small, and its layers are not known here)
        visits = rung.text_encoder in (TextEncoderPlace.OFFLOAD, TextEncoderPlace.STREAMED)
        img_dev = held.resident + (ie if visits else 0.0) + mem.IMAGE_ENCODE_ACT_GB
        phases.append(PhasePlan("image_encode", places, img_dev, held.idle_ram))
    if req.video_input:   # the VAE stays on the device: the input's clip and the encoder's work join it there
        encode = mem.vae_encode_gb(spec, req.width, req.height, req.frames, rung.vae_tile, rung.vae_bytes)
        phases.append(PhasePlan("video_encode", places, held.resident + encode + mem.RUN_OVERHEAD_GB,
                                held.idle_ram + mem.input_frames_ram_gb(req.width, req.height, req.frames)))
    return phases


def _run_phases(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, rung: Rung, held: _Held,
                places: dict) -> list[PhasePlan]:
    """The denoise (and the swap of experts within it), the decode and the export, the encoders put away."""
    _, nbytes = compute_dtype(hw)
    tokens = mem.denoise_tokens(spec, req.width, req.height, req.frames, req.window)
    act = (mem.denoise_activations_gb(spec, tokens, nbytes, attention_kind(hw) == "math") / req.ranks
           + mem.windowed_latents_gb(spec, req.width, req.height, req.frames, req.window))
    decode = mem.vae_decode_gb(spec, req.width, req.height, req.frames, rung.vae_tile, rung.vae_bytes)
    frames_ram = mem.frames_ram_gb(req.width, req.height, req.frames)
    resident, idle_ram = held.resident, held.idle_ram
    encoders_at = ComponentPlace.DEVICE if rung.text_encoder == TextEncoderPlace.DEVICE else ComponentPlace.CPU
    denoise_places = {**places, Component.TEXT_ENCODER: encoders_at}
    if Component.IMAGE_ENCODER in places:
        denoise_places[Component.IMAGE_ENCODER] = encoders_at
    phases = [PhasePlan("denoise", denoise_places,
                        resident - held.transformer_idle + held.transformer_device + act + mem.RUN_OVERHEAD_GB,
                        idle_ram)]
    if Component.TRANSFORMER_2 in places:
        # The high-noise expert's device copy is dropped (its RAM copy stays), then the low-noise one copied in.
        denoise_places = {**denoise_places, Component.TRANSFORMER: ComponentPlace.CPU,
                          Component.TRANSFORMER_2: ComponentPlace.DEVICE}
        phases.append(PhasePlan("expert_swap", denoise_places, resident + mem.RUN_OVERHEAD_GB, idle_ram))
    phases.append(PhasePlan("vae_decode", denoise_places, resident + decode + mem.RUN_OVERHEAD_GB,
                            idle_ram + frames_ram))
    phases.append(PhasePlan("export", denoise_places, resident, idle_ram + frames_ram))
    phases += [PhasePlan(name, denoise_places, resident, idle_ram + gb) if name == "join" else
               PhasePlan(name, denoise_places, resident + gb, idle_ram) for name, gb in _post_phases(req, nbytes)]
    return phases
