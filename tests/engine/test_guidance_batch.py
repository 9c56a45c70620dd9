"""Guidance in one batch: the step's conditional and unconditional passes as one call of batch 2, equal to the
two calls (bit for bit in bfloat16 here, within float rounding in float32), chosen by the planner where the
device has room for the second pass's activations, and recorded in the sidecar."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.events import JobFinished
from engine.models.selftest import SELFTEST_I2V, SELFTEST_T2V, build_selftest_pipeline
from engine.models.spec import KNOWN_MODELS
from engine.planning import memory as mem
from engine.planning.phases import attention_kind
from engine.planning.plan import Override, PlanRequest
from engine.planning.planner import plan_memory
from engine.planning.speed import SpeedRequest
from engine.planning.timing import predict_times
from engine.run.engine import Engine
from engine.run.guidance_batch import batched_guidance
from tests.conftest import CPU, run_engine, tiny_request
from tests.helpers.machines import H200_CALIBRATION, HARDWARE

T2V_13 = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
I2V_14 = KNOWN_MODELS["Wan-AI/Wan2.1-I2V-14B-720P-Diffusers"]
GUIDED = SpeedRequest(50, 5.0)


def _latents(pipe, negative, positive, batched: bool, **inputs):
    import torch

    with batched_guidance([pipe.transformer], negative if batched else None) as batches:
        latents = pipe(prompt_embeds=positive, negative_prompt_embeds=negative, height=32, width=32, num_frames=5,
                       num_inference_steps=3, guidance_scale=5.0, output_type="latent",
                       generator=torch.Generator().manual_seed(7), **inputs).frames
    return latents, [batch.batched for batch in batches]


@pytest.fixture(scope="module")
def pipes(ti2v_pipe):
    return {"t2v": build_selftest_pipeline(SELFTEST_T2V), "i2v": build_selftest_pipeline(SELFTEST_I2V),
            "ti2v": ti2v_pipe}


@pytest.mark.parametrize("kind", ["t2v", "i2v", "ti2v"])
def test_one_batch_equals_the_two_passes(kind, pipes):
    import torch
    from PIL import Image

    pipe = pipes[kind]   # ti2v: Wan2.2-5B's timestep per token
    inputs = {"image": Image.new("RGB", (32, 32), (200, 40, 90))} if kind == "i2v" else {}
    positive, negative = pipe.encode_prompt("a red fox", "blurry", device="cpu")
    two, _ = _latents(pipe, negative, positive, False, **inputs)
    one, counts = _latents(pipe, negative, positive, True, **inputs)
    assert counts == [3]                                   # one batched pass a step
    assert torch.allclose(one, two, atol=1e-5, rtol=0)    # float32: the matmuls' rounding only
    assert not torch.equal(one, torch.zeros_like(one))
    if kind == "t2v":   # in bfloat16 each sample's arithmetic is its own here: bit for bit
        pipe.transformer.to(torch.bfloat16)
        try:
            two, _ = _latents(pipe, negative, positive, False, **inputs)
            one, _ = _latents(pipe, negative, positive, True, **inputs)
        finally:
            pipe.transformer.to(torch.float32)
        assert torch.equal(one, two)


def test_the_hook_goes_when_the_denoise_ends(pipes):
    pipe = pipes["t2v"]
    positive, negative = pipe.encode_prompt("a red fox", "blurry", device="cpu")
    _latents(pipe, negative, positive, True)
    _, counts = _latents(pipe, negative, positive, False)
    assert counts == [] and "wan_studio_guidance_batch" not in pipe.transformer._diffusers_hook.hooks


def _denoise(plan):
    return {phase.phase: phase for phase in plan.phases}["denoise"]


def test_a_gpu_with_room_batches_guidance_where_it_compiles_and_counts_the_second_pass_activations():
    h200 = replace(HARDWARE["h200"], triton=True)
    two = plan_memory(T2V_13, PlanRequest(832, 480, 81, speed=GUIDED), h200, Override(guidance_batch=False))
    one = plan_memory(T2V_13, PlanRequest(832, 480, 81, speed=GUIDED), h200)
    assert one.compile and one.guidance_batch and not two.guidance_batch
    # The plain, uncompiled path keeps its two calls (its latents are plain diffusers' bit for bit) unless asked.
    exact = plan_memory(T2V_13, PlanRequest(832, 480, 81, speed=GUIDED), h200, Override(compile=False))
    assert not exact.compile and not exact.guidance_batch
    assert plan_memory(T2V_13, PlanRequest(832, 480, 81, speed=GUIDED), h200,
                       Override(compile=False, guidance_batch=True)).guidance_batch
    extra = mem.denoise_activations_gb(T2V_13, mem.denoise_tokens(T2V_13, 832, 480, 81), 2,
                                       attention_kind(h200) == "math")
    assert extra > 1.0
    assert _denoise(one).peak_vram_gb == pytest.approx(_denoise(two).peak_vram_gb + extra, abs=0.02)
    assert any("Guidance's two passes run as one batch" in d for d in one.decisions)
    # No guidance: one pass a step, nothing to batch.
    assert not plan_memory(T2V_13, PlanRequest(832, 480, 81, speed=SpeedRequest(4, 1.0)), h200).guidance_batch


def test_a_streamed_transformer_batches_guidance_to_copy_its_weights_once_a_step():
    card = HARDWARE["24gb-64"]   # no Triton here: nothing compiles
    plan = plan_memory(I2V_14, PlanRequest(832, 480, 81, image_to_video=True, speed=GUIDED), card)
    assert plan.transformer != "device" and not plan.compile
    if plan.guidance_batch:
        assert any("which halves what is streamed" in d for d in plan.decisions)
    else:
        assert any("would not fit" in d for d in plan.decisions)


def test_a_step_cache_windows_or_a_cpu_keep_the_two_passes():
    h200 = replace(HARDWARE["h200"], triton=True)
    cached = plan_memory(T2V_13, PlanRequest(832, 480, 81, speed=SpeedRequest(50, 5.0, "mag")), h200,
                         Override(guidance_batch=True))
    assert not cached.guidance_batch
    assert any("one after the other (a step cache keeps the two passes apart)" in d for d in cached.decisions)
    assert not plan_memory(T2V_13, PlanRequest(832, 480, 241, speed=GUIDED), h200).guidance_batch   # 3 windows
    roomy_cpu = replace(CPU, ram_total_gb=128, ram_available_gb=120)
    assert not plan_memory(T2V_13, PlanRequest(480, 480, 25, speed=GUIDED), roomy_cpu).guidance_batch
    forced = plan_memory(T2V_13, PlanRequest(480, 480, 25, speed=GUIDED), roomy_cpu, Override(guidance_batch=True))
    assert forced.fits and forced.guidance_batch


@pytest.mark.parametrize("hw_name", list(HARDWARE))
def test_a_batch_is_chosen_only_where_its_activations_fit(hw_name):
    hardware = HARDWARE[hw_name]
    for spec in (T2V_13, I2V_14):
        request = PlanRequest(832, 480, 81, image_to_video=spec is I2V_14, speed=GUIDED)
        plan = plan_memory(spec, request, hardware)
        if plan.guidance_batch:
            assert _denoise(plan).peak_vram_gb <= plan.budget_vram_gb and plan.fits
        elif plan.fits:   # said why, or the exact path (uncompiled, on the device), which keeps its two calls
            exact_path = not plan.compile and plan.transformer == "device"
            assert any("one after the other" in d for d in plan.decisions) or exact_path, hw_name


def test_the_time_plan_streams_an_offloaded_transformer_once_a_step():
    card = HARDWARE["24gb-64"]
    request = PlanRequest(832, 480, 81, image_to_video=True, speed=GUIDED)
    two = plan_memory(I2V_14, request, card, Override(guidance_batch=False))
    one = plan_memory(I2V_14, request, card)
    assert two.transformer != "device"
    if not one.guidance_batch:
        pytest.skip("no room for the batch on this card")
    times = [predict_times(I2V_14, 832, 480, 81, 50, 5.0, plan, H200_CALIBRATION, loaded=True, image_to_video=True)
             for plan in (two, one)]
    assert times[1].seconds["denoise"] < times[0].seconds["denoise"]
    assert "1 batched pass of 2" in times[1].how["denoise"]


def test_a_run_with_guidance_in_one_batch_says_so_in_its_sidecar(model_dirs, presets, tmp_path):
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    request = tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", frames=9, guidance=4.0,
                           guidance_batch=True)
    batched, _ = run_engine(engine, request)
    assert isinstance(batched, JobFinished), batched
    sidecar = json.loads(Path(batched.sidecar).read_text())
    assert sidecar["speed"]["guidance_batch"] is True and sidecar["plan"]["guidance_batch"] is True
    assert sidecar["speed"]["approximate"] is False
    assert "wan_studio_guidance_batch" not in engine.loaded.pipe.transformer._diffusers_hook.hooks
    plain, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", frames=9,
                                               guidance=4.0))
    assert json.loads(Path(plain.sidecar).read_text())["speed"]["guidance_batch"] is False
