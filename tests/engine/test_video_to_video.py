"""Video to video: an input video made again by a text-to-video model, by how much its strength says.

Real parts all the way: the self-test model, its VAE, ffmpeg reading the input, and diffusers' own
WanVideoToVideoPipeline to compare with.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.errors import InputError
from engine.events import JobFailed, JobFinished, PhaseFinished, StepFinished
from engine.outputs.export import read_video, write_mp4
from engine.outputs.history import find_entry, reuse_values
from engine.run.engine import Engine
from engine.settings.request import check_request, check_request_with_notes
from engine.settings.values import Settings
from engine.settings.videos import fitted_frames, read_video as read_input
from tests.conftest import CPU, one_torch_thread, run_engine, tiny_request

SIZE = dict(width=64, height=64, frames=9, steps=4)


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("v2v-models"), CPU)
    yield engine
    engine.unload()


@pytest.fixture(scope="module")
def input_video(tmp_path_factory) -> Path:
    """A 24-frame 96x64 clip at 24 fps of a moving colour ramp: another rate and shape than the runs'."""
    ramp = np.linspace(0, 255, 96 * 64 * 3).reshape(64, 96, 3)
    clip = np.stack([np.roll(ramp, 5 * i, axis=1) for i in range(24)]).astype(np.uint8)
    return write_mp4(clip, tmp_path_factory.mktemp("inputs") / "clip.mp4", 24)


def _run(engine, request):
    result, events = run_engine(engine, check_request(request))
    assert isinstance(result, JobFinished), result
    return result, events


def _latents(result: JobFinished) -> torch.Tensor:
    from safetensors.torch import load_file

    path = Path(result.sidecar).with_suffix("").with_name(Path(result.sidecar).stem + ".latents.safetensors")
    return next(iter(load_file(path).values()))


def test_the_steps_run_are_the_last_strength_part_of_them():
    settings = Settings("m", "v2v", 64, 64, 9, 10, 5.0, 3.0, strength=0.55)
    assert settings.denoise_steps == 5
    assert Settings("m", "v2v", 64, 64, 9, 10, 5.0, 3.0, strength=1.0).denoise_steps == 10
    assert Settings("m", "v2v", 64, 64, 9, 3, 5.0, 3.0, strength=0.3).denoise_steps == 0
    assert Settings("m", "t2v", 64, 64, 9, 10, 5.0, 3.0, strength=0.3).denoise_steps == 10   # only video to video


def test_strength_1_is_exactly_the_text_to_video_run_of_its_seed(engine, presets, outputs, input_video):
    t2v, _ = _run(engine, tiny_request(presets, "selftest-t2v", outputs, keep_latents=True, **SIZE))
    v2v, events = _run(engine, tiny_request(presets, "selftest-t2v", outputs, mode="v2v", video=str(input_video),
                                            strength=1.0, keep_latents=True, **SIZE))
    assert torch.equal(_latents(v2v), _latents(t2v))
    assert np.array_equal(read_video(v2v.paths[0])[0], read_video(t2v.paths[0])[0])
    assert "video_encode" not in v2v.timings   # nothing of the input is used
    assert any("input video is not used" in getattr(e, "message", "") for e in events)


def test_strength_0_gives_the_input_back_through_the_vae(engine, presets, outputs, input_video):
    result, events = _run(engine, tiny_request(presets, "selftest-t2v", outputs, mode="v2v", video=str(input_video),
                                               strength=0.0, keep_latents=True, **SIZE))
    assert not any(isinstance(e, StepFinished) for e in events) and "denoise" not in result.timings
    assert result.timings["video_encode"] > 0
    # What the VAE makes of the input, encoded and decoded by diffusers itself.
    vae = engine.loaded.pipe.vae
    frames = np.stack(list(fitted_frames(input_video, 64, 64, 16, 9)))
    clip = torch.from_numpy(frames).permute(3, 0, 1, 2)[None].float() / 127.5 - 1
    with torch.no_grad():
        encoded = vae.encode(clip).latent_dist.mode()
        round_trip = vae.decode(encoded).sample
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    assert torch.allclose(_latents(result).float(), (encoded - mean) / std, atol=1e-5)   # the input's own latents
    expected = ((round_trip[0].permute(1, 2, 3, 0).clamp(-1, 1) + 1) * 127.5).round().numpy()
    made = read_video(result.paths[0])[0].astype(np.float64)
    assert made.shape == expected.shape == (9, 64, 64, 3)
    assert np.abs(made - expected).mean() < 4.0   # equal but for the mp4's own compression (of noise-like frames)


