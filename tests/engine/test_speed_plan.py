"""The plan's speed choices, per hardware profile: VAE precision, convolution set-up, compiling, attention."""
from __future__ import annotations

from dataclasses import replace

import pytest

from engine.device.hardware import HardwareProfile
from engine.models.spec import KNOWN_MODELS
from engine.planning.planner import Override, PlanRequest, plan_memory
from engine.planning.speed import COMPILE_MIN_PASSES, SpeedRequest, fast_bf16
from engine.service.ahead import plan_table
from engine.settings.values import InputError, Settings, check_settings

T2V_13 = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
I2V_14 = KNOWN_MODELS["Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"]
H200 = HardwareProfile(backend="cuda", device_name="NVIDIA H200", arch="sm_90", vram_total_gb=139.8, vram_free_gb=139,
                       ram_total_gb=128, ram_available_gb=120, triton=True)
RTX_2080 = replace(H200, device_name="RTX 2080", arch="sm_75", vram_total_gb=8, vram_free_gb=7.5, ram_total_gb=32,
                   ram_available_gb=28)
STRIX_WINDOWS = HardwareProfile(backend="rocm", device_name="Radeon 8060S", arch="gfx1151", vram_total_gb=48,
                                vram_free_gb=47, ram_total_gb=16, ram_available_gb=12, unified_memory=True,
                                os="windows", triton=False)
STRIX_LINUX = replace(STRIX_WINDOWS, os="linux", triton=True)
MAC = HardwareProfile(backend="mps", device_name="Apple M3 Max", arch="apple", vram_total_gb=64, vram_free_gb=50,
                      ram_total_gb=64, ram_available_gb=50, unified_memory=True, os="macos")
CPU = HardwareProfile(backend="cpu", device_name="cpu", ram_total_gb=64, ram_available_gb=60)
FIFTY_STEPS = PlanRequest(832, 480, 81, speed=SpeedRequest(steps=50, guidance=5.0))
THREE_STEPS = PlanRequest(832, 480, 81, speed=SpeedRequest(steps=3, guidance=1.0))


@pytest.mark.parametrize("hw, vae, conv, compiled", [
    (H200, "bfloat16", "default", True),   # cudnn.benchmark: no gain once tuned, seconds lost tuning
    (RTX_2080, "float32", "default", True),       # no fast bf16: the VAE stays in float32
    (STRIX_LINUX, "bfloat16", "no_miopen", True),
    (STRIX_WINDOWS, "bfloat16", "no_miopen", False),   # ROCm on Windows has no Triton
    (MAC, "float32", "default", False),
    (CPU, "float32", "default", False),
])
def test_each_backend_gets_its_own_speed_choices(hw, vae, conv, compiled):
    plan = plan_memory(T2V_13, FIFTY_STEPS, hw)
    assert (plan.vae_dtype, plan.conv, plan.compile, plan.attention_backend) == (vae, conv, compiled, "native")
    assert "Speed: " in plan_table(plan)


def test_windows_rocm_says_why_it_does_not_compile_and_forcing_it_changes_nothing():
    plan = plan_memory(T2V_13, FIFTY_STEPS, STRIX_WINDOWS, Override(compile=True))
    assert not plan.compile
    assert any("ROCm on Windows has no Triton" in d for d in plan.decisions)


def test_compiling_pays_only_for_long_runs_unless_forced():
    assert plan_memory(T2V_13, FIFTY_STEPS, H200).compile
    short = plan_memory(T2V_13, THREE_STEPS, H200)
    assert not short.compile and any("would not earn back" in d for d in short.decisions)
    assert plan_memory(T2V_13, THREE_STEPS, H200, Override(compile=True)).compile
    assert not plan_memory(T2V_13, FIFTY_STEPS, H200, Override(compile=False)).compile
    edge = PlanRequest(832, 480, 81, speed=SpeedRequest(steps=COMPILE_MIN_PASSES // 2, guidance=5.0))
    assert plan_memory(T2V_13, edge, H200).compile


def test_no_compile_where_hooks_run_the_transformer():
    small = replace(H200, vram_total_gb=24, vram_free_gb=23.5)
    offloaded = plan_memory(I2V_14, PlanRequest(832, 480, 81, True, SpeedRequest(40, 5.0)), small)
    assert offloaded.transformer != "device" and not offloaded.compile
    cached = plan_memory(T2V_13, PlanRequest(832, 480, 81, speed=SpeedRequest(50, 5.0, "first_block")), H200)
    assert not cached.compile and any("step cache" in d for d in cached.decisions)


def test_a_bf16_vae_needs_less_decode_memory_and_float32_stays_available():
    bf16 = plan_memory(T2V_13, FIFTY_STEPS, H200)
    fp32 = plan_memory(T2V_13, FIFTY_STEPS, H200, Override(vae_dtype="float32"))
    decode = {p.phase: p.peak_vram_gb for p in bf16.phases}["vae_decode"]
    assert fp32.vae_dtype == "float32" and {p.phase: p.peak_vram_gb for p in fp32.phases}["vae_decode"] > decode
    assert bf16.reload_key == fp32.reload_key and bf16.vae_dtype != fp32.vae_dtype   # the VAE alone is read again


def test_the_fastest_measured_attention_is_used_unless_forced():
    measured = replace(H200, attention="_native_cudnn")
    assert plan_memory(T2V_13, FIFTY_STEPS, measured).attention_backend == "_native_cudnn"
    assert plan_memory(T2V_13, FIFTY_STEPS, measured, Override(attention="native")).attention_backend == "native"


def test_fast_bf16_by_architecture():
    assert fast_bf16("cuda", "sm_86") and not fast_bf16("cuda", "sm_75") and fast_bf16("cuda", "")
    assert fast_bf16("rocm", "gfx1151") and fast_bf16("rocm", "gfx942") and not fast_bf16("rocm", "gfx1030")
    assert not fast_bf16("mps", "apple") and not fast_bf16("cpu", "")


def test_speed_settings_are_checked_with_a_sentence_each():
    base = Settings("selftest-t2v", "t2v", 64, 64, 9, 4, 5.0, 3.0)
    assert check_settings(replace(base, decoder="fast", step_cache="mag", compile=True, attention="sage",
                                  vae_dtype="float32")).decoder == "fast"
    with pytest.raises(InputError) as caught:
        check_settings(replace(base, decoder="tiny", step_cache="teacache", compile="yes", attention="flash_hub",
                               vae_dtype="float16"))
    assert len(caught.value.problems) == 5
    assert "Decoder 'tiny' is unknown" in str(caught.value) and "flash_hub" in str(caught.value)


@pytest.mark.parametrize("mode, benchmark, enabled", [("benchmark", True, True), ("no_miopen", False, False),
                                                      ("default", False, True)])
def test_the_decode_runs_under_the_plans_convolution_set_up_and_the_process_gets_its_own_back(mode, benchmark,
                                                                                              enabled):
    import torch

    from engine.run.apply_plan import conv_settings

    cudnn = torch.backends.cudnn
    before = (cudnn.benchmark, cudnn.enabled)
    with conv_settings(mode):
        assert (cudnn.benchmark, cudnn.enabled) == (benchmark or before[0], enabled and before[1])
    assert (cudnn.benchmark, cudnn.enabled) == before
    with pytest.raises(RuntimeError), conv_settings(mode):
        raise RuntimeError("a failed decode")
    assert (cudnn.benchmark, cudnn.enabled) == before
