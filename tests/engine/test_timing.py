"""The time model (engine/planning/timing.py) and the machine's calibration (engine/device/calibrate.py).

The H200 figures of docs/reference-figures.md are the model's sanity check: with the rates calibrate() measured
on an H200 (docs/data/timing-h200.json), each prediction must land within 25% of what was measured there.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from engine.device.calibrate import CALIBRATION_FILE, Calibration
from engine.device.hardware import HardwareProfile
from engine.models.spec import KNOWN_MODELS
from engine.planning import post_time, timing, vae_time
from engine.planning.learning import STEP_TOKEN_EXPONENT, MeasuredRun, learn, token_exponent
from engine.planning.planner import PlanRequest, plan_memory
from engine.planning.post_time import PostFiles
from engine.planning.rates import device_rates
from engine.planning.timing import predict_times, transformer_pass
from engine.planning.vae_time import VAE21, VAE22, decoder_flops, vae_decode_seconds
from tests.helpers.machines import H200, H200_CALIBRATION, plan_for

T2V_13 = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
I2V_14 = KNOWN_MODELS["Wan-AI/Wan2.1-I2V-14B-720P-Diffusers"]
T2V_14 = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-14B-Diffusers"]
TI2V_5 = KNOWN_MODELS["Wan-AI/Wan2.2-TI2V-5B-Diffusers"]


def within(predicted: float, measured: float, tolerance: float = 0.25) -> bool:
    return abs(predicted - measured) <= tolerance * measured


# ----- the H200 cross-check (docs/reference-figures.md) --------------------------------------------------

def test_a_13b_step_with_guidance_is_about_the_h200s():
    times = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan_for(T2V_13), H200_CALIBRATION)
    assert times.passes == 2
    assert within(times.step_seconds, 1.23)          # measured 1.21-1.25 s
    assert within(times.seconds["denoise"], 14.0)    # the engine's phase, 10 steps with the live preview


def test_a_14b_step_is_about_the_h200s():
    plan = plan_for(I2V_14, i2v=True)
    assert plan.transformer == "device"
    times = predict_times(I2V_14, 832, 480, 81, 4, 5.0, plan, H200_CALIBRATION, image_to_video=True)
    assert within(times.step_seconds, 6.40)


def test_a_14b_step_with_group_offload_is_about_the_h200s():
    plan = plan_for(I2V_14, i2v=True, strategy="group_offload", transformer="group")
    times = predict_times(I2V_14, 832, 480, 81, 4, 5.0, plan, H200_CALIBRATION, image_to_video=True)
    assert within(times.step_seconds, 7.32)
    small = predict_times(I2V_14, 480, 480, 33, 4, 5.0, plan_for(I2V_14, 480, 480, 33, True, strategy="group_offload",
                                                                 transformer="group"),
                          H200_CALIBRATION, image_to_video=True)
    assert within(small.step_seconds, 2.13)          # docs/speed.md: the engine under a 24 GiB cap


@pytest.mark.parametrize("vae_dtype, tile, measured", [("float32", None, 2.79), ("bfloat16", None, 1.83),
                                                       ("float32", 256, 5.37), ("bfloat16", 256, 4.25)])
def test_the_vae_decode_is_about_the_h200s(vae_dtype, tile, measured):
    """docs/reference-figures.md: cuDNN's defaults (no benchmark), untiled and in 256-pixel tiles."""
    seconds, how = vae_decode_seconds(T2V_13, 832, 480, 81, vae_dtype, tile, H200_CALIBRATION)
    assert within(seconds, measured), how


@pytest.mark.parametrize("vae_dtype, measured", [("float32", 2.20), ("bfloat16", 1.69)])
def test_the_vae_decode_with_cudnn_benchmark_is_about_the_h200s(vae_dtype, measured):
    seconds, how = vae_decode_seconds(T2V_13, 832, 480, 81, vae_dtype, None, H200_CALIBRATION, "benchmark")
    assert within(seconds, measured), how


def test_the_wan22_vae_decode_is_about_the_h200s():
    """docs/data/timing-h200.json: 832x480x41, 0.91 s in bfloat16 and 1.41 s in float32."""
    assert within(vae_decode_seconds(TI2V_5, 832, 480, 41, "bfloat16", None, H200_CALIBRATION)[0], 0.906)
    assert within(vae_decode_seconds(TI2V_5, 832, 480, 41, "float32", None, H200_CALIBRATION)[0], 1.411)


