"""Weights stored in another width than they compute in (the published Wan2.1 float32 files, computed in bf16): the
plan says what the load maps of them, the time plan reads their real bytes, and a loaded model lets go of its files."""
from __future__ import annotations

import gc
from pathlib import Path

import pytest

from bench.models_table import PROFILES
from engine.models.spec import KNOWN_MODELS, SELFTEST_SPECS
from engine.planning.memory import GIB, mapped_gb, stored_bytes
from engine.planning.planner import override_for, plan_memory, plan_request_for
from engine.settings.presets import load_presets
from tests.conftest import CPU

PRESETS = load_presets()
H200 = PROFILES["H200 (141 GB), 128 GB RAM"]


def _load_phase(preset: str, hardware):
    settings = PRESETS[preset].settings
    plan = plan_memory(KNOWN_MODELS[settings.model], plan_request_for(settings), hardware, override_for(settings))
    return plan, next(phase for phase in plan.phases if phase.phase == "load")


@pytest.mark.parametrize("preset, mapped_bytes", [
    ("wan21-t2v-1.3b", 5_680_910_336 * 4),        # the float32 text encoder is the largest cast
    ("fastwan21-t2v-1.3b", 5_680_910_336 * 4),    # its transformer is bf16 already: the text encoder again
    ("wan22-ti2v-5b", 4_999_787_712 * 4),         # bf16 text encoder; the float32 transformer is cast
    ("wan22-t2v-a14b", 14_288_491_584 * 4),       # one expert at a time, not both
])
def test_the_load_phase_says_the_largest_file_it_casts_from_its_map(preset, mapped_bytes):
    plan, load = _load_phase(preset, H200)
    assert load.mapped_gb == pytest.approx(mapped_bytes / GIB, abs=0.01)
    assert load.peak_ram_gb < plan.budget_ram_gb and plan.fits     # page cache: it never makes a plan not fit
    (said,) = [d for d in plan.decisions if "mapped at once" in d]
    assert f"up to {load.mapped_gb:.1f} GB of them mapped at once beside the {load.peak_ram_gb:.1f} GB" in said


def test_files_stored_as_the_plan_computes_map_nothing_beyond_the_weights():
    """On a CPU everything computes in float32: Wan2.1's float32 files are the weights, Wan2.2's bf16 text encoder
    is cast up from its map."""
    _, wan21 = _load_phase("wan21-t2v-1.3b", CPU)
    assert wan21.mapped_gb == 0.0
    _, wan22 = _load_phase("wan22-ti2v-5b", CPU)
    assert wan22.mapped_gb == pytest.approx(5_680_910_336 * 2 / GIB, abs=0.01)
    spec = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
    assert mapped_gb(spec, 4, 4) == 0.0 and mapped_gb(spec, 2, 2) > 0.0


def test_before_a_download_the_time_plan_reads_the_repository_s_own_bytes():
    from engine.planning.timing import predict_times
    from tests.helpers.machines import H200_CALIBRATION

    plan, _ = _load_phase("fastwan21-t2v-1.3b", H200)
    spec = KNOWN_MODELS["FastVideo/FastWan2.1-T2V-1.3B-Diffusers"]
    assert stored_bytes(spec) == pytest.approx(26.21e9, rel=0.005)   # tests/fixtures/published: 26.2 GB
    times = predict_times(spec, 832, 448, 61, 3, 1.0, plan, H200_CALIBRATION)
    assert times.how["load"].startswith("26.2 GB of weights read at")
    bf16 = predict_times(spec, 832, 448, 61, 3, 1.0, plan, H200_CALIBRATION, weight_bytes=int(13.2e9))
    assert times.seconds["load"] == pytest.approx(bf16.seconds["load"] * 26.21 / 13.2, rel=0.01)


def _mapped(folder: Path) -> int:
    """This process's memory maps of files under ``folder`` (Linux)."""
    return sum(1 for line in Path("/proc/self/maps").read_text().splitlines() if str(folder) in line)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_a_transformer_cast_from_float32_files_lets_go_of_them(model_dirs, tmp_path):
    """diffusers keeps a Wan transformer's norms and embeddings in float32: loaded from float32 files into bf16,
    they stay views of the files' map, which keeps every file mapped for as long as the model lives."""
    import torch
    from diffusers import WanTransformer3DModel

    from engine.run.apply_plan import let_go_of_files

    folder = tmp_path / "transformer"
    WanTransformer3DModel.from_pretrained(model_dirs["tiny-t2v"] / "transformer").save_pretrained(
        folder, max_shard_size="40KB")
    model = WanTransformer3DModel.from_pretrained(folder, dtype=torch.bfloat16)
    gc.collect()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16, torch.float32}
    assert _mapped(folder) > 0
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    let_go_of_files(model)
    gc.collect()
    assert _mapped(folder) == 0
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())


def test_a_transformer_loaded_alone_holds_what_diffusers_loads(model_dirs):
    """The engine's load of a transformer stored wider than it computes (alone, its files let go of) gives the very
    tensors diffusers' own from_pretrained gives, in the same dtypes."""
    from dataclasses import replace

    import torch
    from diffusers import WanTransformer3DModel

    from engine.run.apply_plan import load_transformers_alone, loads_transformers_alone

    settings = PRESETS["selftest-t2v"].settings
    spec = SELFTEST_SPECS[settings.model]
    plan = replace(plan_memory(spec, plan_request_for(settings), CPU, override_for(settings)), dtype="bfloat16")
    assert loads_transformers_alone(spec, plan)            # float32 files, a bf16 plan
    ours = load_transformers_alone(model_dirs["tiny-t2v"], plan, "", {})["transformer"].state_dict()
    theirs = WanTransformer3DModel.from_pretrained(model_dirs["tiny-t2v"] / "transformer",
                                                   dtype=torch.bfloat16).state_dict()
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in ours)


def test_the_stored_load_bench_gives_a_load_between_two_samples_the_memory_around_it():
    """bench/stored_load.py samples the child's memory every 20 ms in a thread; a load that no sample fell inside (a
    short one, or the thread not scheduled on a busy machine) reported 0 GB, and its test failed."""
    from bench.stored_load import Memory

    memory = Memory()
    memory.samples = [(1.0, 1 * GIB, 0), (1.3, 2 * GIB, GIB), (2.0, 3 * GIB, GIB)]
    assert memory.peaks(1.2, 1.4) == {"rss_gb": 2.0, "anon_gb": 1.0}           # the sample inside
    assert memory.peaks(1.5, 1.8) == {"rss_gb": 3.0, "anon_gb": 2.0}           # none inside: the two around it
    assert memory.peaks(2.5, 3.0) == {"rss_gb": 3.0, "anon_gb": 2.0}           # after the last: the last
    assert Memory().peaks(0, 1) == {"rss_gb": 0.0, "anon_gb": 0.0}             # never sampled
