"""The planner, table-driven: the articles' and comparable apps' machines against the Wan models."""
from __future__ import annotations

import json

import pytest

from engine.device.hardware import HardwareProfile
from engine.models.spec import KNOWN_MODELS
from engine.planning.planner import LADDER, Override, PlanRequest, budgets, plan_memory, plan_request_for
from tests.helpers.machines import HARDWARE, T2V_13

FASTWAN = "FastVideo/FastWan2.1-T2V-1.3B-Diffusers"
I2V_14 = "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers"
TI2V_5 = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
A14B = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
REQUESTS = {
    "wan21-1.3b-832x480x81": (T2V_13, PlanRequest(832, 480, 81)),
    "fastwan-480x480x25": (FASTWAN, PlanRequest(480, 480, 25)),
    "i2v-14b-480x480x33": (I2V_14, PlanRequest(480, 480, 33, image_to_video=True)),
    "i2v-14b-832x480x81": (I2V_14, PlanRequest(832, 480, 81, image_to_video=True)),
    "ti2v-5b-1280x704x121": (TI2V_5, PlanRequest(1280, 704, 121)),
    "a14b-832x480x81": (A14B, PlanRequest(832, 480, 81)),
}
CASES = [(h, r) for h in HARDWARE for r in REQUESTS]


def plan(hw_name, request_name, **override):
    ref, request = REQUESTS[request_name]
    return plan_memory(KNOWN_MODELS[ref], request, HARDWARE[hw_name], Override(**override))


def assert_each_suggestion_makes_it_fit(chosen, hw_name, request_name, **override):
    """Every tip of a plan that does not fit, applied as it says, gives a plan that fits; without a tip the
    plan says that nothing smaller would fit."""
    import re
    from dataclasses import replace

    ref, request = REQUESTS[request_name]
    hw = HARDWARE[hw_name]
    if not chosen.suggestions:
        assert any("Neither fewer frames, a smaller size nor a smaller known model" in d for d in chosen.decisions)
    for tip in chosen.suggestions:
        spec, changed, forced = KNOWN_MODELS[ref], request, Override(**override)
        if found := re.match(r"Use (\d+) frames? instead", tip):
            changed = replace(request, frames=int(found[1]))
        elif found := re.match(r"Use (\d+)x(\d+) instead", tip):
            changed = replace(request, width=int(found[1]), height=int(found[2]))
        elif found := re.search(r"\(([\w.-]+/[\w.-]+)\) fits here", tip):
            spec = KNOWN_MODELS[found[1]]
            assert spec.transformer.params * spec.experts < KNOWN_MODELS[ref].transformer.params * KNOWN_MODELS[ref].experts
        elif tip.startswith("Set Strategy, Text encoder and VAE tiling back to Auto"):
            forced = Override()
        else:
            raise AssertionError(f"a tip the test cannot check: {tip}")
        assert plan_memory(spec, changed, hw, forced).fits, tip


@pytest.mark.parametrize("hw_name, request_name", CASES)
def test_a_fitting_plan_stays_inside_the_budget_with_the_margin(hw_name, request_name):
    chosen = plan(hw_name, request_name)
    hw = HARDWARE[hw_name]
    vram_budget, ram_budget = budgets(hw)
    assert vram_budget < hw.vram_free_gb and ram_budget < hw.ram_available_gb  # a margin is kept
    if not chosen.fits:
        assert_each_suggestion_makes_it_fit(chosen, hw_name, request_name)
        return
    for phase in chosen.phases:
        if hw.backend == "mps":
            assert phase.peak_vram_gb + phase.peak_ram_gb <= ram_budget + 1e-6
        else:
            assert phase.peak_vram_gb <= vram_budget + 1e-6, phase
            assert phase.peak_ram_gb <= ram_budget + 1e-6, phase
    assert chosen.predicted_peak_vram_gb == max(p.peak_vram_gb for p in chosen.phases)


@pytest.mark.parametrize("hw_name, request_name", CASES)
def test_the_fastest_fitting_rung_is_chosen(hw_name, request_name):
    chosen = plan(hw_name, request_name)
    if not chosen.fits:
        assert all(not plan(hw_name, request_name, strategy=s).fits for s in LADDER)
        return
    for faster in LADDER[:LADDER.index(chosen.strategy)]:
        assert not plan(hw_name, request_name, strategy=faster).fits, f"{faster} also fits"


