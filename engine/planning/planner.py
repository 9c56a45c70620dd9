"""The memory planner: a pure function of (model spec, request, hardware) -> Plan.

It walks a ladder of strategies, fastest first, predicts the device and host memory of every phase for each
(the phase table, engine/planning/phases.py), and picks the first that fits the budget with a safety margin.
Every choice comes with a sentence saying why (engine/planning/explain.py). What it is asked and what it
answers are the values of engine/planning/plan.py.
"""
from __future__ import annotations

from dataclasses import replace

from engine.device.hardware import HardwareProfile
from engine.models.spec import ModelSpec
from engine.models.windows import model_windows
from engine.planning import memory as mem
from engine.planning.explain import explain, explain_files
from engine.planning.phases import Rung, attention_kind, compute_dtype, copy_streams, disk_room, phase_table, round_up
from engine.planning.plan import Override, Plan, PlanRequest
from engine.planning.speed import SpeedRequest, choose_speed, compile_key, fp8_compute_missing, vae_dtype_for
from engine.planning.split import CONTEXT_PARALLEL_BACKENDS, NO_COLLECTIVES, Split, choose_split
from engine.settings.choices import LADDER, TEXT_ENCODER_PLACES, TextEncoderPlace
from engine.words import plural

# Rungs of the ladder, fastest (and highest quality) first: LADDER (engine/settings/choices.py, where settings
# are checked against it).
# Rungs only a model with two experts (Wan2.2 A14B) has.
TWO_EXPERT_RUNGS = ("expert_swap",)
# Where the text (and image) encoder lives: TEXT_ENCODER_PLACES (engine/settings/choices.py).
# Device memory kept free for the desktop, the driver and the allocator's slack.
DEVICE_MARGIN_FRACTION = 0.05
DEVICE_MARGIN_MIN_GB = 0.75
# Host memory kept free for the OS and the desktop.
RAM_MARGIN_FRACTION = 0.05
RAM_MARGIN_MIN_GB = 1.5
# The rungs that keep the transformer whole on the device: a plan on another one leaves the device to run (it
# streams or shrinks weights), which splitting the denoise across GPUs may avoid.
ON_DEVICE_RUNGS = ("all_on_device", "text_encoder_offload")


def plan_request_for(settings) -> PlanRequest:
    """What the memory planner needs of a job's Settings (engine/settings/values.py)."""
    return PlanRequest(settings.width, settings.height, settings.frames, settings.mode == "i2v",
                       SpeedRequest(settings.steps, settings.guidance, settings.step_cache),
                       window=settings.window, overlap=settings.overlap, interpolate=settings.interpolate,
                       upscale=settings.upscale,
                       video_input=settings.mode == "v2v" and settings.denoise_steps < settings.steps,
                       decoder=settings.decoder, compute=settings.compute,
                       loras=any(lora.strength for lora in settings.loras))


def override_for(settings) -> Override:
    """The memory and speed choices a job's Settings force on the planner."""
    return Override(settings.strategy, settings.text_encoder, settings.vae_tiling, settings.vae_dtype,
                    settings.compile, settings.attention, settings.guidance_batch)


def budgets(hw: HardwareProfile) -> tuple[float, float]:
    """(device GiB, RAM GiB) a run may use, after the safety margins."""
    ram = hw.ram_available_gb - max(RAM_MARGIN_MIN_GB, RAM_MARGIN_FRACTION * hw.ram_total_gb)
    if hw.device == "cpu":
        return 0.0, max(ram, 0.0)
    vram = hw.vram_free_gb - max(DEVICE_MARGIN_MIN_GB, DEVICE_MARGIN_FRACTION * hw.vram_total_gb)
    return max(vram, 0.0), max(ram, 0.0)


