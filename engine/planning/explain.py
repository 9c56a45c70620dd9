"""What a memory plan says about itself: a sentence for every choice the planner made (engine/planning/planner.py),
and the words for each rung of the ladder as the page and the command line show them."""
from __future__ import annotations

from pathlib import PurePath

from engine.device.hardware import HardwareProfile
from engine.models.components import Component
from engine.models.spec import ModelSpec
from engine.planning import memory as mem
from engine.planning.phases import DISK_MARGIN_GB, Rung, compute_dtype, disk_copy_gb, disk_room, weights_gb
from engine.planning.places import TransformerPlace
from engine.planning.plan import Override, Plan, PlanRequest
from engine.settings.choices import TextEncoderPlace

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
CPU_ONLY = "CPU only"
CPU_ONLY_TEXT = "everything in RAM, computed on the CPU"


def strategy_words(strategy: str, device: str) -> tuple[str, str]:
    """(the strategy's name, what it does) as the page and the command line say them: a CPU-only machine's
    plan is "CPU only" (its rung is all_on_device, and the device is the CPU)."""
    if device == "cpu":
        return (CPU_ONLY if strategy == "all_on_device" else f"{strategy} (on the CPU)"), CPU_ONLY_TEXT
    return strategy, RUNG_TEXT.get(strategy, strategy)


def explain(spec: ModelSpec, req: PlanRequest, hw: HardwareProfile, plan: Plan, override: Override) -> list[str]:
    """Why the plan holds each component where it does: the budgets, the rung, the text encoder's place, the
    offload, fp8, the load, the tiles and the attention, and what is missing when nothing fits."""
    if hw.device == "cpu":
        return _explain_cpu(spec, req, hw, plan, override)
    _, nbytes = compute_dtype(hw)
    te_gb = spec.text_encoder_params * nbytes / mem.GIB
    tr_gb = mem.transformer_weights_gb(spec, nbytes)
    said = [f"{hw.device_name} ({hw.backend.upper()}): {plan.budget_vram_gb:.1f} GB of device memory and "
            f"{plan.budget_ram_gb:.1f} GB of RAM may be used after the safety margins; computing in {plan.dtype}."]
    if override.strategy:
        said.append(f"Strategy forced to '{plan.strategy}': {RUNG_TEXT[plan.strategy]}.")
    elif not plan.fits:
        said.append(f"No rung fits; the closest is '{plan.strategy}' ({RUNG_TEXT[plan.strategy]}).")
    else:
        said.append(f"Chose '{plan.strategy}' ({RUNG_TEXT[plan.strategy]}): the fastest rung whose every phase "
                    f"fits, peaking at {plan.predicted_peak_vram_gb:.1f} GB on the device and "
                    f"{plan.predicted_peak_ram_gb:.1f} GB of RAM.")
    said.extend(_explain_text_encoder(plan, te_gb, tr_gb))
    if plan.swaps_experts and spec.experts > 1:
        said.append(_explain_swap(spec, hw, plan, override))
    said.extend(_explain_transformer(spec, hw, plan, tr_gb))
    if plan.load == "device_map":
        said.append("Weights load straight to the device: there is not enough RAM to stage them on the CPU first.")
    said.extend(explain_mapped(plan))
    said.extend(_explain_tiles(req, plan, override))
    if plan.attention == "math":
        tokens = mem.denoise_tokens(spec, req.width, req.height, req.frames, req.window)
        said.append(f"This backend uses math attention: its score buffer grows with tokens^2 ({tokens} tokens).")
    if hw.unified_memory and hw.backend == "rocm":
        said.append("Unified memory: the device carve-out and the RAM left to the OS are budgeted separately.")
    if not plan.fits:
        said.append(f"Nothing fits: even '{plan.strategy}' needs {plan.predicted_peak_vram_gb:.1f} GB on the device "
                    f"and {plan.predicted_peak_ram_gb:.1f} GB of RAM.")
    return said


def _explain_text_encoder(plan: Plan, te_gb: float, tr_gb: float) -> list[str]:
    if plan.text_encoder == TextEncoderPlace.OFFLOAD:
        return [f"The text encoder ({te_gb:.1f} GB) moves to the device only to encode the prompt, then back to RAM, "
                f"so it never sits beside the {tr_gb:.1f} GB transformer while it denoises."]
    if plan.text_encoder == TextEncoderPlace.STREAMED:
        return [f"The text encoder ({te_gb:.1f} GB) does not fit on the device whole beside the rest: it stays in "
                f"RAM (pinned once when the model loads) and streams through the device layer by layer to encode "
                f"each new prompt, many times faster than encoding on the CPU."]
    if plan.text_encoder == TextEncoderPlace.CPU:
        return [f"The text encoder ({te_gb:.1f} GB) runs on the CPU: it would not fit on the device beside the rest."]
    return []


