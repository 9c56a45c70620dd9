"""Presets that name LoRAs (fetched once when published, refused offline before any load), the Wan2.1 14B and
4-step presets, and LoRAs for one expert of a two-expert model (``@high`` / ``@low``)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from engine.events import JobFailed, JobFinished, LatentsSaved, PhaseStarted
from engine.models.loras import Lora
from engine.models.spec import spec_for
from engine.outputs.history import read_entry, reuse_values
from engine.outputs.latents import load_latents
from engine.planning.planner import plan_memory, plan_request_for
from engine.run.engine import Engine
from engine.run.lora import apply_loras, loaded_adapters
from engine.settings.loras import lora_line, parse_lora, parse_lora_lines
from engine.settings.presets import UserPresets, parse_preset, preset_json
from engine.settings.values import InputError, check_settings
from tests.conftest import CPU, run_engine, tiny_request
from tests.helpers.loras import FAST, original_lora
from ui.views.plan_panel import lora_text

NEW_PRESETS = ("wan21-t2v-14b-480p", "wan21-t2v-14b-720p", "wan21-i2v-14b-720p", "wan21-flf2v-14b",
               "wan21-i2v-14b-480p-4step", "wan21-t2v-14b-4step")
FOUR_STEP = ("wan21-i2v-14b-480p-4step", "wan21-t2v-14b-4step")
PUBLISHED = dict(repo="someone/loras", path="folder/published.safetensors")


def phases(events) -> list[str]:
    return [e.phase for e in events if isinstance(e, PhaseStarted)]


def latents_of(events):
    return load_latents(next(e.path for e in events if isinstance(e, LatentsSaved)))[0]


def assert_lightx2v_sampling(settings):
    """Timesteps 1000/750/500/250, warped by shift 5 once (the scheduler applies the shift to the given sigmas)."""
    from engine.run.schedulers import make_scheduler

    assert settings.sigmas == (1.0, 0.75, 0.5, 0.25) and settings.shift == 5.0
    scheduler = make_scheduler({"num_train_timesteps": 1000}, settings.shift, settings.sigmas)
    scheduler.set_timesteps(settings.steps)
    assert scheduler.timesteps.tolist() == pytest.approx([1000 * 5 * s / (1 + 4 * s) for s in settings.sigmas])


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_each_new_preset_loads_and_plans_from_the_known_specs(presets, name):
    preset = presets[name]
    spec = spec_for(preset.settings.model)   # no folder: the known table, as offline
    assert spec is not None, preset.settings.model
    plan = plan_memory(spec, plan_request_for(preset.settings), CPU)
    assert plan.phases and "GB" in preset.description
    assert parse_preset(preset_json(preset), f"{name}.json") == preset


def test_the_4_step_presets_sample_as_lightx2v_does(presets):
    for name in FOUR_STEP:
        settings = presets[name].settings
        assert (settings.steps, settings.guidance, settings.scheduler) == (4, 1.0, "flow_euler")
        assert_lightx2v_sampling(settings)
        (lora,) = settings.loras
        assert lora.repo == "Kijai/WanVideo_comfy" and lora.path == f"Lightx2v/{lora.file}"
        assert "approximate" in presets[name].title and lora.expert == "both"


def test_the_plan_command_works_offline_for_a_preset_whose_lora_is_not_there(tmp_path):
    import subprocess

    from tests.conftest import app_command, app_env

    card = tmp_path / "card.json"   # a 24 GB card, so the plan fits
    card.write_text(json.dumps({"backend": "cuda", "device_name": "24 GB card", "vram_total_gb": 24,
                                "vram_free_gb": 23.5, "ram_total_gb": 64, "ram_available_gb": 56}))
    run = subprocess.run(app_command("plan", "--preset", "wan21-t2v-14b-4step", "--models-dir", str(tmp_path),
                                     "--hardware", str(card)), capture_output=True, text=True, env=app_env(),
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Wan-AI/Wan2.1-T2V-14B-Diffusers at 832x480x81" in run.stdout and "fits: yes" in run.stdout


@pytest.fixture(scope="module")
def engine_and_models(tmp_path_factory):
    models = tmp_path_factory.mktemp("preset-lora-models")
    engine = Engine(models, CPU)
    yield engine, models
    engine.unload()


def test_a_missing_published_lora_is_refused_offline_before_the_model_loads(engine_and_models, presets, model_dirs,
                                                                          outputs, monkeypatch):
    engine, models = engine_and_models
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, loras=(Lora("published.safetensors", 1.0,
                                                                                 **PUBLISHED),), **FAST)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert "LoRA file published.safetensors is not in " in result.text and str(models / "loras") in result.text
    assert "download folder/published.safetensors from someone/loras" in result.text
    assert "load" not in phases(events) and "download" not in phases(events)
    assert not (models / "loras" / "published.safetensors").exists()


def test_a_published_lora_already_in_the_loras_folder_is_used_and_recorded(engine_and_models, presets, model_dirs,
                                                                           outputs, monkeypatch):
    engine, models = engine_and_models
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (models / "loras").mkdir(exist_ok=True)
    save_file(original_lora(), models / "loras" / "published.safetensors")
    base, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, **FAST))
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, loras=(
        Lora("published.safetensors", 1.0, **PUBLISHED),), **FAST))
    assert isinstance(result, JobFinished), result
    assert "download" not in phases(events) and "lora" in phases(events)
    assert not torch.equal(latents_of(events), latents_of(_))
    (recorded,) = json.loads(open(result.sidecar).read())["parameters"]["loras"]
    assert recorded == {"file": str((models / "loras" / "published.safetensors").resolve()), "strength": 1.0,
                        "expert": "both", **PUBLISHED}
    # Reuse settings gets the same LoRAs back, and the LoRA box shows the file by name.
    entry = read_entry(result.sidecar)
    assert reuse_values(entry).settings.loras == (Lora(recorded["file"], 1.0, **PUBLISHED),)
    assert lora_text(entry.settings.loras, models) == "published.safetensors: 1"


def _expert_outputs(pipe):
    inputs = (torch.randn(1, 16, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([500]),
              torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1)))
    with torch.inference_mode():
        return [model(*inputs, return_dict=False)[0] for model in (pipe.transformer, pipe.transformer_2)]


def test_a_lora_for_one_expert_changes_only_that_expert(two_experts, tmp_path):
    from diffusers import WanPipeline

    file = tmp_path / "expert.safetensors"
    save_file(original_lora(), file)
    pipe = WanPipeline.from_pretrained(two_experts)
    high, low = _expert_outputs(pipe)
    for expert, changed in (("high", (True, False)), ("low", (False, True))):
        setup = apply_loras(pipe, [Lora(str(file), 1.0, expert)])
        assert setup.read == ("expert.safetensors",)
        after = _expert_outputs(pipe)
        assert [not torch.equal(a, b) for a, b in zip(after, (high, low))] == list(changed), expert
        holds = [bool(getattr(model, "peft_config", None)) for model in (pipe.transformer, pipe.transformer_2)]
        assert holds[changed.index(True)]
    assert len(loaded_adapters(pipe)) == 2   # one per expert: the same file, two adapters
    apply_loras(pipe, [Lora(str(file), 0.0, "high")])   # strength 0: the model's own, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(_expert_outputs(pipe), (high, low)))


def test_the_engine_puts_a_high_noise_lora_into_the_first_expert_only(two_experts, presets, outputs, tmp_path):
    file = tmp_path / "mine.safetensors"
    save_file(original_lora(), file)
    engine = Engine(tmp_path / "models", CPU)
    try:
        base, base_events = run_engine(engine, tiny_request(presets, two_experts, outputs, **FAST))
        assert isinstance(base, JobFinished), base
        result, events = run_engine(engine, tiny_request(presets, two_experts, outputs,
                                                         loras=(parse_lora(f"{file}:0.7@high"),), **FAST))
        assert isinstance(result, JobFinished), result
        assert not torch.equal(latents_of(events), latents_of(base_events))
        pipe = engine.loaded.pipe
        assert loaded_adapters(pipe) and not getattr(pipe.transformer_2, "peft_config", None)
        assert any("mine.safetensors (high-noise expert) at 0.7" in getattr(e, "message", "") for e in events)
        recorded = json.loads(open(result.sidecar).read())["parameters"]["loras"]
        assert recorded[0]["expert"] == "high" and recorded[0]["strength"] == 0.7
    finally:
        engine.unload()


def test_the_a14b_4_step_presets_switch_experts_after_step_2_with_each_lightning_lora_in_its_expert(
        two_experts, presets, outputs, tmp_path, monkeypatch):
    """Wan2.2-Lightning: one LoRA per expert, 4 steps at timesteps 1000/750/500/250 warped by shift 5; the
    high-noise expert takes the first two (boundary 0.875 for text, 0.900 for image to video)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("wan22-t2v-a14b-4step", "wan22-i2v-a14b-4step"):
        settings = presets[name].settings
        assert (settings.steps, settings.guidance, settings.guidance_2) == (4, 1.0, None)
        assert_lightx2v_sampling(settings)
        assert [(lora.expert, lora.repo) for lora in settings.loras] == [("high", "lightx2v/Wan2.2-Lightning"),
                                                                          ("low", "lightx2v/Wan2.2-Lightning")]
        assert [lora.path.rsplit("/", 1)[1] for lora in settings.loras] == ["high_noise_model.safetensors",
                                                                           "low_noise_model.safetensors"]
    settings = presets["wan22-t2v-a14b-4step"].settings
    engine = Engine(tmp_path / "models", CPU)
    (tmp_path / "models" / "loras").mkdir(parents=True)
    for lora in settings.loras:   # as if fetched before: the preset's own names in the loras folder
        save_file(original_lora(), tmp_path / "models" / "loras" / lora.file)
    try:
        request = tiny_request(presets, two_experts, outputs, steps=4, guidance=1.0, scheduler=settings.scheduler,
                               sigmas=settings.sigmas, shift=settings.shift, loras=settings.loras, **{
                                   k: v for k, v in FAST.items() if k not in ("steps", "guidance")})
        result, events = run_engine(engine, request)
        assert isinstance(result, JobFinished), result
        assert "download" not in phases(events)
        record = json.loads(open(result.sidecar).read())["experts"]
        assert record["switch_step"] == 2 and record["steps"] == {"transformer": 2, "transformer_2": 2}
        pipe = engine.loaded.pipe
        assert [len(getattr(m, "peft_config", {}) or {}) for m in (pipe.transformer, pipe.transformer_2)] == [1, 1]
    finally:
        engine.unload()


