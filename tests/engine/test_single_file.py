"""A single transformer file (GGUF or safetensors) in place of the model's own, through the path users take.

The files are written here from the tiny model's own transformer, as people download them: one safetensors
in the original Wan key layout under ComfyUI's ``model.diffusion_model.`` prefix, a GGUF with Q8_0 weights
(written with the gguf package as diffusers reads it), ComfyUI's "fp8 scaled", and headers of other shapes.
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.events import Info, JobFailed, JobFinished, LatentsSaved, PhaseStarted
from engine.models.refs import resolve_model
from engine.models.catalog import ModelCatalog
from engine.models.single_file import PREFIX, read_transformer_file, use_transformer_files
from engine.models.spec import KNOWN_MODELS, TransformerWeights
from engine.outputs.latents import load_latents
from engine.planning import memory as mem
from engine.planning.planner import PlanRequest, plan_memory, plan_request_for
from engine.run.engine import Engine
from engine.settings.values import InputError, check_settings
from tests.conftest import CPU, run_engine, tiny_request
from tests.helpers.machines import HARDWARE
from tests.helpers.weights import RUN, original_state, q8_rows, write_gguf


def write_scaled_fp8(state: dict, path: Path) -> Path:
    """ComfyUI's "fp8 scaled": each 2-D weight in fp8 divided by a scale kept beside it, and the marker tensor."""
    import torch
    from safetensors.torch import save_file

    scaled = {"scaled_fp8": torch.zeros(0, dtype=torch.float8_e4m3fn)}
    for name, tensor in state.items():
        if tensor.ndim == 2:
            scale = tensor.abs().max().float() / 448
            scaled[name] = (tensor / scale).to(torch.float8_e4m3fn)
            scaled[name.removesuffix(".weight") + ".scale_weight"] = scale.reshape(())
        else:
            scaled[name] = tensor
    save_file({PREFIX + name: tensor for name, tensor in scaled.items()}, str(path))
    return path


def write_quant_metadata_fp8(state: dict, path: Path, formats: dict | None = None, container: bool = False,
                             scale_shape: tuple = ()) -> Path:
    """ComfyUI's newer fp8 layout: each 2-D weight in fp8 divided by ``<layer>.weight_scale`` (and an activation
    ``<layer>.input_scale``), the layers listed with their format in the header's ``_quantization_metadata``.
    ``container``: the fp8 bytes in uint8 tensors; ``formats``: layer -> format to write instead of fp8."""
    import json

    import torch
    from safetensors.torch import save_file

    tensors, layers = {}, {}
    for name, tensor in state.items():
        if tensor.ndim == 2:
            layer = name.removesuffix(".weight")
            scale = tensor.abs().max().float() / 448
            stored = (tensor / scale).to(torch.float8_e4m3fn)
            tensors[name] = stored.view(torch.uint8) if container else stored
            tensors[layer + ".weight_scale"] = scale.reshape(()).expand(scale_shape).contiguous()
            tensors[layer + ".input_scale"] = torch.tensor(1.0)
            layers[PREFIX + layer] = {"format": (formats or {}).get(layer, "float8_e4m3fn")}
        else:
            tensors[name] = tensor
    metadata = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}
    save_file({PREFIX + name: tensor for name, tensor in tensors.items()}, str(path), metadata=metadata)
    return path


def write_header_only(path: Path, width: int, layers: int, in_channels: int = 16) -> Path:
    """A safetensors file with the tensors that tell a Wan transformer's shape, and nothing else."""
    import torch
    from safetensors.torch import save_file

    save_file({"patch_embedding.weight": torch.zeros(width, in_channels, 1, 2, 2, dtype=torch.float16),
               f"blocks.{layers - 1}.self_attn.norm_q.weight": torch.zeros(1, dtype=torch.float16)}, str(path))
    return path


@pytest.fixture(scope="module")
def files(model_dirs, tmp_path_factory) -> dict[str, Path]:
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("single-files")
    state = original_state(model_dirs["tiny-t2v"])
    save_file({PREFIX + name: tensor for name, tensor in state.items()}, str(folder / "tiny-t2v.safetensors"))
    return {"state": state, "safetensors": folder / "tiny-t2v.safetensors",
            "gguf": write_gguf(state, folder / "tiny-t2v-Q8_0.gguf"),
            "scaled": write_scaled_fp8(state, folder / "tiny-t2v_fp8_scaled.safetensors"),
            "i2v": write_gguf(original_state(model_dirs["tiny-i2v"]), folder / "tiny-i2v-Q8_0.gguf"),
            "1.3b": write_header_only(folder / "wan2.1-t2v-1.3b.safetensors", 1536, 30)}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("single-file-models"), CPU)
    yield engine
    engine.unload()


