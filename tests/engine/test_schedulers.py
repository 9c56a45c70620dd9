"""The kinds of denoising step: FastWan sampled as FastVideo samples it (its DMD timesteps as written, fresh noise
between steps, drawn from the seed), lightx2v's Euler steps, and a distilled model's sampler kept when the step
count changes."""
from __future__ import annotations

import pytest
import torch

from engine.events import JobFinished
from engine.outputs.latents import load_latents
from engine.run.engine import Engine
from engine.run.schedulers import RENOISE_SEED_OFFSET, make_scheduler
from tests.conftest import CPU, run_engine, tiny_request


def test_fastwan_feeds_the_transformer_its_dmd_timesteps_as_written(presets):
    fast = presets["fastwan21-t2v-1.3b"].settings
    scheduler = make_scheduler({"num_train_timesteps": 1000}, fast.shift, fast.sigmas, fast.scheduler, 7)
    scheduler.set_timesteps(fast.steps)
    assert scheduler.timesteps.tolist() == pytest.approx([1000.0, 757.0, 522.0])
    assert scheduler.sigmas.tolist() == pytest.approx([1.0, 0.757, 0.522, 0.0])


def test_a_dmd_step_predicts_the_clean_video_and_noises_it_again_from_the_seed():
    def one_step(seed):
        scheduler = make_scheduler({}, 1.0, (1.0, 0.757, 0.522), "flow_dmd", seed)
        scheduler.set_timesteps(3)
        sample, velocity = torch.full((1, 4, 2, 3, 3), 0.5), torch.full((1, 4, 2, 3, 3), 0.25)
        scheduler.step(velocity, scheduler.timesteps[0], sample)                      # 1.0 -> 0.757
        return scheduler.step(velocity, scheduler.timesteps[1], sample, return_dict=False)[0]   # 0.757 -> 0.522

    clean = 0.5 - 0.757 * 0.25
    second = one_step(7)
    drawn = torch.Generator("cpu").manual_seed(7 + RENOISE_SEED_OFFSET)
    torch.randn(second.shape, generator=drawn)                                           # the first step's noise
    expected = (1 - 0.522) * clean + 0.522 * torch.randn(second.shape, generator=drawn)
    assert torch.allclose(second, expected, atol=1e-6)
    assert torch.equal(one_step(7), second) and not torch.equal(one_step(8), second)
    euler = make_scheduler({}, 1.0, (1.0, 0.757, 0.522), "flow_euler")
    euler.set_timesteps(3)
    moved = euler.step(torch.ones(2), euler.timesteps[0], torch.zeros(2), return_dict=False)[0]
    assert moved.tolist() == pytest.approx([-0.243, -0.243])                           # along the velocity


def test_a_dmd_run_is_the_same_video_for_a_seed_and_differs_from_euler_steps(selftest_models_dir, presets, outputs):
    engine = Engine(selftest_models_dir, CPU)

    def latents(**settings):
        request = tiny_request(presets, "selftest-t2v", outputs, steps=3, guidance=1.0, shift=1.0,
                               sigmas=(1.0, 0.757, 0.522), keep_latents=True, **settings)
        result, _ = run_engine(engine, request)
        assert isinstance(result, JobFinished), result
        import json
        from pathlib import Path

        return load_latents(Path(json.loads(Path(result.sidecar).read_text())["latents"]))[0]

    dmd = latents(scheduler="flow_dmd")
    assert torch.equal(latents(scheduler="flow_dmd"), dmd)
    assert not torch.equal(latents(scheduler="flow_dmd", seed=99), dmd)
    assert not torch.equal(latents(scheduler="flow_euler"), dmd)


def test_changing_the_steps_drops_the_fixed_schedule_but_keeps_the_sampler(presets):
    fast = presets["fastwan21-t2v-1.3b"].settings.changed(steps=4)
    assert fast.sigmas is None and fast.scheduler == "flow_dmd"
    scheduler = make_scheduler({"num_train_timesteps": 1000}, fast.shift, fast.sigmas, fast.scheduler, 1)
    scheduler.set_timesteps(4)
    assert scheduler.timesteps.tolist() == pytest.approx([1000.0, 667.0, 334.0, 1.0])
