"""float8 compute (approximate): the transformer's block linears through torchao where the GPU has float8 tensor
cores and the plan keeps the transformer whole on the device; everywhere else the plan says why it computes in
the model's precision, and the run says which it did."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.device.hardware import HardwareProfile
from engine.events import JobFinished
from engine.models.spec import KNOWN_MODELS
from engine.planning.plan import Override, PlanRequest
from engine.planning.planner import plan_memory
from engine.planning.speed import SpeedRequest, fp8_compute_missing
from engine.planning.timing import predict_times
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request
from tests.engine.test_planner import HARDWARE
from tests.engine.test_timing import H200_CALIBRATION

T2V_13 = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
I2V_14 = KNOWN_MODELS["Wan-AI/Wan2.1-I2V-14B-720P-Diffusers"]
H200 = replace(HARDWARE["h200"], torchao=True, triton=True)
FP8 = PlanRequest(832, 480, 81, speed=SpeedRequest(4, 1.0), compute="fp8")


def test_gpus_with_float8_tensor_cores_are_told_apart():
    assert fp8_compute_missing(H200) is None
    assert fp8_compute_missing(replace(H200, arch="sm_89")) is None                       # Ada: RTX 40xx, L40
    assert fp8_compute_missing(replace(H200, backend="rocm", arch="gfx942")) is None      # MI300
    assert "no float8 tensor cores" in fp8_compute_missing(replace(H200, arch="sm_86", device_name="RTX 3060"))
    assert "no float8 tensor cores" in fp8_compute_missing(replace(H200, backend="rocm", arch="gfx1151"))
    assert fp8_compute_missing(CPU).startswith("the CPU has no float8 tensor cores")
    assert "pip install torchao" in fp8_compute_missing(replace(H200, torchao=False))
    assert "Triton" in fp8_compute_missing(replace(H200, triton=False))


def test_an_fp8_capable_gpu_computes_the_linears_in_float8_compiled():
    plan = plan_memory(T2V_13, FP8, H200)
    assert plan.fp8_compute and plan.compile      # compiled, even for 4 steps
    assert any("block linears compute in float8 (your choice, approximate" in d for d in plan.decisions)
    assert plan.reload_key != plan_memory(T2V_13, replace(FP8, compute="exact"), H200).reload_key
    assert not plan_memory(T2V_13, replace(FP8, compute="exact"), H200).fp8_compute


@pytest.mark.parametrize("why, request_, hardware, override", [
    ("has no float8 tensor cores", FP8, replace(HARDWARE["rtx3060-12-32"], torchao=True, triton=True), Override()),
    ("LoRAs go into the 16-bit weights", replace(FP8, loras=True), H200, Override()),
    ("a step cache runs the blocks uncompiled", replace(FP8, speed=SpeedRequest(50, 5.0, "mag")), H200, Override()),
    ("which you turned off", FP8, H200, Override(compile=False)),
    ("streams or swaps it", FP8, H200, Override(strategy="group_offload")),
    ("stores it in fp8", FP8, H200, Override(strategy="fp8_storage")),
])
def test_elsewhere_the_plan_says_why_it_computes_exactly(why, request_, hardware, override):
    plan = plan_memory(T2V_13, request_, hardware, override)
    assert not plan.fp8_compute
    said = [d for d in plan.decisions if "float8 was asked for" in d]
    assert len(said) == 1 and why in said[0], plan.decisions


def test_the_time_plan_counts_the_measured_pass():
    exact = plan_memory(T2V_13, replace(FP8, compute="exact"), H200, Override(compile=True))
    fp8 = plan_memory(T2V_13, FP8, H200)
    times = [predict_times(T2V_13, 832, 480, 81, 4, 1.0, plan, H200_CALIBRATION, loaded=True, compiled=True)
             for plan in (exact, fp8)]
    assert times[1].seconds["denoise"] < times[0].seconds["denoise"]
    assert times[1].seconds["vae_decode"] == times[0].seconds["vae_decode"]


def test_a_cpu_run_asked_for_float8_computes_exactly_and_says_so(model_dirs, presets, tmp_path):
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    request = tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", frames=5, compute="fp8")
    done, events = run_engine(engine, request)
    assert isinstance(done, JobFinished), done
    sidecar = json.loads(Path(done.sidecar).read_text())
    assert sidecar["speed"]["compute"] == "exact" and sidecar["speed"]["approximate"] is False
    assert sidecar["plan"]["fp8_compute"] is False and sidecar["parameters"]["compute"] == "fp8"
    assert any("the CPU has no float8 tensor cores" in d for d in sidecar["plan"]["decisions"])


def test_the_hardware_profile_reads_torchao_back():
    profile = HardwareProfile.from_dict({**H200.to_dict(), "torchao": True})
    assert profile.torchao and not HardwareProfile.from_dict({**H200.to_dict(), "torchao": False}).torchao
