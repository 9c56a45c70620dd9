"""Weights that hold NaN or infinite values never end in "Done" with a black video.

A probe of the app found a LoRA with NaN or ±inf weights, and a GGUF transformer full of NaN, finishing in a second
with an mp4 of zeros. Here such files are made for the tiny self-test model and run through the engine as users run
them: a damaged LoRA, transformer file or fast decoder is refused, named, before any step; latents that go NaN with
files that passed (a LoRA of finite but enormous values) fail naming the files and the phase, nothing saved; a VAE
that overflows fails the decode, its latents kept to decode again.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.events import JobFailed, JobFinished, PhaseStarted
from engine.models.fast_decoder_file import MODEL_OWN_FOLDER, random_fast_decoder_state, write_fast_decoder
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request
from tests.helpers.loras import FAST, diffusers_lora
from tests.helpers.weights import RUN, original_state, write_gguf

BEFORE_ANY_STEP = ("text_encode", "denoise", "vae_decode", "export")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("broken-weights-models"), CPU, preview_seconds=-1)
    yield engine
    engine.unload()


def phases(events) -> list[str]:
    return [e.phase for e in events if isinstance(e, PhaseStarted)]


def nothing_written(outputs: Path) -> bool:
    return not [path for path in outputs.rglob("*") if path.is_file()]


def damaged(state: dict, names: list[str], value: float) -> dict:
    """``state`` with every value of the tensors ``names`` replaced by ``value`` (NaN, inf or -inf)."""
    return {name: torch.full_like(tensor, value) if name in names else tensor for name, tensor in state.items()}


# ----- LoRAs ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, kind", [(float("nan"), "NaN"), (float("inf"), "infinite"), (-float("inf"), "infinite")])
def test_a_lora_holding_nan_or_infinite_weights_is_refused_naming_how_many_before_any_step(
        engine, presets, model_dirs, outputs, tmp_path, value, kind):
    state = diffusers_lora()
    names = sorted(state)
    path = tmp_path / "detail.safetensors"
    save_file(damaged(state, names[3:6], value), path)
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, loras=((str(path), 0.8),), **FAST)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert result.message == (f"The LoRA detail.safetensors holds {kind} values in 3 of its {len(names)} tensors "
                              f"(first: {names[3]}): it is damaged; remove it or download it again.")
    assert result.phase == "lora" and not set(BEFORE_ANY_STEP) & set(phases(events))
    assert nothing_written(outputs)


def test_latents_gone_nan_from_files_that_passed_name_those_files_and_the_denoise(engine, presets, model_dirs,
                                                                                  outputs, tmp_path):
    """Every value finite, each far too large: the transformer's activations overflow to inf, then NaN."""
    path = tmp_path / "overcooked.safetensors"
    save_file({name: torch.full_like(tensor, 1e20) for name, tensor in diffusers_lora().items()}, path)
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, loras=((str(path), 1.0),), **FAST)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFailed) and result.kind == "values", result
    assert result.phase == "denoise" and "denoise" in phases(events)
    assert result.message.startswith("The denoising produced NaN")
    assert ("of the latents) with the LoRA overcooked.safetensors at 1, so there is no video to decode; nothing was "
            "saved.") in result.message
    assert result.hint.startswith("It passed the check of its values, yet it may be damaged or not suited to this "
                                  "model: run again without it, or with a lower LoRA strength")
    assert result.latents is None and nothing_written(outputs)
    fine, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, **FAST))
    assert isinstance(fine, JobFinished), fine   # the engine goes on; the adapter is off without the LoRA


# ----- transformer files -----------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")   # the gguf package quantising NaN
def test_a_gguf_transformer_full_of_nan_is_refused_as_it_loads(engine, presets, model_dirs, outputs, tmp_path):
    state = original_state(model_dirs["tiny-t2v"])
    path = write_gguf(damaged(state, list(state), float("nan")), tmp_path / "wan-Q8_0.gguf")
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs,
                                                     transformer=str(path), **RUN))
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert result.message.startswith(f"The transformer file wan-Q8_0.gguf holds NaN values in {len(state)} of the "
                                     f"{len(state)} tensors sampled (first: ")
    assert result.message.endswith("it is damaged; download it again, or clear the transformer file to use the "
                                   "model's own transformer.")
    assert result.phase == "load" and not set(BEFORE_ANY_STEP) & set(phases(events))
    assert nothing_written(outputs)


