"""The order of VAE decode fallbacks after an out-of-memory error, and the streamed decode."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from engine.events import JobFinished, PhaseFinished
from engine.planning.memory import VAE_TILES
from engine.run.apply_plan import set_vae_tiling
from engine.run.decoding import decode_attempts, decode_latents, decode_stream, decoded_shape
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request


def test_a_device_decode_falls_back_to_smaller_tiles_then_the_cpu():
    largest, smaller = VAE_TILES[0], VAE_TILES[1]
    assert decode_attempts(None, "cuda", VAE_TILES) == [
        ("as planned", None, "cuda"), ("tiled", largest, "cuda"), ("on the CPU", largest, "cpu")]
    assert decode_attempts(largest, "cuda", VAE_TILES) == [
        ("as planned", largest, "cuda"), ("tiled", smaller, "cuda"), ("on the CPU", smaller, "cpu")]


def test_on_the_cpu_only_smaller_tiles_are_left_to_try():
    assert decode_attempts(None, "cpu", VAE_TILES) == [("as planned", None, "cpu"), ("tiled", VAE_TILES[0], "cpu")]
    smallest = VAE_TILES[-1]
    assert decode_attempts(smallest, "cpu", VAE_TILES) == [("as planned", smallest, "cpu")]
    assert decode_attempts(smallest, "cuda", VAE_TILES) == [
        ("as planned", smallest, "cuda"), ("tiled", smallest, "cuda"), ("on the CPU", smallest, "cpu")]


# ----- the streamed decode ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wan21_vae():
    """The self-test model's VAE (Wan2.1: 16 latent channels, 8x), random weights, seeded."""
    import torch

    from engine.models.selftest import _vae

    torch.manual_seed(0)
    return _vae()


def _latents(vae, frames: int = 13, height: int = 32, width: int = 48, seed: int = 3):
    import torch

    spatial = vae.config.scale_factor_spatial
    shape = (1, vae.config.z_dim, (frames - 1) // 4 + 1, height // spatial, width // spatial)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _video_processor(vae):
    from diffusers.video_processor import VideoProcessor

    return VideoProcessor(vae_scale_factor=vae.config.scale_factor_spatial)


@pytest.mark.parametrize("which", ["wan2.1", "wan2.2-5b"])
def test_the_streamed_decode_equals_the_whole_decode_in_any_window(which, wan21_vae, ti2v_pipe):
    vae = wan21_vae if which == "wan2.1" else ti2v_pipe.vae   # 5B-style: residual, 2x2 patches, 48 channels
    latents = _latents(vae)
    whole = decode_latents(vae, _video_processor(vae), latents, None, "cpu")
    assert whole.shape == decoded_shape(vae, latents) == (13, 32, 48, 3)
    assert len(np.unique(whole)) > 20   # pictures of noise, not a flat clamp
    for window in (1, 2, 3, 4):   # 4 latent frames: 1 + 4 + 4 + 4 video frames, the first always alone
        batches = list(decode_stream(vae, latents, "cpu", window=window))
        assert all(b.dtype == np.uint8 and b.flags.c_contiguous for b in batches)
        assert [len(b) for b in batches] == {1: [1, 4, 4, 4], 2: [1, 8, 4], 3: [1, 12], 4: [1, 12]}[window]
        streamed = np.concatenate(batches)
        if which == "wan2.1" or window == 1:
            assert np.array_equal(streamed, whole), f"window {window}"
        else:   # the 5B's decoder sums in another order over several frames: float rounding, at most one level
            levels = np.abs(streamed.astype(np.int16) - whole.astype(np.int16))
            assert levels.max() <= 1 and (levels > 0).mean() < 1e-4, f"window {window}"


def test_a_stream_closed_early_frees_the_vae_cache_and_a_tiled_plan_is_not_streamed(wan21_vae):
    latents = _latents(wan21_vae)
    stream = decode_stream(wan21_vae, latents, "cpu")
    next(stream)
    assert any(cached is not None for cached in wan21_vae._feat_map)
    stream.close()
    assert all(cached is None for cached in wan21_vae._feat_map)
    set_vae_tiling(wan21_vae, VAE_TILES[-1])
    try:
        with pytest.raises(ValueError, match="untiled"):
            next(decode_stream(wan21_vae, latents, "cpu"))
    finally:
        set_vae_tiling(wan21_vae, None)


def test_an_engine_run_streams_its_video_and_makes_the_same_file_as_the_whole_decode(model_dirs, presets, outputs,
                                                                                    tmp_path):
    """The run's mp4 is the one the whole decode and write_mp4 make from its latents; vae_decode and export
    are both timed, and the encoder was already writing when the export phase (its tail) began."""
    from engine.outputs.export import read_video, write_mp4
    from engine.outputs.latents import load_latents

    peek = PartialFiles(outputs)
    engine = Engine(tmp_path / "m", CPU, faults=peek)
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, frames=13, steps=2, keep_latents=True)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    assert {"vae_decode", "export"} <= set(result.timings)
    assert [e.phase for e in events if isinstance(e, PhaseFinished)][-2:] == ["vae_decode", "export"]
    video = Path(result.paths[0])
    assert peek.seen["vae_decode"] == [] and peek.seen["export"] == [f".{video.stem}.partial.mp4"]
    latents, _ = load_latents(json.loads(Path(result.sidecar).read_text())["latents"])
    pipe = engine.loaded.pipe
    whole = decode_latents(pipe.vae, pipe.video_processor, latents, None, "cpu")
    reference = write_mp4(whole, tmp_path / "whole.mp4", request.settings.fps)
    assert np.array_equal(read_video(video)[0], read_video(reference)[0])
    assert video.read_bytes() == reference.read_bytes()
    assert json.loads(Path(result.sidecar).read_text())["output"] == {"frames": 13, "height": 64, "width": 64,
                                                                      "fps": 16}
    assert not list(outputs.rglob(".*partial*"))


@dataclass
class PartialFiles:
    """A phase hook that only looks: the temporary files under ``folder`` as each phase starts. Before ``awaited``
    phases it gives an encoder already started up to ``wait_s`` to open its file (ffmpeg opens it after its first
    frame, later on a busy machine); the engine waits meanwhile, so a file that appears was not made by that phase."""
    folder: Path
    seen: dict = field(default_factory=dict)
    awaited: tuple = ("export",)
    wait_s: float = 10.0

    def before_phase(self, phase: str) -> None:
        deadline = time.monotonic() + (self.wait_s if phase in self.awaited else 0)
        while True:
            self.seen[phase] = sorted(p.name for p in self.folder.rglob(".*partial*"))
            if self.seen[phase] or time.monotonic() >= deadline:
                return
            time.sleep(0.02)
