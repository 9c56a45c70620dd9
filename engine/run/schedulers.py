"""Scheduler set-up for a request: the flow shift, the kind of step, and a fixed sigma schedule (distilled models).

Kinds (the ``scheduler`` setting):
- ``unipc``: the Wan models' own multistep solver (their default);
- ``flow_euler``: flow-match Euler steps, each moving along the predicted velocity (lightx2v's 4-step models);
- ``flow_dmd``: flow-match steps that predict the clean video and noise it again with fresh noise to the next
  sigma, as DMD-distilled models are sampled (FastWan: FastVideo feeds the transformer its DMD timesteps as
  written, 1000/757/522, so its preset gives those sigmas with shift 1). The fresh noise comes from the request's
  seed, so a seed gives the same video every time, on every GPU of a split job.

Fixed ``sigmas`` are warped by ``shift`` as diffusers' flow-match scheduler warps any schedule.

Video to video runs the last steps of a schedule only (``kept``): the scheduler computes its whole schedule and keeps
its tail, the timesteps and their sigmas, so the pipeline loops over those and each step is the step it would be in
the whole schedule (diffusers' video-to-video pipeline cuts the timesteps the same way).
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


def _tail_class(base):
    """``base`` made to run only the last steps of its schedule."""

    class TailScheduler(base):
        """``base``'s schedule of ``whole_steps`` steps (whatever the pipeline asks), of which only the last
        ``kept_steps`` are given to the pipeline."""

        whole_steps = 0
        kept_steps = 0

        def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
            super().set_timesteps(self.whole_steps or num_inference_steps, device=device, **kwargs)
            kept = self.kept_steps
            if 0 < kept < len(self.timesteps):
                self.timesteps = self.timesteps[-kept:]
                self.sigmas = self.sigmas[-(kept + 1):]   # each step's sigma and the next one's, to the last
                self.num_inference_steps = kept

    TailScheduler.__name__ = f"Tail{base.__name__}"
    return TailScheduler


def first_sigma(scheduler, steps: int) -> float:
    """The noise level the first step of ``scheduler``'s ``steps``-step run starts from (its tail's first, when it
    keeps only the last steps), read from a copy."""
    import copy

    probe = copy.deepcopy(scheduler)
    probe.set_timesteps(steps, device="cpu")
    return float(probe.sigmas[0])


def make_scheduler(original_config, shift: float, sigmas: tuple[float, ...] | None, kind: str = "unipc",
                   seed: int | None = None, steps: int | None = None, kept: int | None = None):
    """A fresh scheduler for one run of the ``kind`` asked for (fixed ``sigmas`` imply flow-match), built from
    the model's own scheduler config; ``seed``: the run's, for a stochastic step's fresh noise. With ``kept`` of its
    ``steps`` (video to video), it runs only the last ``kept`` steps of its ``steps``-step schedule."""
    import torch
    from diffusers import UniPCMultistepScheduler

    tail = kept is not None and steps is not None and kept < steps

    def made(base):
        return _tail_class(base) if tail else base

    train_steps = original_config.get("num_train_timesteps", 1000)
    if sigmas or kind in ("flow_euler", "flow_dmd"):
        scheduler = made(_flow_match_class())(shift=shift, num_train_timesteps=train_steps,
                                              stochastic_sampling=kind == "flow_dmd")
        scheduler.fixed_sigmas = tuple(sigmas or ())
        if kind == "flow_dmd":
            scheduler.noise_generator = torch.Generator("cpu").manual_seed(
                ((seed if seed is not None else 0) + RENOISE_SEED_OFFSET) % 2**63)
    elif original_config.get("_class_name") == "UniPCMultistepScheduler":
        scheduler = made(UniPCMultistepScheduler).from_config(original_config, flow_shift=shift)
    else:
        scheduler = made(UniPCMultistepScheduler)(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                  flow_shift=shift, num_train_timesteps=train_steps)
    if tail:
        scheduler.whole_steps, scheduler.kept_steps = steps, kept
    return scheduler
