"""Long videos: more frames than the model's window, denoised whole in overlapping windows and blended."""
from __future__ import annotations

import json
import re

import pytest
import torch

from engine.events import JobFailed, JobFinished, StepFinished, WindowDone
from engine.models.spec import KNOWN_MODELS, SELFTEST_SPECS
from engine.models.windows import LONGEST_FRAMES, Windows, job_windows, windows_for
from engine.outputs.export import read_video
from engine.planning.planner import plan_memory, plan_request_for
from engine.planning.timing import predict_times
from engine.run.engine import Engine
from engine.run.windows import blended_pass
from engine.settings.values import InputError, Settings, check_settings
from engine.models.limits import limits_of
from tests.conftest import CPU, app_main, run_engine, tiny_request
from tests.helpers.machines import H200_CALIBRATION, HARDWARE, T2V_13


# ----- the windows themselves ----------------------------------------------------------------------------
@pytest.mark.parametrize("frames,window,overlap", [(241, 81, 16), (LONGEST_FRAMES, 81, 16), (85, 81, 16),
                                                    (241, 125, 16), (161, 81, 4), (1025, 121, 32), (97, 17, 8)])
def test_windows_cover_the_video_each_of_the_same_length_sharing_at_least_the_overlap(frames, window, overlap):
    windows = windows_for(frames, window, overlap)
    latent, size, shared = (frames - 1) // 4 + 1, (window - 1) // 4 + 1, overlap // 4
    assert windows.latent == latent and windows.size == size and windows.window_frames == window
    spans = windows.spans
    assert spans[0][0] == 0 and spans[-1][1] == latent and all(end - start == size for start, end in spans)
    assert all(spans[i + 1][0] - spans[i][1] <= -shared for i in range(len(spans) - 1))   # they overlap enough
    assert all(spans[i + 1][0] > spans[i][0] for i in range(len(spans) - 1))              # and each one moves on
    # The fewest windows that can: one fewer could not share the overlap.
    assert (windows.count - 1) * (size - shared) + size >= latent > (windows.count - 2) * (size - shared) + size
    for i in range(windows.count):
        weights = windows.weights(i)
        before, after = windows.shared(i)
        assert len(weights) == size and all(0 < w <= 1 for w in weights)
        assert weights[before:size - after] == (1.0,) * (size - before - after)   # its own frames: all its own
        if before and before + after <= size:   # (windows sharing most of their frames rise and fall at once)
            assert list(weights[:before]) == sorted(weights[:before]) and weights[0] < 1
    assert windows.frames_of(windows.count - 1)[1] == frames - 1 and windows.frames_of(0) == (0, window - 1)
    assert windows.to_dict()["count"] == windows.count == len(windows.to_dict()["frames"])


def test_a_video_that_fits_in_one_window_has_none_and_the_model_s_own_window_is_its_clip():
    assert windows_for(81, 81, 16) is None and windows_for(5, 81, 16) is None
    settings = Settings("m", "t2v", 832, 480, 121, 4, 5.0, 5.0)
    assert job_windows(KNOWN_MODELS["Wan-AI/Wan2.2-TI2V-5B-Diffusers"], settings) is None   # its clip is 121
    assert job_windows(KNOWN_MODELS[T2V_13], settings).count == 2                          # Wan2.1's is 81
    assert job_windows(KNOWN_MODELS[T2V_13], Settings("m", "t2i", 832, 480, 1, 4, 5.0, 5.0)) is None
    assert job_windows(SELFTEST_SPECS["selftest-t2v"], Settings("m", "t2v", 64, 64, 241, 4, 5.0, 3.0)).size == 32


# ----- the blend ------------------------------------------------------------------------------------------
def _per_frame(hidden_states, timestep, encoder_hidden_states=None, return_dict=False):
    """A stand-in pass whose output at a frame depends on that frame alone (and its timesteps): windows must
    then give back exactly what one pass over the whole video gives, whatever their weights."""
    out = hidden_states[:, :2] * 3.0 + encoder_hidden_states.mean()
    if timestep.ndim == 2:   # a timestep per token, frame after frame
        out = out + timestep.view(out.shape[0], 1, *out.shape[2:]).to(out.dtype)
    else:
        out = out + timestep.view(-1, 1, 1, 1, 1)
    return (out,)