def test_the_decode_phase_adds_bringing_the_frames_home():
    plan = plan_for(T2V_13, vae_dtype="float32", conv="default")
    times = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan, H200_CALIBRATION)
    # The engine streams an untiled video's frames to the encoder as uint8: its decode phase measured 2.87 s
    # in float32 on the H200 (4.40 s with the export's 1.53 s tail), 1.84-1.88 s in bfloat16.
    assert within(times.seconds["vae_decode"], 2.87)
    bf16 = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan_for(T2V_13, vae_dtype="bfloat16", conv="benchmark"),
                         H200_CALIBRATION)
    assert within(bf16.seconds["vae_decode"], 1.86)


def test_the_text_encode_is_about_the_h200s():
    times = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan_for(T2V_13), H200_CALIBRATION)
    assert within(times.seconds["text_encode"], 0.70)   # prompt and negative, the first after a load
    one = predict_times(T2V_13, 832, 480, 81, 3, 1.0, plan_for(T2V_13), H200_CALIBRATION)
    assert within(one.seconds["text_encode"], 0.40)      # FastWan: guidance 1, no negative prompt
    warm = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan_for(T2V_13), H200_CALIBRATION, loaded=True)
    assert within(warm.seconds["text_encode"], 0.09)     # the next run's (docs/speed.md)


@pytest.mark.parametrize("place, measured", [("offload", 1.82), ("streamed", 0.57), ("cpu", 4.35)])
def test_the_text_encoders_places_cost_what_the_h200_measured(place, measured):
    """docs/speed.md, the second run of each (the encoder already placed)."""
    plan = plan_for(T2V_13, strategy="text_encoder_offload", text_encoder=place)
    times = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan, H200_CALIBRATION, loaded=True)
    assert within(times.seconds["text_encode"], measured), times.how["text_encode"]


def test_moving_the_pipeline_to_the_device_is_about_the_h200s():
    plan = plan_for(T2V_13)
    assert plan.load == "cpu" and plan.text_encoder == "device"
    # The folder that load measured held the weights in bf16, 14.7 GB (the published one holds them in float32).
    times = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan, H200_CALIBRATION, weight_bytes=int(14.7e9))
    assert within(times.seconds["transfer"], 2.4)    # 14.7 GB at 6.1 GB/s
    assert within(times.seconds["load"], 10.9)       # the engine's load, no disk rate measured yet
    assert "default" in times.how["load"]
    assert within(times.seconds["export"], 2.1)      # no encoder measured: the H200 machine's own rate


def test_a_measured_disk_rate_replaces_the_default():
    calibration = H200_CALIBRATION.with_disk_rate(3.0)
    times = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan_for(T2V_13), calibration, weight_bytes=15 * 10 ** 9)
    assert times.seconds["load"] == pytest.approx(5.0, rel=0.01)
    assert "measured" in times.how["load"]


# ----- what the predictions do as the request changes ----------------------------------------------------

def _rates():
    return device_rates(plan_for(T2V_13), H200_CALIBRATION)


def test_more_frames_give_attention_a_larger_share():
    shares = []
    for frames in (17, 33, 81, 121):
        one = transformer_pass(T2V_13, T2V_13.tokens(832, 480, frames), 0, _rates(), 2)
        shares.append(one.attention / one.total)
    assert shares == sorted(shares) and shares[-1] > 0.5 > shares[0]


def test_guidance_one_halves_the_step():
    plan = plan_for(T2V_13)
    guided = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan, H200_CALIBRATION)
    plain = predict_times(T2V_13, 832, 480, 81, 10, 1.0, plan, H200_CALIBRATION)
    assert plain.passes == 1 and plain.step_seconds == pytest.approx(guided.step_seconds / 2, rel=1e-3)


@pytest.mark.parametrize("spec", [T2V_13, T2V_14, TI2V_5])
@pytest.mark.parametrize("size", [(480, 480, 17), (832, 480, 81), (1280, 704, 121)])
def test_offloading_is_never_faster_than_everything_on_the_device(spec, size):
    on_device = predict_times(spec, *size, 20, 5.0, plan_for(spec, *size), H200_CALIBRATION)
    group = predict_times(spec, *size, 20, 5.0, plan_for(spec, *size, strategy="group_offload", transformer="group"),
                          H200_CALIBRATION)
    leaf = predict_times(spec, *size, 20, 5.0, plan_for(spec, *size, strategy="leaf_offload", transformer="leaf"),
                         H200_CALIBRATION)
    assert on_device.step_seconds <= group.step_seconds <= leaf.step_seconds


