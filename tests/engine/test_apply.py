"""Applying a plan's encoder placement: an offloaded encoder's visit to the device leaves its RAM weights as
they were (nothing is copied back), even when encoding fails."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from engine.models.spec import SELFTEST_SPECS
from engine.planning.planner import PlanRequest, plan_memory
from engine.run.apply_plan import encoder_visiting, load_into_ram, loaded_into_ram
from tests.conftest import CPU


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


def test_encoders_kept_off_the_device_load_into_ram_when_the_rest_loads_straight_to_it():
    plan = offload_plan("cuda")
    assert loaded_into_ram(replace(plan, load="device_map")) == ("text_encoder", "image_encoder")
    assert loaded_into_ram(replace(plan, load="device_map", text_encoder="streamed")) == ("text_encoder", "image_encoder")
    assert loaded_into_ram(replace(plan, load="device_map", text_encoder="device")) == ()
    assert loaded_into_ram(replace(plan, load="cpu")) == ()


def test_a_device_mapped_load_takes_the_encoders_loaded_on_their_own(model_dirs):
    """Through the engine's loader, with a plan that maps the pipeline to a device ("cpu" here, the one
    this machine has): the encoders come from their own load, in the plan's dtype, and the pipeline works."""
    from transformers import CLIPVisionModel, UMT5EncoderModel

    from engine.models.refs import resolve_model
    from engine.run.engine import Engine

    folder = model_dirs["tiny-i2v"]
    plan = replace(offload_plan("cpu"), load="device_map", text_encoder="cpu", dtype="bfloat16")
    parts = load_into_ram(folder, loaded_into_ram(plan), plan)
    assert isinstance(parts["text_encoder"], UMT5EncoderModel) and isinstance(parts["image_encoder"], CLIPVisionModel)
    assert all(p.dtype == torch.bfloat16 for part in parts.values() for p in part.parameters())
    reference = UMT5EncoderModel.from_pretrained(folder / "text_encoder", dtype=torch.bfloat16)
    for (name, mine), (_, theirs) in zip(parts["text_encoder"].state_dict().items(), reference.state_dict().items()):
        assert torch.equal(mine, theirs), name
    assert "image_encoder" not in load_into_ram(model_dirs["tiny-t2v"], loaded_into_ram(plan), plan)

    pipe = Engine(folder.parent / "m", CPU)._from_pretrained(resolve_model(str(folder), folder.parent), plan)
    assert pipe.text_encoder.dtype == torch.bfloat16 and pipe.transformer.dtype == torch.bfloat16
    positive, _ = pipe.encode_prompt("a red fox", do_classifier_free_guidance=False, device="cpu",
                                     dtype=torch.bfloat16, max_sequence_length=16)
    assert positive.shape[:2] == (1, 16) and torch.isfinite(positive.float()).all()
