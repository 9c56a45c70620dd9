"""The memory plan on the page: its markdown, the plan for the form's values, and the plan a run used."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from engine.device.hardware import HardwareProfile
from engine.events import Info, PlanReady
from engine.models.loras import Lora
from engine.models.spec import KNOWN_MODELS
from engine.planning.planner import Override, PlanRequest, plan_memory
from engine.service.worker import WorkerClient
from tests.conftest import shown
from tests.helpers.machines import RTX_3060
from ui.context import AppContext
from ui.views.job_view import JobView
from ui.parts.form import transformer_choices
from engine.settings.fields import AUTO, OFF, OWN_TRANSFORMER, Place, on_page, plan_fields, read_all
from ui.views import plan_panel
from ui.views.plan_panel import gpu_choices, lora_text, plan_markdown, transformer_choice

PANEL = tuple(field.name for field in on_page(Place.PLAN))   # the plan panel's own boxes, in the API's order


def panel_markdown(ctx, hardware, mode, *values) -> str:
    """The plan panel's markdown for its inputs given in the /plan API's order (the field table's plan_fields);
    those left out are not given (the preset's)."""
    return plan_panel.form_plan_markdown(ctx, hardware, mode, dict(zip((f.name for f in plan_fields()), values)))


def overrides(*values) -> dict:
    """The plan panel's boxes, given in its order, read as a run reads them (every box given)."""
    return read_all(dict(zip(PANEL, values + tuple(f.start for f in on_page(Place.PLAN)[len(values):]))))

CARD_4GB = HardwareProfile(backend="cuda", device_name="NVIDIA GeForce GTX 1650", arch="sm_75",
                           vram_total_gb=4.0, vram_free_gb=3.8, ram_total_gb=16.0, ram_available_gb=12.0)
CPU = HardwareProfile(backend="cpu", device_name="x86_64", ram_total_gb=16.0, ram_available_gb=12.0, cpu_count=4)


@pytest.fixture
def ctx(presets, selftest_models_dir, outputs):
    # The client is never started: the plan only reads its models folder.
    return AppContext(WorkerClient(selftest_models_dir), presets, str(outputs))


def test_a_fitting_plan_shows_strategy_peaks_phases_and_reasons():
    plan = plan_memory(KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"], PlanRequest(832, 480, 81), RTX_3060)
    assert plan.fits
    text = plan_markdown(plan)
    assert text.startswith(f"**Strategy: {plan.strategy}** (fits)")
    assert (f"Predicted peak: {plan.predicted_peak_vram_gb:.2f} of {plan.budget_vram_gb:.2f} GB device memory, "
            f"{plan.predicted_peak_ram_gb:.2f} of {plan.budget_ram_gb:.2f} GB RAM.") in text
    assert "| Phase | Device GB | RAM GB | Where the components live |" in text
    denoise = next(p for p in plan.phases if p.phase == "denoise")
    assert f"| Denoise | {denoise.peak_vram_gb:.2f} | {denoise.peak_ram_gb:.2f} | device: " in text
    assert all(f"- {sentence}" in text for sentence in plan.decisions)
    assert "To make it fit" not in text


def test_a_plan_that_does_not_fit_says_so_and_what_to_change():
    plan = plan_memory(KNOWN_MODELS["Wan-AI/Wan2.1-T2V-14B-Diffusers"], PlanRequest(832, 480, 81), RTX_3060)
    assert not plan.fits and plan.suggestions
    text = plan_markdown(plan)
    assert "(does NOT fit)" in text
    assert "**To make it fit**" in text
    assert all(f"- {tip}" in text for tip in plan.suggestions)
    assert "Use a smaller model: Wan2.2 TI2V 5B" in text
    assert "streamed: transformer" in text
    hopeless = plan_markdown(plan_memory(KNOWN_MODELS["Wan-AI/Wan2.1-T2V-14B-Diffusers"], PlanRequest(832, 480, 81),
                                         CARD_4GB))
    assert "**To make it fit**" not in hopeless and "GGUF" not in hopeless
    assert "Neither fewer frames, a smaller size nor a smaller known model makes it fit" in hopeless


def test_a_cpu_plan_has_no_device_column():
    plan = plan_memory(KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"], PlanRequest(480, 480, 25), CPU)
    text = plan_markdown(plan)
    assert "(CPU only)" in text and "| Phase | RAM GB |" in text and "Device GB" not in text


def test_dropdowns_become_request_overrides():
    defaults = {"strategy": None, "text_encoder": None, "vae_tiling": None, "decoder": "vae", "step_cache": None,
                "compile": None, "attention": None, "vae_dtype": None, "loras": (), "transformer": None,
                "transformer_2": None, "gpus": 0, "guidance_batch": None, "compute": "exact"}
    assert overrides() == defaults
    assert overrides(None, None, None, None, None, None, None, None) == overrides(AUTO, AUTO, AUTO) == defaults
    assert overrides("group_offload", "cpu", "On", "fast", "mag", "Off", "_native_cudnn", "float32") == {
        "strategy": "group_offload", "text_encoder": "cpu", "vae_tiling": True, "decoder": "fast", "step_cache": "mag",
        "compile": False, "attention": "_native_cudnn", "vae_dtype": "float32", "loras": (), "transformer": None,
        "transformer_2": None, "gpus": 0, "guidance_batch": None, "compute": "exact"}
    assert overrides(AUTO, "offload", "Off")["vae_tiling"] is False
    assert overrides(*[None] * 8, "a.safetensors: 0.5\n\nb.safetensors")["loras"] == (
        Lora("a.safetensors", 0.5), Lora("b.safetensors", 1.0))


def test_the_lora_box_names_files_in_the_models_folder(presets, selftest_models_dir, outputs, tmp_path):
    import torch
    from safetensors.torch import save_file

    models = tmp_path / "models"
    (models / "loras" / "style").mkdir(parents=True)
    file = models / "loras" / "style" / "ink.safetensors"
    save_file({"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(2, 24),
               "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.zeros(24, 2)}, file)
    ctx = AppContext(WorkerClient(selftest_models_dir), presets, str(outputs), models_dir=str(models))
    choices = [AUTO, AUTO, AUTO, "vae", OFF, AUTO, AUTO, AUTO]
    assert ctx.lora_files(overrides(*choices, "style/ink.safetensors: 0.5")["loras"]) == (Lora(str(file), 0.5),)
    assert lora_text(((str(file), 0.5), ("/elsewhere/x.safetensors", 1.0)), models) == (
        "style/ink.safetensors: 0.5\n/elsewhere/x.safetensors: 1")

    def plan(text):
        return shown(panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "selftest-t2v", 64, 64, 9, *choices, text))

    assert plan("style/ink.safetensors: 0.5").startswith("_For `selftest-t2v`")
    assert plan("gone.safetensors") == (f"**No plan yet:** LoRA file '{models / 'loras' / 'gone.safetensors'}' is not "
                                        "there: check its name and folder.")
    for outside in ("/etc/x.safetensors", "../x.safetensors", "~/x.safetensors"):
        assert plan(outside).startswith(f"**No plan yet:** LoRA file '{outside}' is a path outside the app's models "
                                        "folder, which the page does not accept; put the file in models/loras/")
    assert plan("style/ink.safetensors: strong") == (
        "**No plan yet:** LoRA 'style/ink.safetensors: strong': the strength after the last ':' must be a number; "
        "write 'detail.safetensors: 0.8'.")
    assert "The strength of LoRA ink.safetensors is 5.0: use -4 to 4" in plan("style/ink.safetensors: 5")


def test_form_values_plan_the_selftest_model(ctx):
    text = panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "selftest-t2v", 64, 64, 9)
    assert "_For `selftest-t2v`, video 64x64, 9 frames, on CPU only (4 cores)" in text
    assert "**Strategy: CPU only** (fits): everything in RAM, computed on the CPU." in text


def test_form_values_with_overrides(ctx):
    text = panel_markdown(ctx, RTX_3060, "t2v", "selftest-t2v", "selftest-t2v", 64, 64, 9,
                              "group_offload", "cpu", "On")
    assert "**Strategy: group_offload** (fits)" in text
    assert "text encoder: cpu" in text and "Strategy forced to 'group_offload'" in text
    # A 64x64 frame is smaller than any tile: tiling on changes nothing, and the plan says so.
    assert "decodes whole (untiled)" in text and "no larger than one 512px tile" in text
    tiled = panel_markdown(ctx, RTX_3060, "t2v", "wan21-t2v-1.3b", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
                               832, 480, 81, "Auto", "Auto", "On")
    assert "decodes in 512px tiles" in tiled and "VAE tiling is on (your choice)" in tiled


def test_image_to_video_form_plans_the_image_encoder(ctx):
    text = panel_markdown(ctx, RTX_3060, "i2v", "selftest-i2v", "selftest-i2v", 96, 64, 9)
    assert "image to video 96x64" in text and "| Image encode |" in text


def test_an_empty_box_is_missing_for_the_plan_as_for_generate_and_an_empty_model_is_the_preset_s(ctx):
    """The plan panel and Generate make their settings in one place (engine/settings/draft.py): an empty size box
    is missing for both (it planned the preset's 64x64 while Generate refused), an empty Model box is the preset's
    model for both."""
    text = panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "", None, None, None)
    assert "Width is missing: give a whole number" in text and "Frames is missing" in text
    text = panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "", 64, 64, 9)
    assert "_For `selftest-t2v`, video 64x64, 9 frames" in text


@pytest.mark.parametrize("model, message", [
    ("/no/such/model-folder", "is a path outside the app's models folder"),
    ("someone/not-downloaded", "someone/not-downloaded is not downloaded and not one of the known Wan models"),
])
def test_a_model_that_cannot_be_planned_is_one_line(ctx, monkeypatch, tmp_path, model, message):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    text = shown(panel_markdown(ctx, CPU, "t2v", "selftest-t2v", model, 64, 64, 9))
    assert text.startswith("**No plan yet:**") and message in text and "\n" not in text


def test_a_folder_that_is_not_a_model_is_one_line(ctx, tmp_path):
    text = shown(panel_markdown(ctx, CPU, "t2v", "selftest-t2v", str(tmp_path), 64, 64, 9))
    assert text.startswith("**No plan yet:**") and "outside the app's models folder" in text


def test_bad_sizes_say_what_to_change(ctx):
    text = shown(panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "selftest-t2v", 70, 64, 10))
    assert text == ("**No plan yet:**\n- Width 70 is not a multiple of 16, which selftest-t2v needs: try 64 or 80."
                    "\n- Frames must be 4k+1 (1, 5, 9, ... up to 1025): 10 is not; try 9 or 13.")
    too_wide = shown(plan_panel.form_plan_markdown(ctx, CPU, "t2v", {"preset": "selftest-t2v", "frames": 241,
                                                                      "window": 129}))
    assert too_wide == ("**No plan yet:** A window of 129 frames is more than selftest-t2v can see at once (its "
                        "position table has 32 rows for the frames): use at most 125.")
    assert "whole number" in panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "selftest-t2v", 64.5, 64, 9)


