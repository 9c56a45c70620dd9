"""Applying a memory plan to a loaded pipeline with diffusers' own mechanisms.

Placement of each component, group offloading, fp8 layerwise casting and VAE
tiling are all hooks or moves that diffusers provides; this module only
decides which to call, from the Plan.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from engine.models.components import Component
from engine.models.spec import TRANSFORMERS
from engine.planning.places import TransformerPlace
from engine.planning.rates import bytes_per
from engine.planning.planner import Plan
from engine.settings.choices import TextEncoderPlace

ENCODERS = (Component.TEXT_ENCODER, Component.IMAGE_ENCODER)


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def from_pretrained_kwargs(plan: Plan) -> dict:
    """Keyword arguments for loading the pipeline under ``plan``."""
    kwargs = {"dtype": {"default": torch_dtype(plan.dtype), Component.VAE: torch_dtype(plan.vae_dtype)}}
    if plan.load == "device_map":
        kwargs["device_map"] = plan.device
    return kwargs


def loaded_into_ram(plan: Plan) -> tuple[str, ...]:
    """Encoders to load on their own, into RAM, when the rest loads straight to the device.

    diffusers maps a whole pipeline to one device; an encoder the plan keeps off the device would
    otherwise land there during the load, beside everything else, before it could be moved out.
    """
    return ENCODERS if plan.load == "device_map" and plan.text_encoder != TextEncoderPlace.DEVICE else ()


def load_into_ram(folder: Path, names: tuple[str, ...], plan: Plan, gate: str = "", **kwargs) -> dict:
    """Each named component that ``folder`` has, loaded on the CPU in the plan's dtype (for from_pretrained);
    ``gate``: where its transformers keep FastWan's gate (engine/run/gated.py), "" when they have none; ``kwargs``:
    more of from_pretrained's (a device map)."""
    index = json.loads((Path(folder) / "model_index.json").read_text())
    parts = {}
    for name in names:
        component = _component_class(index, name, gate)
        if component is None or not (Path(folder) / name).is_dir():
            continue
        parts[name] = component.from_pretrained(Path(folder) / name, dtype=torch_dtype(plan.dtype), **kwargs)
    return parts


def _component_class(index: dict, name: str, gate: str):
    """The class a component loads as: the one model_index.json names, a gated transformer for FastWan's."""
    import importlib

    library, class_name = index.get(name) or (None, None)
    if not library:
        return None
    if gate and name in TRANSFORMERS:
        from engine.run.gated import gated_transformer_class

        return gated_transformer_class(gate)
    return getattr(importlib.import_module(library), class_name)


def load_transformers_alone(folder: Path, plan: Plan, gate: str, loaded: dict) -> dict:
    """Each transformer of ``folder`` not in ``loaded``, loaded on its own as the rest of the pipeline loads (to the
    device with a device-map plan, else on the CPU) and made to let go of its files at once (let_go_of_files): one
    expert's files mapped at a time, not both until the whole pipeline is in. ``gate``: FastWan's, kept
    (engine/run/gated.py), which diffusers' own loader would drop."""
    parts = {}
    for name in (name for name in TRANSFORMERS if name not in loaded):
        parts |= load_into_ram(folder, (name,), plan, gate,
                               **({"device_map": plan.device} if plan.load == "device_map" else {}))
        for model in parts.values():
            let_go_of_files(model)
    return parts


def let_go_of_files(module) -> None:
    """Give the layers diffusers keeps in float32 (norms, the time embedding, the modulation tables) memory of their
    own. Loaded from float32 files (the published Wan2.1 and Wan2.2 transformers are) into another dtype, they are
    views of the files' memory map, and a view keeps the whole file mapped: a 1.3B transformer held 5.4 GiB of mapped
    file beside its 2.6 GiB of bf16 weights for as long as it stayed in RAM (measured on the CPU; docs/models.md).
    Copies cost a few MB. A model of one dtype (nothing kept apart) is left as it is."""
    import torch

    if not isinstance(module, torch.nn.Module) or len({p.dtype for p in module.parameters()}) < 2:
        return
    for part in module.modules():
        for param in part.parameters(recurse=False):
            if param.dtype == torch.float32 and param.device.type == "cpu":
                param.data = param.data.clone()


def let_go_of_pipeline_files(pipe) -> None:
    """let_go_of_files for every model of a loaded pipeline."""
    for component in pipe.components.values():
        let_go_of_files(component)


