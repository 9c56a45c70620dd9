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
