"""Live previews: the colour maps, the exact clean estimate for both schedulers, and previews in real runs."""
from __future__ import annotations

import io
import pickle
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from engine.events import Info, JobFinished, LatentsSaved, PhaseFinished, PhaseStarted, PreviewReady, StepFinished
from engine.models.selftest import SELFTEST_T2V, _vae, build_selftest_pipeline
from engine.outputs.latents import load_latents
from engine.run.engine import Engine
from engine.run.preview import (
    DERIVE_LATENT_FRAMES,
    DERIVE_LATENT_SIZE,
    DERIVE_SEED,
    PreviewMap,
    clean_estimate,
    encode_animation,
    fit_map,
    known_map,
    latents_to_frames,
    preview_map_for,
)
from engine.run.schedulers import make_scheduler
from engine.service.worker import WorkerClient
from tests.conftest import CPU, run_engine, tiny_request

FASTWAN_SIGMAS = (1.0, 0.757, 0.522)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("preview-models"), CPU, preview_seconds=0)
    yield engine
    engine.unload()


def run(engine, request, preview_seconds=0.0):
    engine.preview_seconds = preview_seconds
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    return events


def previews_of(events) -> list[PreviewReady]:
    return [e for e in events if isinstance(e, PreviewReady)]


def frames_of(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    frames = []
    for index in range(getattr(image, "n_frames", 1)):
        image.seek(index)
        frames.append(np.asarray(image.convert("RGB"), dtype=np.int16))
    return np.stack(frames)


def decoded(preview: PreviewReady) -> np.ndarray:
    """The preview's frames, checked against what the event says about them."""
    frames = frames_of(preview.image)
    assert frames.shape == (preview.frames, preview.height, preview.width, 3)
    return frames


# ----- colour maps ---------------------------------------------------------------
def test_known_map_holds_the_published_wan21_factors():
    preview_map = known_map()
    assert preview_map.factors.shape == (16, 3) and preview_map.bias.shape == (3,) and preview_map.source == "known"
    np.testing.assert_allclose(preview_map.factors[0], [-0.1299, -0.1692, 0.2932])
    np.testing.assert_allclose(preview_map.factors[6], [-0.3477, -0.4059, -0.2925])
    np.testing.assert_allclose(preview_map.factors[15], [0.1984, 0.0913, 0.1861])
    np.testing.assert_allclose(preview_map.bias, [-0.1835, -0.0868, -0.3360])
    sixteen = preview_map_for(_vae())
    assert sixteen.source == "known" and np.array_equal(sixteen.factors, preview_map.factors)


def test_a_48_channel_vae_gets_the_least_squares_map_of_its_decoded_colours(ti2v_pipe):
    vae = ti2v_pipe.vae
    derived = preview_map_for(vae)
    assert derived.source == "derived" and derived.factors.shape == (48, 3) and derived.bias.shape == (3,)
    # Decode the same random latents independently: un-normalise, decode, pool frame 0 alone, then groups
    # of 4 frames, and 16 x 16 pixels.
    frames, size = DERIVE_LATENT_FRAMES, DERIVE_LATENT_SIZE
    latents = torch.randn((1, 48, frames, size, size), generator=torch.Generator("cpu").manual_seed(DERIVE_SEED))
    mean = torch.tensor(vae.config.latents_mean).view(1, 48, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, 48, 1, 1, 1)
    with torch.inference_mode():
        video = vae.decode(latents * std + mean, return_dict=False)[0]
    assert video.shape == (1, 3, 1 + 4 * (frames - 1), 16 * size, 16 * size)
    groups = [video[:, :, 1 + 4 * k:5 + 4 * k].mean(dim=2, keepdim=True) for k in range(frames - 1)]
    grouped = torch.cat([video[:, :, :1], *groups], dim=2)
    colours = torch.nn.functional.avg_pool3d(grouped, (1, 16, 16))[0].permute(1, 2, 3, 0).reshape(-1, 3).double()
    x = latents[0].permute(1, 2, 3, 0).reshape(-1, 48).double()
    fitted = x @ torch.from_numpy(derived.factors).double() + torch.from_numpy(derived.bias).double()
    residual = colours - fitted
    bias_only = ((colours - colours.mean(dim=0)) ** 2).sum()
    assert (residual ** 2).sum() < bias_only < (colours ** 2).sum()
    # The normal equations hold: what is left is uncorrelated with every channel and the bias, so no
    # other linear map fits these colours better. (A random-weight decoder mixes neighbouring latent
    # pixels, so the best per-pixel map explains little of it; real Wan VAEs are close to linear here.)
    regressors = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
    assert (regressors.T @ residual).abs().max() < 1e-4 * len(x)


def test_fitting_recovers_an_exact_linear_map():
    generator = torch.Generator().manual_seed(3)
    factors, bias = torch.randn(48, 3, generator=generator), torch.randn(3, generator=generator)
    latents = torch.randn(1, 48, 2, 16, 16, generator=generator)
    colours = (torch.einsum("bcthw,cr->brthw", latents, factors) + bias.view(1, 3, 1, 1, 1))
    fitted = fit_map(latents, colours)
    np.testing.assert_allclose(fitted.factors, factors.numpy(), atol=1e-5)
    np.testing.assert_allclose(fitted.bias, bias.numpy(), atol=1e-5)


def test_latents_map_to_clamped_uint8_frames():
    preview_map = PreviewMap(np.eye(2, 3, dtype=np.float32), np.array([0.0, 0.0, -0.5], np.float32), "derived")
    latents = torch.zeros(1, 2, 3, 4, 5)
    latents[0, 0, 1] = 0.5    # frame 1: red at half
    latents[0, 1, 2] = 9.0    # frame 2: green far past 1, clamped
    frames = latents_to_frames(latents, preview_map)
    assert frames.dtype == np.uint8 and frames.shape == (3, 4, 5, 3)
    assert frames[0, 0, 0].tolist() == [128, 128, 64]
    assert frames[1, 0, 0].tolist() == [191, 128, 64]
    assert frames[2, 3, 4].tolist() == [128, 255, 64]
    with pytest.raises(ValueError, match="16 latent channels, these latents have 2"):
        latents_to_frames(latents, known_map())


def test_frames_encode_to_a_looping_animation_or_a_still():
    frames = np.random.default_rng(0).integers(0, 256, (5, 6, 10, 3), dtype=np.uint8)
    animation = Image.open(io.BytesIO(encode_animation(frames, fps=4.0)))
    assert animation.format == "WEBP" and animation.n_frames == 5 and animation.size == (256, 154)
    assert animation.info["loop"] == 0   # forever
    for index in range(5):
        animation.seek(index)
        animation.load()
        assert animation.info["duration"] == 250   # 4 latent frames a second: 16 fps video frames, 4 per latent
    still = Image.open(io.BytesIO(encode_animation(frames[:1], fps=4.0, max_side=64)))
    assert getattr(still, "n_frames", 1) == 1 and still.size == (64, 38)


# ----- the clean estimate ----------------------------------------------------------
@pytest.mark.parametrize("sigmas", [None, (1.0, 0.8, 0.6, 0.4)], ids=["unipc", "euler"])
def test_clean_estimate_is_the_x0_of_the_model_output(sigmas):
    """x0 = x_t - sigma_t * v with x_t and v read off the transformer itself and sigma_t from the scheduler."""
    pipe = build_selftest_pipeline(SELFTEST_T2V)
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = make_scheduler(dict(pipe.scheduler.config), 3.0, sigmas)
    calls = []
    handle = pipe.transformer.register_forward_hook(
        lambda module, args, kwargs, output: calls.append((kwargs["hidden_states"], output[0])), with_kwargs=True)
    estimates, previous = [], [None]

    def on_step_end(pipeline, i, t, tensors):
        estimates.append(clean_estimate(pipeline.scheduler, tensors["latents"], previous[0]))
        previous[0] = tensors["latents"]
        return {}

    try:
        pipe("a red fox", height=32, width=32, num_frames=5, num_inference_steps=4, guidance_scale=1.0,
             max_sequence_length=16, output_type="latent", callback_on_step_end=on_step_end,
             generator=torch.Generator("cpu").manual_seed(0))
    finally:
        handle.remove()
    assert len(calls) == len(estimates) == 4
    for step, ((x_t, v), estimate) in enumerate(zip(calls, estimates)):
        if sigmas and step == 0:
            assert estimate is None   # Euler: the initial noise is never seen by the callback
            continue
        expected = x_t - float(pipe.scheduler.sigmas[step]) * v
        assert estimate.shape == expected.shape
        torch.testing.assert_close(estimate, expected, rtol=1e-5, atol=1e-5)
        if step < 3:   # a real estimate, not the latents themselves
            assert not torch.allclose(estimate, x_t, atol=1e-3)


# ----- previews in real runs -----------------------------------------------------------
@pytest.mark.parametrize("mode, frames", [("t2v", 9), ("i2v", 13), ("t2i", 1)])
def test_a_run_previews_every_step_with_every_latent_frame(engine, model_dirs, presets, outputs, image_file,
                                                            mode, frames):
    model = model_dirs["tiny-i2v" if mode == "i2v" else "tiny-t2v"]
    extra = {"image": str(image_file)} if mode == "i2v" else {}
    events = run(engine, tiny_request(presets, model, outputs, mode=mode, frames=frames, steps=4, **extra))
    previews = previews_of(events)
    assert [p.step for p in previews] == [1, 2, 3, 4] and all(p.total == 4 for p in previews)
    latent_frames = (frames - 1) // 4 + 1
    for preview in previews:
        assert preview.mime == "image/webp" and preview.source == "known" and preview.frames == latent_frames
        assert max(preview.width, preview.height) == 256 and preview.seconds >= 0
        assert len(pickle.dumps(preview)) < 60_000
        decoded(preview)
    # Each preview follows its step's StepFinished, inside the denoise phase.
    names = [(type(e).__name__, getattr(e, "phase", None) or getattr(e, "step", None)) for e in events]
    start, end = names.index(("PhaseStarted", "denoise")), names.index(("PhaseFinished", "denoise"))
    for preview in previews:
        at = events.index(preview)
        assert start < at < end and names[at - 1] == ("StepFinished", preview.step)
    # The last step's estimate is where the denoising ended: its preview is that of the final latents.
    latents, _ = load_latents(next(e.path for e in events if isinstance(e, LatentsSaved)))
    expected = frames_of(encode_animation(latents_to_frames(latents, known_map()), fps=4.0))
    assert np.abs(decoded(previews[-1]) - expected).mean() < 2.0
    assert np.abs(decoded(previews[0]) - expected).mean() > 2.0


def test_euler_previews_start_at_the_second_step(engine, model_dirs, presets, outputs):
    events = run(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, sigmas=FASTWAN_SIGMAS, steps=3))
    previews = previews_of(events)
    assert [p.step for p in previews] == [2, 3]
    # The last Euler step lands on sigma 0: its estimate is exactly the final latents.
    latents, _ = load_latents(next(e.path for e in events if isinstance(e, LatentsSaved)))
    expected = frames_of(encode_animation(latents_to_frames(latents, known_map()), fps=4.0))
    assert np.array_equal(decoded(previews[-1]), expected)