def test_fp8_storage_computes_as_much():
    plain = predict_times(T2V_14, 832, 480, 81, 10, 5.0, plan_for(T2V_14), H200_CALIBRATION)
    fp8 = predict_times(T2V_14, 832, 480, 81, 10, 5.0, plan_for(T2V_14, strategy="fp8_storage", fp8=True),
                        H200_CALIBRATION)
    assert fp8.step_seconds == pytest.approx(plain.step_seconds, rel=0.01)   # measured 1.21 s either way (1.3B)
    streamed = predict_times(T2V_14, 832, 480, 81, 10, 5.0,
                             plan_for(T2V_14, strategy="fp8_group_offload", transformer="group", fp8=True),
                             H200_CALIBRATION)
    group = predict_times(T2V_14, 832, 480, 81, 10, 5.0,
                          plan_for(T2V_14, strategy="group_offload", transformer="group"), H200_CALIBRATION)
    assert plain.step_seconds < streamed.step_seconds < group.step_seconds   # half the bytes to stream


def test_speed_choices_change_the_figures_they_should():
    plan = plan_for(T2V_13)
    base = predict_times(T2V_13, 832, 480, 81, 10, 5.0, replace(plan, compile=False), H200_CALIBRATION, loaded=True)
    compiled = predict_times(T2V_13, 832, 480, 81, 10, 5.0, replace(plan, compile=True), H200_CALIBRATION,
                             loaded=True, compiled=True)
    assert within(compiled.step_seconds, 1.07, 0.1) and compiled.step_seconds < base.step_seconds
    first = predict_times(T2V_13, 832, 480, 81, 10, 5.0, replace(plan, compile=True), H200_CALIBRATION, loaded=True)
    assert first.seconds["denoise"] > compiled.seconds["denoise"] + 10
    flash = predict_times(T2V_13, 832, 480, 81, 10, 5.0, replace(plan, attention_backend="_native_flash"),
                          H200_CALIBRATION, loaded=True)
    assert within(flash.step_seconds, 1.68, 0.1)


def test_the_phases_are_those_a_run_goes_through():
    times = predict_times(I2V_14, 480, 480, 33, 20, 5.0, plan_for(I2V_14, 480, 480, 33, True), H200_CALIBRATION,
                          image_to_video=True, interpolate=2, upscale=4, extends=True)
    assert tuple(times.seconds) == tuple(phase for phase in timing.PHASES if phase not in ("expert_swap", "video_encode"))
    assert set(times.how) == set(times.seconds) and all(times.how.values())
    assert times.total == pytest.approx(sum(times.seconds.values()), abs=0.02)
    loaded = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan_for(T2V_13), H200_CALIBRATION, loaded=True)
    assert tuple(loaded.seconds) == ("text_encode", "denoise", "vae_decode", "export")
    assert json.loads(json.dumps(loaded.to_dict()))["seconds"] == loaded.seconds
    # Video to video: its input encoded first, at about half the decode of as many frames; the steps it runs.
    remade = predict_times(T2V_13, 832, 480, 81, 7, 5.0, plan_for(T2V_13), H200_CALIBRATION, loaded=True,
                           video_input=True)
    assert tuple(remade.seconds)[:2] == ("text_encode", "video_encode")
    assert remade.seconds["video_encode"] == pytest.approx(vae_time.VIDEO_ENCODE_SHARE * loaded.seconds["vae_decode"],
                                                           rel=0.05)
    assert remade.seconds["denoise"] == pytest.approx(loaded.seconds["denoise"] * 7 / 10, rel=0.02)


def test_image_to_video_encodes_its_condition_inside_the_denoise_phase():
    plan = plan_for(I2V_14, 480, 480, 33, True, vae_dtype="float32")
    i2v = predict_times(I2V_14, 480, 480, 33, 1, 5.0, plan, H200_CALIBRATION, image_to_video=True)
    assert within(i2v.seconds["denoise"] - i2v.step_seconds, 0.41)   # a Wan2.1 encode of 480x480x33, fp32


