"""Scheduler set-up for a request: the flow shift, or a fixed sigma schedule (distilled models)."""
from __future__ import annotations


def _fixed_sigmas_class():
    from diffusers import FlowMatchEulerDiscreteScheduler

    class FixedSigmasFlowMatchScheduler(FlowMatchEulerDiscreteScheduler):
        """Flow-match Euler that always samples the same sigmas (e.g. FastWan's 3 DMD steps)."""

        fixed_sigmas: tuple[float, ...] = ()

        def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
            return super().set_timesteps(device=device, sigmas=list(self.fixed_sigmas))

    return FixedSigmasFlowMatchScheduler


def make_scheduler(original_config, shift: float, sigmas: tuple[float, ...] | None):
    """A fresh scheduler for one run, built from the model's own scheduler config."""
    from diffusers import UniPCMultistepScheduler

    if sigmas:
        scheduler = _fixed_sigmas_class()(shift=shift, num_train_timesteps=original_config.get("num_train_timesteps", 1000))
        scheduler.fixed_sigmas = tuple(sigmas)
        return scheduler
    if original_config.get("_class_name") == "UniPCMultistepScheduler":
        return UniPCMultistepScheduler.from_config(original_config, flow_shift=shift)
    return UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift,
        num_train_timesteps=original_config.get("num_train_timesteps", 1000))