def test_previews_are_throttled_or_off(engine, model_dirs, presets, outputs):
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, steps=4)
    assert [p.step for p in previews_of(run(engine, request, preview_seconds=3600))] == [1]
    assert previews_of(run(engine, request, preview_seconds=-1)) == []


# A map for 8 channels on a model with 16: latents_to_frames fails on the denoising thread.
# A map to 5 colours: the frames are taken, and Pillow refuses them on the encoding thread.
@pytest.mark.parametrize("channels, colours, error", [(8, 3, "ValueError"), (16, 5, "TypeError")],
                         ids=["taking-frames", "encoding"])
def test_a_failing_preview_turns_previews_off_and_the_run_goes_on(engine, model_dirs, presets, outputs,
                                                                 channels, colours, error):
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, steps=3)
    run(engine, request)
    engine.loaded.preview_map = PreviewMap(np.zeros((channels, colours), np.float32),
                                           np.zeros(colours, np.float32), "derived")
    try:
        events = run(engine, request)
    finally:
        engine.loaded.preview_map = None
    assert previews_of(events) == []
    notes = [e for e in events if isinstance(e, Info) and "preview" in e.message]
    assert len(notes) == 1 and "previews are off for this run" in notes[0].message and error in notes[0].message
    assert "at step 1 " in notes[0].message
    assert len([e for e in events if isinstance(e, StepFinished)]) == 3
    denoised = next(i for i, e in enumerate(events) if isinstance(e, PhaseFinished) and e.phase == "denoise")
    assert events.index(notes[0]) < denoised