def test_a_bad_override_is_one_line(ctx):
    text = shown(panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "selftest-t2v", 64, 64, 9, "turbo"))
    # The run's own sentence (check_settings), not the planner's.
    assert "\n" not in text and text.startswith("**No plan yet:** Strategy 'turbo' is unknown: use auto or one of")


def test_the_status_shows_the_plan_the_engine_used():
    spec = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
    plan = plan_memory(spec, PlanRequest(832, 480, 81), RTX_3060)
    view = JobView().apply(PlanReady("j", plan)).apply(Info("j", "Plan: why"))
    text = shown(view.markdown())
    assert f"Plan: {plan.strategy} (predicted peak {plan.predicted_peak_vram_gb:.2f} GB device" in text
    assert text.index(f"Plan: {plan.strategy} (") < text.index("- why") and "- Plan: why" not in text
    # After an out-of-memory step-down the engine announces the lower rung: the status follows it.
    assert plan.strategy != "leaf_offload"
    view.apply(PlanReady("j", replace(plan, strategy="leaf_offload")))
    assert "Plan: leaf_offload (" in view.markdown() and f"Plan: {plan.strategy} (" not in view.markdown()


def test_the_hardware_is_asked_once(monkeypatch):
    client = WorkerClient("models")
    calls = []
    monkeypatch.setattr(client, "hardware", lambda: calls.append(1) or CPU)
    assert client.hardware_profile() == CPU and client.hardware_profile() == CPU
    assert len(calls) == 1


