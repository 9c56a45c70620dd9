"""The Presets tab: each preset with the memory the engine expects here; saving, using and deleting your own."""
from __future__ import annotations

import json
import re

import pytest
from gradio_client import Client

from engine.device.hardware import HardwareProfile
from engine.outputs.export import read_video
from engine.planning.planner import LADDER
from engine.service.worker import WorkerClient
from engine.settings.presets import BUILTIN_PRESETS_DIR, UserPresets, load_preset_file, load_presets
from tests.conftest import running_app
from ui.context import AppContext
from ui.preset_saving import save_user_preset
from ui.views.preset_cards import card_markdown, machine_markdown, preset_entries

pytestmark = pytest.mark.server

CARD_12GB = HardwareProfile(backend="cuda", device_name="NVIDIA GeForce RTX 3060", arch="sm_86",
                            vram_total_gb=12.0, vram_free_gb=11.5, ram_total_gb=32.0, ram_available_gb=28.0)
CARD_4GB = HardwareProfile(backend="cuda", device_name="NVIDIA GeForce GTX 1650", arch="sm_75",
                           vram_total_gb=4.0, vram_free_gb=3.8, ram_total_gb=16.0, ram_available_gb=12.0)
CPU = HardwareProfile(backend="cpu", device_name="x86_64", ram_total_gb=16.0, ram_available_gb=12.0, cpu_count=4)
# A user preset found at start-up: its fps (not on the form) shows that a run used it.
SLOW_FOX = {"name": "slow-fox", "title": "Slow fox", "description": "Eight frames a second.",
            "model": "selftest-t2v", "mode": "t2v", "width": 64, "height": 64, "frames": 5, "steps": 2,
            "guidance": 4.0, "shift": 3.0, "fps": 8, "selftest": True}



def boxes(preset, negative_prompt, model, width, height, frames, steps, guidance, shift, **more) -> dict:
    """A form's values as preset saving takes them, by field name."""
    return dict(preset=preset, negative_prompt=negative_prompt, model=model, width=width, height=height,
                frames=frames, steps=steps, guidance=guidance, shift=shift, **more)

def _builtin_files():
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in BUILTIN_PRESETS_DIR.iterdir()}


# ----- the cards and the saving, without a server -------------------------------
@pytest.fixture
def ctx(presets, selftest_models_dir, outputs, tmp_path):
    # The client is never started: planning only reads its models folder.
    presets = dict(presets)
    return AppContext(WorkerClient(selftest_models_dir), presets, str(outputs),
                      user_presets=UserPresets(tmp_path / "user", presets))


def test_cards_show_settings_expected_memory_and_strategy(ctx):
    entries = {e["name"]: e for e in preset_entries(ctx, CARD_12GB)}
    assert set(entries) == set(load_presets())
    wan = entries["wan21-t2v-1.3b"]
    plan = wan["plan"]
    assert plan["fits"] and plan["strategy"] in LADDER and plan["to_make_it_fit"] == []
    text = card_markdown(wan)
    assert text.startswith("### Wan2.1 T2V 1.3B")
    for part in ("`Wan-AI/Wan2.1-T2V-1.3B-Diffusers` (Text to Video)", "832x480, 81 frames (5.0 s at 16 fps)",
                 "50, guidance 6, shift 8",
                 f"peak {plan['expected_peak_vram_gb']:.2f} GB device memory, "
                 f"{plan['expected_peak_ram_gb']:.2f} GB RAM",
                 f"strategy **{plan['strategy']}**", "Fits."):
        assert part in text
    assert "NVIDIA GeForce RTX 3060" in machine_markdown(list(entries.values()))


