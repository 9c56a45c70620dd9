"""The step's speed-ups on the tiny self-test pipelines, run directly: attention backends (the process-wide
default untouched), regional compilation's bookkeeping (nothing compiled here), and each step cache with
classifier-free guidance on text- and image-to-video: it changes the output, and once removed the output is the
uncached one exactly. MagCache calibrates, keeps its ratios in a file and then skips."""
from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from PIL import Image

from engine.models.selftest import SELFTEST_I2V, SELFTEST_T2V, build_selftest_pipeline
from engine.run.speedups import (
    CACHE_KINDS,
    GPU_ATTENTION,
    WAN_TAYLOR_IDENTIFIERS,
    apply_step_cache,
    attention_backend_of,
    calibration_ratios,
    can_compile,
    compile_transformer,
    fastest_attention,
    is_compiled,
    load_mag_ratios,
    measure_attention,
    remove_step_cache,
    save_mag_ratios,
    set_attention,
    step_cache_of,
    steps_per_transformer,
    taylor_memory_bytes,
    usable_attention_backends,
)
from tests.conftest import one_torch_thread

STEPS = 8
GUIDANCE = 5.0   # with classifier-free guidance: a cond and an uncond pass per step, each with its own cache state
# Settings that make each cache skip on this tiny model (its first block and magnitudes change a lot per step).
SKIPPING = {"first_block": {"threshold": 10.0}, "taylor": {}, "mag": {"threshold": 10.0}}


def tiny(ref: str = SELFTEST_T2V):
    pipe = build_selftest_pipeline(ref)
    for part in pipe.components.values():
        if isinstance(part, torch.nn.Module):
            part.eval()   # built in memory, the models are in training mode: the text encoder's dropout is on
    pipe.set_progress_bar_config(disable=True)
    return pipe


IMAGE = Image.new("RGB", (32, 32), (200, 40, 60))


