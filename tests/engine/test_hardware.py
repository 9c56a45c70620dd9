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