def loads_transformers_alone(spec, plan: Plan) -> bool:
    """Whether the transformers load on their own first: FastWan's gate, or files stored in another width than the
    plan computes in (cast from their mapped files, which each lets go of before the next loads)."""
    if spec is None:
        return False
    width = bytes_per(plan.dtype)
    return spec.transformer.gated or any(spec.stored_width(name) not in (0.0, width) for name in TRANSFORMERS)


def load_transformer_files(resolved, plan: Plan) -> dict:
    """Each single transformer file of ``resolved`` loaded on the CPU, by component (for from_pretrained).

    The config is always the base model's own (guessed from the file, diffusers can pick another Wan variant).
    A GGUF file stays quantised (diffusers dequantises each layer as it computes); a safetensors file loads at
    the plan's dtype, ComfyUI's fp8 scaled ones with each weight multiplied by its scale first."""
    from diffusers import GGUFQuantizationConfig, WanTransformer3DModel

    dtype = torch_dtype(plan.dtype)
    parts = {}
    for name, file in zip(TRANSFORMERS, resolved.transformer_files):
        if file is None:
            continue
        kwargs = {"config": str(resolved.folder), "subfolder": name, "dtype": dtype, "local_files_only": True}
        if file.kind == "gguf":
            kwargs["quantization_config"] = GGUFQuantizationConfig(compute_dtype=dtype)
        source = _unscaled_fp8(file.path, dtype) if file.scaled_fp8 else file.path
        if file.first_last:
            source = _with_first_last_embedding(source)
        parts[name] = WanTransformer3DModel.from_single_file(source, **kwargs)
    return parts


def _with_first_last_embedding(source) -> dict:
    """The tensors of ``source`` (a file, or tensors read already) with FLF2V's position embedding under
    diffusers' name: its single-file converter renames every other tensor of the original layout but not this
    one, which would leave the model's embedding empty (a load that dies copying out of the meta device)."""
    from diffusers.models.model_loading_utils import load_state_dict

    from engine.models.single_file import DIFFUSERS_FIRST_LAST_EMBEDDING, FIRST_LAST_EMBEDDING, PREFIX

    state = load_state_dict(source)
    for prefix in ("", PREFIX):
        if prefix + FIRST_LAST_EMBEDDING in state:
            state[prefix + DIFFUSERS_FIRST_LAST_EMBEDDING] = state.pop(prefix + FIRST_LAST_EMBEDDING)
    return state


def _unscaled_fp8(path: str, dtype) -> dict:
    """The tensors of ComfyUI's fp8 scaled file with every weight multiplied by its scale, at ``dtype``
    (diffusers would load the fp8 values alone: a transformer of wrong weights). Both of ComfyUI's layouts: the
    older (``scaled_fp8`` marker, ``<layer>.scale_weight``) and the newer (``<layer>.weight_scale``, its fp8
    weight possibly kept in a uint8 container); activation scales are dropped (the compute is in ``dtype``)."""
    import torch
    from safetensors.torch import load_file

    from engine.models.single_file import SCALE_NAMES, SCALE_SUFFIXES, WEIGHT_SCALE

    state = load_file(path)
    for key in [k for k in state if k.endswith((SCALE_SUFFIXES[0], WEIGHT_SCALE))]:
        suffix = WEIGHT_SCALE if key.endswith(WEIGHT_SCALE) else SCALE_SUFFIXES[0]
        scale, weight = state.pop(key), key[:-len(suffix)] + ".weight"
        if weight in state:
            stored = state[weight]
            if stored.dtype == torch.uint8:   # fp8 bytes in a uint8 container
                stored = stored.view(torch.float8_e4m3fn)
            state[weight] = (stored.to(torch.float32) * scale.to(torch.float32)).to(dtype)
    for key in [k for k in state if k.endswith(SCALE_NAMES)]:
        del state[key]
    return state


def is_quantized(model) -> bool:
    """Loaded from a GGUF file: its linear layers hold quantised bytes and dequantise as they compute."""
    return getattr(model, "hf_quantizer", None) is not None