def test_an_expert_lora_on_a_one_transformer_model_is_refused_before_loading(presets, model_dirs, outputs,
                                                                            tmp_path):
    file = tmp_path / "mine.safetensors"
    save_file(original_lora(), file)
    engine = Engine(tmp_path / "models", CPU)
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs,
                                                     loras=(Lora(str(file), 1.0, "low"),), **FAST))
    assert isinstance(result, JobFailed) and result.kind == "input"
    assert "has one transformer, so LoRA mine.safetensors (low-noise expert) cannot go into an expert" in result.text
    assert "remove '@high' / '@low'" in result.text and "load" not in phases(events)


def test_lora_text_names_an_expert_after_the_strength():
    assert parse_lora("a.safetensors@high") == Lora("a.safetensors", 1.0, "high")
    assert parse_lora(" a.safetensors : 0.5 @LOW ") == Lora("a.safetensors", 0.5, "low")
    assert parse_lora(r"C:\loras\a.safetensors:0.8@low") == Lora(r"C:\loras\a.safetensors", 0.8, "low")
    assert parse_lora(r"C:\loras\a.safetensors@high") == Lora(r"C:\loras\a.safetensors", 1.0, "high")
    assert parse_lora(r"C:\loras\a.safetensors:0.8") == Lora(r"C:\loras\a.safetensors", 0.8)
    assert parse_lora("me@home/a.safetensors:2") == Lora("me@home/a.safetensors", 2.0)
    assert parse_lora("a.safetensors@both") == Lora("a.safetensors")
    with pytest.raises(InputError, match="after '@' write high"):
        parse_lora("a.safetensors:0.5@middle")
    lines = "a.safetensors: 0.5@high\nb.safetensors: 1@low\nc.safetensors: 1"
    assert "\n".join(lora_line(lora) for lora in parse_lora_lines(lines)) == lines


