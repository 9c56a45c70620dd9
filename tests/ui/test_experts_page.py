"""The page's low-noise guidance (Wan2.2 A14B's second expert): the Guidance 2 box's value, or the preset's for a
caller that leaves it out, carried only where it can act; saved with a preset."""
from __future__ import annotations

from engine.service.worker import WorkerClient
from ui.context import AppContext
from ui.generate import build_request


def request(ctx, model, guidance, **boxes):
    return build_request(ctx, "t2v", dict(preset="wan22-t2v-a14b-480p", prompt="a fox", model=model, width=832,
                                          height=480, frames=81, steps=40, guidance=guidance, shift=12.0, seed=1,
                                          **boxes))


def test_the_low_noise_guidance_goes_with_two_experts_and_guidance_on(presets, selftest_models_dir, outputs):
    # The client is never started: the catalog reads the models' specs only.
    ctx = AppContext(WorkerClient(selftest_models_dir), presets, str(outputs))
    assert presets["wan22-t2v-a14b-480p"].settings.guidance_2 == 3.0
    assert request(ctx, None, 4.0).settings.guidance_2 == 3.0
    assert request(ctx, "Wan-AI/Wan2.1-T2V-14B-Diffusers", 4.0).settings.guidance_2 is None   # one transformer
    assert request(ctx, None, 1.0).settings.guidance_2 is None   # guidance off for both experts


def test_the_guidance_2_box_sets_it_and_0_or_empty_means_the_same_as_guidance(presets, selftest_models_dir, outputs):
    ctx = AppContext(WorkerClient(selftest_models_dir), presets, str(outputs))

    def boxed(value, model=None, guidance=4.0):
        return request(ctx, model, guidance, guidance_2=value).settings.guidance_2

    assert boxed(2.5) == 2.5
    assert boxed(0) is None and boxed(None) is None and boxed("") is None   # the same as guidance
    assert boxed(2.5, "Wan-AI/Wan2.1-T2V-14B-Diffusers") is None            # one transformer: left out
    assert boxed(2.5, guidance=1.0) is None                                 # guidance off for both experts


def test_a_saved_preset_keeps_the_guidance_2_the_form_had(presets, selftest_models_dir, outputs, tmp_path):
    from engine.settings.presets import UserPresets
    from ui.preset_saving import save_user_preset

    ctx = AppContext(WorkerClient(selftest_models_dir), presets, str(outputs),
                     user_presets=UserPresets(tmp_path / "user", presets))
    form = {"preset": "wan22-t2v-a14b-480p", "guidance": 4.0}
    assert save_user_preset(ctx, "mine-a14b", "t2v", {**form, "guidance_2": 2.0}).preset.settings.guidance_2 == 2.0
    for same in (None, 0, ""):   # the box's 0 or empty, and an API's None: the same guidance as the high-noise one
        cleared = save_user_preset(ctx, "mine-a14b", "t2v", {**form, "guidance_2": same})
        assert cleared.replaced and cleared.preset.settings.guidance_2 is None
    assert save_user_preset(ctx, "mine-a14b", "t2v", form).preset.settings.guidance_2 == 3.0   # left out: the preset's
