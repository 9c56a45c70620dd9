"""The page's low-noise guidance (Wan2.2 A14B's second expert): the Guidance 2 box's value, or the preset's for a
caller that leaves it out, carried only where it can act; saved with a preset."""
from __future__ import annotations

from engine.service.worker import WorkerClient
from ui.context import AppContext
from ui.generate import build_request


def request(ctx, model, guidance):
    return build_request(ctx, "t2v", "wan22-t2v-a14b-480p", "a fox", None, model, 832, 480, 81, 40, guidance, 12.0, 1)


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
        return build_request(ctx, "t2v", "wan22-t2v-a14b-480p", "a fox", None, model, 832, 480, 81, 40, guidance,
                             12.0, 1, guidance_2=value).settings.guidance_2

    assert boxed(2.5) == 2.5
    assert boxed(0) is None and boxed(None) is None and boxed("") is None   # the same as guidance
    assert boxed(2.5, "Wan-AI/Wan2.1-T2V-14B-Diffusers") is None            # one transformer: left out
    assert boxed(2.5, guidance=1.0) is None                                 # guidance off for both experts


def test_a_saved_preset_keeps_the_guidance_2_the_form_had(presets, selftest_models_dir, outputs, tmp_path):
    from engine.settings.presets import UserPresets
    from ui.preset_saving import save_user_preset

    ctx = AppContext(WorkerClient(selftest_models_dir), presets, str(outputs),
                     user_presets=UserPresets(tmp_path / "user", presets))
    args = ("mine-a14b", "t2v", "wan22-t2v-a14b-480p", None, None, None, None, None, None, 4.0, None)
    assert save_user_preset(ctx, *args, guidance_2=2.0).preset.settings.guidance_2 == 2.0
    cleared = save_user_preset(ctx, *args, guidance_2=None)
    assert cleared.replaced and cleared.preset.settings.guidance_2 is None
    assert save_user_preset(ctx, *args).preset.settings.guidance_2 == 3.0   # left out: the preset's
