"""Smoother and larger: the steps after a video is written, as a run's options and on an output already made.

Real files all the way: the self-test model's videos, ffmpeg's minterpolate, RIFE and ESRGAN files with random
weights in their published layouts (engine/post/rife.py, engine/post/upscale.py), Lanczos.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.errors import InputError
from engine.events import JobCancelled, JobFailed, JobFinished, PhaseFinished, PostProgress
from engine.outputs.export import read_video, write_mp4, write_png
from engine.outputs.sidecar import read_sidecar
from engine.post.apply import Media, StepRunner, run_steps
from engine.post.rife import write_random_rife
from engine.post.steps import PostStep, post_steps
from engine.post.upscale import write_random_esrgan
from engine.run.engine import Engine
from engine.run.job import Cancelled, Job
from engine.settings.values import Settings, check_settings
from tests.conftest import CPU, one_torch_thread, run_engine, tiny_request


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a busy 2-core machine two make the CPU convolutions many times slower."""
    with one_torch_thread():
        yield


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Offline, as the app's own tests run it (tests/conftest.py app_env): without a RIFE file the smoother would
    fetch one from the Hub (tests/engine/test_rife_fetch.py fetches it from a stand-in)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def models_with_files(tmp_path) -> Path:
    """A models folder with a RIFE file and a 2x ESRGAN file (random weights, published layouts)."""
    folder = tmp_path / "models"
    write_random_rife(_made(folder / "interpolators") / "rife49.pth")
    write_random_esrgan(_made(folder / "upscalers") / "esrgan_x2.pth", scale=2)
    return folder


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _video(path: Path, frames: int = 5, fps: int = 16) -> Media:
    """A small video of smooth colour ramps (so the codec keeps it close), as a step reads it."""
    ramp = np.linspace(0, 255, 48, dtype=np.float32)[None, :, None]
    clip = np.stack([np.broadcast_to(ramp * (0.5 + 0.1 * i), (32, 48, 3)) for i in range(frames)]).astype(np.uint8)
    write_mp4(clip, path, fps)
    return Media.read(path)


def _steps(media: Media, steps, models: Path, dest: Path, cancel=lambda: False):
    events: list = []
    job = Job("post", events.append, cancel)
    made, records = run_steps(job, StepRunner(models, "cpu", job), steps, media, dest)
    return made, records, events, job


def test_the_steps_run_in_order_and_say_what_they_make():
    assert post_steps(1, 1) == ()
    assert post_steps(2, 4) == (PostStep("interpolate", 2), PostStep("upscale", 4))
    assert PostStep("interpolate", 4).shape_after(81, 832, 480, 16) == (321, 832, 480, 64)
    assert PostStep("upscale", 2).shape_after(81, 832, 480, 16) == (81, 1664, 960, 16)


def test_minterpolate_without_a_rife_file_doubles_the_frames_less_one_and_the_fps(tmp_path):
    media = _video(tmp_path / "in.mp4")
    made, records, events, job = _steps(media, (PostStep("interpolate", 2),), tmp_path / "no-models",
                                        tmp_path / "out.mp4")
    frames, fps = read_video(made.path)
    assert (made.frames, made.fps) == (len(frames), fps) == (9, 32)
    assert records[0].method == "ffmpeg minterpolate" and records[0].seconds > 0
    assert "interpolate" in job.timings and any("no RIFE file" in getattr(e, "message", "") and "offline" in
                                                getattr(e, "message", "") for e in events)
    assert [(e.done, e.total) for e in events if isinstance(e, PostProgress)][-1] == (9, 9)
    original, _ = read_video(media.path)
    assert np.abs(frames[0].astype(int) - original[0]).mean() < 3      # the video's own frames stay


def test_rife_with_a_file_in_the_published_layout_makes_4x_and_keeps_the_video_s_frames(tmp_path, models_with_files):
    media = _video(tmp_path / "in.mp4")
    made, records, events, _ = _steps(media, (PostStep("interpolate", 4),), models_with_files, tmp_path / "out.mp4")
    frames, fps = read_video(made.path)
    assert (len(frames), fps) == (17, 64) and records[0].method == "RIFE 4.7-4.9 (rife49.pth)"
    original, _ = read_video(media.path)
    for i in range(5):   # every fourth frame is the video's own (through the codec once more)
        assert np.abs(frames[4 * i].astype(int) - original[i]).mean() < 3, i


def test_larger_with_an_esrgan_file_and_with_lanczos_doubles_the_size(tmp_path, models_with_files):
    media = _video(tmp_path / "in.mp4")
    made, records, _, _ = _steps(media, (PostStep("upscale", 2),), models_with_files, tmp_path / "esrgan.mp4")
    assert read_video(made.path)[0].shape == (5, 64, 96, 3) and "ESRGAN" in records[0].method
    made, records, _, _ = _steps(media, (PostStep("upscale", 2),), tmp_path / "no-models", tmp_path / "lanczos.mp4")
    assert read_video(made.path)[0].shape == (5, 64, 96, 3) and records[0].method == "Lanczos"