@pytest.mark.parametrize("per_token", [False, True])
def test_blending_windows_of_a_frame_local_pass_gives_back_the_whole_pass(per_token):
    hidden = torch.randn(1, 4, 16, 2, 3)
    text = torch.randn(1, 5, 8)
    timestep = torch.rand(1, 16 * 6) if per_token else torch.tensor([700.0])
    windows = windows_for(61, 25, 8)   # latent 16 frames, windows of 7
    assert windows.count > 2
    seen = []
    whole = _per_frame(hidden, timestep, text)[0]
    out = blended_pass(_per_frame, windows, lambda i, n: seen.append((i, n)), None, (),
                       {"hidden_states": hidden, "timestep": timestep, "encoder_hidden_states": text,
                        "return_dict": False})[0]
    assert torch.allclose(out, whole, atol=1e-6) and out.shape == (1, 2, 16, 2, 3)
    assert seen == [(i, windows.count) for i in range(1, windows.count + 1)]


def test_one_window_over_the_whole_video_is_the_transformer_s_own_pass(model_dirs):
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(model_dirs["tiny-t2v"] / "transformer").eval()
    hidden = torch.randn(1, model.config.in_channels, 5, 8, 8)
    kwargs = {"hidden_states": hidden, "timestep": torch.tensor([500]),
              "encoder_hidden_states": torch.randn(1, 7, model.config.text_dim), "return_dict": False}
    with torch.no_grad():
        plain = model(**kwargs)[0]
        one = blended_pass(model.forward, Windows(5, 5, (0,)), lambda i, n: None, model, (), kwargs)[0]
    assert torch.equal(plain, one)


# ----- the settings and the plan --------------------------------------------------------------------------
def test_windows_are_checked_with_one_sentence_each():
    limits = limits_of(SELFTEST_SPECS["selftest-t2v"])
    base = Settings("selftest-t2v", "t2v", 64, 64, 241, 4, 5.0, 3.0)
    assert check_settings(base, limits).frames == 241
    cases = {"window": (129, "a window of 129 frames is more than selftest-t2v can see at once"),
             "overlap": (6, "overlap 6 must be a multiple of 4 frames"),
             "step_cache": ("mag", "the step cache (mag) decides once per pass over the whole video")}
    for name, (value, words) in cases.items():
        with pytest.raises(InputError, match="(?i)" + re.escape(words)):
            check_settings(base.changed(**{name: value}), limits)
    with pytest.raises(InputError, match="(?i)frames 1029 is out of range: use 1 to 1025"):
        check_settings(base.changed(frames=1029), limits)
    check_settings(base.changed(frames=125, step_cache="mag"), limits)   # one window: a cache is fine


def test_the_plan_counts_one_window_s_activations_and_the_time_counts_the_windows():
    spec, hw = KNOWN_MODELS[T2V_13], HARDWARE["h200"]
    short = Settings(T2V_13, "t2v", 832, 480, 81, 50, 5.0, 5.0)
    long = short.changed(frames=241)
    peaks = [next(p for p in plan_memory(spec, plan_request_for(s), hw).phases if p.phase == "denoise").peak_vram_gb
             for s in (short, long)]
    assert peaks[1] <= peaks[0] * 1.10   # the device peak of the denoise doesn't grow with the length
    one_pass = plan_memory(spec, plan_request_for(long.changed(window=241)), hw)
    assert next(p for p in one_pass.phases if p.phase == "denoise").peak_vram_gb > peaks[1] + 2   # 241 frames at once
    plan = plan_memory(spec, plan_request_for(short), hw)
    times = [predict_times(spec, 832, 480, s.frames, 50, 5.0, plan, H200_CALIBRATION, window=s.window)
             for s in (short, long)]
    windows = job_windows(spec, long).count
    assert times[1].passes == 2 * windows and times[1].tokens == times[0].tokens
    assert times[1].step_seconds == pytest.approx(windows * times[0].step_seconds, rel=0.01)
    assert times[1].seconds["text_encode"] == times[0].seconds["text_encode"]   # the prompts are encoded once


