"""Wan2.2 TI2V-5B makes videos from text and from an image with one set of weights (a tiny look-alike here)."""
from __future__ import annotations

import numpy as np
from PIL import Image

from engine.events import JobFailed, JobFinished, PhaseStarted
from engine.models.refs import resolve_model
from engine.outputs.export import read_video
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request


def _image(path, colour):
    Image.new("RGB", (64, 64), colour).save(path)
    return str(path)


def test_a_text_and_image_model_takes_an_image_without_loading_again(ti2v_dir, presets, outputs, tmp_path):
    assert resolve_model(str(ti2v_dir), tmp_path).takes_image
    engine = Engine(tmp_path / "m", CPU)
    red, blue = _image(tmp_path / "red.png", (220, 20, 20)), _image(tmp_path / "blue.png", (20, 20, 220))
    common = dict(frames=5, steps=2, width=64, height=64, seed=3, mode="i2v")
    first, events = run_engine(engine, tiny_request(presets, ti2v_dir, outputs, image=red, **common))
    assert isinstance(first, JobFinished), first
    assert "load" in [e.phase for e in events if isinstance(e, PhaseStarted)]
    second, events = run_engine(engine, tiny_request(presets, ti2v_dir, outputs, image=blue, **common))
    assert isinstance(second, JobFinished), second
    assert "load" not in [e.phase for e in events if isinstance(e, PhaseStarted)]   # the same weights
    text, events = run_engine(engine, tiny_request(presets, ti2v_dir, outputs, **{**common, "mode": "t2v"}))
    assert isinstance(text, JobFinished) and "load" not in [e.phase for e in events if isinstance(e, PhaseStarted)]
    red_video, blue_video, text_video = (read_video(r.paths[0])[0] for r in (first, second, text))
    assert red_video.shape == (5, 64, 64, 3)
    # The image is the first frame's condition: another image, another start; the same seed without one differs.
    assert np.abs(red_video[0].astype(int) - blue_video[0].astype(int)).mean() > 1
    assert np.abs(red_video[0].astype(int) - text_video[0].astype(int)).mean() > 1


def test_a_last_frame_is_refused_by_a_model_that_cannot_use_one(ti2v_dir, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU)
    image = _image(tmp_path / "red.png", (220, 20, 20))
    result, _ = run_engine(engine, tiny_request(presets, ti2v_dir, outputs, mode="i2v", image=image, last_image=image,
                                                frames=5, steps=2, width=64, height=64))
    assert isinstance(result, JobFailed) and result.kind == "input"
    assert "cannot use a last frame" in result.message