def test_a_cpu_plan_uses_the_cpus_rates():
    cpu = HardwareProfile(backend="cpu", device_name="x86_64", ram_total_gb=64, ram_available_gb=60, cpu_count=2)
    calibration = Calibration(
        device_name="x86_64", backend="cpu", torch_version="2", dtype="float32",
        matmul_tflops=((512, 0.03), (1024, 0.037)), attention_tflops=((512, 0.014), (2048, 0.035)),
        conv3d_tflops=(("default", "float32", 96, 0.01), ("default", "float32", 384, 0.03)),
        memory_gbps=5.0, cpu_matmul_tflops=0.037, to_uint8_gbps=0.6)
    plan = plan_memory(T2V_13, PlanRequest(480, 480, 17), cpu)
    times = predict_times(T2V_13, 480, 480, 17, 4, 5.0, plan, calibration)
    assert "transfer" in times.seconds and times.seconds["transfer"] == 0.0
    assert times.seconds["denoise"] > 100 * predict_times(T2V_13, 480, 480, 17, 4, 5.0, plan_for(T2V_13, 480, 480, 17),
                                                          H200_CALIBRATION).seconds["denoise"]


def test_the_fast_decoder_is_many_times_faster():
    plan = plan_for(T2V_13, vae_dtype="bfloat16")
    vae = predict_times(T2V_13, 832, 480, 81, 3, 1.0, plan, H200_CALIBRATION)
    fast = predict_times(T2V_13, 832, 480, 81, 3, 1.0, plan, H200_CALIBRATION, decoder="fast")
    # The engine's phase on an H200, streamed into the encoder: 0.18-0.29 s (docs/data/speed-1.3b-h200.json).
    assert within(fast.seconds["vae_decode"], 0.23, 0.5)
    assert fast.seconds["vae_decode"] < vae.seconds["vae_decode"] / 2
    with pytest.raises(ValueError):
        predict_times(T2V_13, 832, 480, 81, 3, 1.0, plan, H200_CALIBRATION, decoder="nope")


# ----- the VAE's work, from its layer widths --------------------------------------------------------------

def test_the_decoders_flops_follow_from_its_widths():
    """Per output pixel of a later latent frame (four output frames): counted by torch's FlopCounterMode on
    diffusers' AutoencoderKLWan with these configs, 8,444,880 (Wan2.1) and 18,394,144 (Wan2.2-5B)."""
    assert decoder_flops(VAE21, 2, 1) - decoder_flops(VAE21, 1, 1) == pytest.approx(8_444_880 * 256, rel=1e-6)
    assert decoder_flops(VAE22, 2, 1) - decoder_flops(VAE22, 1, 1) == pytest.approx(18_394_144 * 1024, rel=1e-6)
    # the first latent frame gives one output frame
    assert decoder_flops(VAE21, 1, 1) == pytest.approx(10_748_168 * 64, rel=1e-5)


def test_the_decoders_flops_match_diffusers_counted_by_torch():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from diffusers import AutoencoderKLWan

    configs = {VAE21: {}, VAE22: dict(base_dim=160, decoder_base_dim=256, z_dim=48, in_channels=12, out_channels=12,
                                       patch_size=2, scale_factor_spatial=16, is_residual=True)}
    for shape, config in configs.items():
        with torch.device("meta"):
            vae = AutoencoderKLWan(**config).eval()
        latents = torch.zeros(1, shape.z_dim, 3, 4, 6, device="meta")
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            vae.decode(latents)
        # (the count also holds the middle attention's, a few parts in 10^5 here, left out of decoder_flops)
        assert counter.get_total_flops() == pytest.approx(decoder_flops(shape, 3, 24), rel=1e-4)
        frames = torch.zeros(1, 3, 5, 64, 96, device="meta")
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            vae.encode(frames)
        expected = 64 * 96 * (shape.encode_first_flops_per_pixel + 4 * shape.encode_flops_per_pixel)
        assert counter.get_total_flops() == pytest.approx(expected, rel=0.01)


# ----- learning from runs ---------------------------------------------------------------------------------