def test_the_command_line_takes_an_expert(tmp_path):
    import app

    args = app.parse_args(["generate", "--prompt", "x", "--models-dir", str(tmp_path),
                           "--lora", r"C:\loras\a.safetensors:0.8@low", "--lora", "b.safetensors@high"])
    assert args.lora == [Lora(r"C:\loras\a.safetensors", 0.8, "low"), Lora("b.safetensors", 1.0, "high")]
    with pytest.raises(SystemExit):
        app.parse_args(["generate", "--prompt", "x", "--lora", "a.safetensors@mid"])


def test_a_preset_s_loras_are_checked_and_saved_back(presets, tmp_path):
    base = preset_json(presets["selftest-t2v"])
    data = {**base, "name": "with-lora", "loras": [
        {"file": "published.safetensors", "strength": 0.5, "expert": "low", **PUBLISHED}, ["/x/old.safetensors", 1]]}
    with pytest.raises(Exception, match="old.safetensors' is not there"):   # a file without a repo must exist
        parse_preset(data, "with-lora.json")
    lora_file = tmp_path / "old.safetensors"
    save_file(original_lora(), lora_file)
    data["loras"][1] = [str(lora_file), 1]
    preset = parse_preset(data, "with-lora.json")
    assert preset.settings.loras == (Lora("published.safetensors", 0.5, "low", **PUBLISHED), Lora(str(lora_file)))
    saved = preset_json(preset)
    assert saved["loras"] == [{"file": "published.safetensors", "strength": 0.5, "expert": "low", **PUBLISHED},
                              {"file": str(lora_file), "strength": 1.0}]
    store = UserPresets(tmp_path / "mine", dict(presets))
    store.save(saved)
    reloaded = UserPresets(tmp_path / "mine", dict(presets))
    reloaded.load()
    assert reloaded.presets["with-lora"].settings.loras == preset.settings.loras
    for bad, words in (({"file": "a/b.safetensors", **PUBLISHED}, "bare name"),
                       ({"file": "b.safetensors", "size": 3}, "got size"),
                       ({"file": "b.safetensors", "repo": "someone/loras"}, "needs both a Hub repo")):
        with pytest.raises(Exception, match=words):
            parse_preset({**data, "loras": [bad]}, "with-lora.json")
    with pytest.raises(InputError, match="is for expert 'middle'"):
        check_settings(preset.settings.changed(loras=(Lora(str(lora_file), 1.0, "middle"),)))


