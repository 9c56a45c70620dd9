"""The page's requests carry a two-expert preset's low-noise guidance only where it can act (the form has no box)."""
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