def test_learn_corrects_a_wrong_prediction_toward_what_was_measured():
    """A calibration twice too optimistic predicts half the time; one measured run (the true figures, here the
    right calibration's) brings a prediction at another size most of the way back."""
    fast = replace(H200_CALIBRATION, matmul_tflops=tuple((k, 2 * v) for k, v in H200_CALIBRATION.matmul_tflops),
                   attention_tflops=tuple((k, 2 * v) for k, v in H200_CALIBRATION.attention_tflops),
                   memory_gbps=2 * H200_CALIBRATION.memory_gbps)
    plan = plan_for(T2V_13)
    truth_then = predict_times(T2V_13, 832, 480, 81, 10, 5.0, plan, H200_CALIBRATION, loaded=True)
    run = MeasuredRun(seconds=truth_then.seconds, tokens=truth_then.tokens, steps=10, passes=2,
                      pixels=truth_then.pixels, step_seconds=truth_then.step_seconds, loaded=True)
    wrong_now = predict_times(T2V_13, 832, 480, 49, 20, 5.0, plan, fast, loaded=True)
    truth_now = predict_times(T2V_13, 832, 480, 49, 20, 5.0, plan, H200_CALIBRATION, loaded=True)
    learned = learn(wrong_now, [run])
    for phase in ("denoise", "vae_decode", "text_encode"):
        assert abs(learned.seconds[phase] - truth_now.seconds[phase]) < \
            0.25 * abs(wrong_now.seconds[phase] - truth_now.seconds[phase]) + 1e-6, phase
    assert within(learned.step_seconds, truth_now.step_seconds, 0.1)
    assert "learned" in learned.how["denoise"]
    assert learned.total == pytest.approx(sum(learned.seconds.values()), abs=0.02)


def test_learn_scales_a_step_by_passes_and_tokens():
    prediction = predict_times(T2V_13, 832, 480, 81, 10, 1.0, plan_for(T2V_13), H200_CALIBRATION, loaded=True)
    run = MeasuredRun(seconds={"denoise": 20.0}, tokens=prediction.tokens // 2, steps=10, passes=2,
                      pixels=prediction.pixels // 2)
    learned = learn(prediction, [run])
    # 1 s a pass measured at half the tokens: x 2^1.4 at the new length, one pass per step here
    assert learned.step_seconds == pytest.approx(2 ** STEP_TOKEN_EXPONENT, rel=1e-3)
    assert learned.seconds["vae_decode"] == prediction.seconds["vae_decode"]   # no decode was measured
    assert learn(prediction, []) is prediction


def test_the_first_decode_after_a_load_is_not_what_the_next_run_learns():
    """Measured on an H200: the FastWan decode took 3.01 s right after the load and 1.80 s on every later run."""
    prediction = predict_times(T2V_13, 832, 480, 81, 3, 1.0, plan_for(T2V_13), H200_CALIBRATION, loaded=True)
    after_load = MeasuredRun({"denoise": 1.9, "vae_decode": 3.01, "export": 0.13}, prediction.tokens, 3, 1,
                             prediction.pixels, loaded=False)
    learned = learn(prediction, [after_load])
    assert learned.seconds["vae_decode"] == prediction.seconds["vae_decode"]   # the model's figure, not 3.01
    assert learned.seconds["export"] == 0.13 and learned.seconds["denoise"] == pytest.approx(1.9)
    warm = replace(after_load, seconds={**after_load.seconds, "vae_decode": 1.8}, loaded=True)
    assert learn(prediction, [after_load, warm]).seconds["vae_decode"] == 1.8


def test_the_token_exponent_is_fitted_from_runs_at_several_lengths():
    runs = [MeasuredRun({}, tokens, 1, 1, 1, step_seconds=0.5 * (tokens / 8000) ** 1.6) for tokens in (8000, 16000, 32000)]
    assert token_exponent(runs) == pytest.approx(1.6, rel=1e-6)
    assert token_exponent(runs[:1]) == STEP_TOKEN_EXPONENT
    steep = [MeasuredRun({}, t, 1, 1, 1, step_seconds=(t / 1000) ** 3) for t in (1000, 2000)]
    assert token_exponent(steep) == 2.0


# ----- the calibration ------------------------------------------------------------------------------------

def test_a_quick_cpu_calibration_runs_in_seconds_saves_and_loads(tmp_path):
    torch = pytest.importorskip("torch")
    from engine.device.calibrate import calibrate
    from engine.outputs.export_rates import export_rates

    result = calibrate("cpu", torch.float32, quick=True, export_rates=export_rates)
    assert result.backend == "cpu" and result.dtype == "float32" and result.torch_version == torch.__version__
    assert result.seconds < 10
    numbers = [v for _, v in result.matmul_tflops] + [v for _, v in result.attention_tflops] + \
              [v for *_, v in result.conv3d_tflops] + [result.memory_gbps, result.cpu_matmul_tflops,
                                                       result.to_uint8_gbps]
    assert numbers and all(v > 0 for v in numbers)
    assert result.h2d_pinned_gbps is None     # no device, no copies
    hardware = HardwareProfile(backend="cpu", device_name=result.device_name, torch_version=torch.__version__)
    path = result.save(tmp_path)
    assert path == tmp_path / CALIBRATION_FILE
    assert Calibration.load(tmp_path, hardware) == result
    times = predict_times(T2V_13, 480, 480, 17, 2, 5.0, plan_memory(T2V_13, PlanRequest(480, 480, 17), replace(
        hardware, ram_total_gb=64, ram_available_gb=60)), result)
    assert all(seconds >= 0 for seconds in times.seconds.values()) and times.total > 0


def test_a_calibration_from_other_hardware_or_torch_is_ignored(tmp_path):
    H200_CALIBRATION.save(tmp_path)
    assert Calibration.load(tmp_path, H200) == H200_CALIBRATION
    assert Calibration.load(tmp_path, replace(H200, device_name="NVIDIA H100")) is None
    assert Calibration.load(tmp_path, replace(H200, torch_version="2.12.0+cu130")) is None
    assert Calibration.load(tmp_path, replace(H200, backend="rocm")) is None
    assert Calibration.load(tmp_path / "nowhere", H200) is None
    (tmp_path / CALIBRATION_FILE).write_text("{not json")
    assert Calibration.load(tmp_path, H200) is None
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"device_name": "NVIDIA H200"}))
    assert Calibration.load(tmp_path, H200) is None