def latents_of(events) -> object:
    return load_latents(Path(next(e.path for e in events if isinstance(e, LatentsSaved))))[0]


@pytest.fixture(scope="module")
def own_latents(engine, model_dirs, presets, tmp_path_factory):
    """The latents of the model's own transformer, for the runs with a file to compare with."""
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"],
                                                     tmp_path_factory.mktemp("own-outputs"), **RUN))
    assert isinstance(result, JobFinished), result
    return latents_of(events)


# ----- the header ------------------------------------------------------------------------------------------
def test_the_header_tells_kind_quantisation_bytes_and_shape(files):
    state = files["state"]
    params = sum(t.numel() for t in state.values())
    q8 = {n: t for n, t in state.items() if q8_rows(t.numpy())}
    assert q8 and len(q8) < len(state)   # some weights quantised, the rest as the converter leaves them
    gguf = read_transformer_file(files["gguf"])
    # Q8_0: 32 weights in 34 bytes (an fp16 scale and 32 int8); F16 2 bytes, F32 4 bytes a weight.
    q8_bytes = sum(t.numel() // 32 * 34 for t in q8.values())
    plain = sum(t.numel() * (2 if t.ndim == 2 else 4) for n, t in state.items() if n not in q8)
    assert (gguf.kind, gguf.quantization, gguf.params) == ("gguf", "Q8_0", params)
    assert (gguf.quantized_bytes, gguf.total_bytes) == (q8_bytes, q8_bytes + plain)
    assert gguf.quantized_params == sum(t.numel() for t in q8.values())
    assert (gguf.width, gguf.layers, gguf.in_channels, gguf.ffn) == (24, 2, 16, 32)
    one = read_transformer_file(files["safetensors"])
    assert (one.kind, one.quantization, one.params, one.total_bytes) == ("safetensors", "fp32", params, 4 * params)
    assert (one.quantized_bytes, one.width, one.layers, one.in_channels, one.ffn) == (0, 24, 2, 16, 32)
    scaled = read_transformer_file(files["scaled"])
    two_d = sum(t.numel() for t in state.values() if t.ndim == 2)
    assert scaled.quantization == "fp8_e4m3fn scaled" and scaled.scaled_fp8
    # fp8 weights (1 byte), a 4-byte scale each, the rest in fp32 as written
    assert scaled.total_bytes == two_d + 4 * sum(t.ndim == 2 for t in state.values()) + 4 * (params - two_d)
    assert one.source == (str(files["safetensors"].resolve()), files["safetensors"].stat().st_size,
                          files["safetensors"].stat().st_mtime_ns)


def test_files_that_are_not_a_whole_wan_transformer_are_refused_with_a_sentence(files, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(files["gguf"].read_bytes()[:-100])
    with pytest.raises(InputError, match="is not a readable GGUF file .*download it again"):
        read_transformer_file(cut)
    import torch
    from safetensors.torch import save_file

    lora = tmp_path / "lora.safetensors"
    save_file({"blocks.0.self_attn.q.lora_A.weight": torch.zeros(4, 24)}, str(lora))
    with pytest.raises(InputError, match="holds no patch_embedding.weight .* not a Wan transformer file"):
        read_transformer_file(lora)


def test_settings_check_each_file_before_any_model_is_read(files, tmp_path, presets):
    settings = presets["selftest-t2v"].settings
    (tmp_path / "folder.gguf").mkdir()
    cases = {"nowhere.gguf": "does not exist: check the path", "model.ckpt": "is not a .gguf or .safetensors file",
             "folder.gguf": "is a folder: give the file itself"}
    for name, words in cases.items():
        with pytest.raises(InputError, match=words):
            check_settings(replace(settings, transformer=str(tmp_path / name)))
    with pytest.raises(InputError, match="already quantised .GGUF.: choose auto or a strategy without fp8"):
        check_settings(replace(settings, transformer=str(files["gguf"]), strategy="fp8_storage"))
    with pytest.raises(InputError, match="low-noise transformer file must be a path"):
        check_settings(replace(settings, transformer_2=3))
    assert check_settings(replace(settings, transformer="  ")).transformer is None   # an empty box: the model's own


# ----- runs ------------------------------------------------------------------------------------------------
def test_the_same_weights_from_a_single_safetensors_file_give_the_model_s_latents(engine, model_dirs, files, presets,
                                                                                outputs, own_latents):
    single, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs,
                                                     transformer=str(files["safetensors"]), **RUN))
    assert isinstance(single, JobFinished), single
    # The same values, but not always bit for bit: the two loaders leave the weights at other memory alignments, and
    # on some CPUs (an AMD EPYC here) the matrix kernels then sum in another order (2.3e-6 apart; the same weights
    # copied to fresh memory give identical outputs). A wrong key or scale is orders of magnitude further off.
    assert (latents_of(events) - own_latents).abs().max() < 1e-5
    # Loaded again for the file (the plan's reload key names it), and said why.
    assert "load" in [e.phase for e in events if isinstance(e, PhaseStarted)]
    assert any("to make room for another transformer file" in e.message for e in events if isinstance(e, Info))


