"""LoRA files with a strength each, on the tiny self-test transformer, in every layout diffusers reads for Wan.

The files are made here for the tiny model (2 blocks, width 24, feed-forward 32), in diffusers' own layout, the
original Wan names (Kijai, ComfyUI, lightx2v: lora_down/lora_up with alpha, diff_b) and musubi-tuner's; each is
run through the engine, and the denoised latents are compared bit for bit with the model's own.
"""
from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from engine.events import Info, JobFailed, JobFinished, LatentsSaved, PhaseStarted
from engine.outputs.latents import load_latents
from engine.models.loras import Lora
from engine.run.engine import Engine
from engine.run.lora import ADAPTER_PREFIX, KEEP_IDLE, apply_loras, loaded_adapters
from engine.settings.loras import find_lora, parse_lora, parse_lora_lines
from engine.settings.values import InputError, check_settings
from tests.conftest import CPU, run_engine, tiny_request
from tests.helpers.loras import FAST, RANK, WIDTH, diffusers_lora, musubi_lora, original_lora

LAYOUTS = {"diffusers": diffusers_lora, "original": original_lora, "musubi": musubi_lora}


@pytest.fixture(scope="module")
def loras(tmp_path_factory) -> dict:
    """A LoRA file of each layout, and files that are no LoRA for this model."""
    folder = tmp_path_factory.mktemp("loras")
    files = {}
    for name, make in LAYOUTS.items():
        files[name] = folder / f"{name}.safetensors"
        save_file(make(), files[name])
    # A LoRA in diffusers' layout for a 14B-wide model: its layers are named as the tiny model's, sized otherwise.
    wide = {key: torch.zeros(RANK, 5120) if "lora_A" in key else torch.zeros(5120, RANK) for key in diffusers_lora()}
    files["wide"] = folder / "wide.safetensors"
    save_file(wide, files["wide"])
    files["model"] = folder / "model.safetensors"
    save_file({"blocks.0.attn1.to_q.weight": torch.zeros(WIDTH, WIDTH)}, files["model"])
    return {name: str(path) for name, path in files.items()}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("lora-engine-models"), CPU)
    yield engine
    engine.unload()


def generate(engine, presets, model_dirs, outputs, loras=()):
    """(the denoised latents, every event) of a tiny run with ``loras``."""
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, loras=tuple(loras),
                                                     **FAST))
    assert isinstance(result, JobFinished), result
    saved = next(e.path for e in events if isinstance(e, LatentsSaved))
    return load_latents(saved)[0], events


def phases(events) -> list[str]:
    return [e.phase for e in events if isinstance(e, PhaseStarted)]


def said(events) -> str:
    return " ".join(e.message for e in events if isinstance(e, Info))