def run(pipe, steps: int = STEPS, guidance: float = GUIDANCE) -> torch.Tensor:
    extra = {"image": IMAGE} if "image_encoder" in pipe.components else {}
    return pipe(prompt="a red fox", negative_prompt="blurry", num_inference_steps=steps, guidance_scale=guidance,
                height=32, width=32, num_frames=9, output_type="latent",
                generator=torch.Generator().manual_seed(0), **extra).frames


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are so small that threads only cost (a run takes 0.2 s on one thread, about 1 s on two of a
    busy machine); every comparison here is made on one thread, and the setting is put back after."""
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def t2v(one_thread):
    pipe = tiny()
    return pipe, run(pipe)


@pytest.fixture(scope="module")
def i2v(one_thread):
    pipe = tiny(SELFTEST_I2V)
    return pipe, run(pipe)


# ---- attention ----

def test_usable_attention_backends_are_offline_and_native_first():
    on_cpu = usable_attention_backends("cpu")
    assert on_cpu[0] == "native" and not any(name.endswith("_hub") for name in on_cpu)
    assert usable_attention_backends("mps") == ("native",)
    assert not any(name.endswith("_hub") for name in GPU_ATTENTION)
    # Without the flash-attn / sageattention / xformers packages, diffusers' own checks rule those out.
    assert not {"flash", "sage", "xformers"} & set(usable_attention_backends("rocm"))


def test_measure_attention_times_what_runs_and_skips_what_cannot():
    seconds = measure_attention("cpu", torch.float32, 2, 16, 64,
                                backends=("native", "_native_math", "_native_cudnn", "flash", "sage_hub"), repeats=2)
    assert set(seconds) == {"native", "_native_math"}
    assert all(value > 0 for value in seconds.values())
    assert fastest_attention(seconds) in seconds and fastest_attention({}) == "native"


def test_set_attention_goes_back_to_the_default_exactly(t2v):
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    pipe, uncached = t2v
    default = _AttentionBackendRegistry._active_backend
    try:
        set_attention(pipe, "_native_math")
        assert attention_backend_of(pipe) == "_native_math"
        assert _AttentionBackendRegistry._active_backend == default   # the process-wide default is not moved
        math = run(pipe)
        assert torch.allclose(math, uncached, atol=1e-4)
    finally:
        set_attention(pipe, None)
    assert attention_backend_of(pipe) is None and _AttentionBackendRegistry._active_backend.value == "native"
    assert torch.equal(run(pipe), uncached)
    with pytest.raises(ValueError, match="downloads"):
        set_attention(pipe, "flash_hub")


# ---- compilation ----

@pytest.mark.parametrize("device, os_name", [("cpu", "linux"), ("mps", "macos"), ("rocm", "windows"),
                                             ("cuda", "macos")])
def test_compilation_is_refused_with_a_reason(device, os_name):
    ok, reason = can_compile(device, os_name)
    assert not ok and reason


def test_compile_transformer_compiles_each_transformer_once_and_refuses_a_step_cache_in_its_graph():
    pipe = tiny()   # its own pipeline: the tests never run a compiled model
    remove_step_cache(pipe)
    apply_step_cache(pipe, "first_block", STEPS)
    with pytest.raises(ValueError, match="fullgraph"):
        compile_transformer(pipe)
    remove_step_cache(pipe)
    assert not is_compiled(pipe.transformer)
    assert compile_transformer(pipe) == ("transformer",)   # torch.compile is lazy: nothing is built until a step
    assert is_compiled(pipe.transformer)
    assert compile_transformer(pipe) == ()
    with pytest.raises(ValueError, match="compiled"):
        apply_step_cache(pipe, "taylor", STEPS)


# ---- step caches ----

@pytest.mark.parametrize("kind", ["first_block", "taylor"])
def test_a_step_cache_skips_with_guidance_and_comes_off_exactly(t2v, kind):
    pipe, uncached = t2v
    try:
        setup = apply_step_cache(pipe, kind, STEPS, **SKIPPING[kind])
        assert (setup.kind, setup.approximate, setup.calibrating) == (kind, True, False) and setup.detail
        assert step_cache_of(pipe) == kind
        assert not torch.equal(run(pipe), uncached)
    finally:
        remove_step_cache(pipe)
    assert step_cache_of(pipe) is None
    assert torch.equal(run(pipe), uncached)


def test_taylor_hooks_wan_self_attention_which_its_defaults_miss(t2v):
    from diffusers.hooks.taylorseer_cache import _TAYLORSEER_CACHE_HOOK, _TRANSFORMER_BLOCK_IDENTIFIERS

    pipe, _ = t2v
    names = [name for name, _ in pipe.transformer.named_modules()]
    assert not [n for n in names if any(re.fullmatch(p, n) for p in _TRANSFORMER_BLOCK_IDENTIFIERS)]
    try:
        apply_step_cache(pipe, "taylor", STEPS)
        hooked = [name for name, module in pipe.transformer.named_modules()
                  if getattr(module, "_diffusers_hook", None)
                  and module._diffusers_hook.get_hook(_TAYLORSEER_CACHE_HOOK)]
        assert hooked == [f"blocks.{i}.attn1" for i in range(len(pipe.transformer.blocks))]
        assert all(any(re.fullmatch(p, n) for p in WAN_TAYLOR_IDENTIFIERS) for n in hooked)
    finally:
        remove_step_cache(pipe)
    assert "no step" in apply_step_cache(pipe, "taylor", 3).detail   # too few steps to extrapolate any
    remove_step_cache(pipe)
    # Its memory: Wan 1.3B (30 blocks of 1536) at 480x832x81 with guidance holds 11.2 GiB of factors.
    assert round(taylor_memory_bytes(30, 1536, 32760, passes=2) / 2**30, 1) == 11.2


def test_mag_cache_calibrates_keeps_its_ratios_and_then_skips(t2v, tmp_path):
    pipe, uncached = t2v
    try:
        setup = apply_step_cache(pipe, "mag", STEPS)
        assert setup.calibrating and "calibrat" in setup.detail
        assert torch.equal(run(pipe), uncached)   # calibrating computes every step
        ratios = calibration_ratios(pipe)
        assert list(ratios) == ["transformer"] and len(ratios["transformer"]) == STEPS
        assert ratios["transformer"][0] == 1.0

        save_mag_ratios(tmp_path, "selftest/t2v", STEPS, ratios)
        assert load_mag_ratios(tmp_path, "selftest/t2v", STEPS) == ratios
        assert load_mag_ratios(tmp_path, "selftest/t2v", STEPS + 2) is None   # ratios are per step count
        assert load_mag_ratios(tmp_path, "other", STEPS) is None

        setup = apply_step_cache(pipe, "mag", STEPS, mag_ratios=load_mag_ratios(tmp_path, "selftest/t2v", STEPS),
                                 **SKIPPING["mag"])
        assert not setup.calibrating and calibration_ratios(pipe) == {}
        assert not torch.equal(run(pipe), uncached)
    finally:
        remove_step_cache(pipe)
    assert torch.equal(run(pipe), uncached)


def test_mag_ratios_files_that_do_not_fit_read_as_none(tmp_path):
    path = save_mag_ratios(tmp_path, "m", 4, {"transformer": [1.0, 1.01, 0.99, 0.98]})
    assert path.name.endswith("-4steps.json") and path.parent == tmp_path
    data = json.loads(path.read_text())
    for broken in ("{not json", json.dumps({**data, "steps": 5}), json.dumps({**data, "ratios": {"transformer": []}}),
                   json.dumps({**data, "ratios": {"transformer": ["x"]}}), json.dumps([1, 2])):
        path.write_text(broken)
        assert load_mag_ratios(tmp_path, "m", 4) is None
    with pytest.raises(ValueError):
        save_mag_ratios(tmp_path, "m", 4, {})


def test_two_experts_each_calibrate_and_cache_their_own_steps():
    from diffusers import WanPipeline

    one = tiny()
    parts = {**one.components, "transformer_2": copy.deepcopy(one.transformer)}
    pipe = WanPipeline(**parts, boundary_ratio=0.875)   # a Wan2.2 A14B look-alike: high- then low-noise expert
    pipe.set_progress_bar_config(disable=True)
    counts = steps_per_transformer(pipe, STEPS)
    assert sum(counts.values()) == STEPS and all(counts.values())
    uncached = run(pipe)
    try:
        apply_step_cache(pipe, "mag", STEPS)
        assert torch.equal(run(pipe), uncached)
        ratios = calibration_ratios(pipe)
        assert {name: len(values) for name, values in ratios.items()} == counts
        apply_step_cache(pipe, "mag", STEPS, mag_ratios=ratios, **SKIPPING["mag"])
        assert not torch.equal(run(pipe), uncached)
    finally:
        remove_step_cache(pipe)
    assert torch.equal(run(pipe), uncached)


@pytest.mark.parametrize("kind", CACHE_KINDS)
def test_each_step_cache_works_on_image_to_video_with_guidance(i2v, kind):
    pipe, uncached = i2v
    try:
        ratios = None
        if kind == "mag":
            apply_step_cache(pipe, "mag", STEPS)
            run(pipe)
            ratios = calibration_ratios(pipe)
        apply_step_cache(pipe, kind, STEPS, mag_ratios=ratios, **SKIPPING[kind])
        assert not torch.equal(run(pipe), uncached)
    finally:
        remove_step_cache(pipe)
    assert torch.equal(run(pipe), uncached)


def test_an_unknown_cache_kind_is_refused(t2v):
    with pytest.raises(ValueError, match="first_block"):
        apply_step_cache(t2v[0], "faster", STEPS)