# ----- the ladder ---------------------------------------------------------------------------------------

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
        te_places = [TextEncoderPlace.CPU if hw.device == "cpu" else TextEncoderPlace.DEVICE]
    elif name == "leaf_offload":
        te_places = [TextEncoderPlace.STREAMED, TextEncoderPlace.CPU]
    elif name == "text_encoder_offload":
        te_places = [TextEncoderPlace.OFFLOAD, TextEncoderPlace.STREAMED, TextEncoderPlace.CPU]
    else:
        te_places = list(TEXT_ENCODER_PLACES)
    if not copy_streams(hw):
        # Without a copy stream diffusers copies every streamed layer back to RAM: slower than the CPU.
        te_places = [place for place in te_places if place != TextEncoderPlace.STREAMED]
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
        if name == "disk_offload" and not disk_room(spec, hw):
            continue
        for te, tile, load in _candidates(name, override, hw, spec):
            rung = Rung.named(name, te, tile, load, vae_bytes)
            phases = phase_table(spec, req, hw, rung)
            first = first or (rung, phases)
            if _fits(phases, vram_budget, ram_budget, hw):
                chosen = (rung, phases)
                break
        if chosen:
            break
    if chosen:
        return (*chosen, True)
    return (*(_fallback(spec, req, hw, ladder, override) or first), False)


def _fallback(spec, req, hw, ladder, override):
    """When nothing fits, the last rung with its smallest settings (so the user sees the closest plan)."""
    name = ladder[-1]
    options = list(_candidates(name, override, hw, spec))
    if not options:
        return None
    te, tile, load = options[-1]
    rung = Rung.named(name, te, tile, load, _vae_bytes(hw, override))
    return rung, phase_table(spec, req, hw, rung)


# ----- the plan -----------------------------------------------------------------------------------------

def fits(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, override: Override = Override()) -> bool:
    return _choose(spec, req, hw, override)[2]


def plan_memory(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, override: Override = Override()) -> Plan:
    """Choose the fastest strategy whose every phase fits the budgets."""
    vram_budget, ram_budget = budgets(hw)
    dtype, _ = compute_dtype(hw)
    rung, phases, fits_ = _choose(spec, req, hw, override)
    peak_vram = max(p.peak_vram_gb for p in phases)
    peak_ram = max(p.peak_ram_gb for p in phases)
    cached = compile_key(spec, req.width, req.height, req.frames, req.window, req.image_to_video, hw.device_name,
                         hw.torch_version) in hw.compiled_sizes
    speed = choose_speed(hw, replace(req.speed, compile_cached=cached), rung.transformer, rung.fp8, override.vae_dtype,
                         override.compile, override.attention)
    split, split_said = _split(spec, req, hw, speed.attention_backend, override)
    if split is not None and split.possible:
        speed = replace(speed, attention_backend=split_backend(split, speed.attention_backend))
    plan = Plan(
        strategy=rung.name, fits=fits_, device=hw.device, dtype=dtype,
        vae_dtype=speed.vae_dtype, attention=attention_kind(hw), text_encoder=rung.text_encoder,
        transformer=rung.transformer, fp8=rung.fp8, vae_tile=rung.vae_tile, load=rung.load,
        pin_memory=copy_streams(hw), use_stream=copy_streams(hw),
        budget_vram_gb=round_up(vram_budget), budget_ram_gb=round_up(ram_budget),
        predicted_peak_vram_gb=round_up(peak_vram), predicted_peak_ram_gb=round_up(peak_ram), phases=phases,
        vae_tiled=rung.vae_tile is not None and (rung.vae_tile < req.width or rung.vae_tile < req.height),
        conv=speed.conv, compile=speed.compile, attention_backend=speed.attention_backend,
        transformer_files=tuple(file.source if file else None for file in spec.transformer_files), split=split)
    plan = _with_decode_window(spec, req, hw, plan, rung.vae_bytes)
    plan, fp8_said = _with_fp8_compute(req, hw, plan, override.compile)
    plan, batch_said = _with_guidance_batch(spec, req, hw, plan, override.guidance_batch)
    decisions = (explain(spec, req, hw, plan, override) + explain_files(spec, hw, plan) + list(speed.decisions)
                 + split_said + _windows_said(spec, req) + _decode_window_said(plan) + fp8_said + batch_said)
    suggestions = () if fits_ else _suggest(spec, req, hw, override)
    if not fits_ and not suggestions:
        decisions.append("Neither fewer frames, a smaller size nor a smaller known model makes it fit this "
                         "machine" + (": it needs more RAM, or a GPU." if hw.device == "cpu" else "."))
    return replace(plan, decisions=tuple(decisions), suggestions=tuple(suggestions))


