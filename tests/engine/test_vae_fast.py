"""The faster, approximate decode with the model's own VAE (decoder "vae_fast"): channels-last convolutions and,
on a GPU, as many latent frames a call of the decoder as the device has room for; the exact decode left alone."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.events import JobFinished
from engine.models.spec import KNOWN_MODELS
from engine.outputs.export import read_video
from engine.planning import memory as mem
from engine.planning.planner import PlanRequest, plan_memory, plan_request_for
from engine.planning.timing import predict_times
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request
from tests.helpers.machines import H200_CALIBRATION, HARDWARE

T2V_13 = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
TI2V_5 = KNOWN_MODELS["Wan-AI/Wan2.2-TI2V-5B-Diffusers"]


def _decode(plan):
    return {phase.phase: phase for phase in plan.phases}["vae_decode"]


def test_the_exact_decode_takes_one_latent_frame_a_call_in_the_loaded_layout():
    for hardware in HARDWARE.values():
        plan = plan_memory(T2V_13, PlanRequest(832, 480, 81), hardware)
        assert plan.decode_window == 1 and not plan.channels_last


def test_the_faster_decode_takes_as_many_frames_a_call_as_the_room_holds_and_counts_them():
    exact = plan_memory(T2V_13, PlanRequest(832, 480, 81), HARDWARE["h200"])
    fast = plan_memory(T2V_13, PlanRequest(832, 480, 81, decoder="vae_fast"), HARDWARE["h200"])
    assert fast.channels_last and fast.decode_window == 20          # Wan2.1's measured best, 21 latent frames
    each = mem.vae_window_gb(T2V_13, 832, 480, 2)                    # bfloat16 on an H200
    assert each == pytest.approx(2.0, rel=0.05)                       # measured: +2.00 GiB a latent frame
    assert _decode(fast).peak_vram_gb == pytest.approx(_decode(exact).peak_vram_gb + 19 * each, abs=0.02)
    assert fast.predicted_peak_vram_gb <= fast.budget_vram_gb and fast.fits
    assert any("channels-last convolutions and 20 latent frames a call" in d for d in fast.decisions)
    assert plan_memory(TI2V_5, PlanRequest(1280, 704, 121, decoder="vae_fast"), HARDWARE["h200"]).decode_window == 2


@pytest.mark.parametrize("hw_name", ["rtx3060-12-32", "24gb-64", "strix-halo-48-16"])
def test_a_smaller_card_takes_fewer_frames_a_call_and_never_more_than_fits(hw_name):
    hardware = HARDWARE[hw_name]
    for width, height, frames in ((832, 480, 81), (480, 480, 25)):
        exact = plan_memory(T2V_13, PlanRequest(width, height, frames), hardware)
        fast = plan_memory(T2V_13, PlanRequest(width, height, frames, decoder="vae_fast"), hardware)
        room = fast.budget_vram_gb - _decode(exact).peak_vram_gb
        each = mem.vae_window_gb(T2V_13, width, height, 2)
        expected = 1 if exact.vae_tiled else max(1, min(20, (frames - 1) // 4, 1 + int(room // each)))
        assert fast.decode_window == expected, (hw_name, width)
        assert _decode(fast).peak_vram_gb <= fast.budget_vram_gb + 0.01


def test_on_the_cpu_and_for_a_still_the_faster_decode_is_channels_last_alone():
    for request in (PlanRequest(832, 480, 81, decoder="vae_fast"), PlanRequest(832, 480, 1, decoder="vae_fast")):
        plan = plan_memory(T2V_13, request, CPU)
        assert plan.channels_last and plan.decode_window == 1
    still = plan_memory(T2V_13, PlanRequest(832, 480, 1, decoder="vae_fast"), HARDWARE["h200"])
    assert still.channels_last and still.decode_window == 1


def test_the_time_plan_counts_the_measured_gain():
    request = PlanRequest(832, 480, 81)
    exact = plan_memory(T2V_13, request, HARDWARE["h200"])
    fast = plan_memory(T2V_13, replace(request, decoder="vae_fast"), HARDWARE["h200"])
    exact_s = predict_times(T2V_13, 832, 480, 81, 4, 1.0, exact, H200_CALIBRATION, loaded=True)
    fast_s = predict_times(T2V_13, 832, 480, 81, 4, 1.0, fast, H200_CALIBRATION, loaded=True)
    assert fast_s.seconds["denoise"] == exact_s.seconds["denoise"]
    assert fast_s.seconds["vae_decode"] < exact_s.seconds["vae_decode"]
    assert "channels-last, 20 latent frames a call (measured)" in fast_s.how["vae_decode"]


def test_a_run_with_the_faster_decode_is_labelled_approximate_and_leaves_the_vae_as_loaded(model_dirs, presets,
                                                                                         tmp_path):
    import torch

    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    request = tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", frames=13, decoder="vae_fast")
    assert plan_request_for(request.settings).decoder == "vae_fast"
    fast, _ = run_engine(engine, request)
    assert isinstance(fast, JobFinished), fast
    sidecar = json.loads(Path(fast.sidecar).read_text())
    assert sidecar["speed"]["decoder"] == "vae_fast" and sidecar["speed"]["approximate"] is True
    assert sidecar["plan"]["channels_last"] is True and sidecar["parameters"]["decoder"] == "vae_fast"
    vae = engine.loaded.pipe.vae
    assert all(m.weight.is_contiguous() for m in vae.modules() if isinstance(m, torch.nn.Conv3d))
    exact, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", frames=13))
    assert json.loads(Path(exact.sidecar).read_text())["speed"]["approximate"] is False
    fast_frames, _ = read_video(Path(fast.paths[0]))
    exact_frames, _ = read_video(Path(exact.paths[0]))
    assert fast_frames.shape == exact_frames.shape == (13, 64, 64, 3)
    # The same picture through another summing order: close, as the mp4's encoder sees it.
    assert np.abs(fast_frames.astype(int) - exact_frames.astype(int)).mean() < 2