@pytest.fixture(scope="module")
def gguf_run(engine, model_dirs, files, presets, tmp_path_factory):
    """(the terminal event, the events, whether the loaded transformer was quantised) of a run with the GGUF file."""
    from engine.run.apply_plan import is_quantized

    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"],
                                                     tmp_path_factory.mktemp("gguf-outputs"),
                                                     transformer=str(files["gguf"]), **RUN))
    return result, events, isinstance(result, JobFinished) and is_quantized(engine.loaded.pipe.transformer)


def test_a_q8_gguf_file_gives_latents_close_to_the_model_s_and_the_sidecar_records_it(files, own_latents, gguf_run):
    quantised, events, held_quantised = gguf_run
    assert isinstance(quantised, JobFinished), quantised
    assert held_quantised   # its linear layers hold the Q8_0 bytes and dequantise as they compute
    expected, got = own_latents, latents_of(events)
    difference = float((got - expected).abs().max())
    # Measured 1.6e-3 here, on latents of spread 1.2 (largest 4.0): 0.13% of the spread, from Q8_0 rounding each
    # weight to 1/254 of its block's largest and F16 to 2^-11 of itself, through 2 steps of 2 passes. 1e-2 (6x
    # that, 0.8% of the spread) leaves room for other CPUs' kernels; another seed or model moves them by ~100%.
    assert 0 < difference < 1e-2, difference
    sidecar = json.loads(Path(quantised.sidecar).read_text())
    assert sidecar["parameters"]["transformer"] == str(files["gguf"])
    assert sidecar["plan"]["transformer_files"][0][0] == str(files["gguf"].resolve())
    assert any(f"comes from {files['gguf'].name} (Q8_0): it stays quantised" in d
               for d in sidecar["plan"]["decisions"])


def test_a_gguf_transformer_streams_through_the_offload_hooks_unchanged(engine, model_dirs, files, presets, outputs,
                                                                         gguf_run):
    """Group and leaf offloading move its quantised weights as they are (on the CPU the hooks run, moving nothing
    elsewhere); fp8 storage would cast its bytes, so the planner never picks it and a forced one is refused."""
    for strategy in ("group_offload", "leaf_offload"):
        streamed, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, strategy=strategy,
                                                           transformer=str(files["gguf"]), **RUN))
        assert isinstance(streamed, JobFinished), streamed
        assert (latents_of(events) == latents_of(gguf_run[1])).all(), strategy


def test_a_file_of_another_shape_is_refused_before_loading(engine, model_dirs, files, presets, outputs):
    base = model_dirs["tiny-t2v"]
    expected = {
        "1.3b": "The transformer file wan2.1-t2v-1.3b.safetensors is shaped like Wan2.1 T2V 1.3B (width 1536, 30 "
                f"layers, 16 input channels), but {base}'s transformer has width 24, 2 layers, 16 input channels: "
                f"choose a file made for {base}, or pick the Wan2.1 T2V 1.3B model to use this file.",
        "i2v": "The transformer file tiny-i2v-Q8_0.gguf is shaped like another model (width 24, 2 layers, 36 input "
               "channels)",
    }
    for name, words in expected.items():
        refused, events = run_engine(engine, tiny_request(presets, base, outputs, transformer=str(files[name]), **RUN))
        assert isinstance(refused, JobFailed) and refused.kind == "input" and words in refused.message, refused
        assert "load" not in [e.phase for e in events if isinstance(e, PhaseStarted)]
    refused, _ = run_engine(engine, tiny_request(presets, base, outputs, transformer_2=str(files["gguf"]), **RUN))
    assert (f"The low-noise transformer file {files['gguf'].name} has no place in {base}: it has one transformer, "
            "no low-noise expert; remove it, or give it as the transformer file.") == refused.message


