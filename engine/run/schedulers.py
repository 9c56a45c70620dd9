"""Scheduler set-up for a request: the flow shift, the kind of step, and a fixed sigma schedule (distilled models).

Kinds (the ``scheduler`` setting):
- ``unipc``: the Wan models' own multistep solver (their default);
- ``flow_euler``: flow-match Euler steps, each moving along the predicted velocity (lightx2v's 4-step models);
- ``flow_dmd``: flow-match steps that predict the clean video and noise it again with fresh noise to the next
  sigma, as DMD-distilled models are sampled (FastWan: FastVideo feeds the transformer its DMD timesteps as
  written, 1000/757/522, so its preset gives those sigmas with shift 1). The fresh noise comes from the request's
  seed, so a seed gives the same video every time, on every GPU of a split job.

Fixed ``sigmas`` are warped by ``shift`` as diffusers' flow-match scheduler warps any schedule.
"""
from __future__ import annotations

# The fresh noise of ``flow_dmd`` is drawn from the seed plus this, apart from the starting noise's draw.
RENOISE_SEED_OFFSET = 1


def _flow_match_class():
    from diffusers import FlowMatchEulerDiscreteScheduler

    class FlowMatchScheduler(FlowMatchEulerDiscreteScheduler):
        """Flow-match Euler that samples ``fixed_sigmas`` when given (e.g. FastWan's 3 DMD steps) and draws a
        stochastic step's noise from ``noise_generator`` (the pipeline passes none)."""

        fixed_sigmas: tuple[float, ...] = ()
        noise_generator = None

        def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
            if self.fixed_sigmas:
                return super().set_timesteps(device=device, sigmas=list(self.fixed_sigmas))
            return super().set_timesteps(num_inference_steps, device=device, **kwargs)

        def step(self, *args, generator=None, **kwargs):
            return super().step(*args, generator=generator or self.noise_generator, **kwargs)

    return FlowMatchScheduler


def make_scheduler(original_config, shift: float, sigmas: tuple[float, ...] | None, kind: str = "unipc",
                   seed: int | None = None):
    """A fresh scheduler for one run of the ``kind`` asked for (fixed ``sigmas`` imply flow-match), built from
    the model's own scheduler config; ``seed``: the run's, for a stochastic step's fresh noise."""
    import torch
    from diffusers import UniPCMultistepScheduler

    train_steps = original_config.get("num_train_timesteps", 1000)
    if sigmas or kind in ("flow_euler", "flow_dmd"):
        scheduler = _flow_match_class()(shift=shift, num_train_timesteps=train_steps,
                                        stochastic_sampling=kind == "flow_dmd")
        scheduler.fixed_sigmas = tuple(sigmas or ())
        if kind == "flow_dmd":
            scheduler.noise_generator = torch.Generator("cpu").manual_seed(
                ((seed if seed is not None else 0) + RENOISE_SEED_OFFSET) % 2**63)
        return scheduler
    if original_config.get("_class_name") == "UniPCMultistepScheduler":
        return UniPCMultistepScheduler.from_config(original_config, flow_shift=shift)
    return UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift, num_train_timesteps=train_steps)