def test_each_layout_changes_the_output_and_strength_0_or_none_is_the_model_s_own(engine, presets, model_dirs,
                                                                                 outputs, loras):
    base, first = generate(engine, presets, model_dirs, outputs)
    assert "lora" not in phases(first)   # no LoRA asked for, none held: nothing to do
    made = {}
    for layout in LAYOUTS:
        latents, events = generate(engine, presets, model_dirs, outputs, [(loras[layout], 1.0)])
        assert not torch.equal(latents, base), layout
        assert "load" not in phases(events) and "lora" in phases(events)   # the model stayed loaded
        assert f"LoRAs on: {layout}.safetensors at 1 (1 file read from disk)." in said(events)
        made[layout] = latents
    assert len({tuple(latents.flatten().tolist()) for latents in made.values()}) == 3
    # Each at strength 0: off, and the output is the model's own, bit for bit.
    zero, events = generate(engine, presets, model_dirs, outputs, [(loras[layout], 0.0) for layout in LAYOUTS])
    assert torch.equal(zero, base)
    assert all(f"LoRA {layout}.safetensors has strength 0: it is off for this run." in said(events)
               for layout in LAYOUTS)
    # The next run without LoRAs: the adapters stay loaded, off.
    none, events = generate(engine, presets, model_dirs, outputs)
    assert torch.equal(none, base) and "lora" not in phases(events)
    assert "the 3 adapters kept loaded are off, so the output is the model's own." in said(events)
    # Another strength, or the same again: nothing is read, no model loaded.
    half, events = generate(engine, presets, model_dirs, outputs, [(loras["musubi"], 0.5)])
    assert not torch.equal(half, made["musubi"]) and not torch.equal(half, base)
    assert "load" not in phases(events) and "musubi.safetensors at 0.5 (1 already loaded)." in said(events)
    again, events = generate(engine, presets, model_dirs, outputs, [(loras["musubi"], 1.0)])
    assert torch.equal(again, made["musubi"]) and "load" not in phases(events)
    both, events = generate(engine, presets, model_dirs, outputs, [(loras["musubi"], 0.5), (loras["original"], 1)])
    assert not torch.equal(both, half) and not torch.equal(both, made["original"])
    assert "LoRAs on: musubi.safetensors at 0.5, original.safetensors at 1 (2 already loaded)." in said(events)
    sidecar = json.loads(open(events[-1].sidecar).read())   # the output says what it was made with
    assert [(e["file"], e["strength"], e["expert"]) for e in sidecar["parameters"]["loras"]] == [
        (loras["musubi"], 0.5, "both"), (loras["original"], 1.0, "both")]
    assert sidecar["speed"]["compiled"] is False
    assert len(loaded_adapters(engine.loaded.pipe)) == 3   # one per file, kept between runs


def test_a_changed_file_is_read_again(engine, presets, model_dirs, outputs, loras, tmp_path):
    path = tmp_path / "changing.safetensors"
    save_file(diffusers_lora(seed=7), path)
    first, _ = generate(engine, presets, model_dirs, outputs, [(str(path), 1.0)])
    before = loaded_adapters(engine.loaded.pipe)
    save_file(diffusers_lora(seed=8), path)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    second, events = generate(engine, presets, model_dirs, outputs, [(str(path), 1.0)])
    assert not torch.equal(first, second) and "1 file read from disk" in said(events)
    after = loaded_adapters(engine.loaded.pipe)
    assert len(after) == len(before) and set(after) != set(before)   # the old version's adapter is gone


def test_a_lora_that_does_not_fit_the_model_is_refused_before_denoising(engine, presets, model_dirs, outputs,
                                                                       loras):
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, loras=((loras["wide"], 1.0),), **FAST)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFailed) and result.kind == "input"
    assert result.text.startswith("LoRA wide.safetensors does not fit ") and "other sizes" in result.text
    assert result.text.endswith("pick a LoRA made for this model.")
    assert "denoise" not in phases(events) and "text_encode" not in phases(events)
    assert not any("wide" in name for name in loaded_adapters(engine.loaded.pipe))


def test_files_that_are_no_wan_lora_are_refused_by_the_check(loras, presets, tmp_path):
    settings = presets["selftest-t2v"].settings
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    sdxl = tmp_path / "sdxl.safetensors"
    save_file({"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": torch.zeros(2, 4)}, sdxl)
    cases = {
        loras["model"]: "'model.safetensors' is not a LoRA (none of its 1 tensors is a lora_A/lora_B or lora_down/"
                        "lora_up weight): give a LoRA file, not a model.",
        str(sdxl): "'sdxl.safetensors' is not a LoRA for Wan (its layers, such as",
        str(text): "LoRA file 'notes.txt' is not a .safetensors file: use the .safetensors version",
        str(tmp_path / "gone.safetensors"): "is not there: check its name and folder.",
    }
    for file, sentence in cases.items():
        with pytest.raises(InputError) as refused:
            check_settings(settings.changed(loras=((file, 1.0),)))
        assert sentence in str(refused.value)
    for strength, sentence in ((9.0, "The strength of LoRA diffusers.safetensors is 9.0: use -4 to 4"),
                               ("x", "The strength of LoRA diffusers.safetensors must be a number, got 'x'.")):
        with pytest.raises(InputError, match=sentence):
            check_settings(settings.changed(loras=((loras["diffusers"], strength),)))
    with pytest.raises(InputError, match="LoRA diffusers.safetensors is listed twice"):
        check_settings(settings.changed(loras=((loras["diffusers"], 1), (loras["diffusers"], 0.5))))
    checked = check_settings(settings.changed(loras=[[loras["diffusers"], 1]]))
    assert checked.loras == (Lora(loras["diffusers"], 1.0),)


