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
from tests.helpers.machines import H200_CALIBRATION, HARDWARE

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


def _h200_measured():
    """The calibration made on an H200 in the light VAE's benchmark run (docs/data/light-vae-h200.json): it has
    the float8 matmul rates."""
    from engine.device.calibrate import Calibration

    data = json.loads((Path(__file__).resolve().parents[2] / "docs/data/light-vae-h200.json").read_text())
    return Calibration.from_dict(data["calibration"])


def test_the_calibration_measures_float8_matmuls_where_they_run():
    import torch

    from engine.device.calibrate import fp8_matmul, timer

    points = fp8_matmul(torch, "cpu", timer("cpu"), 64, (128, 256))    # torch multiplies float8 on the CPU too
    assert [dim for dim, _ in points] == [128, 256] and all(rate > 0 for _, rate in points)
    cal = _h200_measured()
    assert [dim for dim, _ in cal.fp8_matmul_tflops] == [1536, 5120]
    assert all(fp8 > 1.5 * bf16 for (_, fp8), (_, bf16) in zip(cal.fp8_matmul_tflops, cal.matmul_tflops))
    from engine.device.calibrate import Calibration

    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    older = {k: v for k, v in cal.to_dict().items() if k != "fp8_matmul_tflops"}
    assert Calibration.from_dict(older).fp8_matmul_tflops == ()     # a file from before it still reads


def _denoise_step(cal, compute: str) -> float:
    plan = plan_memory(T2V_13, replace(FP8, compute=compute), H200, Override(compile=True))
    return predict_times(T2V_13, 832, 480, 81, 4, 1.0, plan, cal, loaded=True, compiled=True).step_seconds


def test_with_a_calibrated_float8_rate_the_time_plan_counts_the_linears_at_it():
    cal = _h200_measured()
    ratio = _denoise_step(cal, "fp8") / _denoise_step(cal, "exact")
    # Measured: a compiled 1.3B pass at 32,760 tokens 0.484 s against 0.520 s on an H200 (0.93), a step 0.501 s
    # against 0.532 s on an H100 (0.94; docs/data/speed-past-bf16-h100.json).
    assert 0.92 <= ratio <= 0.95, ratio
    faster = replace(cal, fp8_matmul_tflops=tuple((d, 2 * r) for d, r in cal.fp8_matmul_tflops))
    assert _denoise_step(faster, "fp8") < _denoise_step(cal, "fp8")
    without = replace(cal, fp8_matmul_tflops=())
    from engine.planning.fp8_time import FP8_COMPUTE_PASS

    assert _denoise_step(without, "fp8") == pytest.approx(FP8_COMPUTE_PASS * _denoise_step(without, "exact"),
                                                                rel=1e-3)
    plan = plan_memory(T2V_13, FP8, H200)
    how = predict_times(T2V_13, 832, 480, 81, 4, 1.0, plan, cal, loaded=True, compiled=True).how["denoise"]
    assert "float8 linears at 1280 TFLOP/s (x1.67)" in how and "casting their inputs" in how
    # The H100's own calibration (the end-to-end run's) against its measured 0.94.
    data = json.loads((Path(__file__).resolve().parents[2] / "docs/data/speed-light-vae-h100.json").read_text())
    from engine.device.calibrate import Calibration

    h100 = Calibration.from_dict(data["calibration"])
    assert 0.93 <= _denoise_step(h100, "fp8") / _denoise_step(h100, "exact") <= 0.96


def test_learned_runs_keep_a_first_compile_and_float8_runs_learn_from_their_own():
    """The first float8 run after compiled bfloat16 ones was predicted at 1.55 s (learned from the bfloat16 runs'
    steady steps) and took 158.6 s on an H100 (docs/data/speed-light-vae-h100.json): float8 runs are a family of
    their own, and a compile still to come stays in a learned prediction."""
    from engine.planning.learning import MeasuredRun
    from engine.planning.fp8_time import FP8_COMPILE_FIRST_S
    from engine.run.time_plan import family_key, predict_job
    from engine.settings.values import Settings

    ref = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    settings = Settings(model=ref, mode="t2v", width=832, height=480, frames=81, steps=3, guidance=1.0, shift=1.0)
    exact = plan_memory(T2V_13, replace(FP8, compute="exact"), H200, Override(compile=True))
    fp8 = plan_memory(T2V_13, FP8, H200)
    assert family_key(ref, exact, settings) != family_key(ref, fp8, settings)
    tokens = T2V_13.tokens(832, 480, 81)
    steady = MeasuredRun({"denoise": 1.6, "vae_decode": 2.25, "export": 0.16}, tokens, 3, 1, 832 * 480 * 81,
                         step_seconds=0.52, loaded=True, model_step=0.55)
    runs = {family_key(ref, exact, settings): [steady]}
    first_fp8 = predict_job(T2V_13, ref, settings, fp8, H200_CALIBRATION, runs, loaded=True, compiled=False)
    assert first_fp8.seconds["denoise"] > FP8_COMPILE_FIRST_S
    learned = predict_job(T2V_13, ref, settings, exact, H200_CALIBRATION, runs, loaded=True, compiled=True)
    assert learned.seconds["denoise"] == pytest.approx(1.6, rel=0.05) and "learned" in learned.how["denoise"]
    new_size = predict_job(T2V_13, ref, settings, exact, H200_CALIBRATION, runs, loaded=True, compiled=False)
    assert new_size.seconds["denoise"] == pytest.approx(learned.seconds["denoise"] + new_size.compile_seconds)
    assert new_size.compile_seconds > 10 and "compiling at this size" in new_size.how["denoise"]