def test_uma_split_keeps_14b_on_the_device_and_loads_it_straight_there():
    # Seed 002: CPU-side loading of 28 GB segfaulted with 16 GB RAM; enable_model_cpu_offload was impossible.
    for request_name in ("i2v-14b-480x480x33", "i2v-14b-832x480x81"):
        chosen = plan("strix-halo-48-16", request_name)
        assert chosen.fits
        assert chosen.transformer == "device" and chosen.load == "device_map"
        assert chosen.strategy in ("all_on_device", "fp8_storage")
        assert chosen.pin_memory is False and chosen.use_stream is False
        assert all(p.placement["transformer"] == "device" for p in chosen.phases)
        assert any("straight to the device" in d for d in chosen.decisions)


def test_12gb_card_runs_14b_only_with_offload_or_fp8():
    for request_name in ("i2v-14b-480x480x33", "i2v-14b-832x480x81", "a14b-832x480x81"):
        chosen = plan("rtx3060-12-32", request_name)
        assert not chosen.fits or chosen.strategy not in ("all_on_device", "text_encoder_offload")
    roomy = HardwareProfile(backend="cuda", device_name="RTX 3060", vram_total_gb=12, vram_free_gb=11.3,
                            ram_total_gb=64, ram_available_gb=58)
    chosen = plan_memory(KNOWN_MODELS[I2V_14], REQUESTS["i2v-14b-480x480x33"][1], roomy)
    assert chosen.fits and chosen.strategy in ("group_offload", "fp8_storage", "fp8_group_offload", "leaf_offload")


def test_h200_runs_everything_on_the_device():
    for request_name in REQUESTS:
        chosen = plan("h200", request_name)
        assert chosen.fits and chosen.strategy == "all_on_device" and chosen.vae_tile is None


def test_math_attention_buffer_is_predicted():
    # 832x480x33 on 14B with math attention wants ~29.4 GiB for the scores alone (seed 002).
    spec = KNOWN_MODELS[I2V_14]
    from engine.planning.memory import denoise_activations_gb
    tokens = spec.tokens(832, 480, 33)
    assert tokens == 14040
    extra = denoise_activations_gb(spec, tokens, 2, True) - denoise_activations_gb(spec, tokens, 2, False)
    assert abs(extra - 29.37) < 0.05


def test_vae_tiling_only_when_the_untiled_decode_does_not_fit():
    assert plan("h200", "wan21-1.3b-832x480x81").vae_tile is None
    small = plan("rtx4060-laptop-8-32", "wan21-1.3b-832x480x81")
    assert small.fits and small.vae_tile is not None
    assert any("tiles" in d for d in small.decisions)


def test_text_encoder_never_sits_beside_the_transformer_on_a_small_card():
    chosen = plan("rtx4060-laptop-8-32", "wan21-1.3b-832x480x81")
    denoise = next(p for p in chosen.phases if p.phase == "denoise")
    assert denoise.placement["text_encoder"] == "cpu"
    assert any("text encoder" in d.lower() for d in chosen.decisions)


def test_a_request_that_fits_nowhere_says_what_would_make_it_fit():
    tiny = HardwareProfile(backend="cuda", device_name="old card", vram_total_gb=4, vram_free_gb=3.5,
                           ram_total_gb=8, ram_available_gb=6)
    chosen = plan_memory(KNOWN_MODELS[I2V_14], PlanRequest(832, 480, 81, True), tiny)
    assert not chosen.fits and chosen.strategy == LADDER[-1]
    assert any("Nothing fits" in d for d in chosen.decisions)
    # Nothing this app can load closes the gap here: no tip pretends otherwise.
    assert chosen.suggestions == ()
    assert any("Neither fewer frames, a smaller size nor a smaller known model makes it fit" in d
               for d in chosen.decisions)
    # A forced strategy that does not fit, where the planner's own choice would: going back to Auto is offered.
    roomier = HardwareProfile(backend="cuda", device_name="8 GB card", vram_total_gb=8, vram_free_gb=7.5,
                              ram_total_gb=64, ram_available_gb=58)
    tight = plan_memory(KNOWN_MODELS[T2V_13], PlanRequest(832, 480, 81), roomier, Override(strategy="all_on_device"))
    assert not tight.fits and plan_memory(KNOWN_MODELS[T2V_13], PlanRequest(832, 480, 81), roomier).fits
    assert any(t.startswith("Set Strategy, Text encoder and VAE tiling back to Auto") for t in tight.suggestions)