def _with_decode_window(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, plan: Plan, vae_bytes: int) -> Plan:
    """The faster VAE decode (decoder "vae_fast", approximate): channels-last convolutions, and on a GPU as many
    latent frames a call of the decoder as the device has room for beside what the decode already holds (an
    untiled decode of a video), its decode's peak raised by what they add. The exact decode ("vae") is left as it
    is: several frames a call change cuDNN's kernels and so the frames by a few levels (bench/decode_windows.py)."""
    if req.decoder != "vae_fast":
        return plan
    plan = replace(plan, channels_last=True)
    if hw.device == "cpu" or plan.vae_tiled or req.frames <= 1 or not plan.fits:
        return plan
    decoding = next((phase for phase in plan.phases if phase.phase == "vae_decode"), None)
    if decoding is None:
        return plan
    window = mem.decode_window(spec, req.width, req.height, req.frames, vae_bytes,
                               plan.budget_vram_gb - decoding.peak_vram_gb)
    if window == 1:
        return plan
    extra = (window - 1) * mem.vae_window_gb(spec, req.width, req.height, vae_bytes)
    phases = tuple(replace(phase, peak_vram_gb=round_up(phase.peak_vram_gb + extra)) if phase is decoding else phase
                   for phase in plan.phases)
    return replace(plan, decode_window=window, phases=phases,
                   predicted_peak_vram_gb=round_up(max(plan.predicted_peak_vram_gb, *(p.peak_vram_gb for p in phases))))


def _decode_window_said(plan: Plan) -> list[str]:
    if not plan.channels_last:
        return []
    frames = (f" and {plan.decode_window} latent frames a call (the device has room for them)"
              if plan.decode_window > 1 else "")
    return [f"The VAE decodes faster and approximately (your choice): channels-last convolutions{frames}; the "
            f"frames differ from the exact decode's by a few levels."]


def _with_guidance_batch(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, plan: Plan,
                         forced: bool | None) -> tuple[Plan, list[str]]:
    """A step's conditional and unconditional passes as one batch (engine/run/guidance_batch.py), with what the
    plan says of it: by default on a GPU whose budget holds a second pass's activations beside the denoise's peak
    (that peak raised by them) where the plan compiles the transformer (its latents already differ from plain
    diffusers' by rounding; the batch took 2.3% off a step on an H100) or streams it (the weights are copied once
    a step instead of twice); or where the user turns it on and it fits. The plain, uncompiled path keeps its two
    calls, so its latents stay plain diffusers' bit for bit. Not with one pass a step (no guidance), a step cache
    (it keeps the two passes' states apart), a video in windows, or a denoise split across GPUs."""
    if forced is False or req.speed.guidance <= 1.0:
        return plan, []
    why_not = ("a step cache keeps the two passes apart" if req.speed.step_cache else
               "the video is denoised in windows" if req.frames > mem.pass_frames(spec, req.frames, req.window) else
               "the denoise is split across GPUs" if plan.split is not None and plan.split.possible else
               "the plan does not fit" if not plan.fits else None)
    if why_not is None and forced is None and (hw.device == "cpu" or not (plan.compile
                                                                          or plan.transformer != "device")):
        return plan, []   # the exact path (and a CPU, where a batch gains nothing) keeps the two calls
    said = f"Guidance's two passes run one after the other ({why_not})."
    if why_not is not None:
        return plan, [said] if forced else []
    denoise = next(phase for phase in plan.phases if phase.phase == "denoise")
    tokens = mem.denoise_tokens(spec, req.width, req.height, req.frames, req.window)
    extra = mem.denoise_activations_gb(spec, tokens, compute_dtype(hw)[1], attention_kind(hw) == "math")
    budget, peak = (plan.budget_ram_gb, denoise.peak_ram_gb) if hw.device == "cpu" else \
        (plan.budget_vram_gb, denoise.peak_vram_gb)
    if peak + extra > budget:
        return plan, [f"Guidance's two passes run one after the other: batched, their activations (+{extra:.1f} GB) "
                      f"would not fit."]
    raised = replace(denoise, **{"peak_ram_gb" if hw.device == "cpu" else "peak_vram_gb": round_up(peak + extra)})
    phases = tuple(raised if phase is denoise else phase for phase in plan.phases)
    plan = replace(plan, guidance_batch=True, phases=phases,
                   predicted_peak_vram_gb=max(plan.predicted_peak_vram_gb, raised.peak_vram_gb),
                   predicted_peak_ram_gb=max(plan.predicted_peak_ram_gb, raised.peak_ram_gb))
    streamed = plan.transformer != "device"
    return plan, [f"Guidance's two passes run as one batch{' (your choice)' if forced else ''}: the weights are "
                  f"read once a step{', which halves what is streamed' if streamed else ''}, for +{extra:.1f} GB of "
                  f"activations."]


