"""Every rung of the ladder runs end to end on the CPU, and out-of-memory steps down."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.events import Info, JobFinished, PhaseFinished, PlanReady
from engine.outputs.export import read_video
from engine.planning.planner import LADDER, TWO_EXPERT_RUNGS
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request
from tests.faults import InjectedFaults

pytestmark = pytest.mark.slow   # in process, but every memory strategy run on the self-test model


@pytest.fixture(scope="module")
def reference(model_dirs, presets, tmp_path_factory):
    """The all-on-device video for the same request, to compare every rung against."""
    engine = Engine(tmp_path_factory.mktemp("m"), CPU)
    out = tmp_path_factory.mktemp("ref")
    result, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], out, seed=5))
    return read_video(result.paths[0])[0]


@pytest.mark.parametrize("strategy", [name for name in LADDER if name not in TWO_EXPERT_RUNGS])   # tests/engine/test_experts.py: those
def test_each_rung_produces_the_video(strategy, model_dirs, presets, outputs, tmp_path, reference):
    engine = Engine(tmp_path / "m", CPU)
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, seed=5, strategy=strategy)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    plan = next(e.plan for e in events if isinstance(e, PlanReady))
    assert plan.strategy == strategy
    frames = read_video(result.paths[0])[0]
    assert frames.shape == reference.shape
    if strategy.startswith("fp8"):
        # fp8 weights change the numbers a little, never the shape or the range.
        assert np.abs(frames.astype(int) - reference.astype(int)).mean() < 64
    else:
        assert np.abs(frames.astype(int) - reference.astype(int)).max() <= 2
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert sidecar["plan"]["strategy"] == strategy


def test_out_of_memory_in_denoise_steps_down_one_rung(model_dirs, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU, faults=InjectedFaults({"denoise": 1}))
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs))
    assert isinstance(result, JobFinished), result
    messages = [e.message for e in events if isinstance(e, Info)]
    assert any("Out of memory during denoise with 'all_on_device'" in m and "'text_encoder_offload'" in m
               for m in messages)
    assert any("'text_encoder_offload' worked" in m for m in messages)
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert sidecar["step_downs"] == [{"phase": "denoise", "from": "all_on_device", "to": "text_encoder_offload"}]
    assert sidecar["plan"]["strategy"] == "text_encoder_offload"
    assert len(sidecar["step_seconds"]) == sidecar["parameters"]["steps"]


def test_repeated_out_of_memory_walks_further_down(model_dirs, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU, faults=InjectedFaults({"text_encode": 2}))
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs))
    assert isinstance(result, JobFinished), result
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert [s["to"] for s in sidecar["step_downs"]] == ["text_encoder_offload", "group_offload"]


def test_out_of_memory_in_decode_retries_the_decode_only(model_dirs, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU, faults=InjectedFaults({"vae_decode": 1}))
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, steps=3))
    assert isinstance(result, JobFinished), result
    denoise_runs = [e for e in events if isinstance(e, PhaseFinished) and e.phase == "denoise"]
    assert len(denoise_runs) == 1, "the denoise must not be repeated"
    messages = [e.message for e in events if isinstance(e, Info)]
    assert any("retrying tiled from the same latents" in m for m in messages)
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert sidecar["decode_fallback"] == "tiled" and sidecar["step_downs"] == []


def test_out_of_memory_everywhere_fails_with_a_clear_message(model_dirs, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU, faults=InjectedFaults({"denoise": 99}))
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs))
    assert result.kind == "runtime" and result.message.startswith("Out of device memory during denoise")
    assert not list(outputs.rglob("*.mp4"))


def test_a_streamed_text_encoder_encodes_the_same_and_the_loaded_model_follows_a_new_placement(
        model_dirs, presets, outputs, tmp_path, reference):
    """The text encoder streamed layer by layer (diffusers' group offload hooks) gives the same video; a
    later run on the same loaded model with another placement moves it without a reload, and back."""
    from engine.run.apply_plan import is_streaming

    engine = Engine(tmp_path / "m", CPU)

    def generate(prompt, place):
        result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, seed=5,
                                                         prompt=prompt, text_encoder=place))
        assert isinstance(result, JobFinished), result
        phases = [e.phase for e in events if isinstance(e, PhaseFinished)]
        plan = next(e.plan for e in events if isinstance(e, PlanReady))
        assert plan.text_encoder == place
        return result, phases

    streamed, phases = generate("a red fox in the snow", "streamed")
    assert "text_encode" in phases and is_streaming(engine.loaded.pipe.text_encoder)
    assert np.abs(read_video(streamed.paths[0])[0].astype(int) - reference.astype(int)).max() <= 2
    loaded = engine.loaded.pipe
    _, phases = generate("a fox asleep", "cpu")
    assert engine.loaded.pipe is loaded and "load" not in phases and "transfer" in phases
    assert not is_streaming(engine.loaded.pipe.text_encoder)
    assert all(p.device.type == "cpu" for p in engine.loaded.pipe.text_encoder.parameters())
    _, phases = generate("a fox awake", "streamed")
    assert engine.loaded.pipe is loaded and "transfer" in phases and is_streaming(engine.loaded.pipe.text_encoder)
    _, phases = generate("a fox at dawn", "streamed")
    assert "transfer" not in phases, "moved although the placement had not changed"


def test_a_disk_plan_writes_the_transformer_to_its_folder_and_an_unload_removes_it(model_dirs, presets, outputs,
                                                                                   tmp_path):
    import os

    from engine.run.disk_offload import OFFLOAD_FOLDER

    stale = tmp_path / "m" / OFFLOAD_FOLDER / "999999999"   # an engine process that was killed with a disk plan
    stale.mkdir(parents=True)
    engine = Engine(tmp_path / "m", CPU)
    result, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, strategy="disk_offload"))
    assert isinstance(result, JobFinished), result
    folder = tmp_path / "m" / OFFLOAD_FOLDER / str(os.getpid()) / "transformer"
    written = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    weights = sum(p.numel() * p.element_size() for p in engine.loaded.pipe.transformer.parameters())
    assert written >= weights * 0.9, (written, weights)   # the blocks' weights (the shared layers stay in RAM)
    assert not stale.exists()
    engine.unload()
    assert not folder.parent.exists()


def test_another_vae_precision_reads_the_vae_alone_again_and_decodes_as_a_fresh_load_would(
        model_dirs, presets, outputs, tmp_path):
    """The transformer and the text encoder stay loaded; the VAE comes from the folder in the new precision
    (not cast: a bfloat16 VAE cast back up is not the float32 one), so each video equals a fresh engine's."""
    def video(engine, dtype, seed):
        result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, vae_dtype=dtype,
                                                         seed=seed))
        assert isinstance(result, JobFinished), result
        return result, events, read_video(Path(result.paths[0]))[0]

    engine = Engine(tmp_path / "models", CPU, preview_seconds=-1)
    _, _, first = video(engine, "float32", 1)
    swapped, events, half = video(engine, "bfloat16", 2)
    assert "load" not in swapped.timings and "transfer" in swapped.timings
    assert any(isinstance(e, Info) and "The VAE is read again in bfloat16" in e.message for e in events)
    fresh = Engine(tmp_path / "fresh-models", CPU, preview_seconds=-1)
    assert np.array_equal(half, video(fresh, "bfloat16", 2)[2])
    back, _, again = video(engine, "float32", 1)
    assert "load" not in back.timings and np.array_equal(again, first)
    engine.unload()
    fresh.unload()