def test_fp8_scaled_weights_are_multiplied_by_their_scales_as_they_load(model_dirs, files, presets, tmp_path):
    from safetensors.torch import load_file

    from engine.run.apply_plan import load_transformer_files

    settings = replace(presets["selftest-t2v"].settings, transformer=str(files["scaled"]))
    resolved = use_transformer_files(resolve_model(str(model_dirs["tiny-t2v"]), tmp_path),
                                     ModelCatalog().transformer_files(settings))
    plan = plan_memory(resolved.spec, plan_request_for(settings), CPU)
    loaded = load_transformer_files(resolved, plan)["transformer"].state_dict()
    own = load_file(str(model_dirs["tiny-t2v"] / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert set(loaded) == set(own)
    for name, tensor in own.items():   # e4m3 keeps 3 bits of mantissa: within 1/16 of each weight
        assert (loaded[name] - tensor).abs().max() <= tensor.abs().max() / 16 + 1e-6, name


@pytest.mark.parametrize("container", [False, True], ids=["fp8", "fp8 in uint8"])
def test_the_newer_comfyui_fp8_layout_loads_with_its_scales(model_dirs, files, presets, tmp_path, engine,
                                                             own_latents, container):
    """``<layer>.weight_scale`` with ``_quantization_metadata``: every weight multiplied back as it loads (not the fp8
    values alone, which gave NaN latents), and the run's latents close to the model's own."""
    from safetensors.torch import load_file

    from engine.run.apply_plan import load_transformer_files

    path = write_quant_metadata_fp8(files["state"], tmp_path / "tiny-t2v_fp8_e4m3fn.safetensors", container=container)
    described = read_transformer_file(path)
    assert described.quantization == "fp8_e4m3fn scaled" and described.scaled_fp8
    settings = replace(presets["selftest-t2v"].settings, transformer=str(path))
    resolved = use_transformer_files(resolve_model(str(model_dirs["tiny-t2v"]), tmp_path),
                                     ModelCatalog().transformer_files(settings))
    loaded = load_transformer_files(resolved, plan_memory(resolved.spec, plan_request_for(settings), CPU))
    own = load_file(str(model_dirs["tiny-t2v"] / "transformer" / "diffusion_pytorch_model.safetensors"))
    state = loaded["transformer"].state_dict()
    assert set(state) == set(own)
    for name, tensor in own.items():   # e4m3 keeps 3 bits of mantissa: within 1/16 of each weight
        assert (state[name] - tensor).abs().max() <= tensor.abs().max() / 16 + 1e-6, name
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], tmp_path / "out",
                                                     transformer=str(path), **RUN))
    assert isinstance(result, JobFinished), result
    got = latents_of(events)
    assert torch.isfinite(got).all()
    assert float((got - own_latents).abs().max()) < 0.25 * float(own_latents.abs().max())


@pytest.mark.parametrize("how, said", [
    ({"formats": {"blocks.0.ffn.0": "nvfp4"}}, "is quantised as nvfp4 (ComfyUI's _quantization_metadata), which the "
                                               "app cannot read"),
    ({"scale_shape": (24,)}, "scales blocks.0.cross_attn.k by 24 values (shape [24]) and 25 more layers so, a layout"),
])
def test_a_newer_fp8_layout_the_app_cannot_read_is_refused_before_the_load(files, tmp_path, how, said):
    """Never run with scales dropped: a format or a scale layout other than fp8 with one scale per weight is
    refused by the header check, saying what to use instead."""
    path = write_quant_metadata_fp8(files["state"], tmp_path / "odd.safetensors", **how)
    with pytest.raises(InputError, match=re.escape(said)):
        read_transformer_file(path)