def place_components(pipe, plan: Plan) -> None:
    """Move every component where ``plan`` keeps it between phases, with its hooks."""
    import torch

    compute = torch_dtype(plan.dtype)
    for name in TRANSFORMERS:
        model = getattr(pipe, name, None)
        if model is None:
            continue
        if plan.fp8 and not is_quantized(model):
            # Only the transformer: UMT5 casts activations to its weights' dtype and breaks in fp8. A GGUF one is
            # quantised already: casting its bytes to fp8 would corrupt them.
            model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=compute)
        if plan.swaps_experts:
            continue   # one expert on the device at a time: engine/run/experts.py places them
        if plan.transformer == TransformerPlace.DEVICE:
            model.to(plan.device)
        elif plan.transformer == TransformerPlace.DISK:
            if not is_streaming(model):
                raise RuntimeError("a disk plan's transformer is offloaded to its files as it loads (offload_to_disk)")
        else:
            if plan.pin_memory:
                pin_in_place(model)    # else a 30 GB model would sit in RAM twice until its first step
            model.enable_group_offload(
                onload_device=plan.device, offload_device="cpu",
                offload_type="block_level" if plan.transformer == TransformerPlace.GROUP else "leaf_level",
                num_blocks_per_group=1 if plan.transformer == TransformerPlace.GROUP else None,
                use_stream=plan.use_stream, low_cpu_mem_usage=not plan.pin_memory)
    place_encoders(pipe, plan)
    pipe.vae.to(plan.device)
    set_vae_tiling(pipe.vae, plan.vae_tile)


def load_transformers(folder: Path, plan: Plan, loaded: dict, gate: str = "") -> dict:
    """Each transformer of the model folder not in ``loaded`` (its single files), loaded on the CPU alone: what a
    disk plan does first, so that each goes to its files before the rest of the model takes RAM."""
    wanted = tuple(name for name in TRANSFORMERS if name not in loaded)
    return {**loaded, **load_into_ram(folder, wanted, plan, gate)}


def offload_to_disk(model, plan: Plan, folder: Path) -> None:
    """Stream ``model`` from files in ``folder``, block by block, with diffusers' group offloading: each block's
    weights are written there once (now), its RAM given up, and read back as the block is about to run."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    model.enable_group_offload(onload_device=plan.device, offload_device="cpu", offload_type="block_level",
                               num_blocks_per_group=1, use_stream=plan.use_stream, low_cpu_mem_usage=True,
                               offload_to_disk_path=str(folder))


def keep_encoder_exact(pipe, folder: Path | None) -> None:
    """An image-to-video pipeline's VAE encodes the first frame, which conditions every step: when the plan
    decodes in bfloat16 its encoder is read again in float32 from the model's ``folder`` (the weights cast back
    from bfloat16 would stay rounded), so the run's latents are those of diffusers' float32 VAE (a bfloat16
    encode moved a 14B run's final latents by up to 0.1). The encoder runs once per video and holds 42% of the
    VAE's weights; text-to-video pipelines never encode and keep it in the plan's dtype. Without the folder's
    VAE (weights built in memory) the encoder is cast."""
    import torch

    if type(pipe).__name__ != "WanImageToVideoPipeline":
        return
    vae = pipe.vae
    if next(vae.encoder.parameters()).dtype == torch.float32:
        return
    device = next(vae.decoder.parameters()).device
    source = Path(folder) / Component.VAE if folder is not None else None
    if source is not None and source.is_dir():
        exact = type(vae).from_pretrained(source, torch_dtype=torch.float32)
        vae.encoder, vae.quant_conv = exact.encoder.to(device), exact.quant_conv.to(device)
    else:
        for part in (vae.encoder, vae.quant_conv):
            part.to(torch.float32)


def use_vae_dtype(pipe, folder: Path, plan: Plan) -> None:
    """The loaded pipeline's VAE in ``plan``'s precision, read again from the model's folder alone (as a whole
    load would read it: a bfloat16 VAE cast back up would not be the float32 one), on the plan's device."""
    vae = pipe.vae
    fresh = type(vae).from_pretrained(Path(folder) / Component.VAE, torch_dtype=torch_dtype(plan.vae_dtype))
    pipe.register_modules(vae=fresh.to(plan.device))
    set_vae_tiling(pipe.vae, plan.vae_tile)
    keep_encoder_exact(pipe, folder)
    del vae


def place_encoders(pipe, plan: Plan) -> None:
    """Put the text and image encoders where ``plan`` keeps them between phases; also when a loaded
    pipeline is reused under a plan that places them differently."""
    from diffusers.hooks import apply_group_offloading

    for name in ENCODERS:
        model = getattr(pipe, name, None)
        if model is None:
            continue
        stop_streaming(model)
        if plan.text_encoder == TextEncoderPlace.STREAMED:
            # Layer by layer, each copied ahead of its use on a copy stream. The copy in RAM is kept
            # (pinned once when the plan pins), so no weight is ever copied back from the device.
            model.to("cpu")
            if plan.pin_memory:
                pin_in_place(model)
            apply_group_offloading(model, onload_device=plan.device, offload_device="cpu",
                                   offload_type="leaf_level", use_stream=plan.use_stream,
                                   low_cpu_mem_usage=not plan.pin_memory)
        else:
            model.to(plan.device if plan.text_encoder == TextEncoderPlace.DEVICE else "cpu")