def test_overrides_are_honoured():
    forced = plan("h200", "wan21-1.3b-832x480x81", strategy="group_offload", vae_tiling=True, text_encoder="cpu")
    assert forced.strategy == "group_offload" and forced.vae_tile is not None and forced.text_encoder == "cpu"
    assert any("forced" in d for d in forced.decisions)
    with pytest.raises(ValueError, match="unknown strategy"):
        Override(strategy="warp-drive")


def test_plan_serialises_to_the_documented_json_shape():
    data = json.loads(json.dumps(plan("rtx3060-12-32", "fastwan-480x480x25").to_dict()))
    for key in ("fits", "strategy", "predicted_peak_vram_gb", "predicted_peak_ram_gb", "phases", "decisions"):
        assert key in data
    assert {"text_encode", "denoise", "vae_decode"} <= set(data["phases"])
    assert {"placement", "peak_vram_gb", "peak_ram_gb"} <= set(data["phases"]["denoise"])


CPU_24 = HardwareProfile(backend="cpu", device_name="x86", ram_total_gb=24, ram_available_gb=22)


def test_cpu_only_machine_plans_in_ram():
    chosen = plan_memory(KNOWN_MODELS[T2V_13], PlanRequest(480, 480, 25), CPU_24)
    assert chosen.device == "cpu" and chosen.dtype == "float32" and chosen.predicted_peak_vram_gb == 0
    assert chosen.text_encoder == "cpu"    # what the page and `plan` both show


@pytest.mark.parametrize("ref, size", [(T2V_13, PlanRequest(832, 480, 81)),
                                          (I2V_14, PlanRequest(480, 480, 33, image_to_video=True))])
def test_on_a_cpu_every_phase_holds_the_weights_once_and_nothing_is_transferred(ref, size):
    """Every weight is in RAM from the load on: each phase is the weights plus its own working memory."""
    from engine.planning import memory as mem

    spec = KNOWN_MODELS[ref]
    chosen = plan_memory(spec, size, CPU_24)
    phases = {p.phase: p for p in chosen.phases}
    assert "transfer" not in phases
    weights = (spec.transformer.params + spec.text_encoder_params + spec.vae_params
               + (spec.image_encoder_params if size.image_to_video else 0)) * 4 / mem.GIB
    assert abs(phases["load"].peak_ram_gb - (weights + mem.BASE_RAM_CPU_ONLY_GB)) < 0.02
    for phase in chosen.phases:
        extra = phase.peak_ram_gb - phases["load"].peak_ram_gb
        assert 0 <= extra < 3.5, phase       # activations or decoded frames, never the weights a second time
        assert phase.peak_vram_gb == 0 and set(phase.placement.values()) == {"cpu"}
    assert not chosen.fits
    said = " ".join(chosen.decisions)
    assert "slow, but it works" not in said.lower()
    assert f"which needs {chosen.predicted_peak_ram_gb:.1f} GB, but only" in said
    assert "GGUF" not in " ".join(chosen.suggestions)


def test_on_a_cpu_overrides_are_explained_and_tiles_larger_than_the_frame_are_not_tiles():
    from engine.models.spec import SELFTEST_SPECS

    chosen = plan_memory(SELFTEST_SPECS["selftest-t2v"], PlanRequest(64, 64, 9), CPU_24,
                         Override(strategy="group_offload", vae_tiling=True))
    assert chosen.fits and chosen.strategy == "group_offload"
    assert chosen.vae_tile == 512 and not chosen.vae_tiled
    said = " ".join(chosen.decisions)
    assert "changes no memory figure" in said
    assert "a 64x64 frame is no larger than one 512px tile, so it decodes whole" in said
    auto = plan_memory(SELFTEST_SPECS["selftest-t2v"], PlanRequest(64, 64, 9), CPU_24)
    assert [p.peak_ram_gb for p in auto.phases] == [p.peak_ram_gb for p in chosen.phases]


