"""LoRAs merged into the transformer's weights while the set and the strengths stay the same.

A LoRA computed beside the weights costs two extra products in every adapted layer at every step (a rank-64
LoRA on every attention and FFN layer of the 1.3B at 832x480x81: +12% a step on an H200) and keeps the
transformer uncompiled. Merged, the layers compute with their weights alone: no step time, and the blocks can
stay compiled (the weights change in place; the code does not).

diffusers' ``fuse_lora`` merges through PEFT and ``unfuse_lora`` subtracts the same product again, which in
bfloat16 does not give the weights back bit for bit. Here every weight a merge changes is first copied to RAM;
the merge adds each active adapter's product, made in float32, and rounds once; taking the merge out copies
the originals back. So a run without LoRAs is the model's own, exactly, whatever ran before it.

Not merged (the adapters then compute beside the weights, as diffusers runs them, and the log says why):
weights that stay quantised (GGUF) or are stored in fp8 (a merge would round the LoRA's change to fp8 and the
original could not come back), transformers that come to the device from a copy in RAM (group, leaf or disk
offload: the hooks hold copies of each weight of their own; Wan2.2 A14B's expert swap puts the RAM copy back at
every swap), and when RAM has no room for the copies.

The record of a merge lives on the transformer module it changed (``MERGE_ATTRIBUTE``), so it goes wherever the
module goes and is gone with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.words import plural

MERGE_ATTRIBUTE = "_studio_merged_loras"
# Room RAM keeps beside the copies of the merged weights (the app, the page, the decode's frames).
RAM_MARGIN_BYTES = 2 * 1024 ** 3


@dataclass
class Merge:
    """One merge on one transformer: the adapters and strengths it is of, and the original weight (and bias) of
    every layer it changed, in RAM."""
    key: tuple
    originals: dict = field(default_factory=dict)   # LoRA layer -> (its weight, its bias or None) before the merge

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.originals.values() for t in pair if t is not None)


def merged_key(transformer) -> tuple | None:
    """The (adapter, strength) pairs merged into ``transformer`` now (None: nothing merged)."""
    merge = getattr(transformer, MERGE_ATTRIBUTE, None)
    return merge.key if merge is not None else None


def _layers(transformer, names) -> list:
    """(LoRA layer, the adapters of ``names`` it holds) for each layer of ``transformer`` that holds any."""
    from peft.tuners.lora import LoraLayer

    found = []
    for module in transformer.modules():
        if isinstance(module, LoraLayer):
            held = [name for name in names if name in module.lora_A]
            if held:
                found.append((module, held))
    return found


def why_not_merged(transformer, names, streamed: bool) -> str:
    """Why the adapters ``names`` cannot be merged into ``transformer`` ("" when they can): the words finish
    "computed beside the weights: ..."."""
    import torch

    from engine.run.apply_plan import is_quantized

    if is_quantized(transformer):
        return "the transformer stays quantised (GGUF), and a merge would need it dequantised"
    if streamed:
        return ("the transformer comes to the device from its copy in RAM (streamed by offload hooks, or one "
                "expert at a time), which a merge on the device copy would not reach")
    layers = _layers(transformer, names)
    if any(module.get_base_layer().weight.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for module, _ in layers):
        return "the weights are stored in fp8, where a merge would round the LoRA's change to fp8"
    if any(type(module.get_base_layer()).__name__ != "Linear" for module, _ in layers):
        return "some adapted layers are not plain linear layers"
    needed = sum(_nbytes(module) for module, _ in layers)
    room = _available_ram()
    if room is not None and needed + RAM_MARGIN_BYTES > room:
        return (f"a merge keeps a copy of the weights it changes in RAM ({needed / 1e9:.1f} GB), and RAM has "
                f"{room / 1e9:.1f} GB free")
    return ""


def _nbytes(module) -> int:
    base = module.get_base_layer()
    return sum(t.numel() * t.element_size() for t in (base.weight, base.bias) if t is not None)


def _available_ram() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available


def merge(transformer, names, strengths) -> Merge:
    """Merge adapters ``names`` at the scales PEFT holds for them (``set_adapters`` set them from ``strengths``)
    into ``transformer``'s weights, taking out whatever merge was there first. Returns the merge's record."""
    import torch

    unmerge(transformer)
    record = Merge(tuple(zip(names, strengths)))
    with torch.no_grad():
        for module, held in _layers(transformer, names):
            base = module.get_base_layer()
            record.originals[module] = (base.weight.detach().to("cpu", copy=True),
                                        None if base.bias is None else base.bias.detach().to("cpu", copy=True))
            weight = base.weight.float()
            for name in held:
                up, down = module.lora_B[name].weight.float(), module.lora_A[name].weight.float()
                weight += (up @ down) * module.scaling[name]
            base.weight.copy_(weight.to(base.weight.dtype))
            with_bias = [name for name in held if getattr(module, "lora_bias", {}).get(name)]
            if with_bias:
                bias = base.bias.float()
                for name in with_bias:
                    bias += module.lora_B[name].bias.float() * module.scaling[name]
                base.bias.copy_(bias.to(base.bias.dtype))
            module.merged_adapters = list(held)   # PEFT's record: its forward now runs the base layer alone
    setattr(transformer, MERGE_ATTRIBUTE, record)
    return record


def unmerge(transformer) -> bool:
    """Take the merge out of ``transformer``: every changed weight copied back from RAM, exactly. False when
    nothing was merged."""
    import torch

    record = getattr(transformer, MERGE_ATTRIBUTE, None)
    if record is None:
        return False
    with torch.no_grad():
        for module, (weight, bias) in record.originals.items():
            base = module.get_base_layer()
            base.weight.copy_(weight)
            if bias is not None:
                base.bias.copy_(bias)
            module.merged_adapters = []
    delattr(transformer, MERGE_ATTRIBUTE)
    return True


def merged_words(transformers) -> str:
    """The log's words for the merges held: 'merged into the weights (2.7 GB of originals kept in RAM)'."""
    records = [getattr(t, MERGE_ATTRIBUTE) for t in transformers if getattr(t, MERGE_ATTRIBUTE, None) is not None]
    if not records:
        return ""
    layers, nbytes = sum(len(r.originals) for r in records), sum(r.nbytes for r in records)
    size = f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"
    return (f"merged into the weights of {plural(layers, 'layer')} (no cost per step; the originals, {size}, are "
            "kept in RAM to take it out exactly)")