def _explain_transformer(spec: ModelSpec, hw: HardwareProfile, plan: Plan, tr_gb: float) -> list[str]:
    """Where the transformer's weights live when they do not simply sit on the device, and in what precision."""
    said = []
    if plan.transformer == TransformerPlace.DISK:
        if plan.fits:
            said.append(f"Slow: the {tr_gb:.1f} GB transformer is written to files on disk as it loads and read back "
                        f"block by block at every step, so each step waits on the disk; it is the last rung, taken "
                        f"because no rung that keeps the transformer in RAM fits {plan.budget_ram_gb:.1f} GB of RAM.")
        if not disk_room(spec, hw):
            said.append(f"The disk has {hw.disk_free_gb:.1f} GB free, and this needs {disk_copy_gb(spec, hw):.1f} GB "
                        f"plus {DISK_MARGIN_GB:.0f} GB to spare: free some space.")
    if plan.transformer in (TransformerPlace.GROUP, TransformerPlace.LEAF):
        said.append(f"The {tr_gb:.1f} GB transformer stays in RAM and streams to the device "
                    f"{'block by block' if plan.transformer == TransformerPlace.GROUP else 'layer by layer'}"
                    + (" with pinned memory and a copy stream, overlapping copies with compute." if plan.use_stream
                       else " (no pinned memory or copy stream: memory is unified)."))
    if plan.fp8:
        said.append("Transformer weights are stored in fp8 and computed in 16-bit, halving their memory "
                    "at a small cost in quality.")
    return said


def _explain_swap(spec: ModelSpec, hw: HardwareProfile, plan: Plan, override: Override) -> str:
    """Why one expert at a time: both do not fit on the device beside the rest, one does."""
    _, nbytes = compute_dtype(hw)
    high, low = mem.expert_weights_gb(spec, nbytes, plan.fp8)[:2]
    why = ("" if override.strategy else
           f"both experts ({high + low:.1f} GB) do not fit on the device beside the rest, one does: ")
    return (f"{why[:1].upper()}{why[1:]}the high-noise expert ({high:.1f} GB) sits on the device for the "
            f"high-noise steps while the low-noise one ({low:.1f} GB) waits in RAM; at the boundary the engine swaps "
            f"them in its own timed phase (expert_swap), so the device never holds more than one expert. Both stay "
            f"in RAM all along: the swap copies one expert in and drops the other's device copy"
            + (", from pinned memory." if plan.pin_memory else "."))


def explain_mapped(plan: Plan) -> list[str]:
    """What the load reads of files stored in another precision than it computes in (memory.py mapped_gb)."""
    load = next((phase for phase in plan.phases if phase.phase == "load"), None)
    if load is None or not load.mapped_gb:
        return []
    return [f"Some of the model's files are stored in another precision than {plan.dtype}, as its repository "
            f"publishes them: the load casts them as it reads them, with up to {load.mapped_gb:.1f} GB of them mapped "
            f"at once beside the {load.peak_ram_gb:.1f} GB it holds. Those are the system's page cache: they show in "
            "the engine's RAM, and the system drops them when it needs the room."]


def explain_files(spec: ModelSpec, hw: HardwareProfile, plan: Plan) -> list[str]:
    """What each single transformer file costs once loaded, against the model's own transformer."""
    _, nbytes = compute_dtype(hw)
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
    weights = weights_gb(spec, req, hw, Rung.named(plan.strategy, plan.text_encoder, plan.vae_tile, plan.load))
    if plan.fits:
        said = [f"No GPU found: everything runs on the CPU in float32, in RAM: up to "
                f"{plan.predicted_peak_ram_gb:.1f} of the {plan.budget_ram_gb:.1f} GB that may be used. "
                "Slow, but it works."]
    else:
        said = [f"No GPU found: on the CPU everything is held in RAM in float32, which needs "
                f"{plan.predicted_peak_ram_gb:.1f} GB, but only {plan.budget_ram_gb:.1f} GB may be used; the "
                f"weights alone take {sum(weights.values()):.1f} GB (text encoder "
                f"{weights[Component.TEXT_ENCODER]:.1f} GB, transformer {weights[Component.TRANSFORMER]:.1f} GB)."]
    if override.strategy and override.strategy != "all_on_device":
        said.append(f"Strategy forced to '{plan.strategy}': on a CPU-only machine it changes no memory figure "
                    "(everything is in RAM either way); it only runs that strategy's offload hooks.")
    if override.text_encoder:
        said.append(f"Text encoder place forced to '{override.text_encoder}': on a CPU-only machine it runs on the "
                    "CPU wherever it is put.")
    said.extend(explain_mapped(plan))
    if plan.fits:
        said.extend(_explain_tiles(req, plan, override))
    return said
