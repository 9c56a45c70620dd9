"""torch.compile's caches in the app's own folder: the index of compiled sizes, written by an engine whose
transformer ran compiled and read by the engine process's hardware profile, and the plan that compiles a cached
size for fewer passes than a first compile needs."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.device.compile_cache import (COMPILE_CACHE_FOLDER, INDEX_FILE, cache_env, compiled_sizes,
                                         remember_compiled)
from engine.models.spec import KNOWN_MODELS
from engine.planning.planner import PlanRequest, plan_memory
from engine.planning.speed import COMPILE_MIN_PASSES, COMPILE_MIN_PASSES_CACHED, SpeedRequest, compile_key
from tests.helpers.machines import HARDWARE

T2V_13 = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
H200 = replace(HARDWARE["h200"], triton=True, torch_version="2.13.0")


def _key(hardware=H200, width=832, height=480, frames=81, image_to_video=False):
    return compile_key(T2V_13, width, height, frames, 0, image_to_video, hardware.device_name, hardware.torch_version)


def test_the_caches_live_beside_the_outputs_and_the_index_keeps_each_size_once(tmp_path):
    env = cache_env(tmp_path)
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / COMPILE_CACHE_FOLDER / "inductor"),
                   "TRITON_CACHE_DIR": str(tmp_path / COMPILE_CACHE_FOLDER / "triton")}
    assert compiled_sizes(tmp_path) == () and compiled_sizes(None) == ()
    assert remember_compiled(tmp_path, "a") == ("a",)
    assert remember_compiled(tmp_path, "b") == ("a", "b")
    assert remember_compiled(tmp_path, "a") == ("b", "a")            # the newest last, once
    assert compiled_sizes(tmp_path) == ("b", "a")
    (tmp_path / COMPILE_CACHE_FOLDER / INDEX_FILE).write_text("{not json")
    assert compiled_sizes(tmp_path) == ()                              # a damaged index: nothing known


def test_a_size_s_key_names_what_its_kernels_depend_on():
    assert _key() != _key(width=480, height=480)                       # other tokens
    assert _key() != _key(image_to_video=True)
    assert _key() != _key(replace(H200, device_name="NVIDIA H100"))
    assert _key() != _key(replace(H200, torch_version="2.14.0"))
    assert _key() == _key(frames=81)


def test_a_cached_size_is_compiled_from_fewer_passes_and_the_plan_says_why():
    twenty = PlanRequest(832, 480, 81, speed=SpeedRequest(steps=COMPILE_MIN_PASSES_CACHED, guidance=1.0))
    assert COMPILE_MIN_PASSES_CACHED < COMPILE_MIN_PASSES
    cold = plan_memory(T2V_13, twenty, H200)
    assert not cold.compile
    assert any(f"it pays from {COMPILE_MIN_PASSES})" in d for d in cold.decisions)
    warm = plan_memory(T2V_13, twenty, replace(H200, compiled_sizes=(_key(),)))
    assert warm.compile
    assert any("compiled here before and its kernels are in the compile cache" in d for d in warm.decisions)
    other_size = plan_memory(T2V_13, PlanRequest(480, 480, 81, speed=twenty.speed),
                             replace(H200, compiled_sizes=(_key(),)))
    assert not other_size.compile
    four = PlanRequest(832, 480, 81, speed=SpeedRequest(steps=4, guidance=1.0))
    assert not plan_memory(T2V_13, four, replace(H200, compiled_sizes=(_key(),))).compile   # 4 passes: not worth it


def test_an_engine_whose_transformer_ran_compiled_remembers_its_size(model_dirs, presets, tmp_path):
    """A real engine on the CPU, its tiny transformer's blocks compiled as the engine compiles them (kernels are
    built lazily, at the first pass: none is run here), then the record of a finished run."""
    from engine.run.engine import Engine
    from engine.run.speedups import compile_transformer
    from tests.conftest import CPU, run_engine, tiny_request

    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1, outputs_dir=tmp_path / "out")
    request = tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out")
    run_engine(engine, request)
    engine._remember_compiled(request)
    assert compiled_sizes(tmp_path / "out") == ()                      # it ran uncompiled: nothing to remember
    compile_transformer(engine.loaded.pipe)
    engine._remember_compiled(request)
    spec = engine.loaded.model.spec
    key = compile_key(spec, 64, 64, request.settings.frames, 0, False, CPU.device_name, CPU.torch_version)
    assert compiled_sizes(tmp_path / "out") == (key,) and engine.hardware.compiled_sizes == (key,)


@pytest.mark.process
def test_the_engine_process_plans_with_the_sizes_kept_beside_the_outputs(tmp_path):
    from engine.service.worker import WorkerClient

    remember_compiled(tmp_path, "kept-size")
    client = WorkerClient(tmp_path / "models", outputs_dir=tmp_path)
    try:
        assert client.hardware(timeout=120).compiled_sizes == ("kept-size",)
    finally:
        client.close()
    assert json.loads((tmp_path / COMPILE_CACHE_FOLDER / INDEX_FILE).read_text()) == {"compiled": ["kept-size"]}