@pytest.mark.parametrize("hw_name", ["rtx3060-12-32", "rtx4060-laptop-8-32"])
def test_a_text_encoder_too_big_for_the_card_streams_through_it_instead_of_running_on_the_cpu(hw_name):
    """UMT5-XXL (10.6 GB) cannot sit beside the 1.3B model on these cards, whole; streamed, it holds about
    its 2 GB embedding on the device while it encodes, and the prompt is still encoded on the GPU."""
    chosen = plan(hw_name, "wan21-1.3b-832x480x81")
    assert chosen.fits and chosen.text_encoder == "streamed"
    phases = {p.phase: p for p in chosen.phases}
    assert phases["text_encode"].placement["text_encoder"] == "streamed"
    assert phases["denoise"].placement["text_encoder"] == "cpu"      # back in RAM, beside nothing
    on_cpu = plan(hw_name, "wan21-1.3b-832x480x81", text_encoder="cpu")
    extra = phases["text_encode"].peak_vram_gb - {p.phase: p for p in on_cpu.phases}["text_encode"].peak_vram_gb
    assert 2.0 < extra < 3.0            # the embedding (2.0 GiB, 1.1x measured) and the encoder's activations
    # Pinning it in RAM holds one tensor (the 2.0 GiB embedding) twice for a moment, during the transfer.
    pinning = phases["transfer"].peak_ram_gb - {p.phase: p for p in on_cpu.phases}["transfer"].peak_ram_gb
    assert 1.9 < pinning < 2.1
    assert any("streams through the device layer by layer" in d for d in chosen.decisions)


def test_no_streamed_text_encoder_without_a_copy_stream():
    """On unified memory diffusers would copy every streamed layer back: the planner never picks it there."""
    unified = HardwareProfile(backend="rocm", device_name="AMD Radeon 8060S", vram_total_gb=8, vram_free_gb=7.5,
                              ram_total_gb=56, ram_available_gb=50, unified_memory=True)
    chosen = plan_memory(KNOWN_MODELS[T2V_13], PlanRequest(832, 480, 81), unified)
    assert chosen.fits and chosen.text_encoder != "streamed" and not chosen.use_stream
    forced = plan_memory(KNOWN_MODELS[T2V_13], PlanRequest(832, 480, 81), unified, Override(text_encoder="streamed"))
    assert forced.text_encoder == "streamed"      # still the user's to force


def _small_ram_gpu(available: float, disk_free: float = -1.0) -> HardwareProfile:
    """A 4 GB card in a 16 GB machine: RAM, not the card, decides whether the 1.3B runs."""
    return HardwareProfile(backend="cuda", device_name="4 GB card", arch="sm_89", vram_total_gb=4, vram_free_gb=3.6,
                           ram_total_gb=16, ram_available_gb=available, disk_free_gb=disk_free)


def test_the_disk_rung_is_taken_only_when_no_ram_rung_fits_and_says_it_is_slow():
    spec, request = KNOWN_MODELS[T2V_13], PlanRequest(832, 480, 81)
    roomy = plan_memory(spec, request, _small_ram_gpu(15.5, disk_free=500))
    assert roomy.fits and roomy.strategy == "fp8_group_offload"   # a RAM rung fits: never the disk
    tight = plan_memory(spec, request, _small_ram_gpu(14.5, disk_free=500))
    assert tight.fits and tight.strategy == "disk_offload" and tight.transformer == "disk"
    assert tight.predicted_peak_ram_gb < roomy.predicted_peak_ram_gb
    slow = next(d for d in tight.decisions if d.startswith("Slow:"))
    assert "read back block by block at every step" in slow and "no rung that keeps the transformer in RAM" in slow
    # No room on the disk for the transformer's copy: the rung is not taken, and the plan says what to free.
    full = plan_memory(spec, request, _small_ram_gpu(14.5, disk_free=3))
    assert not full.fits and full.strategy == "disk_offload"
    assert any("The disk has 3.0 GB free, and this needs 2.6 GB plus 2 GB to spare" in d for d in full.decisions)


def test_a_disk_plan_s_step_is_paced_by_the_disk_s_measured_rate():
    from dataclasses import replace

    from engine.planning.timing import predict_times
    from tests.helpers.machines import H200_CALIBRATION

    spec, request = KNOWN_MODELS[T2V_13], PlanRequest(832, 480, 81)
    hardware = _small_ram_gpu(14.5, disk_free=500)
    disk = plan_memory(spec, request, hardware)
    group = plan_memory(spec, request, hardware, Override(strategy="group_offload"))
    fast, slow = (replace(H200_CALIBRATION, disk_gbps=gbps) for gbps in (5.0, 0.5))
    steps = {name: predict_times(spec, 832, 480, 81, 4, 5.0, plan, cal)
             for name, plan, cal in (("group", group, slow), ("disk fast", disk, fast), ("disk slow", disk, slow))}
    assert steps["group"].step_seconds < steps["disk fast"].step_seconds < steps["disk slow"].step_seconds
    assert "from disk, measured by the last load" in steps["disk slow"].how["denoise"]