def pin_in_place(model) -> None:
    """Move each weight into page-locked RAM, one at a time, dropping the ordinary copy as it goes.

    Group offloading pins a copy of every weight and lets go of the originals only on the first offload,
    so for a while the model would be in RAM twice; already pinned weights are used as they are.
    """
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None and not param.data.is_pinned():
                param.data = param.data.pin_memory()
        for key, buffer in module._buffers.items():
            if buffer is not None and not buffer.is_pinned():
                module._buffers[key] = buffer.pin_memory()


def _hook_names(model) -> set[str]:
    """The diffusers hooks on ``model`` and its layers (the encoders get none but streaming's)."""
    return {hook for m in model.modules() if getattr(m, "_diffusers_hook", None) is not None
            for hook in m._diffusers_hook.hooks}


def is_streaming(model) -> bool:
    return bool(_hook_names(model))


def stop_streaming(model) -> None:
    """Remove streaming's hooks from ``model``; its weights are left in RAM, where streaming keeps them."""
    from diffusers.hooks import HookRegistry

    names = _hook_names(model)
    if names:
        registry = HookRegistry.check_if_exists_or_initialize(model)
        for hook in names:
            registry.remove_hook(hook, recurse=True)


def set_vae_tiling(vae, tile: int | None) -> None:
    if tile is None:
        vae.disable_tiling()
        return
    stride = tile * 3 // 4
    vae.enable_tiling(tile_sample_min_height=tile, tile_sample_min_width=tile,
                      tile_sample_stride_height=stride, tile_sample_stride_width=stride)


@contextmanager
def conv_settings(conv: str):
    """The decode's convolution set-up (speed.CONV_MODES) while the block runs; the process's own after it.

    Scoped to the decode: the transformer's only convolution (its patch embedding) keeps the defaults,
    so the latents stay exactly those of plain diffusers."""
    import torch

    cudnn = torch.backends.cudnn
    saved = (cudnn.benchmark, cudnn.enabled)
    if conv == "benchmark":
        cudnn.benchmark = True
    elif conv == "no_miopen":
        cudnn.enabled = False
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.enabled = saved


@contextmanager
def decoder_layout(vae, channels_last: bool):
    """The VAE decoder's 3-D convolution weights in channels-last layout while the block runs (the faster,
    approximate decode: cuDNN's channels-last kernels sum in another order), contiguous again after it, so the
    next exact decode and the image-to-video encoder see the weights as loaded."""
    import torch

    if not channels_last:
        yield
        return
    convs = [module for module in vae.modules() if isinstance(module, torch.nn.Conv3d)]
    for module in convs:
        module.to(memory_format=torch.channels_last_3d)
    try:
        yield
    finally:
        for module in convs:
            module.to(memory_format=torch.contiguous_format)


def encoder_device(plan: Plan) -> str:
    """Where the text and image encoders compute."""
    return "cpu" if plan.text_encoder == TextEncoderPlace.CPU else plan.device


@contextmanager
def encoder_visiting(pipe, name: str, plan: Plan):
    """While encoding: an offloaded encoder is on the device; afterwards it is back in RAM.

    Its weights in RAM are kept while it visits, and put back afterwards: sending the device copy back
    would copy 11 GB into freshly allocated host memory, which takes longer than encoding on the CPU.
    """
    model = getattr(pipe, name, None)
    if model is None or plan.text_encoder != TextEncoderPlace.OFFLOAD:
        yield
        return
    # .to() either swaps a parameter's data or replaces the parameter: keep both, and every buffer.
    params = [(module, key, param, param.data) for module in model.modules()
              for key, param in module._parameters.items() if param is not None]
    buffers = [(module, key, buffer) for module in model.modules() for key, buffer in module._buffers.items()
               if buffer is not None]
    try:
        model.to(plan.device)
        yield
    finally:
        for module, key, param, data in params:
            param.data = data
            module._parameters[key] = param
        for module, key, buffer in buffers:
            module._buffers[key] = buffer