def test_a_middle_strength_equals_diffusers_video_to_video_pipeline(engine, presets, outputs, input_video):
    from diffusers import UniPCMultistepScheduler, WanVideoToVideoPipeline
    from PIL import Image

    request = check_request(tiny_request(presets, "selftest-t2v", outputs, mode="v2v", video=str(input_video),
                                         strength=0.5, keep_latents=True, **SIZE))
    result, events = _run(engine, request)
    steps = [e for e in events if isinstance(e, StepFinished)]
    assert [e.step for e in steps] == [1, 2] and {e.total for e in steps} == {2}   # the last 2 of 4
    assert [e.phase for e in events if isinstance(e, PhaseFinished)].index("video_encode") < \
        [e.phase for e in events if isinstance(e, PhaseFinished)].index("denoise")
    pipe = engine.loaded.pipe
    theirs = WanVideoToVideoPipeline(tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae,
                                     transformer=pipe.transformer,
                                     scheduler=UniPCMultistepScheduler.from_config(pipe.scheduler.config,
                                                                                   flow_shift=request.settings.shift))
    theirs.set_progress_bar_config(disable=True)
    frames = [Image.fromarray(f) for f in fitted_frames(input_video, 64, 64, 16, 9)]
    expected = theirs(video=frames, prompt=request.prompt, negative_prompt=request.negative_prompt, height=64,
                      width=64, num_inference_steps=4, guidance_scale=request.settings.guidance, strength=0.5,
                      generator=torch.Generator("cpu").manual_seed(request.seed), output_type="latent").frames
    assert torch.allclose(_latents(result).float(), expected.float(), atol=1e-4)


def test_the_input_is_kept_and_reuse_fills_the_video_to_video_tab(engine, presets, outputs, input_video):
    result, _ = _run(engine, tiny_request(presets, "selftest-t2v", outputs, mode="v2v", video=str(input_video),
                                          strength=0.5, **SIZE))
    kept = Path(result.paths[0]).with_name(Path(result.paths[0]).stem + ".input.mp4")
    assert kept.read_bytes() == input_video.read_bytes()
    entry = find_entry(outputs, f"{kept.parent.name}/{Path(result.paths[0]).name}")
    values = reuse_values(entry)
    assert values.tab == "v2v" and values.video == str(kept) and values.settings.strength == 0.5
    again, _ = _run(engine, tiny_request(presets, "selftest-t2v", outputs, mode="v2v", video=values.video,
                                         strength=values.settings.strength, seed=values.seed, **SIZE))
    assert np.array_equal(read_video(again.paths[0])[0], read_video(result.paths[0])[0])


def test_an_input_too_short_or_unreadable_or_missing_is_refused_before_any_work(presets, outputs, input_video,
                                                                                 tmp_path):
    # 24 frames at 24 fps hold 16 at 16 fps: at most 13 (4k+1).
    with pytest.raises(InputError, match=r"has 16 frames at 16 fps .* make at most 13 frames"):
        check_request(tiny_request(presets, "selftest-t2v", outputs, mode="v2v", video=str(input_video),
                                   **{**SIZE, "frames": 17}))
    fake = tmp_path / "notes.mp4"
    fake.write_text("not a video")
    with pytest.raises(InputError, match="is not a readable video"):
        check_request(tiny_request(presets, "selftest-t2v", outputs, mode="v2v", video=str(fake), **SIZE))
    with pytest.raises(InputError, match="(?i)video to video needs an input video"):
        check_request(tiny_request(presets, "selftest-t2v", outputs, mode="v2v", **SIZE))
    with pytest.raises(InputError, match="(?i)strength 1.5 is out of range"):
        check_request(tiny_request(presets, "selftest-t2v", outputs, mode="v2v", video=str(input_video),
                                   strength=1.5, **SIZE))
    with pytest.raises(InputError, match="(?i)a video to make again was given but the mode is text-to-video"):
        check_request(tiny_request(presets, "selftest-t2v", outputs, video=str(input_video), **SIZE))


def test_the_notes_say_what_preparing_the_input_changes(presets, outputs, input_video):
    _, notes = check_request_with_notes(tiny_request(presets, "selftest-t2v", outputs, mode="v2v",
                                                     video=str(input_video), **{**SIZE, "frames": 5}))
    said = " ".join(notes)
    assert "24 fps and is read at 16 fps" in said and "cropped away" in said and "first 5 of its 16 frames" in said
    assert read_input(input_video).usable_frames(16) == 13


def test_an_image_to_video_model_is_refused_for_video_to_video(engine, presets, outputs, input_video):
    request = tiny_request(presets, "selftest-i2v", outputs, mode="v2v", video=str(input_video), **SIZE)
    request = request.with_values(model="selftest-i2v")
    result, _ = run_engine(engine, check_request(request))
    assert isinstance(result, JobFailed) and "is an image-to-video model; video to video" in result.message


def test_wan22_a14b_s_two_experts_and_ti2v_5b_make_a_video_again(engine, presets, outputs, input_video, two_experts,
                                                                   ti2v_dir):
    """Both run on their loaded pipeline: A14B's kept steps go to the expert their timesteps belong to (here the
    last half of 4 steps, all below the 0.875 boundary: the low-noise expert alone); TI2V-5B's latents are 16x
    smaller than its frames."""
    result, events = _run(engine, tiny_request(presets, str(two_experts), outputs, mode="v2v", video=str(input_video),
                                               strength=0.5, **SIZE))
    experts = json.loads(Path(result.sidecar).read_text())["experts"]
    assert experts["steps"] == {"transformer": 0, "transformer_2": 2}
    assert len([e for e in events if isinstance(e, StepFinished)]) == 2
    request = tiny_request(presets, str(ti2v_dir), outputs, mode="v2v", video=str(input_video), strength=0.5,
                           keep_latents=True, **SIZE)
    made, _ = _run(engine, request)
    assert _latents(made).shape[-2:] == (4, 4) and read_video(made.paths[0])[0].shape == (9, 64, 64, 3)
