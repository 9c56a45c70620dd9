"""Memory across models, in the engine process as the page drives it (the WorkerClient): a swap frees every module
of the old model before the new one loads, whatever else the app asked the engine meanwhile."""
from __future__ import annotations

import gc
import shutil
from dataclasses import dataclass

import pytest

from engine.events import JobFinished
from engine.service.worker import WorkerClient
from tests.conftest import tiny_request

pytestmark = pytest.mark.process

COMPONENTS = ("WanTransformer3DModel", "AutoencoderKLWan", "UMT5EncoderModel", "CLIPVisionModelWithProjection")


def live_components() -> dict[str, int]:
    """How many modules of each pipeline component class are alive in this process (after a collection)."""
    gc.collect()
    counts: dict[str, int] = {}
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in COMPONENTS:
            counts[name] = counts.get(name, 0) + 1
    return counts


@dataclass(frozen=True)
class NothingLoadedAtLoad:
    """A phase hook that only looks: a load that starts while any component of a model is still alive fails,
    naming what lives (the hook runs in the engine process)."""

    def before_phase(self, phase: str) -> None:
        if phase == "load" and (alive := live_components()):
            raise RuntimeError(f"still alive as a load starts: {alive}")


@pytest.fixture
def two_models(selftest_models_dir, tmp_path):
    """A models folder with the self-test text-to-video model and a copy of it under another name."""
    folder = tmp_path / "models"
    shutil.copytree(selftest_models_dir, folder)
    shutil.copytree(folder / "selftest-t2v", folder / "copy-t2v")
    return folder


def test_a_swap_frees_every_module_of_the_old_model_before_the_new_one_loads(two_models, presets, tmp_path,
                                                                             image_file):
    from safetensors.torch import save_file

    from tests.helpers.loras import original_lora

    lora = two_models / "loras" / "style.safetensors"
    lora.parent.mkdir(exist_ok=True)
    save_file(original_lora(), lora)
    client = WorkerClient(two_models, faults=NothingLoadedAtLoad())
    try:
        for model, extra in (("selftest-t2v", {}), ("copy-t2v", {"loras": ((str(lora), 0.8),)}),
                             ("selftest-t2v", {}), ("selftest-i2v", {"image": str(image_file)}), ("copy-t2v", {})):
            mode = "i2v" if "image" in extra else "t2v"
            request = tiny_request(presets, str(two_models / model), tmp_path / "out", mode=mode, steps=2, **extra)
            events = list(client.submit(request))
            assert isinstance(events[-1], JobFinished), getattr(events[-1], "message", events[-1])
            # The page asks what the engine holds after every job (the status thread answers).
            assert client.memory(timeout=10).model is not None
            assert client.loaded_files(timeout=10) is not None
    finally:
        client.close()


def test_trimming_the_heap_gives_freed_ram_back_to_the_system():
    """What an unload does after freeing the model's tensors (release_memory): freed heap blocks that the C library
    kept for the process go back to the system."""
    import sys

    import psutil

    from engine.device.runtime import trim_heap

    if not sys.platform.startswith("linux"):
        pytest.skip("malloc_trim is glibc's")
    process = psutil.Process()
    blocks = [bytearray(60_000) for _ in range(4000)]   # 240 MB in blocks below the size glibc maps on its own
    kept = blocks[::16]   # one block in 16 stays: the freed ones between cannot shrink the heap by themselves
    del blocks
    before = process.memory_info().rss
    trim_heap()
    after = process.memory_info().rss
    assert before - after > 150e6, (before, after)
    assert len(kept) == 250


def test_out_of_memory_with_a_gguf_transformer_steps_down_the_planner_s_own_ladder(model_dirs, presets, tmp_path):
    """The engine's step-down asks the planner for the rungs below: a GGUF transformer stays quantised, so the
    fp8 rungs are not on its ladder (the settings check refuses them too) and group offload steps to leaf offload."""
    import json
    from pathlib import Path

    from engine.planning.planner import LADDER, rungs_below
    from engine.run.engine import Engine
    from tests.conftest import CPU, run_engine
    from tests.helpers.weights import original_state, write_gguf
    from tests.faults import InjectedFaults

    gguf = write_gguf(original_state(model_dirs["tiny-t2v"]), tmp_path / "tiny-Q8_0.gguf")
    engine = Engine(tmp_path / "m", CPU, faults=InjectedFaults({"denoise": 1}))
    request = tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out", transformer=str(gguf),
                           strategy="group_offload", steps=2)
    result, _ = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert sidecar["step_downs"] == [{"phase": "denoise", "from": "group_offload", "to": "leaf_offload"}]
    spec = engine.loaded.model.spec
    assert rungs_below(spec, "group_offload") == ("leaf_offload", "disk_offload")
    assert "fp8_group_offload" in LADDER and rungs_below(spec, "disk_offload") == ()


def test_the_page_plans_with_the_attention_backend_the_engine_runs(selftest_models_dir, presets, tmp_path):
    """This machine's measured fastest attention backend is read from the calibration beside the outputs by the
    engine as it probes the device, and after a job that measured it: the profile the page plans with (the
    WorkerClient's) names what the run uses, before and after."""
    from dataclasses import replace

    from engine.device.calibrate import calibrate
    from engine.events import PlanReady
    from engine.outputs.export_rates import export_rates

    outputs = tmp_path / "out"
    client = WorkerClient(selftest_models_dir, outputs_dir=outputs, env={"WAN_STUDIO_CALIBRATE": "1"})
    try:
        first = client.hardware_profile()
        assert first.attention == ""   # never measured here
        # A calibration kept beside the outputs (as a first job on this machine would keep it), whose attention
        # probe found another backend fastest than torch's own.
        rates = calibrate("cpu", "float32", quick=True, export_rates=export_rates)
        replace(rates, device_name=first.device_name, backend=first.backend, torch_version=first.torch_version,
                attention_seconds={"native": 0.2, "_native_math": 0.1}).save(outputs)
        events = list(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)))
        assert isinstance(events[-1], JobFinished), events[-1]
        ran = next(e.plan for e in events if isinstance(e, PlanReady)).attention_backend
        assert ran == "_native_math"
        assert client.hardware_profile().attention == ran   # the page's next plan says the same
    finally:
        client.close()
    # A fresh engine process reads it as it probes the device: the page's first plan says it already.
    again = WorkerClient(selftest_models_dir, outputs_dir=outputs, env={"WAN_STUDIO_CALIBRATE": "1"})
    try:
        assert again.hardware_profile().attention == "_native_math"
    finally:
        again.close()