def test_an_flf2v_transformer_from_a_single_file_gives_the_model_s_latents(engine, presets, image_file, tmp_path):
    """FLF2V's position embedding (``img_emb.emb_pos``, which diffusers' converter does not rename) loads from a
    safetensors and a GGUF file, and the run equals the model's own; a file with it and a model without it (or the
    other way round) is refused before anything loads."""
    from PIL import Image
    from safetensors.torch import save_file

    from engine.models.selftest import SELFTEST_I2V, build_selftest_pipeline

    flf, i2v = tmp_path / "tiny-flf2v", tmp_path / "tiny-i2v"
    build_selftest_pipeline(SELFTEST_I2V, first_last=True).save_pretrained(flf)
    build_selftest_pipeline(SELFTEST_I2V).save_pretrained(i2v)
    last = tmp_path / "last.png"
    Image.new("RGB", (80, 60), (20, 200, 40)).save(last)
    state = original_state(flf)
    assert "img_emb.emb_pos" in state
    single = tmp_path / "tiny-flf2v.safetensors"
    save_file({PREFIX + name: tensor for name, tensor in state.items()}, str(single))
    gguf = write_gguf(state, tmp_path / "tiny-flf2v-Q8_0.gguf")
    run = dict(mode="i2v", image=str(image_file), last_image=str(last), width=32, height=32, frames=5, steps=2)
    own, events = run_engine(engine, tiny_request(presets, flf, tmp_path / "out", **run))
    assert isinstance(own, JobFinished), own
    expected = latents_of(events)
    for file, within in ((single, 1e-5), (gguf, 1e-2)):
        assert read_transformer_file(file).first_last
        result, events = run_engine(engine, tiny_request(presets, flf, tmp_path / "out", transformer=str(file), **run))
        assert isinstance(result, JobFinished), (file.name, result)
        assert float((latents_of(events) - expected).abs().max()) < within, file.name
    loaded = engine.loaded.pipe.transformer.condition_embedder.image_embedder.pos_embed
    assert torch.allclose(loaded.float(), state["img_emb.emb_pos"].float(), atol=1e-3)
    i2v_file = tmp_path / "tiny-i2v.safetensors"
    save_file(original_state(i2v), str(i2v_file))
    for base, file, said in ((i2v, single, "is a first-and-last-frame (FLF2V) transformer"),
                             (flf, i2v_file, "has no img_emb.emb_pos")):
        result, events = run_engine(engine, tiny_request(presets, base, tmp_path / "out", transformer=str(file),
                                                         **{**run, "last_image": str(last) if base == flf else None}))
        assert isinstance(result, JobFailed) and result.kind == "input" and said in result.message, result
        assert "load" not in [e.phase for e in events if isinstance(e, PhaseStarted)]


# ----- the plan ---------------------------------------------------------------------------------------------
def quantised_14b(bits_per_weight: float, name: str) -> object:
    """Wan2.1 T2V 14B as a GGUF file of ``name``'s type: 99.5% of its weights quantised (ComfyUI-GGUF keeps the
    norms, biases and modulation in F32)."""
    spec = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-14B-Diffusers"]
    params = spec.transformer.params
    quantised = int(params * 0.995)
    file = TransformerWeights((f"/models/wan2.1-t2v-14b-{name}.gguf", 1, 1), name, params, quantised,
                              int(quantised * bits_per_weight / 8))
    return replace(spec, transformer_files=(file,))