# ----- runs -----------------------------------------------------------------------------------------------
def test_a_long_video_is_made_in_windows_and_says_so(selftest_models_dir, presets, outputs, tmp_path):
    engine = Engine(selftest_models_dir, CPU)
    long = tiny_request(presets, "selftest-t2v", outputs, frames=241, steps=2, seed=7)
    result, events = run_engine(engine, long)
    assert isinstance(result, JobFinished), result
    frames, _ = read_video(result.paths[0])
    assert frames.shape[0] == 241
    windows = json.loads(open(result.sidecar).read())["windows"]
    assert windows["count"] == 3 and windows["window_frames"] == 125 and windows["frames"][-1][1] == 240
    said = [(e.step, e.window, e.windows) for e in events if isinstance(e, WindowDone)]
    passes = 2   # guidance: the conditional and the unconditional pass, each in every window
    assert said == [(step, w, 3) for step in (1, 2) for _ in range(passes) for w in (1, 2, 3)]
    assert [e.step for e in events if isinstance(e, StepFinished)] == [1, 2]
    short, _ = run_engine(engine, tiny_request(presets, "selftest-t2v", outputs, frames=125, steps=2, seed=7))
    assert result.peak_ram_gb <= short.peak_ram_gb * 1.10


def test_a_video_in_one_window_is_the_ordinary_run_exactly(selftest_models_dir, presets, outputs):
    from engine.outputs.latents import load_latents

    engine = Engine(selftest_models_dir, CPU)
    runs = [run_engine(engine, tiny_request(presets, "selftest-t2v", outputs, frames=61, steps=2, seed=5, window=w,
                                            keep_latents=True))[0] for w in (0, 61)]
    assert all(isinstance(r, JobFinished) for r in runs), runs
    latents = [load_latents(json.loads(open(r.sidecar).read())["latents"])[0] for r in runs]
    assert torch.equal(latents[0], latents[1])
    assert "windows" not in json.loads(open(runs[0].sidecar).read())


def test_image_to_video_and_a_timestep_per_token_run_in_windows(selftest_models_dir, ti2v_dir, presets, outputs,
                                                                image_file):
    engine = Engine(selftest_models_dir, CPU)
    i2v, _ = run_engine(engine, tiny_request(presets, "selftest-i2v", outputs, mode="i2v", image=str(image_file),
                                             frames=241, steps=2))
    assert isinstance(i2v, JobFinished), i2v
    assert read_video(i2v.paths[0])[0].shape[0] == 241
    ti2v, events = run_engine(engine, tiny_request(presets, ti2v_dir, outputs, frames=25, window=9, overlap=4,
                                                   steps=2, width=64, height=64))
    assert isinstance(ti2v, JobFinished), ti2v
    assert {e.windows for e in events if isinstance(e, WindowDone)} == {windows_for(25, 9, 4).count} == {3}


def test_a_step_cache_with_windows_is_refused_by_the_engine_once_the_model_is_known(selftest_models_dir, presets,
                                                                                   outputs):
    engine = Engine(selftest_models_dir, CPU)
    result, _ = run_engine(engine, tiny_request(presets, "selftest-t2v", outputs, frames=241, steps=2,
                                                step_cache="first_block"))
    assert isinstance(result, JobFailed) and result.kind == "input"
    assert "denoised in windows of 125" in result.message


@pytest.mark.process
def test_generate_a_long_video_from_the_command_line(selftest_models_dir, outputs):
    done = app_main("generate", "--models-dir", str(selftest_models_dir), "--outputs", str(outputs), "--model",
                    "selftest-t2v", "--prompt", "a long cat", "--frames", "241", "--window", "65", "--overlap", "8",
                    "--steps", "2")
    assert done.returncode == 0, done.stderr
    video = next(outputs.rglob("*.mp4"))
    assert read_video(video)[0].shape[0] == 241
    sidecar = json.loads(video.with_suffix(".json").read_text())
    assert sidecar["parameters"]["window"] == 65 and sidecar["parameters"]["overlap"] == 8
    assert sidecar["windows"]["window_frames"] == 65 and sidecar["windows"]["count"] == 4
    assert done.stderr.count("in 4 windows of 65 frames") == 1, done.stderr   # said once, by the plan
