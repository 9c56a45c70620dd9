"""A request's LoRAs on the loaded pipeline, with diffusers' own adapters (its PEFT backend).

Each LoRA file becomes one adapter of the transformer (of both experts on Wan2.2 A14B, or of the one its
``expert`` names: ``high`` the high-noise ``transformer``, ``low`` the low-noise ``transformer_2``), named after
the file's path, size and modification time and its expert: an adapter stays on the pipeline between jobs, so
changing which LoRAs are on, or their strengths, reads at most the new files and never reloads the model; a file
changed on disk gets a new name, and its old adapter is deleted. Adapters a run does not use stay loaded but off (up to KEEP_IDLE of them).

The LoRAs on are merged into the weights while the set and strengths stay the same (engine/run/lora_fusion.py):
no cost per step, and the transformer stays compiled. Where a merge cannot be made (GGUF, fp8 storage, a
transformer streamed from RAM or swapped with its second expert, no room in RAM for the originals) they compute beside the weights, uncompiled,
and the log says why.

Exactness: a run without LoRAs (or with every strength 0) takes any merge out (the original weights copied
back) and turns the adapters off (``disable_lora``), which makes each adapted layer call its base layer alone:
the output is the model's own, bit for bit. (A weight of 0 through ``set_adapters`` is exact too, since it adds
zeros, but still computes every LoRA product; an adapter at 0 is not even loaded here.)

A run's LoRA files are found (or fetched once from the Hub, for a preset's published LoRA) and checked against
the model's experts before the model loads (``lora_files``).
"""
from __future__ import annotations

import hashlib
import os
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from engine.models.loras import MADE_FOR_WAN, Lora, as_lora, lora_file_problem
from engine.models.spec import TRANSFORMERS
from engine.run.failures import is_out_of_memory
from engine.settings.values import InputError
from engine.words import plural

ADAPTER_PREFIX = "lora_"
# Adapters a run leaves off are kept loaded, at most this many (the oldest loaded go first): switching back to
# one is free, yet they hold memory (a rank-64 LoRA of a 14B model is about 0.3 GB in bfloat16).
KEEP_IDLE = 4
# Why LoRAs computed beside the weights run with the transformer uncompiled (diffusers' LoRA guide, "torch.compile"
# and "hotswapping").
COMPILE_NOTE = ("The transformer runs uncompiled while LoRAs compute beside its weights: diffusers recompiles it "
                "whenever an adapter is loaded or a strength changes, which would cost more than compiling saves.")


@dataclass(frozen=True)
class LoraSetup:
    """What ``apply_loras`` did: the LoRAs on, the files read from disk this time, the ones left off (strength 0),
    the adapters deleted, and the transformers it had to uncompile; how the LoRAs on run: ``merged`` into the
    weights (its words), or computed ``beside`` them (why they are not merged)."""
    on: tuple[Lora, ...] = ()
    read: tuple[str, ...] = ()
    off: tuple[str, ...] = ()
    idle: int = 0
    deleted: int = 0
    uncompiled: tuple[str, ...] = ()
    merged: str = ""
    beside: str = ""
    diffs: str = ""                    # words for the whole-tensor differences added (lora_diffs.count_words)
    left_out: tuple[str, ...] = ()     # sentences: tensors of a file read now that no layer of the model takes

    @property
    def detail(self) -> str:
        """The phase row's words: '2 on, 1 read from disk, merged'."""
        if not self.on:
            return "none on"
        return f"{len(self.on)} on, {len(self.read)} read from disk, {'merged' if self.merged else 'beside the weights'}"

    def sentences(self) -> list[str]:
        """What the job's log says about its LoRAs."""
        said = []
        if self.on:
            names = ", ".join(f"{lora.shown} at {lora.strength:g}" for lora in self.on)
            kept = len(self.on) - len(self.read)
            how = ([f"{plural(len(self.read), 'file')} read from disk"] if self.read else []) + \
                  ([f"{kept} already loaded"] if kept else [])
            said.append(f"LoRAs on: {names} ({', '.join(how)}).")
            if self.merged:
                said.append(f"They are {self.merged}.")
            elif self.beside:
                said.append(f"They compute beside the weights at every step: {self.beside}.")
            if self.diffs:
                said.append(f"In the weights: {self.diffs} (added as ComfyUI adds them, times the strength).")
        said.extend(self.left_out)
        for name in self.off:
            said.append(f"LoRA {name} has strength 0: it is off for this run.")
        if not self.on and self.idle:
            said.append(f"No LoRA on in this run: the {plural(self.idle, 'adapter')} kept loaded "
                        f"{'is' if self.idle == 1 else 'are'} off, so the output is the model's own.")
        if self.uncompiled:
            said.append(COMPILE_NOTE)
        return said