def test_with_this_machine_measured_the_plan_says_how_long_the_video_takes(ctx, outputs):
    from dataclasses import replace

    from engine.device.calibrate import calibrate
    from engine.outputs.export_rates import export_rates

    assert "About" not in panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "selftest-t2v", 64, 64, 9)
    measured = replace(calibrate("cpu", "float32", quick=True, export_rates=export_rates),
                       device_name=CPU.device_name, backend="cpu", torch_version=CPU.torch_version)
    measured.save(outputs)
    text = panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "selftest-t2v", 64, 64, 9)
    assert "**About " in text and "when the model is already loaded" in text
    several = plan_panel.form_plan_markdown(ctx, CPU, "t2v", {"preset": "selftest-t2v", "model": "selftest-t2v",
                                                              "width": 64, "height": 64, "frames": 9, "count": 3})
    assert "to make these 3 videos (the first" in several and "the prompt encoded once" in several, several
    assert "smoother" not in text and "larger" not in several
    # The steps after the video are predicted too, their seconds in the total (each video's, for several).
    after = plan_panel.form_plan_markdown(ctx, CPU, "t2v", {"preset": "selftest-t2v", "model": "selftest-t2v",
                                                            "width": 64, "height": 64, "frames": 9, "interpolate": 2,
                                                            "upscale": 4})
    assert re.search(r"decoding [\d.]+ s, smoother [\d.]+ s, larger [\d.]+ s\)", after), after
    total = lambda text: float(re.search(r"\*\*About ([\d.]+) s\*\*", text).group(1))
    assert total(after) > total(text)
    many = plan_panel.form_plan_markdown(ctx, CPU, "t2v", {"preset": "selftest-t2v", "model": "selftest-t2v",
                                                           "width": 64, "height": 64, "frames": 9, "count": 2,
                                                           "upscale": 2})
    assert "the prompt encoded once; each video larger " in many, many
    # An extension is joined after the video it continues: counted in the time (the page sends its video's file).
    values = {"preset": "selftest-i2v", "model": "selftest-i2v", "width": 64, "height": 64, "frames": 9}
    alone = plan_panel.form_plan_markdown(ctx, CPU, "i2v", values)
    joined = plan_panel.form_plan_markdown(ctx, CPU, "i2v", {**values, "extend": {"path": "/tmp/earlier.mp4"}})
    assert "joining" not in alone and re.search(r"joining [\d.]+ s\)", joined), joined
    # Its seconds are in the total (which shows whole seconds past 10 s: a join of milliseconds may not move it).
    assert float(re.search(r"joining ([\d.]+) s\)", joined).group(1)) > 0 and total(joined) >= total(alone)


