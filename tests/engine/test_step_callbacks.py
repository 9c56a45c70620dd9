"""The step-end work of a denoise, composed through diffusers' MultiPipelineCallbacks on a real tiny pipeline:
each step timed and said, a cancel that stops the steps after it, the expert swap at its step and no later."""
from __future__ import annotations

import pytest

from engine.events import StepFinished
from engine.run.job import Job
from engine.run.preview import LivePreview
from engine.run.step_callbacks import StepClock, step_callbacks


@pytest.fixture(scope="module")
def pipe(model_dirs):
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(model_dirs["tiny-t2v"])


def _denoise(pipe, steps: int, stop_after: int | None = None, switch: int | None = None):
    """(the steps said, the number of steps said when the low-noise expert was brought) of one tiny denoise."""
    import torch

    events, swaps = [], []

    def said() -> list[StepFinished]:
        return [e for e in events if isinstance(e, StepFinished)]

    job = Job("j", events.append, steps=steps)
    previews = LivePreview("j", steps, -1, 4.0, lambda: None)   # previews off: nothing to decode here
    callbacks = step_callbacks(job, steps, StepClock("cpu"), previews,
                               lambda: stop_after is not None and len(said()) >= stop_after, switch,
                               lambda: swaps.append(len(said())))
    pipe(prompt="a fox", height=32, width=32, num_frames=5, num_inference_steps=steps, guidance_scale=1.0,
         output_type="latent", generator=torch.Generator().manual_seed(0), callback_on_step_end=callbacks,
         callback_on_step_end_tensor_inputs=callbacks.tensor_inputs)
    return said(), swaps


def test_every_step_is_timed_and_said_in_order(pipe):
    steps, swaps = _denoise(pipe, 4)
    assert [(e.step, e.total) for e in steps] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(e.seconds >= 0 for e in steps) and swaps == []


def test_a_cancel_stops_the_steps_after_it_and_no_swap_follows_it(pipe):
    steps, swaps = _denoise(pipe, 5, stop_after=2, switch=2)
    assert [e.step for e in steps] == [1, 2]   # interrupted after the second step: no third one ran
    assert swaps == []                         # the swap due after that same step is skipped: the cancel came first
    assert _denoise(pipe, 5, switch=2)[1] == [2]   # without the cancel, it is brought there


def test_the_low_noise_expert_is_brought_once_before_its_first_step(pipe):
    steps, swaps = _denoise(pipe, 5, switch=3)
    assert len(steps) == 5 and swaps == [3]    # after the third step, before the fourth (index 3)