def test_the_steps_after_the_video_are_phases_of_the_plan_with_their_measured_memory():
    """Smoother and larger follow the export, the model still held: its memory plus the step's own (measured on an
    H200: docs/data/post-h200.json), on a card and on a CPU (float32: twice the float16 figure)."""
    from engine.planning import memory as mem

    spec = KNOWN_MODELS[T2V_13]
    for hw, nbytes in ((HARDWARE["rtx3060-12-32"], 2), (CPU_24, 4)):
        plain = plan_memory(spec, PlanRequest(832, 480, 81), hw)
        after = plan_memory(spec, PlanRequest(832, 480, 81, interpolate=2, upscale=4), hw)
        phases = {p.phase: p for p in after.phases}
        assert [p.phase for p in after.phases][-2:] == ["interpolate", "upscale"] and "upscale" not in {
            p.phase for p in plain.phases}
        held = phases["export"].peak_vram_gb if hw.device != "cpu" else phases["load"].peak_ram_gb
        peak = phases["upscale"].peak_vram_gb if hw.device != "cpu" else phases["upscale"].peak_ram_gb
        assert abs(peak - held - mem.UPSCALE_TILE_GB * nbytes / 2 - mem.RUN_OVERHEAD_GB) < 0.02, (hw.device, peak)
        rife = mem.RIFE_GB_PER_MEGAPIXEL * 832 * 480 / 1e6 * nbytes / 2
        got = (phases["interpolate"].peak_vram_gb if hw.device != "cpu" else phases["interpolate"].peak_ram_gb) - held
        assert abs(got - rife - mem.RUN_OVERHEAD_GB) < 0.02


def test_a_frame_smaller_than_an_upscaler_tile_is_counted_as_its_own_tile():
    from engine.planning import memory as mem

    assert mem.post_step_gb("upscale", 64, 64, 4) < 0.1 < mem.post_step_gb("upscale", 832, 480, 2) == mem.UPSCALE_TILE_GB


def test_video_to_video_plans_its_input_s_encode_as_measured_and_an_extension_its_join():
    """The encode's memory against bench/from_video_gpu.py's H200 run (docs/data/from-video-h200.json)."""
    import json
    from dataclasses import replace

    from engine.planning import memory
    from engine.settings.values import Settings
    from tests.conftest import ROOT

    measured = json.loads((ROOT / "docs" / "data" / "from-video-h200.json").read_text())["encode"]
    specs = {"wan21": KNOWN_MODELS[T2V_13], "wan22-5b": KNOWN_MODELS["Wan-AI/Wan2.2-TI2V-5B-Diffusers"]}
    for row in measured:
        planned = memory.vae_encode_gb(specs[row["vae"]], 832, 480, 81, None, 4 if row["dtype"] == "float32" else 2)
        assert planned == pytest.approx(row["peak_gib_above_weights"], rel=0.1), row
    settings = Settings(T2V_13, "v2v", 832, 480, 81, 50, 5.0, 3.0, strength=0.6)
    request = plan_request_for(settings)
    assert request.video_input and not plan_request_for(replace(settings, strength=1.0)).video_input
    plan = plan_memory(KNOWN_MODELS[T2V_13], replace(request, extends=True), HARDWARE["rtx3060-12-32"])
    phases = [phase.phase for phase in plan.phases]
    assert phases.index("video_encode") < phases.index("denoise") and phases[-1] == "join"


@pytest.mark.parametrize("hw_name, request_name", CASES)
def test_the_fewer_frames_tip_names_the_most_frames_that_fit(hw_name, request_name):
    """The tip's count, found by halving, is the one trying every count from the most down finds: the memory of
    each phase never shrinks as frames are added (long videos in windows included)."""
    from dataclasses import replace

    from engine.planning.planner import fits, most_frames_that_fit

    ref, request = REQUESTS[request_name]
    spec, hw = KNOWN_MODELS[ref], HARDWARE[hw_name]
    for asked in (request, replace(request, frames=241, window=81)):
        every = next((frames for frames in range(asked.frames - 4, 0, -4)
                      if fits(spec, replace(asked, frames=frames), hw)), None)
        assert most_frames_that_fit(spec, asked, hw, Override()) == every, asked