def test_infinite_values_across_the_middle_of_one_tensor_of_a_safetensors_file_are_found_by_the_sample(
        presets, model_dirs, tmp_path):
    from engine.models.finite import SAMPLE_ELEMENTS, transformer_file_problem
    from engine.models.single_file import PREFIX, read_transformer_file

    state = original_state(model_dirs["tiny-t2v"])
    name = "blocks.1.ffn.0.weight"
    # A tensor longer than the sample, whose start is fine and whose middle is not: only the middle rows tell.
    state[name] = torch.randn(SAMPLE_ELEMENTS // 6, 24)
    state[name][state[name].shape[0] // 2:] = float("inf")
    path = tmp_path / "wan.safetensors"
    save_file({PREFIX + key: value for key, value in state.items()}, path)
    problem = transformer_file_problem(read_transformer_file(path))
    assert problem.startswith(f"the transformer file wan.safetensors holds infinite values in 1 of the {len(state)} "
                              f"tensors sampled (first: {PREFIX}{name})")
    state[name] = torch.randn(SAMPLE_ELEMENTS // 6, 24)
    save_file({PREFIX + key: value for key, value in state.items()}, path)
    assert transformer_file_problem(read_transformer_file(path)) is None


# ----- the fast decoder: checked before the denoise -------------------------------------------------------------------
@pytest.fixture
def fast_model(model_dirs, tmp_path) -> Path:
    """A copy of the tiny model that carries its own fast decoder file (what find_fast_decoder picks first)."""
    folder = tmp_path / "tiny-t2v"
    shutil.copytree(model_dirs["tiny-t2v"], folder)
    (folder / MODEL_OWN_FOLDER).mkdir()
    return folder


@pytest.mark.parametrize("name, expected", [
    ("taew2_1.safetensors", "The fast decoder taew2_1.safetensors cannot be used: it is not a safetensors file (it "
                            "does not begin with a safetensors header); download it again"),
    ("taew2_1.pth", "The fast decoder taew2_1.pth cannot be used: it cannot be read as weights (UnpicklingError): it "
                    "is damaged or cut short"),
])
def test_a_fast_decoder_of_random_bytes_is_refused_before_any_step(engine, presets, fast_model, outputs, name,
                                                                   expected):
    noise = random.Random(0).randbytes(64 * 1024)
    (fast_model / MODEL_OWN_FOLDER / name).write_bytes(noise)
    result, events = run_engine(engine, tiny_request(presets, fast_model, outputs, decoder="fast"))
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert result.message.startswith(expected), result.message
    assert "\\x" not in result.message and str(fast_model) not in result.message   # no bytes, no folders
    assert not {"load", *BEFORE_ANY_STEP} & set(phases(events))
    assert nothing_written(outputs)


def test_a_fast_decoder_holding_nan_is_refused_before_any_step(engine, presets, fast_model, outputs):
    state = random_fast_decoder_state(16, 1)
    decoder_keys = sorted(key for key in state if key.startswith("decoder."))
    write_fast_decoder(fast_model / MODEL_OWN_FOLDER / "taew2_1.safetensors",
                       damaged(state, [decoder_keys[0]], float("nan")))
    result, events = run_engine(engine, tiny_request(presets, fast_model, outputs, decoder="fast"))
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert result.message.startswith(f"The fast decoder taew2_1.safetensors holds NaN values in 1 of its "
                                     f"{len(decoder_keys)} tensors (first: {decoder_keys[0]}): it is damaged; "
                                     "download it again")
    assert not {"load", *BEFORE_ANY_STEP} & set(phases(events))


# ----- the decode ---------------------------------------------------------------------------------------------------
@pytest.fixture
def overflowing_vae_model(model_dirs, tmp_path) -> Path:
    """A copy of the tiny model whose VAE turns finite latents into infinities (its first decoder conv scaled far
    beyond float32's range, as a float16 VAE's activations overflow 65,504)."""
    folder = tmp_path / "tiny-t2v-overflow"
    shutil.copytree(model_dirs["tiny-t2v"], folder)
    file = folder / "vae" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(file))
    state["decoder.conv_in.weight"] = torch.full_like(state["decoder.conv_in.weight"], 1e38)
    save_file(state, str(file))
    return folder


@pytest.mark.parametrize("mode", ["t2v", "t2i"])   # the streamed decode, and the whole one of a still
def test_a_vae_that_overflows_fails_the_decode_and_keeps_the_latents(engine, presets, overflowing_vae_model, outputs,
                                                                     mode):
    request = tiny_request(presets, overflowing_vae_model, outputs, mode=mode, **({"frames": 1} if mode == "t2i"
                                                                                  else {}))
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFailed) and result.kind == "values", result
    assert result.phase == "vae_decode"
    assert result.message.startswith("The VAE decode produced NaN")
    assert "of the frames' pixels) from finite latents, so the video would be black." in result.message
    assert result.hint.startswith("The model's VAE weights may be damaged: download the model again.")
    assert result.latents and Path(result.latents).is_file()   # the denoise is not lost
    assert not list(outputs.rglob("*.mp4")) and not list(outputs.rglob("*.png"))
