"""The first planner: a pure function of hardware and component sizes."""
from __future__ import annotations

from engine.hardware import HardwareProfile
from engine.plan import component_params, make_plan

B = 1_000_000_000
WAN_14B_I2V = {"transformer": 16_400_000_000, "text_encoder": 5_700_000_000, "image_encoder": 632_000_000,
               "vae": 127_000_000}
WAN_1_3B = {"transformer": 1_420_000_000, "text_encoder": 5_700_000_000, "vae": 127_000_000}


def gpu(vram, ram, unified=False, backend="cuda"):
    return HardwareProfile(backend=backend, device_name="GPU", vram_total_gb=vram, vram_free_gb=vram,
                           ram_total_gb=ram, ram_available_gb=ram * 0.8, unified_memory=unified)


def test_cpu_only_runs_everything_on_the_cpu_in_float32():
    plan = make_plan(HardwareProfile(backend="cpu", device_name="x86", ram_total_gb=24), WAN_1_3B)
    assert (plan.device, plan.dtype, plan.offload) == ("cpu", "float32", "none")
    assert "No GPU found" in plan.decisions[0]


def test_big_card_keeps_everything_on_the_device():
    plan = make_plan(gpu(141, 128), WAN_14B_I2V)
    assert plan.offload == "none" and not plan.vae_tiling and plan.dtype == "bfloat16"


def test_12gb_card_offloads_14b_and_tiles_the_vae():
    plan = make_plan(gpu(12, 32), WAN_14B_I2V)
    assert plan.offload == "model" and plan.vae_tiling
    assert any("model offload" in d for d in plan.decisions)


def test_uma_split_with_little_ram_does_not_offload_to_ram():
    # Strix Halo 48/16 split: RAM left to the OS is too small to hold the weights.
    hw = HardwareProfile(backend="rocm", device_name="Radeon 8060S", arch="gfx1151", vram_total_gb=48,
                         vram_free_gb=30, ram_total_gb=16, ram_available_gb=12, unified_memory=True, os="windows")
    plan = make_plan(hw, WAN_14B_I2V)
    assert plan.offload == "none"
    assert any("would fail" in d for d in plan.decisions)


def test_component_params_read_from_safetensors_headers(model_dirs):
    import torch
    from diffusers import WanTransformer3DModel

    params = component_params(model_dirs["tiny-t2v"])
    model = WanTransformer3DModel.from_pretrained(model_dirs["tiny-t2v"] / "transformer")
    assert params["transformer"] == sum(p.numel() for p in model.parameters())
    assert set(params) == {"transformer", "text_encoder", "vae"}
    assert torch.is_tensor(next(model.parameters()))