def test_both_experts_of_a_two_expert_model_take_the_lora(model_dirs, loras):
    from diffusers import WanPipeline

    one = WanPipeline.from_pretrained(model_dirs["tiny-t2v"])
    parts = {**one.components, "transformer_2": copy.deepcopy(one.transformer)}
    pipe = WanPipeline(**parts, boundary_ratio=0.875)   # a Wan2.2 A14B look-alike
    inputs = (torch.randn(1, 16, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([500]),
              torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1)))

    def outputs():
        with torch.inference_mode():
            return [model(*inputs, return_dict=False)[0] for model in (pipe.transformer, pipe.transformer_2)]

    base = outputs()
    setup = apply_loras(pipe, [(loras["original"], 1.0)])
    assert setup.read == ("original.safetensors",)
    assert all(not torch.equal(a, b) for a, b in zip(outputs(), base))
    assert pipe.transformer.peft_config.keys() == pipe.transformer_2.peft_config.keys()
    apply_loras(pipe, [])
    assert all(torch.equal(a, b) for a, b in zip(outputs(), base))


def test_fp8_weights_get_adapters_in_the_compute_dtype(model_dirs, loras):
    from diffusers import WanPipeline

    plain = WanPipeline.from_pretrained(model_dirs["tiny-t2v"])
    stored = copy.deepcopy(plain.transformer)
    stored.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    fp8 = WanPipeline(**{**plain.components, "transformer": stored})
    for pipe in (plain, fp8):
        apply_loras(pipe, [(loras["original"], 1.0)], dtype=torch.float32)
    exact, rounded = (dict(pipe.transformer.named_parameters()) for pipe in (plain, fp8))
    adapter = [name for name in exact if ADAPTER_PREFIX in name]
    assert adapter and all(rounded[name].dtype == torch.float32 for name in adapter)
    assert all(torch.equal(exact[name], rounded[name]) for name in adapter)   # the file's values, not fp8's
    with torch.inference_mode():   # and it runs (an adapter in fp8 computes nothing)
        stored(torch.randn(1, 16, 1, 4, 4), torch.tensor([500]), torch.randn(1, 8, 32), return_dict=False)


def test_idle_adapters_are_kept_up_to_a_limit(model_dirs, loras, tmp_path):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(model_dirs["tiny-t2v"])
    files = []
    for number in range(KEEP_IDLE + 2):
        files.append(str(tmp_path / f"l{number}.safetensors"))
        save_file(diffusers_lora(seed=number), files[-1])
    for file in files:
        apply_loras(pipe, [(file, 1.0)])
    assert len(loaded_adapters(pipe)) == KEEP_IDLE + 1   # the one on and KEEP_IDLE idle, the oldest deleted


