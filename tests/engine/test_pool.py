"""Every GPU in the box: which GPUs --gpus picks, and what each engine process is told about them."""
from __future__ import annotations

import pytest

from engine.service.pool import GPU_ORDER_ENV, GpuChoice, GpuChoiceError, engine_environment


def test_gpus_all_a_count_or_a_list_and_clear_words_for_anything_else():
    assert GpuChoice.parse("all").pick(4, cpu_only=False) == (0, 1, 2, 3)
    assert GpuChoice.parse(None).pick(1, cpu_only=False) == (0,)
    assert GpuChoice.parse("2").pick(4, cpu_only=False) == (0, 1)
    assert GpuChoice.parse("2, 3").pick(4, cpu_only=False) == (2, 3)
    assert GpuChoice.parse("1,").pick(2, cpu_only=False) == (1,)
    assert GpuChoice.parse("all").pick(0, cpu_only=True) == (0,)          # a CPU machine: one engine
    assert GpuChoice.parse("2").pick(0, cpu_only=True) == (0, 1)          # ... or as many as asked for
    for wrong in ("0", "-1", "two", ",", "0,0", "0,x"):
        with pytest.raises(GpuChoiceError, match="write all, a number of GPUs"):
            GpuChoice.parse(wrong)
    with pytest.raises(GpuChoiceError, match="names GPU 2, but this machine has 2 \\(numbered 0 to 1\\)"):
        GpuChoice.parse("0,2").pick(2, cpu_only=False)
    with pytest.raises(GpuChoiceError, match="--gpus 3: this machine has 2 GPUs"):
        GpuChoice.parse("3").pick(2, cpu_only=False)


def test_each_engine_sees_its_own_gpu_first_and_the_others_after():
    env = engine_environment(2, (1, 2, 3), engines=3, cpu_count=16, inherited={})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,1,3" and env[GPU_ORDER_ENV] == "2,1,3"
    assert env["OMP_NUM_THREADS"] == "5"        # a share of the cores each
    # Numbers within a list the user set: GPU 1 of "5,7" is the machine's 7.
    mine = engine_environment(1, (0, 1), engines=2, cpu_count=2, inherited={"CUDA_VISIBLE_DEVICES": "5,7",
                                                                            "OMP_NUM_THREADS": "2"})
    assert mine["CUDA_VISIBLE_DEVICES"] == "7,5" and "OMP_NUM_THREADS" not in mine
    assert engine_environment(0, (0,), engines=1, cpu_count=2, inherited={}) == {
        "CUDA_VISIBLE_DEVICES": "0", GPU_ORDER_ENV: "0"}