def adapter_name(file: str, expert: str = "both") -> str:
    """The adapter's name for ``file`` put into ``expert``: its path (and the expert, when it is one), then its size
    and modification time (a changed file differs)."""
    path = os.path.realpath(os.path.expanduser(file))
    stat = os.stat(path)
    where = hashlib.sha256((path if expert == "both" else f"{path}@{expert}").encode()).hexdigest()[:12]
    version = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:8]
    return f"{ADAPTER_PREFIX}{where}_{version}"


def _same_file(a: str, b: str) -> bool:
    return a.rsplit("_", 1)[0] == b.rsplit("_", 1)[0]


def _transformers(pipe) -> list:
    return [model for model in (getattr(pipe, name, None) for name in TRANSFORMERS) if model is not None]


def loaded_adapters(pipe) -> list[str]:
    """This app's adapters on the pipeline's transformers (low-rank factors, whole-tensor differences or both),
    oldest first."""
    from engine.run.lora_diffs import held_diffs

    names = {}
    for model in _transformers(pipe):
        names.update((name, None) for name in [*(getattr(model, "peft_config", None) or {}), *held_diffs(model)]
                     if name.startswith(ADAPTER_PREFIX))
    return list(names)


def _with_factors(pipe) -> set[str]:
    """The adapters PEFT holds (the ones with low-rank factors): the only names set_adapters takes."""
    return {name for model in _transformers(pipe) for name in (getattr(model, "peft_config", None) or {})}


def check_lora_experts(loras, experts: int, model: str = "the model") -> None:
    """InputError when a LoRA asks for one expert (``@high`` / ``@low``) of a model that has only one transformer."""
    one = [lora.shown for lora in map(as_lora, loras) if lora.expert != "both" and lora.strength]
    if one and experts < 2:
        raise InputError(f"{model} has one transformer, so LoRA {', '.join(one)} cannot go into "
                         f"{'an expert' if len(one) == 1 else 'experts'} of its own: remove '@high' / '@low' "
                         "(they are for two-expert models such as Wan2.2 A14B)")


def locate_loras(loras, models_dir, offline: bool = False, download_phase=nullcontext) -> tuple[Lora, ...]:
    """``loras`` with each file's path: as given, else by name in the models folder's loras/, else fetched once
    from its Hub ``repo`` into that folder (inside ``download_phase()``, the engine's timed phase). InputError
    saying which file to put where when one is missing and cannot be fetched (offline: nothing is tried), or
    when a fetched file is no LoRA for Wan. Nothing here loads a model: the engine calls it before any load."""
    from engine.settings.loras import find_lora, lora_folder

    located, fetch = [], []
    for lora in map(as_lora, loras):
        found = find_lora(lora.file, models_dir)
        if not Path(found).is_file() and lora.fetchable and lora.strength:
            fetch.append(len(located))
        located.append(replace(lora, file=found) if Path(found).is_file() else lora)
    if fetch:
        folder = lora_folder(models_dir)
        if offline:
            raise InputError([_where(located[i], folder) + ", or go online so the app fetches it" for i in fetch])
        with download_phase():
            for i in fetch:
                located[i] = replace(located[i], file=str(_download(located[i], folder)))
    problems = [problem for lora in located if lora.strength and (problem := lora_file_problem(lora.file))]
    if problems:
        raise InputError(problems)
    return tuple(located)


def _where(lora: Lora, folder: Path) -> str:
    return (f"LoRA file {lora.name} is not in {folder} and the app is offline: download {lora.path} from "
            f"{lora.repo} on the Hugging Face Hub and put it in {folder} as {lora.name}")


def _download(lora: Lora, folder: Path) -> Path:
    """Fetch ``lora``'s file from its Hub repo into ``folder`` under its own name; InputError when that fails."""
    target = folder / lora.name
    try:
        from huggingface_hub import hf_hub_download

        folder.mkdir(parents=True, exist_ok=True)
        got = Path(hf_hub_download(lora.repo, lora.path, local_dir=folder))
        if got.resolve() != target.resolve():
            os.replace(got, target)
            for parent in got.parents:   # the repo's folders it came in, now empty
                if parent.resolve() == folder.resolve() or any(parent.iterdir()):
                    break
                parent.rmdir()
        return target
    except Exception as exc:   # no network, no such file: the user can still place it by hand
        raise InputError(f"LoRA file {lora.name} could not be downloaded ({type(exc).__name__}): download "
                         f"{lora.path} from {lora.repo} on the Hugging Face Hub and put it in {folder} as "
                         f"{lora.name}") from exc