def test_a_calibration_reads_back_what_it_wrote():
    data = json.loads(json.dumps(H200_CALIBRATION.to_dict()))
    assert Calibration.from_dict(data) == H200_CALIBRATION
    assert Calibration.from_dict({**data, "from_a_newer_app": 1}) == H200_CALIBRATION
    with pytest.raises(ValueError):
        Calibration.from_dict([])
    assert math.isclose(H200_CALIBRATION.with_disk_rate(2).disk_gbps, 2.0)


def test_a_small_run_s_fixed_costs_are_not_scaled_up_as_work():
    """The self-test model at 64x64x9 took 0.03 s a step, nearly all of it fixed costs; at 256x256x33 (59 times
    the tokens) the tokens rule said 9 s a step, and the run took 0.24. Measured = k x model + c keeps the
    fixed part fixed."""
    from engine.planning.timing import PhaseTimes

    def prediction(tokens, model_step):
        return PhaseTimes({"denoise": model_step * 20}, {"denoise": ""}, model_step, 20, 2, tokens, tokens * 16, 1.0,
                          model_step_seconds=model_step)

    small = MeasuredRun({"denoise": 0.6}, 144, 20, 2, 144 * 16, step_seconds=0.03, model_step=0.0004)
    big = learn(prediction(8448, 0.03), [small])
    assert 0.03 < big.step_seconds < 0.2, big.how["denoise"]      # 3 x the model's work + the fixed 0.029 s
    assert big.step_seconds == pytest.approx(3 * 0.03 + (0.03 - 3 * 0.0004))
    # Two runs at different sizes: the fit finds both parts.
    runs = [MeasuredRun({"denoise": 1.0}, t, 20, 2, t * 16, step_seconds=2 * (1.5 * m / 2 + 0.01), model_step=m)
            for t, m in ((144, 0.001), (8448, 0.05))]
    assert learn(prediction(4000, 0.02), runs).step_seconds == pytest.approx(2 * (1.5 * 0.01 + 0.01))


# ----- the steps after the video (engine/planning/post_time.py) ----------------------------------------------------

X4PLUS = PostFiles(interpolator=True, upscaler_bytes=67_004_607)   # bench/post_gpu.py's files: rife47, ESRGAN x4plus


def _after(spec=T2V_13, width=832, height=480, frames=81, interpolate=1, upscale=1, files=X4PLUS, device="cuda",
           calibration=H200_CALIBRATION):
    plan = plan_for(spec, width, height, frames, device=device)
    return predict_times(spec, width, height, frames, 4, 5.0, plan, calibration, interpolate=interpolate,
                         upscale=upscale, post_files=files)


