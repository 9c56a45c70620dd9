"""A long video's denoise in windows: every transformer pass of the pipeline run window by window, blended.

A hook on each transformer (diffusers' hook registry, as its caches and offloading use) takes the pipeline's
call for the whole latent video and runs the transformer once per window of ``Windows`` (engine/models/windows.py)
on that window's frames, its timesteps (Wan2.2 TI2V-5B has one per token) sliced alike, then blends the windows'
predictions with their weights. The pipeline, its scheduler and its image conditioning see the whole video as
always; only the transformer sees a window at a time, each with its own positions.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

from engine.models.windows import Windows

HOOK_NAME = "wan_studio_windows"


def _window_hook_class():
    from diffusers.hooks import ModelHook

    class WindowedPasses(ModelHook):
        """Runs the transformer's forward once per window and blends what the windows predict."""

        def __init__(self, windows: Windows, on_window: Callable[[int, int], None]):
            super().__init__()
            self.windows, self.on_window = windows, on_window

        def new_forward(self, module, *args, **kwargs):
            return blended_pass(self.fn_ref.original_forward, self.windows, self.on_window, module, args, kwargs)

    return WindowedPasses


def blended_pass(forward, windows: Windows, on_window, module, args: tuple, kwargs: dict):
    """``forward``'s output over the whole latent video, made window by window (``on_window(i, count)`` after
    each), in the shape and kind the pipeline asked for (a tuple with return_dict=False)."""
    import torch
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    kwargs = dict(kwargs)
    hidden = kwargs.pop("hidden_states") if "hidden_states" in kwargs else args[0]
    timestep = kwargs.pop("timestep") if "timestep" in kwargs else args[1]
    rest = args[2:] if len(args) > 2 else ()
    return_dict = kwargs.pop("return_dict", True)
    frames = hidden.shape[2]
    if frames != windows.latent:
        raise RuntimeError(f"the pipeline passed {frames} latent frames, the windows were made for {windows.latent}")
    per_frame = timestep.ndim == 2   # a timestep per token, the tokens frame after frame
    total = weight_sum = None
    for index, (start, end) in enumerate(windows.spans):
        part_time = (timestep.unflatten(1, (frames, -1))[:, start:end].flatten(1) if per_frame else timestep)
        out = forward(hidden[:, :, start:end], part_time, *rest, return_dict=False, **kwargs)[0]
        weights = torch.tensor(windows.weights(index), dtype=torch.float32, device=out.device).view(1, 1, -1, 1, 1)
        if total is None:
            total = torch.zeros((*out.shape[:2], frames, *out.shape[3:]), dtype=torch.float32, device=out.device)
            weight_sum = torch.zeros((1, 1, frames, 1, 1), dtype=torch.float32, device=out.device)
        total[:, :, start:end] += out.float() * weights
        weight_sum[:, :, start:end] += weights
        del out
        on_window(index + 1, windows.count)
    blended = (total / weight_sum).to(hidden.dtype)
    return Transformer2DModelOutput(sample=blended) if return_dict else (blended,)


@contextmanager
def windowed(transformers: list, windows: Windows | None, on_window: Callable[[int, int], None]):
    """Inside it, each of ``transformers`` runs in ``windows`` (nothing changes with None: the video fits in one);
    the hooks are removed afterwards, whatever happened."""
    if windows is None:
        yield
        return
    from diffusers.hooks import HookRegistry

    hook_class = _window_hook_class()
    registries = []
    try:
        for model in transformers:
            registry = HookRegistry.check_if_exists_or_initialize(model)
            registry.register_hook(hook_class(windows, on_window), HOOK_NAME)
            registries.append(registry)
        yield
    finally:
        for registry in registries:
            registry.remove_hook(HOOK_NAME, recurse=False)
