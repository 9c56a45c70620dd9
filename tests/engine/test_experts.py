"""Wan2.2 A14B's two experts: which runs each step, the low-noise guidance, and one expert on the device at a time
(the planner's expert_swap rung and the engine's expert_swap phase), on a tiny two-expert pipeline."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.device.hardware import HardwareProfile
from engine.events import JobFailed, JobFinished, LatentsSaved, PhaseFinished, PhaseStarted, StepFinished
from engine.models.limits import limits_of
from engine.models.spec import KNOWN_MODELS, SELFTEST_SPECS
from engine.outputs.latents import load_latents
from engine.planning import memory as mem
from engine.planning.planner import PlanRequest, plan_memory
from engine.planning.speed import SpeedRequest
from engine.planning.timing import predict_times
from engine.run.engine import Engine
from engine.settings.values import InputError, check_settings
from tests.conftest import CPU, run_engine, tiny_request

BOUNDARY = 0.875
A14B = KNOWN_MODELS["Wan-AI/Wan2.2-T2V-A14B-Diffusers"]
T14 = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-14B-Diffusers"]
REQ_480 = PlanRequest(832, 480, 81, speed=SpeedRequest(40, 4.0))


def card(vram: float, ram: float = 128) -> HardwareProfile:
    return HardwareProfile(backend="cuda", device_name=f"{vram:g} GB card", arch="sm_89", vram_total_gb=vram,
                           vram_free_gb=vram - 1, ram_total_gb=ram, ram_available_gb=ram - 8)


# ----- the plan ------------------------------------------------------------------------------------------

def test_two_experts_that_do_not_fit_together_take_turns_on_a_48_gb_card():
    plan = plan_memory(A14B, REQ_480, card(48))
    assert plan.fits and plan.strategy == "expert_swap"
    one_expert = mem.expert_weights_gb(A14B, 2)[0]
    assert one_expert < plan.predicted_peak_vram_gb < 2 * one_expert <= plan.budget_vram_gb + one_expert
    phases = [p.phase for p in plan.phases]
    assert phases.index("denoise") + 1 == phases.index("expert_swap")
    swap = plan.to_dict()["phases"]["expert_swap"]
    assert swap["placement"]["transformer"] == "cpu" and swap["placement"]["transformer_2"] == "device"
    assert plan.to_dict()["phases"]["denoise"]["placement"]["transformer_2"] == "cpu"
    # RAM holds both experts all along (the swap copies one in, nothing comes back)
    assert plan.predicted_peak_ram_gb > 2 * one_expert
    assert any("high-noise expert" in d and "expert_swap" in d for d in plan.decisions)


def test_both_experts_stay_on_an_80_gb_card_and_a_24_gb_card_streams_or_stores_fp8():
    roomy = plan_memory(A14B, REQ_480, card(80))
    assert roomy.strategy in ("all_on_device", "text_encoder_offload")
    assert "expert_swap" not in [p.phase for p in roomy.phases]
    small = plan_memory(A14B, REQ_480, card(24, 64))
    assert small.strategy in ("group_offload", "fp8_storage", "fp8_group_offload")


def test_a_model_with_one_transformer_never_swaps():
    for vram in (24, 40, 48, 80):
        plan = plan_memory(T14, REQ_480, card(vram))
        assert plan.strategy != "expert_swap"
        assert "expert_swap" not in [p.phase for p in plan.phases]


def test_the_time_plan_counts_one_expert_copied_at_the_boundary():
    from tests.helpers.machines import H200_CALIBRATION

    plan = plan_memory(A14B, REQ_480, card(48))
    times = predict_times(A14B, 832, 480, 81, 40, 4.0, plan, H200_CALIBRATION)
    expert_bytes = A14B.transformer.params * 2
    assert times.seconds["expert_swap"] == pytest.approx(
        expert_bytes / (H200_CALIBRATION.h2d_pinned_gbps * 1e9), rel=0.01)
    again = predict_times(A14B, 832, 480, 81, 40, 4.0, plan, H200_CALIBRATION, loaded=True)
    assert again.seconds["expert_swap"] == pytest.approx(2 * times.seconds["expert_swap"], rel=0.01)
    both = predict_times(A14B, 832, 480, 81, 40, 4.0, plan_memory(A14B, REQ_480, card(80)), H200_CALIBRATION)
    assert "expert_swap" not in both.seconds


# ----- the settings ----------------------------------------------------------------------------------------

def test_a_low_noise_guidance_is_refused_for_a_model_with_one_transformer(presets):
    settings = replace(presets["selftest-t2v"].settings, guidance_2=3.0)
    with pytest.raises(InputError, match="no low-noise expert"):
        check_settings(settings, limits_of(SELFTEST_SPECS["selftest-t2v"]))
    with pytest.raises(InputError, match="expert_swap"):
        check_settings(replace(settings, guidance_2=None, strategy="expert_swap"),
                       limits_of(SELFTEST_SPECS["selftest-t2v"]))
    assert check_settings(settings, limits_of(A14B)).guidance_2 == 3.0
    with pytest.raises(InputError, match="(?i)low-noise guidance 31"):
        check_settings(replace(settings, guidance_2=31), limits_of(A14B))


# ----- the run ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def a14b_dir(tmp_path_factory) -> Path:
    """A tiny two-expert pipeline (Wan2.2 A14B's layout: transformer, transformer_2, boundary_ratio), saved."""
    import torch
    from diffusers import UniPCMultistepScheduler, WanPipeline

    from engine.models.selftest import _text_encoder, _tokenizer, _transformer, _vae

    torch.manual_seed(7)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    pipe = WanPipeline(tokenizer=_tokenizer(), text_encoder=_text_encoder(), vae=_vae(), transformer=_transformer(False),
                       transformer_2=_transformer(False), scheduler=scheduler, boundary_ratio=BOUNDARY)
    folder = tmp_path_factory.mktemp("a14b") / "tiny-a14b"
    pipe.save_pretrained(folder)
    return folder


class ExpertCalls:
    """A phase hook that only watches: as the denoise starts, it records every call of either expert
    (its name, the timestep, a copy of the latents it was given)."""

    def __init__(self, engine: Engine):
        self.engine, self.calls, self._handles = engine, [], []

    def before_phase(self, phase: str) -> None:
        if phase != "denoise":
            return
        for handle in self._handles:
            handle.remove()
        pipe = self.engine.loaded.pipe
        self._handles = [getattr(pipe, name).register_forward_pre_hook(self._recorder(name), with_kwargs=True)
                         for name in ("transformer", "transformer_2")]

    def _recorder(self, name):
        def record(module, args, kwargs):
            self.calls.append((name, float(kwargs["timestep"].flatten()[0]), kwargs["hidden_states"].clone()))
        return record

    def steps(self) -> list[tuple[str, float]]:
        """(expert, timestep) of each step, from its first call (the conditional one)."""
        return [(name, t) for number, (name, t, _) in enumerate(self.calls) if number % 2 == 0]


# Small enough to take about a second a run; 4 steps of shift 3 (timesteps 999, 900, 750, 500) switch after two.
SMALL = dict(width=32, height=32, frames=5, seed=3)


def run_watched(a14b_dir, presets, outputs, **overrides):
    outputs.mkdir(exist_ok=True)
    engine = Engine(outputs.parent / "m", CPU)
    engine.faults = calls = ExpertCalls(engine)
    result, events = run_engine(engine, tiny_request(presets, a14b_dir, outputs, **SMALL, **overrides))
    assert isinstance(result, JobFinished), result
    return engine, calls, events, result


@pytest.fixture(scope="module")
def reference(a14b_dir, presets, tmp_path_factory):
    """(the recorded calls, the events, the result) of a run with both experts on the device."""
    _, calls, events, result = run_watched(a14b_dir, presets, tmp_path_factory.mktemp("reference") / "out")
    return calls, events, result


def latents_of(events):
    return load_latents(next(e.path for e in events if isinstance(e, LatentsSaved)))[0]


def test_each_step_runs_the_expert_of_its_timestep_and_the_switch_is_recorded(reference, presets):
    calls, events, result = reference
    steps = calls.steps()
    assert len(steps) == presets["selftest-t2v"].settings.steps == 4
    first_low = next(i for i, (_, t) in enumerate(steps) if t < BOUNDARY * 1000)
    assert 0 < first_low < len(steps)
    assert [name for name, _ in steps] == ["transformer"] * first_low + ["transformer_2"] * (len(steps) - first_low)
    assert not any(isinstance(e, PhaseStarted) and e.phase == "expert_swap" for e in events)   # both on the device
    record = json.loads(Path(result.sidecar).read_text())["experts"]
    assert record["steps"] == {"transformer": first_low, "transformer_2": len(steps) - first_low}
    assert record["switch_step"] == first_low and record["swapped"] is False


def test_the_low_noise_guidance_changes_only_the_low_noise_steps(a14b_dir, presets, tmp_path, reference):
    same, same_latents = reference[0], latents_of(reference[1])
    _, other, events, _ = run_watched(a14b_dir, presets, tmp_path / "out", guidance_2=1.5)
    other_latents = latents_of(events)
    switch = next(i for i, (name, _) in enumerate(same.steps()) if name == "transformer_2")
    inputs = [[x for _, _, x in run.calls[::2]] for run in (same, other)]
    # every step up to the first low-noise one sees the same latents: the high-noise guidance is unchanged
    for step in range(switch + 1):
        assert inputs[0][step].equal(inputs[1][step]), step
    assert not inputs[0][switch + 1].equal(inputs[1][switch + 1])
    assert not same_latents.equal(other_latents)


def test_one_expert_at_a_time_swaps_once_at_the_boundary_and_changes_nothing(a14b_dir, presets, tmp_path, reference):
    plain_events, swap_out = reference[1], tmp_path / "swap"
    engine, calls, events, result = run_watched(a14b_dir, presets, swap_out, strategy="expert_swap")
    switch = next(i for i, (name, _) in enumerate(calls.steps()) if name == "transformer_2")
    started = [n for n, e in enumerate(events) if isinstance(e, PhaseStarted) and e.phase == "expert_swap"]
    assert len(started) == 1
    steps_before = [e.step for e in events[:started[0]] if isinstance(e, StepFinished)]
    assert steps_before == list(range(1, switch + 1))   # right after the last high-noise step
    finished = next(e for e in events[started[0]:] if isinstance(e, PhaseFinished))
    assert finished.phase == "expert_swap" and "low-noise expert on the device" in finished.detail
    assert isinstance(events[events.index(finished) + 1], StepFinished)   # the denoise goes on
    assert latents_of(events).equal(latents_of(plain_events))   # bit for bit
    assert engine.loaded.experts.on_device == "transformer_2"
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert sidecar["plan"]["strategy"] == "expert_swap" and sidecar["experts"]["swapped"] is True
    assert "expert_swap" in sidecar["timings"]
    # the next run on the loaded pipeline brings the high-noise expert back first, then swaps again
    again, events_again = run_engine(engine, tiny_request(presets, a14b_dir, swap_out, **SMALL, strategy="expert_swap"))
    assert isinstance(again, JobFinished), again
    assert [e.phase for e in events_again if isinstance(e, PhaseStarted) and e.phase == "expert_swap"] == \
        ["expert_swap"] * 2
    assert latents_of(events_again).equal(latents_of(plain_events))


def test_a_low_noise_guidance_for_a_one_transformer_model_fails_before_loading(model_dirs, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU)
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, guidance_2=2.0))
    assert isinstance(result, JobFailed) and result.kind == "input"
    assert "no low-noise expert" in result.message
    assert not any(isinstance(e, PhaseStarted) and e.phase == "load" for e in events)


def test_a_lora_on_swapped_experts_computes_beside_the_weights_and_every_run_has_it(a14b_dir, presets, tmp_path):
    """With one expert on the device at a time, each swap puts an expert's RAM copy back: a merge made on the device
    copy would be lost at the first swap. The LoRA computes beside the weights instead, and two runs agree."""
    from safetensors.torch import save_file

    from tests.helpers.loras import original_lora

    lora = tmp_path / "style.safetensors"
    save_file(original_lora(), lora)
    engine = Engine(tmp_path / "m", CPU)
    latents = []
    for _ in range(2):
        result, events = run_engine(engine, tiny_request(presets, a14b_dir, tmp_path / "out", **SMALL,
                                                         strategy="expert_swap", loras=((str(lora), 1.0),)))
        assert isinstance(result, JobFinished), result
        assert json.loads(Path(result.sidecar).read_text())["speed"]["loras"] == "beside the weights"
        latents.append(load_latents(next(e.path for e in events if isinstance(e, LatentsSaved)))[0])
    assert (latents[0] == latents[1]).all()
