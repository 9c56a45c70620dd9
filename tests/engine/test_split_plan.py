"""Planning a job over several GPUs (pure): how many the job takes, and how they share the denoise."""
from __future__ import annotations

from dataclasses import replace

import pytest

from engine.device.hardware import GpuDevice, HardwareProfile
from engine.models.spec import KNOWN_MODELS
from engine.planning import memory as mem
from engine.planning.plan import Override
from engine.planning.planner import gpus_for, override_for, plan_memory, plan_request_for
from engine.planning.split import choose_split
from engine.settings.presets import load_presets

T2V_14B = "Wan-AI/Wan2.1-T2V-14B-Diffusers"


def cards(count: int, gb: float) -> HardwareProfile:
    """A machine of ``count`` alike CUDA cards of ``gb`` GB each, with room in RAM for any offload."""
    return HardwareProfile(backend="cuda", device_name="card", vram_total_gb=gb, vram_free_gb=gb - 1,
                           ram_total_gb=128, ram_available_gb=120,
                           devices=tuple(GpuDevice(i, "card", gb, gb - 1) for i in range(count)))


@pytest.fixture(scope="module")
def hd_14b():
    """Wan2.1 T2V 14B at 1280x720, 81 frames: weights of ~29 GB, activations that decide the rest."""
    return load_presets()["wan21-t2v-14b-720p"].settings


def test_automatic_takes_the_fewest_gpus_that_keep_the_transformer_on_the_device(hd_14b):
    spec = KNOWN_MODELS[hd_14b.model]
    assert plan_memory(spec, plan_request_for(hd_14b), cards(2, 36)).strategy == "group_offload"
    for count in (2, 4):
        ranks, why = gpus_for(hd_14b, spec, cards(count, 36))
        assert ranks == 2, why
        assert "needs 'group_offload'" in why and "split across 2 (ulysses)" in why
    # On 33 GB cards half the activations are not enough; a quarter is.
    assert gpus_for(hd_14b, spec, cards(2, 33))[0] == 1
    assert gpus_for(hd_14b, spec, cards(4, 33))[0] == 4


def test_automatic_stays_on_one_gpu_when_the_job_fits_or_splitting_cannot_help(hd_14b):
    spec = KNOWN_MODELS[hd_14b.model]
    ranks, why = gpus_for(hd_14b, spec, cards(4, 80))
    assert ranks == 1 and "fits on it" in why
    ranks, why = gpus_for(hd_14b, spec, cards(4, 24))   # the weights alone leave no room: splitting divides none
    assert ranks == 1 and "each GPU holds the whole model" in why
    assert gpus_for(hd_14b, spec, cards(1, 36)) == (1, "One GPU: the machine has no other.")


def test_an_explicit_count_wins_capped_by_the_gpus_present(hd_14b):
    spec = KNOWN_MODELS[hd_14b.model]
    assert gpus_for(replace(hd_14b, gpus=3), spec, cards(4, 80)) == (3, "3 GPUs, as the settings ask.")
    ranks, why = gpus_for(replace(hd_14b, gpus=8), spec, cards(4, 80))
    assert ranks == 4 and "8 GPUs asked for" in why and "has 4 GPUs" in why
    assert gpus_for(replace(hd_14b, gpus=1), spec, cards(2, 33))[0] == 1


def test_a_split_plan_holds_the_whole_model_and_a_share_of_the_activations_on_each_gpu(hd_14b):
    spec, hw = KNOWN_MODELS[hd_14b.model], cards(2, 80)
    one = plan_memory(spec, plan_request_for(hd_14b), hw, Override(guidance_batch=False))   # one pass's activations
    two = plan_memory(spec, replace(plan_request_for(hd_14b), ranks=2), hw)
    assert one.split is None and two.split.kind == "ulysses" and two.split.ranks == 2
    assert one.strategy == two.strategy == "all_on_device"
    (one_denoise, one_after), (two_denoise, two_after) = (
        [next(p.peak_vram_gb for p in plan.phases if p.phase == name) for name in ("denoise", "export")]
        for plan in (one, two))
    assert one_after == two_after, "the weights on each GPU are not divided"
    activations = one_denoise - one_after - mem.RUN_OVERHEAD_GB
    assert two_denoise - two_after - mem.RUN_OVERHEAD_GB == pytest.approx(activations / 2, abs=0.02)
    assert any("Split across 2 GPUs" in sentence for sentence in two.decisions)