def test_previews_are_encoded_off_the_denoising_thread_and_keep_their_order(engine, model_dirs, presets, outputs):
    """The animation is encoded while the next step runs; each preview is still emitted after its own
    step's StepFinished and before the next one's, and the last one inside the denoise phase."""
    engine.preview_seconds = 0
    seen = []
    result = engine.run(tiny_request(presets, model_dirs["tiny-t2v"], outputs, steps=5), "job",
                        lambda event: seen.append((event, threading.current_thread())))
    assert isinstance(result, JobFinished)
    main = threading.current_thread()
    previews = [(e, thread) for e, thread in seen if isinstance(e, PreviewReady)]
    assert [e.step for e, _ in previews] == [1, 2, 3, 4, 5]
    assert all(thread is not main and thread.name.startswith("live-preview") for _, thread in previews)
    assert all(thread is main for e, thread in seen if not isinstance(e, PreviewReady))
    order = [(type(e).__name__, getattr(e, "step", None) or getattr(e, "phase", None)) for e, _ in seen]
    for preview, _ in previews:
        at = order.index(("PreviewReady", preview.step))
        assert order[at - 1] == ("StepFinished", preview.step)
        assert order[at + 1] == (("StepFinished", preview.step + 1) if preview.step < 5
                                 else ("PhaseFinished", "denoise"))
    assert not any(t.name.startswith("live-preview") for t in threading.enumerate()), "the thread outlived the run"