def test_lora_text_reads_as_file_and_strength(tmp_path):
    assert parse_lora("a.safetensors") == Lora("a.safetensors", 1.0)
    assert parse_lora(" b.safetensors : -0.5 ") == Lora("b.safetensors", -0.5)
    assert parse_lora(r"C:\loras\c.safetensors") == Lora(r"C:\loras\c.safetensors", 1.0)
    assert parse_lora(r"C:\loras\c.safetensors:2") == Lora(r"C:\loras\c.safetensors", 2.0)
    assert parse_lora_lines("a.safetensors: 0.8\n\n# off for now: b.safetensors\nc.safetensors") == (
        Lora("a.safetensors", 0.8), Lora("c.safetensors", 1.0))
    with pytest.raises(InputError) as refused:
        parse_lora_lines("a.safetensors:strong\n:1")
    assert refused.value.problems == (
        "LoRA 'a.safetensors:strong': the strength after the last ':' must be a number; write "
        "'detail.safetensors: 0.8'.", "LoRA ':1' has a strength but no file: write 'detail.safetensors: 0.8'.")
    models = tmp_path / "models"
    (models / "loras").mkdir(parents=True)
    (models / "loras" / "mine.safetensors").write_bytes(b"")
    assert find_lora("mine.safetensors", models) == str((models / "loras" / "mine.safetensors").resolve())
    with pytest.raises(InputError) as missing:   # both places it looked are named
        find_lora("other.safetensors", models, must_exist=True)
    assert f"other.safetensors is neither in this folder ({os.getcwd()}) nor in {(models / 'loras').resolve()}" \
        in str(missing.value)
    assert find_lora("other.safetensors", models) == os.path.abspath("other.safetensors")   # may be fetched first


def test_a_merged_lora_computes_what_the_adapters_compute_and_comes_out_exactly(model_dirs, loras):
    """LoRAs on a transformer that stays on the device are merged into its weights (no products per step), equal
    to the adapters computed beside the weights; another strength re-merges from the originals without reading the
    file again; none on copies the originals back, bit for bit."""
    from diffusers import WanPipeline

    from engine.run.lora_fusion import MERGE_ATTRIBUTE, merged_key

    pipe = WanPipeline.from_pretrained(model_dirs["tiny-t2v"])
    original = {name: tensor.clone() for name, tensor in pipe.transformer.state_dict().items()}
    inputs = (torch.randn(1, 16, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([500]),
              torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1)))

    def output():
        with torch.inference_mode():
            return pipe.transformer(*inputs, return_dict=False)[0]

    base = output()
    both = [(loras["original"], 0.7), (loras["musubi"], 1.3)]   # the original layout has bias diffs too
    beside = apply_loras(pipe, both, streamed=True)   # as on a plan that streams the transformer from RAM
    assert beside.beside.startswith("the transformer comes to the device from its copy in RAM") and not beside.merged
    assert merged_key(pipe.transformer) is None
    computed = output()
    merged = apply_loras(pipe, both)
    assert merged.read == () and merged.merged.startswith("merged into the weights of 20 layers")
    assert "They are merged into the weights" in " ".join(merged.sentences())
    assert merged_key(pipe.transformer) is not None
    layers = getattr(pipe.transformer, MERGE_ATTRIBUTE).originals
    assert all(module.merged for module in layers)   # PEFT's layers run their base layer alone
    fused = output()
    assert not torch.equal(fused, base)
    assert torch.allclose(fused, computed, rtol=1e-4, atol=1e-5), float((fused - computed).abs().max())
    # Another strength: the merge is taken out and made again from the originals, exactly as a first merge.
    apply_loras(pipe, [(loras["original"], 0.2)])
    apply_loras(pipe, both)
    assert torch.equal(output(), fused)
    apply_loras(pipe, [])
    assert merged_key(pipe.transformer) is None
    after = {name.replace(".base_layer", ""): tensor for name, tensor in pipe.transformer.state_dict().items()}
    assert all(torch.equal(after[name], tensor) for name, tensor in original.items())
    assert torch.equal(output(), base)


def test_fp8_and_streamed_weights_keep_their_loras_beside_them_and_say_why(model_dirs, loras):
    from diffusers import WanPipeline

    plain = WanPipeline.from_pretrained(model_dirs["tiny-t2v"])
    stored = copy.deepcopy(plain.transformer)
    stored.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    fp8 = WanPipeline(**{**plain.components, "transformer": stored})
    setup = apply_loras(fp8, [(loras["original"], 1.0)], dtype=torch.float32)
    assert setup.beside == "the weights are stored in fp8, where a merge would round the LoRA's change to fp8"
    assert "They compute beside the weights at every step: the weights are stored in fp8" in " ".join(
        setup.sentences())