def apply_loras(pipe, loras, model: str = "the model", dtype=None, streamed: bool = False, disk: bool = False,
                parked=nullcontext) -> LoraSetup:
    """Put ``loras`` (Lora values or (file, strength) pairs, in order) on ``pipe``: each file not yet loaded is
    read into the transformer (both experts when there are two, or the one its ``expert`` names), then exactly
    these adapters are on, at these strengths, merged into the weights where they can be, their whole-tensor
    differences added into the weights (engine/run/lora_diffs.py); none on takes any merge and difference out
    and turns the adapters off. ``dtype``: the plan's compute dtype, which the adapters take when the weights are
    stored in fp8; ``streamed``: the transformer comes to the device from a copy in RAM (offload, expert swap):
    no merge then; ``disk``: it streams from files on disk, which no difference reaches; ``parked``: a context
    in which the weights are in RAM alone (Wan2.2 A14B's expert swap), where differences go.
    InputError (the adapter left out again) when a file does not fit ``model``, or names an expert ``model``
    does not have."""
    from engine.run.lora_diffs import added_key, wanted_key
    from engine.run.lora_fusion import merge, merged_key, merged_words, unmerge, why_not_merged

    loras = [as_lora(entry) for entry in loras]
    on = [replace(lora, strength=float(lora.strength)) for lora in loras if lora.strength]
    off = tuple(lora.shown for lora in loras if not lora.strength)
    check_lora_experts(on, len(_transformers(pipe)), model)
    present = loaded_adapters(pipe)
    names = [adapter_name(lora.file, lora.expert) for lora in on]
    pairs = tuple(zip(names, (lora.strength for lora in on)))
    for transformer in _transformers(pipe):   # another set or strength: the merge comes out first, exactly
        if merged_key(transformer) not in (None, _factor_key(pipe, pairs)):
            unmerge(transformer)
    if not on:
        if present:
            pipe.disable_lora()
        _set_diffs(pipe, (), parked)
        return LoraSetup(off=off, idle=len(present))
    deleted = _delete_unwanted(pipe, present, names, parked)
    read, left_out = [], []
    for lora, name in zip(on, names):
        if name not in present:
            left_out += _load(pipe, lora, name, model, dtype, disk)
            read.append(lora.name)
    key = _factor_key(pipe, pairs)
    if key:
        pipe.enable_lora()
        # Each transformer is given every name: PEFT's layers skip the adapters they do not hold (an expert's own).
        pipe.set_adapters([name for name, _ in key], adapter_weights=[strength for _, strength in key])
    elif _with_factors(pipe):   # only differences on: the factors of earlier runs go off
        pipe.disable_lora()
    for transformer in _transformers(pipe):   # differences change under a merge: the merge comes out first
        if merged_key(transformer) is not None and added_key(transformer) != wanted_key(transformer, pairs):
            unmerge(transformer)
    diffs = _set_diffs(pipe, pairs, parked)
    done = dict(on=tuple(on), read=tuple(read), off=off, deleted=deleted, diffs=diffs, left_out=tuple(left_out))
    beside = next((why for t in _transformers(pipe) if key and (why := why_not_merged(t, [n for n, _ in key],
                                                                                        streamed))), "")
    if beside:
        from engine.run.speedups import uncompile_transformer

        return LoraSetup(**done, beside=beside,
                         uncompiled=uncompile_transformer(pipe))   # adapters change the blocks' code: COMPILE_NOTE
    for transformer in _transformers(pipe):
        if key and merged_key(transformer) != key:
            merge(transformer, [n for n, _ in key], [s for _, s in key])
    return LoraSetup(**done, merged=merged_words(_transformers(pipe)) if key else "")


def _factor_key(pipe, pairs) -> tuple:
    """The (adapter, strength) pairs of ``pairs`` that have low-rank factors: what set_adapters and a merge take."""
    factors = _with_factors(pipe)
    return tuple(pair for pair in pairs if pair[0] in factors)