@pytest.mark.parametrize("size, interpolate, upscale, phase, measured", [
    ((832, 480, 81), 2, 1, "interpolate", 1.673),    # RIFE 4.7, float16
    ((1280, 720, 17), 2, 1, "interpolate", 0.78),
    ((832, 480, 81), 1, 2, "upscale", 29.936),       # ESRGAN of x4plus's size, float16, tiles of 512
])
def test_the_steps_after_the_video_on_a_gpu_are_about_the_h200s(size, interpolate, upscale, phase, measured):
    """docs/data/post-h200.json, the model files in the folders: within 25% of what the H200 took."""
    times = _after(T2V_13, *size, interpolate=interpolate, upscale=upscale)
    assert within(times.seconds[phase], measured), times.how[phase]
    assert times.total == pytest.approx(sum(times.seconds.values()), abs=0.02)


def test_without_files_the_steps_are_predicted_as_their_fallbacks_on_the_cpu():
    with_files, without = _after(interpolate=2, upscale=2), _after(interpolate=2, upscale=2, files=PostFiles())
    assert (with_files.post["interpolate"]["method"], with_files.post["upscale"]["method"]) == \
        ("rife/gpu", "upscaler/gpu/67004607")
    assert (without.post["interpolate"]["method"], without.post["upscale"]["method"]) == ("minterpolate", "lanczos")
    assert "minterpolate" in without.how["interpolate"] and "Lanczos" in without.how["upscale"]
    # The H200 found RIFE 11 times quicker than minterpolate, and Lanczos 8 times quicker than the ESRGAN.
    assert without.seconds["interpolate"] > 5 * with_files.seconds["interpolate"]
    assert with_files.seconds["upscale"] > 4 * without.seconds["upscale"]
    # Everything before the steps is the same prediction; the steps add to the total.
    assert {p: s for p, s in without.seconds.items() if p not in post_time.POST_PHASES} == \
        {p: s for p, s in with_files.seconds.items() if p not in post_time.POST_PHASES}
    plain = _after()
    assert "interpolate" not in plain.seconds and "upscale" not in plain.seconds and plain.post == {}
    assert without.total == pytest.approx(plain.total + without.seconds["interpolate"] + without.seconds["upscale"],
                                          abs=0.02)


def test_the_steps_grow_with_the_frames_and_pixels_they_work_on():
    short, long_ = _after(frames=41, interpolate=2), _after(frames=81, interpolate=2)
    assert long_.seconds["interpolate"] / short.seconds["interpolate"] == pytest.approx(161 / 81, rel=0.01)
    small, large = (_after(width=w, height=h, upscale=2, files=PostFiles()) for w, h in ((416, 240), (832, 480)))
    assert 3.0 < large.seconds["upscale"] / small.seconds["upscale"] <= 4.0     # 4 times the pixels, a fixed cost
    twice, four = (_after(upscale=f, files=PostFiles()) for f in (2, 4))
    assert 3.0 < four.seconds["upscale"] / twice.seconds["upscale"] <= 4.0      # Lanczos: the pixels it writes
    # The upscaler sees the frames the smoother made: 161 frames, not 81.
    after = _after(interpolate=2, upscale=2)
    assert after.seconds["upscale"] / _after(upscale=2).seconds["upscale"] == pytest.approx(161 / 81, rel=0.01)
    assert after.post["upscale"]["written"] == pytest.approx(161 * 1664 * 960 / 1e6, rel=1e-3)


def test_an_upscaler_s_work_follows_its_file_s_size_and_is_never_quicker_than_lanczos():
    big = _after(upscale=2, files=PostFiles(upscaler_bytes=67_000_000))
    small = _after(upscale=2, files=PostFiles(upscaler_bytes=3_494_575))       # bench/post_cpu.py's small ESRGAN
    assert small.seconds["upscale"] < big.seconds["upscale"] / 3
    tiny = _after(upscale=4, files=PostFiles(upscaler_bytes=1_000))
    lanczos = _after(upscale=4, files=PostFiles())
    assert tiny.seconds["upscale"] >= lanczos.seconds["upscale"] - 0.2 and "no quicker than" in tiny.how["upscale"]