def _with_fp8_compute(req: PlanRequest, hw: HardwareProfile, plan: Plan, compile_: bool | None) -> tuple[Plan, list[str]]:
    """The transformer's block linears in float8 through torchao where the user asks for it (approximate) and
    this machine and plan allow it: a GPU with float8 tensor cores, torchao and Triton, the transformer whole on
    the device in 16-bit (not streamed, swapped or stored in fp8), no LoRAs (they go into 16-bit weights), and
    compiled (uncompiled, quantizing the activations each pass costs more than the float8 matmuls save)."""
    if req.compute != "fp8":
        return plan, []
    why_not = (fp8_compute_missing(hw)
               or ("the plan does not fit" if not plan.fits else None)
               or ("the transformer is not whole on the device in 16-bit here (the plan "
                   f"{'stores it in fp8' if plan.fp8 else 'streams or swaps it'})"
                   if plan.fp8 or plan.transformer != "device" or plan.swaps_experts else None)
               or ("LoRAs go into the 16-bit weights" if req.loras else None)
               or ("a step cache runs the blocks uncompiled" if req.speed.step_cache else None)
               or ("it needs the transformer compiled, which you turned off" if compile_ is False else None))
    if why_not is not None:
        return plan, [f"The transformer's linears compute in {plan.dtype} (exact): float8 was asked for, but "
                      f"{why_not}."]
    return replace(plan, fp8_compute=True, compile=True), [
        "The transformer's block linears compute in float8 (your choice, approximate: about 1% off the latents, 6% "
        "faster a step on an H100), the blocks compiled: the first run at each size compiles for about 3 minutes."]


def _suggest(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, override: Override) -> list[str]:
    """Changes that make this request fit, each checked with the planner; none when nothing would."""
    tips = []
    frames = most_frames_that_fit(spec, req, hw, override)
    if frames is not None:
        tips.append(f"Use {plural(frames, 'frame')} instead of {req.frames}.")
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


def most_frames_that_fit(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, override: Override) -> int | None:
    """The most frames, of the counts 4, 8... below the request's, whose plan fits; None when none does. Found by
    halving the counts in turn (a count's every phase needs at least as much memory as a smaller count's), in about
    five plans instead of up to twenty: a plan that fits nowhere tries every rung and setting of the ladder."""
    counts = range(req.frames - 4, 0, -4)    # most first: those that fit, if any, are at the end
    low, high = 0, len(counts)                # the first count that fits is within counts[low:high], or none does
    while low < high:
        middle = (low + high) // 2
        if fits(spec, replace(req, frames=counts[middle]), hw, override):
            high = middle
        else:
            low = middle + 1
    return counts[low] if low < len(counts) else None


def _smaller_model(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile) -> str | None:
    """A tip naming the largest known model smaller than ``spec`` that fits this request here, if any."""
    from engine.models.spec import KNOWN_MODELS

    def does(candidate: ModelSpec) -> bool:   # image to video: an I2V model or Wan2.2-5B
        return candidate.takes_image if req.image_to_video else not candidate.image_to_video

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


def _windows_said(spec: ModelSpec, req: PlanRequest) -> list[str]:
    """A long video's windows, in one sentence (none for a video in one window)."""
    windows = model_windows(spec, req.frames, req.window, req.overlap)
    if windows is None:
        return []
    return [f"A long video: {req.frames} frames are denoised together in {windows.describe()}, blended where "
            f"they overlap; the memory is one window's, and each step runs the transformer {windows.count} times as "
            "often."]


# ----- several GPUs -------------------------------------------------------------------------------------

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
    tokens = mem.denoise_tokens(spec, req.width, req.height, req.frames, req.window)
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