def _set_diffs(pipe, pairs, parked) -> str:
    """Each transformer's tensors with exactly the differences of ``pairs`` added (inside ``parked`` when any
    changes); the log's words for them."""
    from engine.run.lora_diffs import add, added_key, count_words, wanted_key

    transformers = _transformers(pipe)
    if any(added_key(t) != wanted_key(t, pairs) for t in transformers):
        with parked():
            records = [add(t, pairs) for t in transformers]
    else:
        records = [add(t, pairs) for t in transformers]   # unchanged: the records as they are
    return ", ".join(words for words in map(count_words, records) if words)


def _delete_unwanted(pipe, present: list[str], wanted: list[str], parked=nullcontext) -> int:
    """Delete the adapters of files changed on disk since they were read, and the oldest idle ones beyond KEEP_IDLE
    (before anything is read, so their memory is free for it)."""
    stale = [name for name in present if name not in wanted and any(_same_file(name, w) for w in wanted)]
    idle = [name for name in present if name not in wanted and name not in stale]
    unwanted = stale + idle[:max(0, len(idle) - KEEP_IDLE)]
    if unwanted:
        _delete(pipe, unwanted, parked)
    return len(unwanted)


def _delete(pipe, names: list[str], parked=nullcontext) -> None:
    """Delete adapters ``names``: their factors (PEFT's) and their differences (taken out of the weights first)."""
    from engine.run.lora_diffs import forget_diffs, held_diffs

    factors = [name for name in names if name in _with_factors(pipe)]
    if factors:
        pipe.delete_adapters(factors)
    if any(name in held_diffs(transformer) for transformer in _transformers(pipe) for name in names):
        with parked():
            for transformer in _transformers(pipe):
                forget_diffs(transformer, names)


def _load(pipe, lora: Lora, name: str, model: str, dtype, disk: bool = False) -> list[str]:
    """Read ``lora``'s file into each transformer it is for as adapter ``name``: its low-rank factors through
    diffusers, its whole-tensor differences kept for lora_diffs. Returns sentences naming what no layer of the
    model takes; InputError saying why when it does not fit."""
    from engine.run.lora_diffs import keep_diffs, missing, problem, tensor_name

    shown = lora.name
    _check_values(lora)
    source, diffs, unknown = _read(lora)
    if diffs and disk:
        raise InputError(f"LoRA {shown} adds whole-tensor changes ({plural(len(diffs), 'tensor')}: norms, biases, "
                         "modulation) into the weights, and this plan streams the transformer from files on disk, "
                         "which they would not reach: close other programs so the plan keeps the transformer in RAM, "
                         "or use a LoRA without whole-tensor differences")
    left_out = []
    try:
        for index, transformer in enumerate(_transformers(pipe)):
            if lora.expert != "both" and index != ("high", "low").index(lora.expert):
                continue
            into_second = {"load_into_transformer_2": True} if index else {}
            factors, absent = _present_factors(transformer, source)
            gone = missing(transformer, diffs)
            absent += gone + unknown
            if factors:
                pipe.load_lora_weights(_copy(factors), adapter_name=name, **into_second)
                if name not in (getattr(transformer, "peft_config", None) or {}):
                    raise InputError(f"LoRA {shown} has no weights for the Wan transformer (diffusers found none of "
                                     f"its layers in it): {MADE_FOR_WAN}")
                if _settle(transformer, name, dtype):   # fp8 weights: the adapter's values again, in the compute dtype
                    pipe.load_lora_weights(_copy(factors), adapter_name=name, hotswap=True, **into_second)
            if diffs:
                why = problem(transformer, diffs, shown)
                if why:
                    raise InputError(why)
                keep_diffs(transformer, name, diffs)
            if not factors and all(tensor_name(*target) in gone for target in diffs):
                raise InputError(f"LoRA {shown} has no weights for the Wan transformer (none of its layers is in "
                                 f"it): {MADE_FOR_WAN}")
            if absent and not left_out:
                left_out.append(_left_out_words(shown, absent))
    except InputError:
        _forget(pipe, name)
        raise
    except Exception as exc:
        _forget(pipe, name)
        if is_out_of_memory(exc):
            raise
        raise InputError(f"LoRA {shown} does not fit {model}: {_why(exc)}; pick a LoRA made for this model") from None
    return left_out


def _read(lora: Lora):
    """(what diffusers loads: the file's path, or the factors converted to its layout; the whole-tensor
    differences by (module, parameter); keys naming no layer of Wan's) of ``lora``'s file. Files in Wan's original
    layer names are converted here (engine/models/lora_layout.py): diffusers' converter drops their norm and
    modulation differences."""
    from safetensors import safe_open

    from engine.models.lora_layout import is_original_layout, split_original_lora

    with safe_open(lora.file, framework="pt") as handle:
        keys = list(handle.keys())
        if not is_original_layout(keys):
            return lora.file, {}, []
        state = {key: handle.get_tensor(key) for key in keys}
    try:
        split = split_original_lora(state, lora.name)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return split.factors, split.diffs, split.unknown


