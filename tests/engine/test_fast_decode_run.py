"""A run that decodes with the fast decoder: found before any heavy work, said on the page and in the sidecar."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.events import JobFailed, JobFinished, PhaseStarted
from engine.models.fast_decoder_file import MODEL_OWN_FOLDER, find_fast_decoder
from engine.models.selftest import SELFTEST_T2V, ensure_selftest_model, write_selftest_fast_decoder
from engine.outputs.export import read_video
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request


def _model_with_fast_decoder(model_dirs, tmp_path) -> Path:
    folder = tmp_path / "tiny-t2v"
    shutil.copytree(model_dirs["tiny-t2v"], folder)
    write_selftest_fast_decoder(folder)
    return folder


def test_a_fast_decoded_run_says_so_and_differs_from_the_vae(model_dirs, presets, tmp_path):
    folder = _model_with_fast_decoder(model_dirs, tmp_path)
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    fast, events = run_engine(engine, tiny_request(presets, folder, tmp_path / "out", decoder="fast"))
    assert isinstance(fast, JobFinished), fast
    sidecar = json.loads(Path(fast.sidecar).read_text())
    assert sidecar["speed"]["decoder"] == "fast (taew2_1)" and sidecar["speed"]["approximate"] is True
    assert sidecar["parameters"]["decoder"] == "fast"
    assert any("with the fast decoder taew2_1: approximate" in getattr(e, "message", "") for e in events)
    frames, _ = read_video(Path(fast.paths[0]))
    assert frames.shape == (9, 64, 64, 3)          # 3 latent frames -> 4 x 3 - 3 frames, 8x the latent size
    exact, _ = run_engine(engine, tiny_request(presets, folder, tmp_path / "out"))
    exact_frames, _ = read_video(Path(exact.paths[0]))
    assert json.loads(Path(exact.sidecar).read_text())["speed"] == {**sidecar["speed"], "decoder": "vae",
                                                                    "approximate": False}
    assert not np.array_equal(frames, exact_frames)


@pytest.mark.parametrize("decoder, file", [("fast", "taew2_1.safetensors"), ("vae_light", "lightvaew2_1.safetensors")])
def test_without_its_decoder_file_offline_the_run_is_refused_before_it_denoises(model_dirs, presets, tmp_path,
                                                                                monkeypatch, decoder, file):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out",
                                                     decoder=decoder))
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert "fast_decoders" in result.message and file in result.message and "offline" in result.message
    assert not any(isinstance(e, PhaseStarted) and e.phase in ("load", "denoise") for e in events)


def test_the_self_test_model_carries_its_own_fast_decoder(tmp_path):
    folder = ensure_selftest_model(SELFTEST_T2V, tmp_path)
    own = folder / MODEL_OWN_FOLDER / "taew2_1.safetensors"
    assert own.is_file() and find_fast_decoder(tmp_path, 16, folder) == own
    assert find_fast_decoder(tmp_path, 16) is None    # not shared with other models


def test_a_fast_decoder_preview_has_one_frame_per_latent_frame_at_preview_size(tmp_path):
    import torch

    from engine.models.fast_decoder_file import random_fast_decoder_state, write_fast_decoder
    from engine.run.fast_decoder import load_fast_decoder
    from engine.run.preview import DecoderPreview, encode_animation

    path = write_fast_decoder(tmp_path / "taew2_1.safetensors", random_fast_decoder_state(16, 1))
    preview = DecoderPreview(load_fast_decoder(path, "cpu"), max_side=64)
    x0 = torch.randn(1, 16, 3, 12, 20, generator=torch.Generator().manual_seed(0))
    frames = preview.frames(x0)
    assert frames.shape == (3, 38, 64, 3) and frames.dtype == np.uint8 and frames.std() > 0
    big = preview.frames(torch.randn(1, 16, 2, 72, 40))       # above 64 latent pixels: decoded at half size
    assert big.shape == (2, 64, 36, 3)
    assert encode_animation(frames, 4.0)[:4] in (b"RIFF", b"GIF8")