@pytest.mark.parametrize("ref, heads", [("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", 12), (T2V_14B, 40),
                                        ("Wan-AI/Wan2.2-TI2V-5B-Diffusers", 24)])
def test_ulysses_needs_the_gpus_to_divide_the_head_count(ref, heads):
    assert KNOWN_MODELS[ref].transformer.heads == heads
    for ranks in range(2, 9):
        split = choose_split(ranks, heads, 32760, "native")
        assert split.possible == (heads % ranks == 0), (ranks, split)
        assert split.kind in ("ulysses", "")


def test_ring_takes_over_where_the_backend_returns_the_log_sum_exp_and_the_refusal_says_what_to_do():
    assert choose_split(3, 40, 32760, "flash").kind == "ring"
    assert choose_split(3, 40, 32760, "_native_cudnn").kind == "ring"
    refused = choose_split(3, 40, 32760, "native")
    assert not refused.possible
    assert "3 GPUs do not divide the model's 40 attention heads" in refused.reason
    assert "log-sum-exp" in refused.reason and "use 2, 4, 5, 8" in refused.reason
    uneven = choose_split(4, 40, 75 * 3, "native")   # a sequence that does not cut in four
    assert not uneven.possible and "225 tokens do not split into 4 equal parts" in uneven.reason


def test_a_step_cache_that_decides_per_gpu_which_steps_to_skip_cannot_run_split():
    refused = choose_split(2, 40, 32760, "native", step_cache="mag")
    assert not refused.possible and "turn the step cache off or run on one GPU" in refused.reason
    assert choose_split(2, 40, 32760, "native", step_cache="taylor").kind == "ulysses"


def test_the_smallest_card_decides_whether_a_split_job_fits(hd_14b):
    """Every rank holds the whole model: a 36 GB card beside a 24 GB one does not make a split that fits."""
    spec = KNOWN_MODELS[hd_14b.model]
    mixed = replace(cards(2, 36), devices=(GpuDevice(0, "card", 36, 35), GpuDevice(1, "small", 24, 23)))
    ranks, why = gpus_for(hd_14b, spec, mixed)
    assert ranks == 1 and "each GPU holds the whole model" in why, why
    assert gpus_for(hd_14b, spec, cards(2, 36))[0] == 2     # the same machine with two alike cards splits


def test_without_nccl_nothing_splits_and_the_plan_says_why(hd_14b):
    """PyTorch for Windows has no NCCL: the automatic choice stays on one GPU, an asked-for split is refused."""
    spec = KNOWN_MODELS[hd_14b.model]
    bare = replace(cards(2, 36), collectives="")
    ranks, why = gpus_for(hd_14b, spec, bare)
    assert ranks == 1 and "no NCCL" in why and "each GPU still serves its own jobs" in why
    plan = plan_memory(spec, replace(plan_request_for(hd_14b), ranks=2), bare)
    assert not plan.split.possible and "no NCCL" in plan.split.reason
    assert any("cannot be split across 2 GPUs" in said for said in plan.decisions)
    with_nccl = plan_memory(spec, replace(plan_request_for(hd_14b), ranks=2), replace(cards(2, 36), collectives="nccl"))
    assert with_nccl.split.kind == "ulysses"


def test_ring_attention_is_refused_on_cpu_engines_where_its_backends_do_not_run():
    settings = replace(load_presets()["selftest-t2v"].settings, attention="_native_flash", width=64, height=64,
                       frames=9)
    cpu = HardwareProfile(backend="cpu", device_name="x86", ram_total_gb=24, ram_available_gb=20, cpu_count=2)
    spec = KNOWN_MODELS[T2V_14B]   # 40 heads: 3 engines cannot divide them
    plan = plan_memory(spec, replace(plan_request_for(settings), ranks=3), cpu, override_for(settings))
    assert not plan.split.possible and "only on GPUs" in plan.split.reason
    on_gpus = plan_memory(spec, replace(plan_request_for(settings), ranks=3), cards(3, 80), override_for(settings))
    assert on_gpus.split.kind == "ring"
