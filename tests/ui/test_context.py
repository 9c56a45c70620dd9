"""What each tab starts with when the app is started with --model."""
from __future__ import annotations

from ui.context import AppContext


def test_model_flag_fills_only_the_tabs_it_suits(presets):
    t2v_model = AppContext(None, presets, "out", "selftest-t2v")
    assert t2v_model.model_for("t2v") == "selftest-t2v"
    assert t2v_model.model_for("i2v") == presets[t2v_model.default_preset("i2v")].settings.model != "selftest-t2v"
    i2v_model = AppContext(None, presets, "out", "selftest-i2v")
    assert i2v_model.model_for("i2v") == "selftest-i2v" and i2v_model.model_for("t2v") != "selftest-i2v"
    unknown = AppContext(None, presets, "out", "someone/my-own-wan")   # no preset says what it is made for
    assert unknown.model_for("t2v") == unknown.model_for("i2v") == "someone/my-own-wan"
    assert AppContext(None, presets, "out").model_for("t2v") == presets[AppContext(None, presets, "out").default_preset("t2v")].settings.model


def test_without_a_model_flag_each_tab_starts_on_the_first_preset_that_fits_else_the_self_test_one(presets,
                                                                                                   tmp_path):
    """Planned from the table of known models: nothing is downloaded and no engine starts."""
    from engine.device.hardware import HardwareProfile
    from engine.service.worker import WorkerClient

    client = WorkerClient(tmp_path / "models")
    ctx = AppContext(client, presets, str(tmp_path / "out"))
    gpu = HardwareProfile(backend="cuda", device_name="RTX 4090", arch="sm_89", vram_total_gb=24, vram_free_gb=23.2,
                          ram_total_gb=64, ram_available_gb=58)
    assert ctx.fitting_preset("t2v", gpu) == ctx.presets_for("t2v")[0] == "fastwan21-t2v-1.3b-quick"
    small = HardwareProfile(backend="cpu", device_name="a small laptop", ram_total_gb=8, ram_available_gb=6)
    assert ctx.fitting_preset("t2v", small) == "selftest-t2v" and ctx.fitting_preset("i2v", small) == "selftest-i2v"
    assert client.pid is None