def test_a_quantised_14b_file_is_counted_at_its_size_and_fits_a_12_gb_card_where_bf16_does_not():
    spec = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-14B-Diffusers"]
    q8, q4 = quantised_14b(8.5, "Q8_0"), quantised_14b(4.5, "Q4_K")   # 34 bytes / 32 weights; 144 / 256
    bf16 = mem.transformer_weights_gb(spec, 2)
    assert 26 < bf16 < 27
    assert 0.52 < mem.transformer_weights_gb(q8, 2) / bf16 < 0.54
    assert 0.28 < mem.transformer_weights_gb(q4, 2) / bf16 < 0.29
    # An RTX 3060: 12 GB, 27 of its 32 GB of RAM free. bf16 (even streamed in fp8) fits nowhere beside the 10.6 GB
    # text encoder in RAM; Q8_0 only streamed from files on disk (the last rung); Q4_K whole on the card at
    # 480x320x33, streamed from RAM at 832x480x81.
    card, request = HARDWARE["rtx3060-12-32"], PlanRequest(480, 320, 33)
    own, plan8, plan4 = (plan_memory(s, request, card) for s in (spec, q8, q4))
    assert (own.fits, plan8.fits, plan4.fits) == (False, True, True)
    assert plan8.strategy == "disk_offload"
    assert (plan4.strategy, plan4.transformer) == ("text_encoder_offload", "device")
    assert plan4.predicted_peak_vram_gb <= plan4.budget_vram_gb
    longer = plan_memory(q4, PlanRequest(832, 480, 81), card)
    assert longer.fits and (longer.strategy, longer.fp8) == ("group_offload", False)
    # With 2 GB more RAM free, bf16 streams its blocks in fp8; Q8_0 streams as it is (GGUF is never cast to fp8).
    roomier = replace(card, ram_available_gb=29)
    own, plan8 = plan_memory(spec, request, roomier), plan_memory(q8, request, roomier)
    assert (own.fits, own.strategy, own.fp8) == (True, "fp8_group_offload", True)
    assert (plan8.fits, plan8.strategy, plan8.fp8) == (True, "group_offload", False)
    assert any("wan2.1-t2v-14b-Q4_K.gguf (Q4_K): it stays quantised once loaded (7.6 GB" in d
               for d in plan4.decisions)
    # Another file, or the same one rewritten, is another load.
    rewritten = replace(q4, transformer_files=(replace(q4.transformer_files[0], source=("/models/x.gguf", 2, 1)),))
    assert plan_memory(rewritten, request, card).reload_key != plan4.reload_key
    assert plan_memory(spec, request, card).reload_key != plan4.reload_key


# ----- the command line --------------------------------------------------------------------------------------
def test_app_plan_takes_a_transformer_file_and_refuses_one_that_does_not_fit(model_dirs, files, tmp_path, capsys):
    import app

    hardware = tmp_path / "cpu.json"
    hardware.write_text(json.dumps({"backend": "cpu", "device_name": "test-cpu", "ram_total_gb": 24,
                                    "ram_available_gb": 20}))
    common = ["plan", "--preset", "selftest-t2v", "--model", str(model_dirs["tiny-t2v"]), "--hardware",
              str(hardware), "--user-presets", str(tmp_path / "user_presets"), "--json"]
    assert app.main([*common, "--transformer", str(files["gguf"])]) == app.EXIT_OK
    plan = json.loads(capsys.readouterr().out)
    assert plan["transformer_files"][0][0] == str(files["gguf"].resolve())
    assert app.main([*common, "--transformer", str(files["1.3b"])]) == app.EXIT_BAD_INPUT
    assert "is shaped like Wan2.1 T2V 1.3B" in capsys.readouterr().err
    # A name is looked for in the models folder's transformers/ (as the page lists them); one in neither place is
    # refused naming both.
    models = tmp_path / "models"
    (models / "transformers" / "wan").mkdir(parents=True)
    shutil.copy(files["gguf"], models / "transformers" / "wan" / "high.gguf")
    given = ["generate", "--prompt", "a fox", "--model", "selftest-t2v", "--transformer", "wan/high.gguf",
             "--models-dir", str(models), "--user-presets", str(tmp_path / "user_presets")]
    settings = app._settings(app.parse_args(given))[1]
    assert settings.transformer == str((models / "transformers" / "wan" / "high.gguf").resolve())
    with pytest.raises(InputError, match=f"low.gguf is neither in this folder .* nor in {models / 'transformers'}"):
        app._settings(app.parse_args([*given, "--transformer-2", "low.gguf"]))
    assert app.main([*common, "--models-dir", str(models), "--transformer", "wan/high.gguf"]) == app.EXIT_OK
    assert json.loads(capsys.readouterr().out)["transformer_files"][0][0] == settings.transformer


def test_the_app_s_check_refuses_a_file_of_another_shape_before_the_job_is_queued(model_dirs, files, presets,
                                                                                   outputs, tmp_path):
    """The catalog reads the model and the file as the engine would, so the sentence comes before any engine
    process starts."""
    from engine.service.worker import WorkerClient

    client = WorkerClient(tmp_path / "models")
    base = model_dirs["tiny-t2v"]
    with pytest.raises(InputError, match="is shaped like Wan2.1 T2V 1.3B"):
        client.check(tiny_request(presets, base, outputs, transformer=str(files["1.3b"]), **RUN))
    assert client.pid is None
    checked, _ = client.check(tiny_request(presets, base, outputs, transformer=str(files["safetensors"]), **RUN))
    assert checked.settings.transformer == str(files["safetensors"])
