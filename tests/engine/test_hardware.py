"""The hardware description round-trips through JSON and refuses malformed input."""
from __future__ import annotations

import json

import pytest

from engine.device.hardware import HardwareError, HardwareProfile, detect_hardware

STRIX_HALO = {"backend": "rocm", "device_name": "AMD Radeon 8060S", "arch": "gfx1151", "vram_total_gb": 48,
              "vram_free_gb": 46.5, "ram_total_gb": 16, "ram_available_gb": 12.0, "unified_memory": True,
              "os": "windows"}


def test_round_trip(tmp_path):
    profile = HardwareProfile.from_dict(STRIX_HALO)
    path = tmp_path / "hw.json"
    path.write_text(profile.to_json())
    again = HardwareProfile.from_file(path)
    assert again == profile and again.vram_total_gb == 48.0 and again.device == "cuda"


def test_defaults_for_missing_optional_fields():
    profile = HardwareProfile.from_dict({"backend": "cpu", "device_name": "x86"})
    assert profile.vram_total_gb == 0.0 and profile.unified_memory is False and profile.os == "linux"


@pytest.mark.parametrize("change, expected", [
    ({"colour": "red"}, "unknown hardware field(s): colour"),
    ({"vram_total_gb": "48"}, "'vram_total_gb' must be float"),
    ({"unified_memory": 1}, "'unified_memory' must be bool"),
    ({"backend": "tpu"}, "'backend' must be one of"),
    ({"os": "beos"}, "'os' must be one of"),
])
def test_malformed_fields_are_refused(change, expected):
    with pytest.raises(HardwareError) as info:
        HardwareProfile.from_dict({**STRIX_HALO, **change})
    assert expected in str(info.value)


def test_detect_on_this_machine_reports_a_backend():
    profile = detect_hardware()
    assert profile.backend in ("cpu", "cuda", "rocm", "mps")
    assert profile.ram_total_gb > 0 and profile.cpu_count >= 1
    json.loads(profile.to_json())


def test_every_gpu_is_listed_with_the_engines_own_first_and_survives_json(monkeypatch):
    from engine.device.hardware import GpuDevice, visible_index

    two = {"backend": "cuda", "device_name": "H200", "vram_total_gb": 139.0,
           "devices": [{"index": 1, "name": "H200", "total_gb": 139.0, "free_gb": 138.5},
                       {"index": 0, "name": "H200", "total_gb": 139.0, "free_gb": 100}]}
    profile = HardwareProfile.from_dict(two)
    assert profile.devices == (GpuDevice(1, "H200", 139.0, 138.5), GpuDevice(0, "H200", 139.0, 100.0))
    assert profile.gpu_count == 2 and "2 GPUs in all" in profile.summary()
    assert HardwareProfile.from_dict(json.loads(profile.to_json())) == profile
    assert HardwareProfile.from_dict({"backend": "cpu", "device_name": "x86"}).gpu_count == 0
    assert HardwareProfile.from_dict({"backend": "cuda", "device_name": "old profile"}).gpu_count == 1
    with pytest.raises(HardwareError, match="devices"):
        HardwareProfile.from_dict({**two, "devices": [{"index": -1, "name": "x", "total_gb": 1, "free_gb": 1}]})
    with pytest.raises(HardwareError, match="devices"):
        HardwareProfile.from_dict({**two, "devices": "0,1"})
    monkeypatch.setenv("WAN_GPU_ORDER", "3,2")
    assert (visible_index(0), visible_index(1), visible_index(2)) == (3, 2, 2)


def test_the_collective_backend_of_a_split_job_is_nccl_on_gpus_and_gloo_on_cpus(monkeypatch):
    import torch.distributed as dist

    from engine.device.hardware import collectives_here
    from engine.run.parallel import collective_backend
    from engine.settings.values import InputError

    assert detect_hardware().collectives == "gloo"          # this CPU machine's torch has gloo
    assert collectives_here("cpu") == collective_backend("cpu") == "gloo"
    assert collectives_here("cuda") == ("nccl" if dist.is_nccl_available() else "")   # never gloo on GPUs
    with pytest.raises(InputError, match="mps devices"):
        collective_backend("mps")
    if not dist.is_nccl_available():
        with pytest.raises(InputError, match="no NCCL"):
            collective_backend("cuda")
    monkeypatch.setattr(dist, "is_available", lambda: False)   # a PyTorch built without torch.distributed
    assert collectives_here("cpu") == ""
    with pytest.raises(InputError, match="no NCCL"):
        collective_backend("cpu")
    assert HardwareProfile.from_dict({"backend": "cuda", "device_name": "x", "collectives": ""}).collectives == ""