def test_a_published_lora_missing_here_is_fetched_once_from_its_hub_repo_into_the_loras_folder(tmp_path):
    """Online, in a fresh process (huggingface_hub reads HF_ENDPOINT once): the file comes from the repo and path
    a preset names, lands in models/loras/ under the preset's own name, and a second run reads it from there."""
    import os
    import subprocess
    import sys

    from safetensors.torch import save as to_bytes

    from tests.conftest import ROOT
    from tests.fake_hub import FakeHub

    data = to_bytes(original_lora())
    hub = FakeHub({"someone/distill": {"folder/high_noise_model.safetensors": data}}).start()
    script = ("import sys\nfrom engine.models.loras import Lora\nfrom engine.run.lora import locate_loras\n"
              "lora = Lora('a14b-high.safetensors', 1.0, 'high', 'someone/distill', 'folder/high_noise_model.safetensors')\n"
              "for _ in range(2):\n    (found,) = locate_loras([lora], sys.argv[1], offline=False)\n    print(found.file)\n")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0"}
    try:
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "models")], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    finally:
        hub.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    target = tmp_path / "models" / "loras" / "a14b-high.safetensors"
    assert done.stdout.split() == [str(target)] * 2
    assert target.read_bytes() == data
    assert len(hub.gets("high_noise_model.safetensors")) == 1   # fetched once; the second run found it
    # Nothing else visible (huggingface_hub keeps its download notes in a hidden .cache folder there).
    assert [p.name for p in (tmp_path / "models" / "loras").iterdir() if not p.name.startswith(".")] == [
        "a14b-high.safetensors"]