def test_both_steps_leave_one_file_and_no_file_between(tmp_path):
    media = _video(tmp_path / "in.mp4")
    made, records, _, _ = _steps(media, post_steps(2, 2), tmp_path / "none", tmp_path / "out.mp4")
    assert read_video(made.path)[0].shape == (9, 64, 96, 3) and [r.step for r in records] == ["interpolate", "upscale"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["in.mp4", "out.mp4"]


def test_a_still_is_made_larger_as_a_png(tmp_path):
    write_png(np.full((32, 48, 3), 90, np.uint8), tmp_path / "in.png")
    made, _, _, _ = _steps(Media.read(tmp_path / "in.png"), (PostStep("upscale", 4),), tmp_path / "none",
                           tmp_path / "out.png")
    from PIL import Image

    with Image.open(made.path) as image:
        assert image.size == (192, 128) and image.getpixel((5, 5)) == (90, 90, 90)


def test_a_cancel_during_a_step_leaves_no_file(tmp_path):
    media = _video(tmp_path / "in.mp4", frames=9)
    events: list = []
    job = Job("post", events.append, lambda: any(isinstance(e, PostProgress) for e in events))
    with pytest.raises(Cancelled):
        run_steps(job, StepRunner(tmp_path / "none", "cpu", job), post_steps(2, 2), media, tmp_path / "out.mp4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mp4"]


def test_factors_and_what_they_would_make_are_checked_with_a_sentence():
    base = Settings("selftest-t2v", "t2v", 64, 64, 9, 4, 5.0, 3.0)
    assert check_settings(base.changed(interpolate="2", upscale=4.0)).upscale == 4
    assert check_settings(base.changed(width=2048, height=2048, upscale=4)).upscale == 4   # 8192: what H.264 holds
    for change, words in ((dict(interpolate=3), "interpolate 3 is not a factor"),
                          (dict(upscale=True), "upscale must be a whole number"),
                          (dict(mode="t2i", frames=1, interpolate=2), "a still has no frames"),
                          (dict(fps=120, interpolate=4), "480 fps"),
                          (dict(width=2048, upscale=8), "not a factor")):
        with pytest.raises(InputError, match=f"(?i){words}"):
            check_settings(base.changed(**change))


def test_a_run_with_both_options_writes_the_final_file_its_sidecar_and_the_chart_s_phases(tmp_path, presets, outputs):
    engine = Engine(tmp_path / "models", CPU)
    request = tiny_request(presets, "selftest-t2v", outputs, frames=9, steps=2, interpolate=2, upscale=2)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    frames, fps = read_video(result.paths[0])
    width, height = request.settings.width, request.settings.height
    assert frames.shape == (17, 2 * height, 2 * width, 3) and fps == 2 * request.settings.fps
    data = json.loads(Path(result.sidecar).read_text())
    assert data["output"] == {"frames": 17, "height": 2 * height, "width": 2 * width, "fps": fps}
    assert [(p["step"], p["factor"], p["method"]) for p in data["post"]] == [
        ("interpolate", 2, "ffmpeg minterpolate"), ("upscale", 2, "Lanczos")]
    assert [e.phase for e in events if isinstance(e, PhaseFinished)][-2:] == ["interpolate", "upscale"]
    again = read_sidecar(result.sidecar).settings()   # Reuse settings: the run's own frames, with its steps
    assert (again.frames, again.fps, again.interpolate, again.upscale) == (9, request.settings.fps, 2, 2)
    assert sorted(p.name for p in Path(result.paths[0]).parent.iterdir() if p.name.startswith(".")) == []


def test_a_run_cancelled_in_its_step_after_the_decode_keeps_nothing_new(tmp_path, presets, outputs):
    engine = Engine(tmp_path / "models", CPU)
    events: list = []
    request = tiny_request(presets, "selftest-t2v", outputs, frames=9, steps=2, interpolate=2)
    result = engine.run(request, "job", events.append, lambda: any(isinstance(e, PostProgress) for e in events))
    assert isinstance(result, JobCancelled) and result.phase == "interpolate", result
    # The decoded video, its sidecar, its latents and the step's file between: all gone, as the page says.
    assert [p.name for p in Path(outputs).rglob("*") if p.is_file()] == []


def test_a_broken_upscaler_file_is_refused_before_the_run(tmp_path, presets, outputs):
    models = tmp_path / "models"
    (_made(models / "upscalers") / "broken.pth").write_bytes(b"not a model at all")
    result, events = run_engine(Engine(models, CPU), tiny_request(presets, "selftest-t2v", outputs, steps=2, upscale=2))
    assert isinstance(result, JobFailed) and "broken.pth" in result.message, result
    assert not any(getattr(e, "phase", None) == "denoise" for e in events) and not list(outputs.rglob("*.mp4"))


def test_smoother_on_an_output_writes_a_new_one_beside_it_that_reuse_makes_in_one_run(tmp_path, presets, outputs):
    engine = Engine(tmp_path / "models", CPU)
    first, _ = run_engine(engine, tiny_request(presets, "selftest-t2v", outputs, frames=9, steps=2))
    original = Path(first.paths[0])
    before = original.read_bytes()
    events: list = []
    made = engine.post_output(str(original), "interpolate", 2, "post", events.append)
    assert isinstance(made, JobFinished), made
    new = Path(made.paths[0])
    assert new.name == original.stem + "_smoother2x.mp4" and original.read_bytes() == before
    assert read_video(new)[0].shape[0] == 17
    sidecar = read_sidecar(made.sidecar)
    assert sidecar.post[0]["source"] == original.name and sidecar.settings().interpolate == 2
    assert sidecar.settings().frames == 9 and sidecar.frames == 17
    assert set(read_sidecar(first.sidecar).timings) <= set(sidecar.timings) and "interpolate" in sidecar.timings
    refused = engine.post_output(str(new), "interpolate", 4, "again", lambda e: None)
    assert isinstance(refused, JobFailed) and "already 2x smoother" in refused.message, refused
    twice = engine.post_output(str(new), "interpolate", 2, "twice", lambda e: None)
    assert isinstance(twice, JobFinished) and read_sidecar(twice.sidecar).settings().interpolate == 4
    cancelled = engine.post_output(str(original), "upscale", 2, "stop", lambda e: None, lambda: True)
    assert isinstance(cancelled, JobCancelled) and not list(original.parent.glob("*larger*"))
