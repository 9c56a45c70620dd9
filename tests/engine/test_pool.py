"""Every GPU in the box: which GPUs --gpus picks, and what each engine process is told about them."""
from __future__ import annotations

import pytest

from engine.service.pool import GPU_ORDER_ENV, GpuChoice, GpuChoiceError, engine_environment

pytestmark = pytest.mark.process


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


def test_a_split_job_whose_leader_fails_says_its_own_words_and_both_engines_serve_on(selftest_models_dir, presets,
                                                                                     outputs):
    """Through the pool: the leading engine runs out of memory in the denoise (injected); the job ends with that
    failure (the other rank's "another GPU failed" is not shown as a cause), and both engines run jobs after."""
    from dataclasses import replace

    from engine.events import Info, JobFailed, JobFinished
    from engine.service.pool import EnginePool
    from tests.conftest import tiny_request
    from tests.faults import InjectedFaults

    pool = EnginePool(selftest_models_dir, GpuChoice.parse("2"), preview_seconds=-1,
                      faults=InjectedFaults(out_of_memory={"denoise": 1}), ranks_grace_s=3.0)   # not 30 s
    pool.start()
    try:
        assert pool.wait_started(120) == 2
        request = tiny_request(presets, "selftest-t2v", outputs, steps=3, seed=5)
        split = replace(request, settings=replace(request.settings, gpus=2))
        assert pool.engines_for(split) == 2 and pool.engines_for(request) == 1
        events = list(pool.run(split, slots=(0, 1)))
        assert isinstance(events[-1], JobFailed) and "Out of device memory during denoise" in events[-1].text
        assert not any(isinstance(e, Info) and "rank 1 failed" in e.message for e in events)
        after = [list(pool.run(request, slots=(slot,)))[-1] for slot in (0, 1)]
        assert all(isinstance(e, JobFinished) for e in after), after
        assert isinstance(list(pool.run(split, slots=(0, 1)))[-1], JobFinished)
    finally:
        pool.close()