def test_a_model_without_known_factors_previews_with_a_derived_map_made_once(ti2v_dir, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU, preview_seconds=0)
    try:
        events = run(engine, tiny_request(presets, ti2v_dir, outputs, frames=5, steps=2))
        previews = previews_of(events)
        assert [p.source for p in previews] == ["derived", "derived"] and previews[0].frames == 2
        made = engine.loaded.preview_map
        assert made.source == "derived" and made.factors.shape == (48, 3)
        run(engine, tiny_request(presets, ti2v_dir, outputs, frames=5, steps=2, seed=7))
        assert engine.loaded.preview_map is made
    finally:
        engine.unload()


def test_decode_again_makes_no_previews(engine, model_dirs, presets, outputs):
    events = run(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, steps=2, keep_latents=True))
    path = next(e.path for e in events if isinstance(e, LatentsSaved))
    again = []
    assert isinstance(engine.decode_saved(path, "again", again.append), JobFinished)
    assert previews_of(again) == [] and not any(isinstance(e, (PhaseStarted, PhaseFinished)) and e.phase == "denoise"
                                                for e in again)


def test_the_worker_passes_the_preview_interval_to_its_engine(tmp_path):
    options = WorkerClient(tmp_path, preview_seconds=2.5).options
    assert Engine(tmp_path, CPU, **options).preview_seconds == 2.5
    assert "preview_seconds" not in WorkerClient(tmp_path).options
