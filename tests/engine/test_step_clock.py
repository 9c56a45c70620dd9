"""The first denoising step is timed from the transformer's first pass: the pipeline's preparation before it
(image-to-video encodes its conditioning frames) belongs to the denoise phase, and its detail says so."""
from __future__ import annotations

import time

from engine.events import JobFinished, PhaseFinished
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request

PREPARING_S = 1.0


def test_the_pipelines_preparation_is_not_the_first_steps(selftest_models_dir, presets, outputs, image_file):
    engine = Engine(selftest_models_dir, CPU)
    request = tiny_request(presets, "selftest-i2v", outputs, mode="i2v", image=str(image_file), steps=3)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    pipe = engine.loaded.for_mode("i2v")
    prepare = pipe.prepare_latents

    def slow_prepare(*args, **kwargs):   # as long as a big video's conditioning frames take on a GPU
        time.sleep(PREPARING_S)
        return prepare(*args, **kwargs)

    pipe.prepare_latents = slow_prepare
    try:
        result, events = run_engine(engine, request)
    finally:
        del pipe.prepare_latents
    assert isinstance(result, JobFinished), result
    steps = engine_steps(result)
    assert len(steps) == 3 and steps[0] < PREPARING_S, steps
    assert result.timings["denoise"] >= PREPARING_S + sum(steps) * 0.9
    denoise = [e for e in events if isinstance(e, PhaseFinished) and e.phase == "denoise"][-1]
    assert "before the first step" in denoise.detail and float(denoise.detail.split()[0]) >= PREPARING_S
    # A text-to-video run prepares next to nothing: no word of it.
    result, events = run_engine(engine, tiny_request(presets, "selftest-t2v", outputs, steps=2))
    denoise = [e for e in events if isinstance(e, PhaseFinished) and e.phase == "denoise"][-1]
    assert isinstance(result, JobFinished) and denoise.detail == ""


def engine_steps(result: JobFinished) -> list[float]:
    import json
    from pathlib import Path

    return json.loads(Path(result.sidecar).read_text())["step_seconds"]
