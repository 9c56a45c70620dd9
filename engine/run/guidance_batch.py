"""Guidance in one batch: a step's conditional and unconditional transformer passes run as one call of batch 2.

diffusers' Wan pipelines call the transformer twice a step with guidance: first with the prompt's embeddings,
then, on the same latents and timestep, with the negative prompt's. A hook on each transformer (diffusers' hook
registry, as its caches use) answers the first call with one pass over both (the latents and timestep twice, the
two prompts' embeddings stacked, an image-to-video run's image embeddings twice), keeps the unconditional half,
and answers the second call with it. The pipeline, its scheduler and its callbacks see the two calls as always.

The weights are read once a step instead of twice (what an offloaded transformer streams halves too) and the
kernels see twice the rows; the activations double, which the planner counts (engine/planning/planner.py). Each
sample's arithmetic is its own, so the result equals two calls up to the matmuls' kernel choice for the larger
batch (bench/guidance_batch.py measures it).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

HOOK_NAME = "wan_studio_guidance_batch"


@dataclass
class _Held:
    """The unconditional half of the last batched pass, and the inputs it was made for."""
    hidden: object
    timestep: object
    text: object
    output: object


class GuidanceBatch:
    """The batching of one transformer's two passes a step, given the negative prompt's embeddings."""

    def __init__(self, negative):
        self.negative = negative
        self.held: _Held | None = None
        self.batched = 0   # passes run as a batch (each one answers two of the pipeline's calls)

    def call(self, forward, args: tuple, kwargs: dict):
        import torch
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        kwargs = dict(kwargs)
        hidden = kwargs.pop("hidden_states") if "hidden_states" in kwargs else args[0]
        timestep = kwargs.pop("timestep") if "timestep" in kwargs else args[1]
        text = kwargs.pop("encoder_hidden_states") if "encoder_hidden_states" in kwargs else args[2]
        rest = args[3:]
        return_dict = kwargs.pop("return_dict", True)

        def answer(sample):
            return Transformer2DModelOutput(sample=sample) if return_dict else (sample,)

        held, self.held = self.held, None
        if held is not None and held.hidden is hidden and held.timestep is timestep and held.text is not text:
            return answer(held.output)   # the step's second call: the unconditional half of the first's batch
        negative = self.negative.to(device=text.device, dtype=text.dtype)
        if negative.shape[1:] != text.shape[1:] or hidden.shape[0] != 1:
            return forward(hidden, timestep, text, *rest, return_dict=return_dict, **kwargs)
        image = kwargs.get("encoder_hidden_states_image")
        if image is not None:
            kwargs["encoder_hidden_states_image"] = torch.cat([image, image])
        out = forward(torch.cat([hidden, hidden]), torch.cat([timestep, timestep]), torch.cat([text, negative]),
                      *rest, return_dict=False, **kwargs)[0]
        conditional, unconditional = out.chunk(2)
        self.held = _Held(hidden, timestep, text, unconditional)
        self.batched += 1
        return answer(conditional)


def _hook_class():
    from diffusers.hooks import ModelHook

    class BatchedGuidance(ModelHook):
        def __init__(self, batch: GuidanceBatch):
            super().__init__()
            self.batch = batch

        def new_forward(self, module, *args, **kwargs):
            return self.batch.call(self.fn_ref.original_forward, args, kwargs)

    return BatchedGuidance


@contextmanager
def batched_guidance(transformers: list, negative):
    """Inside it, each of ``transformers`` runs a step's two guided passes as one batch (nothing changes with
    ``negative`` None); yields the batches (how many passes each ran), and removes the hooks afterwards."""
    if negative is None:
        yield []
        return
    from diffusers.hooks import HookRegistry

    hook_class, registries, batches = _hook_class(), [], []
    try:
        for model in transformers:
            batch = GuidanceBatch(negative)
            registry = HookRegistry.check_if_exists_or_initialize(model)
            registry.register_hook(hook_class(batch), HOOK_NAME)
            registries.append(registry)
            batches.append(batch)
        yield batches
    finally:
        for registry in registries:
            registry.remove_hook(HOOK_NAME, recurse=False)
