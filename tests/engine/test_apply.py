"""Applying a plan's encoder placement: an offloaded encoder's visit to the device leaves its RAM weights as
they were (nothing is copied back), even when encoding fails."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from engine.apply import encoder_visiting
from engine.hardware import HardwareProfile
from engine.modelspec import SELFTEST_SPECS
from engine.planner import PlanRequest, plan_memory

CPU = HardwareProfile(backend="cpu", device_name="test-cpu", ram_total_gb=24, ram_available_gb=20)


def tiny_text_encoder():
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    config = UMT5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4,
                        feed_forward_proj="gated-gelu")
    return UMT5EncoderModel(config).eval()


def offload_plan(device: str):
    plan = plan_memory(SELFTEST_SPECS["selftest-t2v"], PlanRequest(64, 64, 9), CPU)
    return replace(plan, device=device, text_encoder="offload")


def storages(model):
    return {name: (t.device.type, t.data_ptr()) for name, t in [*model.named_parameters(), *model.named_buffers()]}


@pytest.mark.parametrize("fail", [False, True])
def test_an_offloaded_encoder_visits_the_device_and_comes_back_to_the_same_ram(fail):
    # "meta" stands in for the GPU: a visit there holds no data, so only weights kept in RAM can come back.
    model = tiny_text_encoder()
    ids = torch.tensor([[5, 9, 2, 0]])
    before = model(ids).last_hidden_state
    kept = storages(model)
    pipe = SimpleNamespace(text_encoder=model)
    with pytest.raises(RuntimeError, match="encode failed") if fail else torch.no_grad():
        with encoder_visiting(pipe, "text_encoder", offload_plan("meta")):
            assert {p.device.type for p in model.parameters()} == {"meta"}
            if fail:
                raise RuntimeError("encode failed")
    assert storages(model) == kept
    assert torch.equal(model(ids).last_hidden_state, before)


def test_an_encoder_placed_elsewhere_does_not_move():
    model = tiny_text_encoder()
    kept = storages(model)
    for place in ("device", "streamed", "cpu"):
        plan = replace(offload_plan("meta"), text_encoder=place)
        with encoder_visiting(SimpleNamespace(text_encoder=model), "text_encoder", plan):
            assert storages(model) == kept
    with encoder_visiting(SimpleNamespace(), "image_encoder", offload_plan("meta")):
        pass   # a pipeline without that encoder