def test_a_card_that_does_not_fit_says_what_to_change(ctx):
    entry = next(e for e in preset_entries(ctx, CARD_12GB) if e["name"] == "wan21-i2v-14b")
    assert not entry["plan"]["fits"] and entry["plan"]["to_make_it_fit"]
    text = card_markdown(entry)
    assert "**Does NOT fit this machine:** it needs " in text and "GB available" in text
    assert "To make it fit:" in text and all(tip in text for tip in entry["plan"]["to_make_it_fit"])
    # Where nothing would make it fit, the card says so instead of offering tips that cannot work.
    hopeless = next(e for e in preset_entries(ctx, CARD_4GB) if e["name"] == "wan21-i2v-14b")
    assert hopeless["plan"]["to_make_it_fit"] == []
    text = card_markdown(hopeless)
    assert "To make it fit" not in text and "Neither fewer frames, a smaller size nor a smaller known model" in text


def test_cpu_cards_and_cards_without_hardware(ctx):
    selftest = next(e for e in preset_entries(ctx, CPU) if e["name"] == "selftest-t2v")
    assert "(CPU only: no device memory)" in card_markdown(selftest) and "Fits." in card_markdown(selftest)
    waiting = preset_entries(ctx, None, "the engine process did not answer")
    assert all(e["plan"] is None for e in waiting)
    assert "unknown: the engine process did not answer" in card_markdown(waiting[0])
    assert machine_markdown(waiting) == "Expected memory: not known yet (the engine process did not answer)."


def test_a_saved_preset_runs_as_the_form_would(ctx):
    saved = save_user_preset(ctx, "fast-square", "t2v", boxes("fastwan21-t2v-1.3b", "", "", 256, 256, 9, 3, 1.0, 8.0))
    preset = saved.preset
    # What the form does not show comes from the preset it was filled from (its fixed 3-step schedule).
    assert (preset.settings.model, preset.settings.width, preset.settings.frames, preset.settings.scheduler, preset.settings.sigmas) == (
        "FastVideo/FastWan2.1-T2V-1.3B-Diffusers", 256, 9, "flow_dmd", (1.0, 0.757, 0.522))
    assert preset.title == "fast-square" and "starting from FastWan2.1" in preset.description
    assert "Saved your preset **fast-square**" in saved.message
    other = save_user_preset(ctx, "fast-square", "t2v", boxes("fastwan21-t2v-1.3b", "", "", 256, 256, 9, 4, 1.0, 8.0))
    assert other.replaced and other.preset.settings.sigmas is None and other.preset.settings.scheduler == "flow_dmd"
    entry = next(e for e in preset_entries(ctx, CPU) if e["name"] == "fast-square")
    assert entry["user"] and "· *your preset*" in card_markdown(entry)


def test_a_saved_preset_keeps_its_loras(ctx, selftest_models_dir):
    from safetensors.torch import save_file

    from engine.models.loras import Lora
    from tests.helpers.loras import original_lora

    kept = save_user_preset(ctx, "fast-14b", "t2v", boxes("wan21-t2v-14b-4step", "", "", 832, 480, 81, 4, 1.0, 5.0))
    (lora,) = kept.preset.settings.loras   # the preset's published LoRA, not on disk yet, with its source
    assert lora.repo == "Kijai/WanVideo_comfy" and lora.path.startswith("Lightx2v/")
    (selftest_models_dir / "loras").mkdir(exist_ok=True)
    save_file(original_lora(), selftest_models_dir / "loras" / "mine.safetensors")
    box = f"mine.safetensors: 0.5@high\n{lora.file}: 0.8"
    saved = save_user_preset(ctx, "fast-14b", "t2v", boxes("wan21-t2v-14b-4step", "", "", 832, 480, 81, 4, 1.0, 5.0,
                             loras=box))
    mine = str(selftest_models_dir / "loras" / "mine.safetensors")
    assert saved.preset.settings.loras[0] == Lora(mine, 0.5, "high")
    assert saved.preset.settings.loras[1].strength == 0.8 and saved.preset.settings.loras[1].repo == lora.repo
    assert ctx.presets["fast-14b"].settings.loras == saved.preset.settings.loras