def test_a_model_step_on_the_cpu_follows_the_cpu_s_measured_matrix_rate_and_on_a_gpu_the_device_s():
    slow = replace(H200_CALIBRATION, cpu_matmul_tflops=post_time.BENCH_CPU_TFLOPS)
    fast = replace(slow, cpu_matmul_tflops=4 * post_time.BENCH_CPU_TFLOPS)
    on_cpu = [_after(frames=17, interpolate=2, upscale=2, device="cpu", calibration=c) for c in (slow, fast)]
    assert [t.post["interpolate"]["method"] for t in on_cpu] == ["rife/cpu", "rife/cpu"]
    for phase in ("interpolate", "upscale"):
        fixed = post_time.method_fixed(on_cpu[0].post[phase]["method"])
        assert (on_cpu[0].seconds[phase] - fixed) / (on_cpu[1].seconds[phase] - fixed) == pytest.approx(4, rel=0.01)
    # On a GPU, RIFE is paced by the frames it writes (the same on a slower CPU); the upscaler by the device.
    gpu = [_after(interpolate=2, upscale=2, calibration=c) for c in (slow, fast)]
    assert gpu[0].seconds == gpu[1].seconds
    half = replace(H200_CALIBRATION, matmul_tflops=tuple((d, r / 2) for d, r in H200_CALIBRATION.matmul_tflops))
    assert _after(upscale=2, calibration=half).seconds["upscale"] == \
        pytest.approx(2 * _after(upscale=2).seconds["upscale"], rel=0.01)


def test_the_cpu_rates_predict_what_bench_post_cpu_measured_here():
    """Every run of docs/data/post-cpu.json (a 2-core CPU, the real StepRunner), predicted from its own calibration:
    within 30%, minterpolate within 45% (its cost a pixel written varies with the factor and the size: 0.14 to 0.24 s
    a megapixel there, its motion search)."""
    data = json.loads((Path(__file__).parents[2] / "docs" / "data" / "post-cpu.json").read_text())
    cpu = replace(H200_CALIBRATION, **{key: data["calibration"][key] for key in (
        "cpu_matmul_tflops", "encode_megapixels_per_s", "encode_fixed_s")})   # minterpolate's processes start as its
    assert cpu.cpu_matmul_tflops == post_time.BENCH_CPU_TFLOPS
    for run in data["runs"]:
        kind = "interpolate" if run["step"] == "interpolate" else "upscale"
        files = PostFiles(run["method"] == "rife", run.get("file_bytes", 0))
        times = _after(T2V_13, run["width"], run["height"], run["frames"], device="cpu", calibration=cpu, files=files,
                       **{kind: run["factor"]})
        tolerance = 0.45 if run["method"] == "minterpolate" else 0.3
        assert within(times.seconds[kind], run["seconds"], tolerance), (run, times.how[kind])


def test_the_time_model_pads_as_rife_does():
    from engine.post.rife import PAD_MULTIPLE

    assert post_time.RIFE_PAD == PAD_MULTIPLE
    work = post_time.post_works(832, 480, 5, 2, 1, "cpu", PostFiles(interpolator=True))[0]
    assert work.megapixels == pytest.approx(4 * 832 * 512 / 1e6)     # 4 frames made, 480 padded to 512


def test_a_step_after_the_video_learns_from_a_run_of_the_same_method_of_any_size():
    from engine.planning.learning import learn_post

    prediction = _after(interpolate=2, upscale=2, files=PostFiles())
    half = _after(frames=41, interpolate=2, upscale=2, files=PostFiles())
    measured = {"interpolate": 20.0, "upscale": 6.0}
    run = MeasuredRun(measured, 1, 4, 2, 1, post=half.post)
    learned = learn_post(prediction, [run])
    fixed = post_time.method_fixed("lanczos")
    assert learned.seconds["upscale"] == pytest.approx(fixed + (6.0 - fixed) * 161 / 81, rel=1e-3)
    fixed = post_time.method_fixed("minterpolate")   # its processes' start
    assert learned.seconds["interpolate"] == pytest.approx(fixed + (20.0 - fixed) * 161 / 81, rel=1e-3)
    assert "learned from a run of the same method (minterpolate)" in learned.how["interpolate"]
    assert learned.total == pytest.approx(sum(learned.seconds.values()), abs=0.02)
    # A run by another method (a RIFE file was there then) says nothing of minterpolate's.
    other = MeasuredRun(measured, 1, 4, 2, 1, post=_after(frames=41, interpolate=2, upscale=2).post)
    assert learn_post(prediction, [other]) == prediction
    # The run keeps its steps' work through the file of kept runs.
    assert MeasuredRun.from_dict(json.loads(json.dumps(run.to_dict()))).post == half.post
