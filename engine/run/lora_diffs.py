"""The whole-tensor differences of LoRA files (norms, biases, modulation, embeddings), added into the weights.

A difference is no low-rank product that could compute beside a layer: ComfyUI adds it to its tensor times the
strength, and so does the app, on every plan, in float32 and rounded once. Each tensor a difference changes is
first copied to RAM; another set of LoRAs or strengths, or none, copies the originals back first, exactly.

Where the weights live decides how: on the device, or in RAM for a model offloaded whole, the tensor itself is
changed; a transformer streamed by group or leaf offloading has its hooks made again from the changed tensors
(diffusers' loaders do the same after an adapter is loaded); Wan2.2 A14B's swapped experts are changed in RAM,
with the expert on the device put back there first (the caller's ``parked``). Refused with a sentence: a tensor
that stays quantised (GGUF keeps its weights as blocks of bytes) and a transformer streamed from files on disk.

The differences and the record of what is added live on the transformer module (``DIFFS_ATTRIBUTE``,
``ADDED_ATTRIBUTE``), so they go wherever the module goes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DIFFS_ATTRIBUTE = "_studio_lora_diffs"     # adapter name -> {(module, parameter): difference}
ADDED_ATTRIBUTE = "_studio_added_diffs"    # the Added record of what is in the weights now


@dataclass
class Added:
    """The differences in ``transformer``'s tensors now: of which (adapter, strength) pairs, and each changed
    tensor's original."""
    key: tuple
    originals: dict = field(default_factory=dict)   # (module, parameter) -> its tensor before, in RAM


def held_diffs(transformer) -> dict:
    """{adapter: {(module, parameter): difference}} the transformer keeps for its LoRAs."""
    return getattr(transformer, DIFFS_ATTRIBUTE, None) or {}


def keep_diffs(transformer, adapter: str, diffs: dict) -> None:
    """Keep ``adapter``'s differences on ``transformer`` (nothing changes in its weights yet)."""
    setattr(transformer, DIFFS_ATTRIBUTE, {**held_diffs(transformer), adapter: diffs})


def forget_diffs(transformer, adapters) -> None:
    """Drop the differences of ``adapters`` (deleted adapters), taking them out of the weights first when in."""
    held = held_diffs(transformer)
    if not any(name in held for name in adapters):
        return
    added = getattr(transformer, ADDED_ATTRIBUTE, None)
    if added is not None and any(name in dict(added.key) for name in adapters):
        take_out(transformer)
    setattr(transformer, DIFFS_ATTRIBUTE, {k: v for k, v in held.items() if k not in adapters})


def missing(transformer, diffs: dict) -> list[str]:
    """The tensors of ``diffs`` the transformer does not have (its layout lacks the layer), by name:
    'blocks.0.attn2.norm_added_k.weight'."""
    return [tensor_name(module, param) for module, param in diffs if _tensor(transformer, module, param) is None]


def problem(transformer, diffs: dict, lora: str) -> str | None:
    """Why ``diffs`` cannot be added into ``transformer`` (a sentence), None when they can."""
    from engine.run.apply_plan import is_quantized

    if is_quantized(transformer):   # first: a quantised tensor's shape is that of its bytes
        quantised = [tensor_name(m, p) for m, p in diffs if _is_quantised(_tensor(transformer, m, p))]
        if quantised:
            return (f"LoRA {lora} adds whole-tensor changes to {quantised[0]}"
                    f"{f' and {len(quantised) - 1} more' if len(quantised) > 1 else ''}, which this GGUF transformer "
                    "keeps quantised: use the model's own transformer (or a safetensors file) with this LoRA")
    wrong = [(tensor_name(m, p), tuple(t.shape), tuple(d.shape)) for (m, p), d in diffs.items()
             if (t := _tensor(transformer, m, p)) is not None and tuple(t.shape) != tuple(d.shape)]
    if wrong:
        name, theirs, ours = wrong[0]
        return (f"LoRA {lora} changes {name} with a tensor of shape {list(ours)}, but the model's is {list(theirs)}: "
                "it is made for another Wan model; pick a LoRA made for this one")
    return None


def tensor_name(module: str, param: str) -> str:
    """'blocks.0.attn2.norm_k.weight', 'scale_shift_table'."""
    return f"{module}.{param}" if module else param


def _tensor(transformer, module: str, param: str):
    try:
        owner = transformer.get_submodule(module) if module else transformer
    except AttributeError:
        return None
    if hasattr(owner, "base_layer"):   # a PEFT-wrapped layer: the weights are its base layer's
        owner = owner.base_layer
    value = getattr(owner, param, None)
    import torch

    return value if isinstance(value, torch.Tensor) else None


def _is_quantised(tensor) -> bool:
    return tensor is not None and type(tensor).__name__ == "GGUFParameter"


def added_key(transformer) -> tuple:
    added = getattr(transformer, ADDED_ATTRIBUTE, None)
    return added.key if added is not None else ()


def wanted_key(transformer, on) -> tuple:
    """The (adapter, strength) pairs of ``on`` whose differences ``transformer`` holds: what ``add`` puts in."""
    held = held_diffs(transformer)
    return tuple((name, strength) for name, strength in on if held.get(name))


def add(transformer, on) -> Added | None:
    """Make ``transformer``'s tensors hold the differences of ``on`` ((adapter, strength) pairs, in order) and
    nothing else; None when no adapter of ``on`` has differences. The tensors of every difference added are
    original + sum(strength x difference), made in float32 and rounded once."""
    import torch

    held = held_diffs(transformer)
    key = wanted_key(transformer, on)
    if added_key(transformer) == key:
        return getattr(transformer, ADDED_ATTRIBUTE, None)
    take_out(transformer)
    if not key:
        return None
    record = Added(key)
    totals: dict = {}
    for name, strength in key:
        for target, diff in held[name].items():
            if _tensor(transformer, *target) is None:
                continue   # a layer this model does not have (the run's log names them)
            totals[target] = totals.get(target, 0) + strength * diff.to(torch.float32)
    with torch.no_grad():
        for target, total in totals.items():
            tensor = _tensor(transformer, *target)
            record.originals[target] = tensor.detach().to("cpu", copy=True)
            changed = tensor.detach().to(torch.float32) + total.to(tensor.device)
            tensor.data.copy_(changed.to(tensor.dtype))
    setattr(transformer, ADDED_ATTRIBUTE, record)
    _remake_offload_hooks(transformer)
    return record


def take_out(transformer) -> bool:
    """Copy the original of every tensor the differences changed back, exactly; False when none were in."""
    import torch

    record = getattr(transformer, ADDED_ATTRIBUTE, None)
    if record is None:
        return False
    with torch.no_grad():
        for target, original in record.originals.items():
            _tensor(transformer, *target).data.copy_(original)
    delattr(transformer, ADDED_ATTRIBUTE)
    _remake_offload_hooks(transformer)
    return True


def _remake_offload_hooks(transformer) -> None:
    """Group and leaf offloading keep their own copies of each tensor to move: made again from the tensors now."""
    from diffusers.hooks.group_offloading import _maybe_remove_and_reapply_group_offloading

    _maybe_remove_and_reapply_group_offloading(transformer)


def count_words(record: Added | None) -> str:
    """'12 tensors (norms, biases, modulation) changed by the LoRAs' whole-tensor differences'."""
    if record is None or not record.originals:
        return ""
    from engine.words import plural

    return f"{plural(len(record.originals), 'tensor')} changed by their whole-tensor differences"
