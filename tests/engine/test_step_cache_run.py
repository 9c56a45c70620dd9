"""A run with a step cache: approximate, different from the uncached run, and said so in the sidecar."""
from __future__ import annotations

import json
from pathlib import Path

from engine.events import Info, JobFinished
from engine.outputs.latents import load_latents
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request


def _latents_of(result: JobFinished):
    sidecar = json.loads(Path(result.sidecar).read_text())
    return load_latents(Path(sidecar["latents"]))[0], sidecar


def test_a_cached_run_differs_from_the_uncached_one_and_says_so(model_dirs, presets, tmp_path):
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    ask = dict(steps=10, keep_latents=True)
    plain, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", **ask))
    cached, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out",
                                                     step_cache="taylor", **ask))
    again, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", **ask))
    base, plain_sidecar = _latents_of(plain)
    approx, sidecar = _latents_of(cached)
    assert not (approx == base).all()
    assert (_latents_of(again)[0] == base).all()      # the cache is gone after its run: exact again
    assert sidecar["speed"]["step_cache"] == "taylor" and sidecar["speed"]["approximate"] is True
    assert "TaylorSeer" in sidecar["speed"]["step_cache_detail"]
    assert plain_sidecar["speed"]["approximate"] is False and plain_sidecar["speed"]["step_cache"] is None
    assert any(isinstance(e, Info) and e.message.startswith("Step cache (approximate)") for e in events)


def test_magcache_calibrates_once_per_model_and_step_count_then_caches(model_dirs, presets, tmp_path):
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    ask = dict(steps=10, keep_latents=True)
    plain, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", **ask))
    first, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out",
                                               step_cache="mag", **ask))
    calibrating, sidecar = _latents_of(first)
    assert "calibrat" in sidecar["speed"]["step_cache_detail"]
    assert (calibrating == _latents_of(plain)[0]).all()     # a calibrating run computes every step
    assert list((tmp_path / "models" / ".calibration").rglob("*.json"))
    second, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out",
                                                step_cache="mag", **ask))
    assert "calibrat" not in _latents_of(second)[1]["speed"]["step_cache_detail"]