def test_the_transformer_dropdowns_list_the_models_folder_s_transformers(presets, selftest_models_dir, outputs,
                                                                        tmp_path):
    models = tmp_path / "models"
    (models / "transformers" / "wan22").mkdir(parents=True)
    for name in ("b-Q4_K_M.gguf", "A.safetensors", "wan22/high.safetensors", "notes.txt"):
        (models / "transformers" / name).write_bytes(b"not a transformer")
    (models / "transformers" / "folder.gguf").mkdir()
    ctx = AppContext(WorkerClient(selftest_models_dir), presets, str(outputs), models_dir=str(models))
    assert transformer_choices(ctx) == [OWN_TRANSFORMER, "A.safetensors", "b-Q4_K_M.gguf", "wan22/high.safetensors"]
    assert transformer_choices(AppContext(WorkerClient(selftest_models_dir), presets, str(outputs),
                                          models_dir=str(tmp_path / "none"))) == [OWN_TRANSFORMER]
    choices = [AUTO, AUTO, AUTO, "vae", OFF, AUTO, AUTO, AUTO, ""]
    high = models / "transformers" / "wan22" / "high.safetensors"
    chosen = ctx.transformer_files({name: value for name, value in overrides(*choices, "wan22/high.safetensors",
                                                                             OWN_TRANSFORMER).items()
                                    if name.startswith("transformer")})
    assert (chosen["transformer"], chosen["transformer_2"]) == (str(high), None)
    assert [transformer_choice(path, models) for path in (str(high), None, "/elsewhere/x.gguf")] == [
        "wan22/high.safetensors", OWN_TRANSFORMER, "/elsewhere/x.gguf"]

    def plan(*files):
        return shown(panel_markdown(ctx, CPU, "t2v", "selftest-t2v", "selftest-t2v", 64, 64, 9, *choices, *files))

    # The plan reads the chosen file's header: one that is no GGUF is named before any run.
    assert plan("b-Q4_K_M.gguf", OWN_TRANSFORMER).startswith(
        "**No plan yet:** The transformer file b-Q4_K_M.gguf is not a GGUF file")
    assert plan("../../etc/passwd", OWN_TRANSFORMER) == (
        "**No plan yet:** The transformer file '../../etc/passwd' is a path outside the app's models folder, which "
        "the page does not accept; put the file in models/transformers/ and choose it by its name, or start the app "
        "with --allow-model-paths to use folders outside models/.")


def test_the_gpus_dropdown_offers_the_machines_gpus_and_becomes_the_gpus_setting():
    assert gpu_choices(1) == [AUTO, "1"] and gpu_choices(4) == [AUTO, "1", "2", "3", "4"]
    assert overrides(*[None] * 11, "2")["gpus"] == 2
    assert overrides(*[None] * 11, AUTO)["gpus"] == 0
    assert overrides(*[None] * 11, "two")["gpus"] == "two"   # left for the request's check to refuse


def test_a_split_plan_says_how_many_gpus_share_the_job_and_a_refused_split_says_why():
    spec = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-14B-Diffusers"]
    h200 = HardwareProfile(backend="cuda", device_name="NVIDIA H200", vram_total_gb=139.8, vram_free_gb=139,
                           ram_total_gb=256, ram_available_gb=240)
    split = plan_markdown(plan_memory(spec, PlanRequest(832, 480, 81, ranks=2), h200))
    assert "**GPUs: 2** (context parallel, ulysses); the peaks are each GPU's." in split
    refused = plan_markdown(plan_memory(spec, PlanRequest(832, 480, 81, ranks=3), h200, Override(attention="native")))
    assert "**GPUs: 3, cannot split**" in refused and "40 attention heads" in refused
    assert "GPUs" not in plan_markdown(plan_memory(spec, PlanRequest(832, 480, 81), h200))