def test_reuse_settings_puts_the_output_s_loras_back_in_the_lora_box(ctx, presets, selftest_models_dir):
    import gradio as gr

    from engine.models.loras import Lora
    from engine.outputs.history import ReuseValues
    from ui.parts.form import Form
    from ui.tabs.history import form_updates

    with gr.Blocks():
        form = Form(*(gr.Textbox() for _ in range(11)))   # preset, prompts, model, the numbers and seed
        form.loras = gr.Textbox()
    loras = (Lora(str(selftest_models_dir / "loras" / "mine.safetensors"), 0.5, "high"), Lora("/x/y.safetensors"))
    values = ReuseValues("t2v", presets["selftest-t2v"].settings.changed(loras=loras), "selftest-t2v", "a fox", "", 7)
    updates, _ = form_updates(ctx, {"t2v": form, "i2v": form}, values)
    assert updates[form.loras] == "mine.safetensors: 0.5@high\n/x/y.safetensors: 1"
    none, _ = form_updates(ctx, {"t2v": form, "i2v": form}, ReuseValues("t2v", presets["selftest-t2v"].settings,
                                                                        "selftest-t2v", "a fox", "", 7))
    assert none[form.loras] == ""   # an output made without LoRAs empties the box


@pytest.mark.parametrize("args, expected", [
    (("x", "t2v", "selftest-t2v", "", "", 70, 64, 9, 4, 5.0, 3.0), "Width 70 is not a multiple of 16, which "
                                                                    "selftest-t2v needs: try 64 or 80"),
    (("x", "t2v", "selftest-t2v", "", "", 64, 64, 8, 4, 5.0, 3.0), "Frames must be 4k+1"),
    (("x", "t2v", "selftest-t2v", "", "", 64, 64, 1029, 4, 5.0, 3.0), "Frames 1029 is out of range: use 1 to 1025"),
    (("x", "v2v", "selftest-t2v", "", "", 64, 64, 9, 4, 5.0, 3.0), "mode must be one of t2v, i2v"),
    (("x", "t2v", "selftest-t2v", "", "/etc", 64, 64, 9, 4, 5.0, 3.0), "is a path outside the app's models folder"),
    (("selftest-i2v", "i2v", "selftest-i2v", "", "", 64, 64, 9, 4, 5.0, 3.0), "is the name of a built-in preset"),
])
def test_saving_refuses_what_a_run_would_refuse(ctx, args, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        save_user_preset(ctx, *args[:2], boxes(*args[2:]))
    assert not (ctx.user_presets.folder).exists()


def test_the_dropdowns_follow_the_presets_through_updates_never_by_changing_the_shared_components(ctx):
    """The Preset dropdowns are built once and serve every session: a session gets the new choices as its own
    update, and no other session's dropdown (nor the page as built) changes."""
    import gradio as gr

    from ui.parts.form import build_form
    from ui.tabs.presets import _Dropdowns

    with gr.Blocks():
        forms = {mode: build_form(ctx, mode, mode)[0] for mode in ("t2v", "i2v")}
    built = {mode: list(form.preset.choices) for mode, form in forms.items()}
    save_user_preset(ctx, "fast-square", "t2v", boxes("selftest-t2v", "", "", 64, 64, 9, 3, 1.0, 8.0))
    t2v, i2v = _Dropdowns(ctx, forms).updates("selftest-t2v", "selftest-i2v", select=("t2v", "fast-square"))
    assert ("fast-square", "fast-square") in t2v.choices and t2v.value == "fast-square"
    assert ("fast-square", "fast-square") not in i2v.choices
    assert {mode: list(form.preset.choices) for mode, form in forms.items()} == built
    assert all("fast-square" not in dict(choices).values() for choices in built.values())


# ----- one real server ------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory, selftest_models_dir):
    user = tmp_path_factory.mktemp("user-presets")
    (user / "slow-fox.json").write_text(json.dumps(SLOW_FOX))
    (user / "broken.json").write_text('{"name": "broken"')
    outputs = tmp_path_factory.mktemp("outputs")
    log = tmp_path_factory.mktemp("logs") / "server.log"
    before = _builtin_files()
    with running_app(log, "--model", "selftest-t2v", "--outputs", str(outputs), "--models-dir",
                     str(selftest_models_dir), "--user-presets", str(user)) as (url, proc):
        yield {"url": url, "user": user, "outputs": outputs, "log": log}
    assert _builtin_files() == before, "the built-in presets folder was changed"


def _by_name(entries) -> dict:
    return {entry["name"]: entry for entry in entries}


def test_the_api_names_are_public(client):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/presets", "/save_preset", "/delete_preset"} <= set(endpoints)
    names = [p["parameter_name"] for p in endpoints["/save_preset"]["parameters"]]
    assert names == ["name", "mode", "preset", "negative_prompt", "model", "width", "height", "frames", "steps",
                     "guidance", "shift", "title", "description", "guidance_2"]


def test_presets_lists_expected_memory_and_plan_of_every_preset(client, server):
    entries = _by_name(client.predict(api_name="/presets"))
    assert set(load_presets()) | {"slow-fox"} <= set(entries)
    for entry in entries.values():
        plan = entry["plan"]
        assert plan is not None, entry["plan_problem"]
        assert plan["strategy"] in LADDER and isinstance(plan["fits"], bool) and plan["machine"]
        assert plan["expected_peak_vram_gb"] >= 0 and plan["expected_peak_ram_gb"] > 0
        assert plan["fits"] or plan["to_make_it_fit"] is not None
    assert entries["selftest-t2v"]["plan"]["fits"] and not entries["selftest-t2v"]["user"]
    # A user preset found at start-up is listed; a bad one is reported and skipped.
    assert entries["slow-fox"]["user"] and "broken" not in entries
    assert "user preset " in server["log"].read_text() and "broken.json skipped" in server["log"].read_text()


def test_a_saved_preset_is_written_listed_and_usable_by_name_at_once(client, server):
    saved = client.predict("my-fox", "t2v", "slow-fox", "blurry", "selftest-t2v", 64, 64, 5, 2, 4.0, 3.0,
                           "My fox", "", api_name="/save_preset")
    assert saved["name"] == "my-fox" and not saved["replaced"] and "Saved your preset" in saved["message"]
    on_disk = load_preset_file(server["user"] / "my-fox.json")
    assert on_disk.settings.fps == 8 and on_disk.negative_prompt == "blurry" and on_disk.title == "My fox"
    assert json.loads((server["user"] / "my-fox.json").read_text()) == saved["preset"]
    # Another session, no restart: listed with its plan, and a run takes it by name.
    other = Client(server["url"], verbose=False)
    entry = _by_name(other.predict(api_name="/presets"))["my-fox"]
    assert entry["user"] and entry["plan"]["fits"]
    video = other.predict("my-fox", "a fox", "blurry", "selftest-t2v", 64, 64, 5, 2, 4.0, 3.0, 3,
                          api_name="/text_to_video")[0]
    assert read_video(video)[1] == 8          # the preset's fps, which the form does not hold
    sidecars = [json.loads(p.read_text()) for p in server["outputs"].rglob("*.json")]
    assert any(s["preset"] == "my-fox" for s in sidecars)
    again = client.predict("my-fox", "t2v", "slow-fox", "blurry", "selftest-t2v", 96, 64, 5, 2, 4.0, 3.0,
                           api_name="/save_preset")
    assert again["replaced"] and load_preset_file(server["user"] / "my-fox.json").settings.width == 96


def test_builtin_and_bad_names_are_refused(client, server):
    with pytest.raises(Exception, match="'selftest-t2v' is the name of a built-in preset.*pick another name"):
        client.predict("selftest-t2v", "t2v", "selftest-t2v", api_name="/save_preset")
    with pytest.raises(Exception, match="use only letters, digits, '-' and '_'"):
        client.predict("my fox", api_name="/save_preset")
    with pytest.raises(Exception, match="is a built-in preset; only your own presets can be deleted"):
        client.predict("selftest-t2v", api_name="/delete_preset")
    assert not (server["user"] / "selftest-t2v.json").exists()


def test_a_deleted_preset_is_gone(client, server):
    client.predict("short-lived", "i2v", "selftest-i2v", api_name="/save_preset")
    assert _by_name(client.predict(api_name="/presets"))["short-lived"]["mode"] == "i2v"
    assert "Deleted your preset **short-lived**" in client.predict("short-lived", api_name="/delete_preset")
    assert not (server["user"] / "short-lived.json").exists()
    assert "short-lived" not in _by_name(Client(server["url"], verbose=False).predict(api_name="/presets"))


def test_a_tab_whose_chosen_preset_is_deleted_turns_to_a_preset_that_runs_here_and_says_so(ctx):
    """Without --model a tab starts on the first preset that fits this machine: a tab whose preset is deleted turns
    to that one too (on this CPU the self-test model's), not to the first of the list, which cannot run here."""
    import gradio as gr

    from tests.conftest import CPU
    from ui.parts.form import build_form, preset_values
    from ui.preset_saving import delete_user_preset
    from ui.tabs.presets import _Dropdowns

    ctx.client._hardware_profile = CPU    # what the engine would say it runs on (it is not started here)
    with gr.Blocks():
        forms = {mode: build_form(ctx, mode, mode)[0] for mode in ("t2v", "i2v")}
    save_user_preset(ctx, "wide-fox", "t2v", boxes("selftest-t2v", "", "", 128, 64, 9, 3, 1.0, 8.0))
    delete_user_preset(ctx, "wide-fox")
    dropdowns = _Dropdowns(ctx, forms)
    updates = dropdowns.updates_and_forms("wide-fox", "selftest-i2v")
    t2v_fields = len(forms["t2v"].preset_fields())
    runs_here = ctx.fitting_preset("t2v", CPU)
    assert runs_here == "selftest-t2v" != ctx.default_preset("t2v")
    assert updates[0].value == runs_here
    assert updates[2:2 + t2v_fields] == preset_values(ctx.presets[runs_here])   # the form is that preset's
    assert all(u == gr.skip() for u in updates[2 + t2v_fields:])               # the other tab keeps its edits
    assert dropdowns.switched("wide-fox", "selftest-i2v") == [
        f"The Text to Video tab used it, so it now uses {ctx.presets['selftest-t2v'].title}, with that preset's "
        "settings."]


def test_preset_files_dropped_in_or_removed_while_the_app_runs_are_seen_and_a_broken_one_is_named(
        presets, outputs, tmp_path):
    from ui.tabs.presets import skipped_markdown

    folder = tmp_path / "user"
    user = UserPresets(folder, dict(presets))
    assert user.load() == []
    ctx = AppContext(WorkerClient(tmp_path / "models"), user.presets, str(outputs), "selftest-t2v",
                     user_presets=user)
    assert skipped_markdown(ctx) == "" and "slow-fox" not in ctx.presets
    folder.mkdir()
    (folder / "slow-fox.json").write_text(json.dumps(SLOW_FOX))
    (folder / "broken.json").write_text('{"name": "broken"')
    said = skipped_markdown(ctx)
    assert "slow-fox" in ctx.presets and ctx.presets["slow-fox"].settings.fps == 8
    assert said.startswith("**Preset files skipped:**") and "broken.json" in said and "slow-fox" not in said
    (folder / "slow-fox.json").unlink()
    skipped_markdown(ctx)
    assert "slow-fox" not in ctx.presets and set(presets) <= set(ctx.presets)
