"""FastWan's transformer loaded with the gate weights of the sparse attention it was trained with.

FastWan was distilled with Video Sparse Attention, which mixes its two branches through a gate: a linear layer in
every block (``to_gate_compress``) that diffusers' ``WanTransformer3DModel`` does not have, so diffusers would drop
those weights with a warning. The class made here is diffusers' transformer with that layer where the files put it
(engine/models/spec.py ``TransformerShape.gate``): the weights load as any other (dtype, device map, offload hooks,
counted by the plan), dense attention leaves the layer unused, and the sparse attention reads it.
"""
from __future__ import annotations


def gated_transformer_class(gate: str):
    """diffusers' WanTransformer3DModel with a dim x dim linear layer at ``gate`` (a path inside each block)."""
    import inspect

    import torch
    from diffusers import WanTransformer3DModel

    owner_path, _, layer = gate.rpartition(".")

    class GatedWanTransformer3DModel(WanTransformer3DModel):
        """A Wan transformer whose blocks keep the sparse attention's gate."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            dim = self.config.num_attention_heads * self.config.attention_head_dim
            for block in self.blocks:
                owner = block.get_submodule(owner_path) if owner_path else block
                setattr(owner, layer, torch.nn.Linear(dim, dim))

    # diffusers reads a model's config keys from its __init__'s signature: the subclass takes the same ones.
    GatedWanTransformer3DModel.__init__.__signature__ = inspect.signature(WanTransformer3DModel.__init__)
    return GatedWanTransformer3DModel