def _present_factors(transformer, source) -> tuple[object, list[str]]:
    """(the factors of ``source`` whose layer ``transformer`` has, the layers it has not): a file's path passes
    as it is (diffusers reads it)."""
    if isinstance(source, str):
        return source, []
    layers = {name for name, _ in transformer.named_modules()}
    kept, absent = {}, []
    for key, tensor in source.items():
        layer = key.removeprefix("transformer.").rsplit(".lora_", 1)[0]
        if layer in layers:
            kept[key] = tensor
        elif layer not in absent:
            absent.append(layer)
    return kept, absent


def _copy(factors):
    return dict(factors) if isinstance(factors, dict) else factors


def _left_out_words(shown: str, absent: list[str]) -> str:
    return (f"LoRA {shown} holds tensors for {plural(len(absent), 'layer')} this model does not have ("
            f"{', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''}): they are left out, as ComfyUI and "
            "LightX2V leave them.")


def _check_values(lora: Lora) -> None:
    """InputError when ``lora``'s file holds NaN or infinite values (each of its tensors looked at whole, as it is
    read: a LoRA is small beside the model), naming how many and the first."""
    from engine.models.finite import safetensors_scan

    problem = safetensors_scan(lora.file).problem(f"the LoRA {lora.name}", "remove it or download it again")
    if problem:
        raise InputError(problem)


def _why(exc: Exception) -> str:
    text = str(exc)
    if "size mismatch" in text:
        return ("its layers have other sizes than the model's (a LoRA for another Wan model, such as a 14B one "
                "on the 1.3B)")
    if "not found in the base model" in text or type(exc).__name__ == "NoMatchingPeftModuleError":
        return "none of its layers is in this model"
    first = text.strip().splitlines()[0][:160] if text.strip() else ""
    return f"diffusers could not load it ({type(exc).__name__}{': ' + first if first else ''})"


def _forget(pipe, name: str) -> None:
    """Whatever a failed load left of adapter ``name``, deleted."""
    if name in loaded_adapters(pipe):
        _delete(pipe, [name])


def _settle(transformer, name: str, dtype) -> bool:
    """Make adapter ``name`` runnable on ``transformer``; True when its values must be read again.

    diffusers leaves a LoRA bias on the "meta" device (no data) for the layers a file gives no bias (``diff_b``)
    while it gives others one: those are zeros. And PEFT gives an adapter its base layer's dtype, fp8 when the
    plan stores the weights in fp8 (layerwise casting), in which nothing computes: the adapter takes the compute
    ``dtype`` instead, and its values, rounded to fp8 meanwhile, are read again.
    """
    import torch
    from peft.tuners.lora import LoraLayer

    changed = requantised = False
    for module in transformer.modules():
        if not isinstance(module, LoraLayer):
            continue
        for part in (module.lora_A, module.lora_B):
            layer = part[name] if name in part else None
            if layer is None:
                continue
            if layer.bias is not None and layer.bias.is_meta:
                layer.bias = torch.nn.Parameter(torch.zeros(layer.out_features, device=layer.weight.device,
                                                            dtype=layer.weight.dtype), requires_grad=False)
                changed = True
            if dtype is not None and layer.weight.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                layer.to(dtype)
                changed = requantised = True
    if changed:
        # Group offloading keeps its own record of each weight: it is made again with the adapter's (diffusers'
        # loaders do the same after loading one).
        from diffusers.hooks.group_offloading import _maybe_remove_and_reapply_group_offloading

        _maybe_remove_and_reapply_group_offloading(transformer)
    return requantised


def lora_files(loras, models_dir, model, download_phase=nullcontext) -> tuple[Lora, ...]:
    """The run's LoRAs, checked against ``model`` (a ResolvedModel: a LoRA for one expert needs two) and each
    file located (fetched once when missing and published, unless the app is offline): what the engine does
    before it loads anything."""
    from engine.models.refs import hub_offline

    experts = model.spec.experts if model.spec else 1 + ("transformer_2" in model.components)
    check_lora_experts(loras, experts, model.ref)
    return locate_loras(loras, models_dir, hub_offline(), download_phase)
