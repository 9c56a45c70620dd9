"""The light VAE (decoder "vae_light"): LightX2V's pruned Wan2.1 VAE files read in their original layout, checked
against the model's VAE, and decoding a run's latents in the VAE's place, said on the page and in the sidecar."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.events import JobFailed, JobFinished, PhaseStarted
from engine.models.catalog import ModelInfo
from engine.models.light_vae_file import (MODEL_OWN_FOLDER, LightVaeError, build_light_vae, find_light_vae,
                                          light_vae_config, light_vae_state, locate_light_vae, random_light_vae,
                                          read_light_vae, to_diffusers_key, write_light_vae)
from engine.models.selftest import SELFTEST_T2V, ensure_selftest_model, write_selftest_light_vae
from engine.outputs.export import read_video
from engine.run.decoding import decode_stream
from engine.run.engine import Engine
from engine.settings.model_fit import check_model_fits
from engine.settings.values import InputError
from tests.conftest import CPU, run_engine, tiny_request

ROOT = Path(__file__).resolve().parents[2]
# Wan2.1's VAE config as its model folders have it (diffusers' AutoencoderKLWan defaults: base width 96).
WAN21_VAE = {"base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
             "temperal_downsample": [False, True, True], "dropout": 0.0}
# A small VAE of the released layout (two residual blocks a stage, widths 1-2-4-4), cheap on the CPU.
SMALL_VAE = {**WAN21_VAE, "base_dim": 8}


def _published_layout() -> dict:
    return json.loads((ROOT / "docs" / "data" / "lightvaew2_1-layout.json").read_text())


def test_a_written_light_vae_has_the_published_files_keys_and_shapes():
    with torch.device("meta"):
        light = build_light_vae(light_vae_config(WAN21_VAE, 24))
    written = {key: list(value.shape) for key, value in light_vae_state(light).items()}
    published = _published_layout()
    assert written == published["tensors"]
    assert sum(torch.Size(shape).numel() for shape in written.values()) == published["parameters"]


def test_the_original_names_map_as_diffusers_own_converter_maps_them():
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    names = list(_published_layout()["tensors"])
    theirs = convert_wan_vae_to_diffusers({name: name for name in names})   # diffusers' name -> the original
    assert {to_diffusers_key(name, 2, 4): name for name in names} == theirs
    assert to_diffusers_key("decoder.upsamples.15.residual.2.weight", 2, 4) is None     # past the last stage
    assert to_diffusers_key("decoder.upsamples.15.resample.1.weight", 2, 4) is None     # no Resample after it
    assert to_diffusers_key("model.diffusion_model.blocks.0.weight", 2, 4) is None


def _small_light(tmp_path, name="lightvaew2_1.safetensors", width=4):
    light = random_light_vae(SMALL_VAE, width, seed=3)
    return light, write_light_vae(tmp_path / name, light)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_a_light_vae_read_back_decodes_as_the_one_written(tmp_path, suffix):
    light, path = _small_light(tmp_path, "lightvaew2_1" + suffix)
    info, state = read_light_vae(path, SMALL_VAE)
    assert (info.base_dim, info.z_dim, info.name) == (4, 16, "lightvaew2_1")
    assert info.parameters == sum(p.numel() for p in light.parameters())
    again = build_light_vae(light_vae_config(SMALL_VAE, info.base_dim), state)
    latents = torch.randn(1, 16, 3, 6, 8, generator=torch.Generator().manual_seed(0))
    first, second = (np.concatenate(list(decode_stream(vae, latents, "cpu"))) for vae in (light, again))
    assert first.shape == (9, 48, 64, 3) and np.array_equal(first, second)


def test_a_file_with_the_decoder_alone_is_enough(tmp_path):
    from safetensors.torch import save_file

    light, _ = _small_light(tmp_path)
    state = {k: v for k, v in light_vae_state(light).items() if not k.startswith(("encoder.", "conv1."))}
    save_file(state, str(tmp_path / "decoder_only.safetensors"))
    info, read = read_light_vae(tmp_path / "decoder_only.safetensors", SMALL_VAE)
    assert info.base_dim == 4 and not any(key.startswith("encoder.") for key in read)


def _rewritten(tmp_path, change) -> Path:
    from safetensors.torch import save_file

    light, _ = _small_light(tmp_path)
    state = light_vae_state(light)
    change(state)
    save_file(state, str(tmp_path / "changed.safetensors"))
    return tmp_path / "changed.safetensors"


@pytest.mark.parametrize("change, words", [
    (lambda s: s.pop("decoder.head.2.weight"), "does not fit this model's VAE (it has no decoder.conv_out.weight"),
    (lambda s: s.__setitem__("decoder.upsamples.0.residual.2.weight", torch.zeros(8, 8, 3, 3, 3)),
     "has shape [8, 8, 3, 3, 3] where [16, 16, 3, 3, 3] fits"),
    (lambda s: s.__setitem__("decoder.extra.weight", torch.zeros(1)), "does not fit this model's VAE (it has a key decoder.extra.weight"),
    (lambda s: s.__setitem__("conv2.weight", torch.full_like(s["conv2.weight"], float("nan"))), "NaN"),
    (lambda s: s.clear() or s.__setitem__("decoder.22.bias", torch.zeros(3)), "not a Wan VAE in its original layout"),
])
def test_a_light_vae_that_does_not_fit_is_refused_with_what_to_do(tmp_path, change, words):
    with pytest.raises(LightVaeError) as refused:
        read_light_vae(_rewritten(tmp_path, change), SMALL_VAE)
    assert words in str(refused.value)
    assert "lightvaew2_1" in str(refused.value) or "choose the VAE" in str(refused.value)


def test_a_light_vae_for_other_latents_or_damaged_is_refused(tmp_path):
    _, path = _small_light(tmp_path)
    with pytest.raises(LightVaeError, match="takes 16-channel latents; the model makes 48-channel"):
        read_light_vae(path, {**SMALL_VAE, "z_dim": 48})
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(LightVaeError, match="cannot be used: .*download lightvaew2_1.safetensors again"):
        read_light_vae(cut, SMALL_VAE)
    with pytest.raises(LightVaeError, match="there is no light VAE file"):
        read_light_vae(tmp_path / "absent.safetensors", SMALL_VAE)


def test_where_a_light_vae_is_looked_for(tmp_path, monkeypatch):
    models, own = tmp_path / "models", tmp_path / "model"
    assert find_light_vae(models, 16, own) is None
    shared = write_light_vae(models / "fast_decoders" / "lightvaew2_1.pth", random_light_vae(SMALL_VAE, 4))
    assert find_light_vae(models, 16, own) == shared
    better = write_light_vae(models / "fast_decoders" / "lightvaew2_1.safetensors", random_light_vae(SMALL_VAE, 4))
    assert find_light_vae(models, 16, own) == better
    mine = write_light_vae(own / MODEL_OWN_FOLDER / "lightvaew2_1.safetensors", random_light_vae(SMALL_VAE, 4))
    assert find_light_vae(models, 16, own) == mine and find_light_vae(models, 48, own) is None
    with pytest.raises(LightVaeError, match="no light VAE is published for 48-channel latents"):
        locate_light_vae(models, 48)
    with pytest.raises(LightVaeError, match=r"offline: put lightvaew2_1.safetensors .* in .*fast_decoders"):
        locate_light_vae(tmp_path / "empty", 16, offline=True)


def test_a_run_decoded_by_the_light_vae_says_so_and_differs_from_the_vae(model_dirs, presets, tmp_path):
    folder = tmp_path / "tiny-t2v"
    shutil.copytree(model_dirs["tiny-t2v"], folder)
    write_selftest_light_vae(folder)
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    light, events = run_engine(engine, tiny_request(presets, folder, tmp_path / "out", decoder="vae_light"))
    assert isinstance(light, JobFinished), light
    exact, _ = run_engine(engine, tiny_request(presets, folder, tmp_path / "out"))
    sidecar = json.loads(Path(light.sidecar).read_text())
    assert sidecar["speed"]["decoder"] == "vae_light (lightvaew2_1)" and sidecar["speed"]["approximate"] is True
    assert sidecar["parameters"]["decoder"] == "vae_light"
    assert any("with the light VAE lightvaew2_1" in getattr(e, "message", "") for e in events)
    frames, _ = read_video(Path(light.paths[0]))
    exact_frames, _ = read_video(Path(exact.paths[0]))
    assert frames.shape == exact_frames.shape and not np.array_equal(frames, exact_frames)
    assert json.loads(Path(exact.sidecar).read_text())["speed"]["decoder"] == "vae"
    again, _ = run_engine(engine, tiny_request(presets, folder, tmp_path / "out", decoder="vae_light"))
    assert np.array_equal(read_video(Path(again.paths[0]))[0], frames)     # the kept light VAE, the same frames
    from engine.service.engine_process import _loaded_files

    kept = folder / MODEL_OWN_FOLDER / "lightvaew2_1.safetensors"
    assert list(engine.loaded.light_vaes) == [kept] and str(kept) in _loaded_files(engine).paths   # not deletable


def test_a_light_vae_of_another_width_layout_is_refused_before_the_denoise(model_dirs, presets, tmp_path):
    folder = tmp_path / "tiny-t2v"
    shutil.copytree(model_dirs["tiny-t2v"], folder)
    write_light_vae(folder / MODEL_OWN_FOLDER / "lightvaew2_1.safetensors", random_light_vae(SMALL_VAE, 4))
    engine = Engine(tmp_path / "models", hardware=CPU, preview_seconds=-1)
    result, events = run_engine(engine, tiny_request(presets, folder, tmp_path / "out", decoder="vae_light"))
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert "does not fit this model's VAE" in result.message
    assert not any(isinstance(e, PhaseStarted) and e.phase == "denoise" for e in events)


def test_the_self_test_model_carries_a_light_vae_and_gets_one_when_built_before_it(tmp_path):
    folder = ensure_selftest_model(SELFTEST_T2V, tmp_path)
    own = folder / MODEL_OWN_FOLDER / "lightvaew2_1.safetensors"
    assert own.is_file() and find_light_vae(tmp_path, 16, folder) == own
    config = json.loads((folder / "vae" / "config.json").read_text())
    assert read_light_vae(own, config)[0].base_dim < config["base_dim"]
    shutil.rmtree(own.parent)
    assert ensure_selftest_model(SELFTEST_T2V, tmp_path) == folder and own.is_file()


def test_a_wan22_5b_model_is_refused_the_light_vae_before_it_is_queued():
    from engine.models.spec import KNOWN_MODELS
    from engine.settings.values import Settings

    for ref, refused in (("Wan-AI/Wan2.2-TI2V-5B-Diffusers", True), ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", False)):
        settings = Settings(model=ref, mode="t2v", width=832, height=480 + 224 * refused, frames=81, steps=2,
                            guidance=5.0, shift=5.0, decoder="vae_light")
        if refused:
            with pytest.raises(InputError, match="48-channel latents and the light VAE decodes Wan2.1's"):
                check_model_fits(ModelInfo(ref, KNOWN_MODELS[ref]), settings, None)
        else:
            check_model_fits(ModelInfo(ref, KNOWN_MODELS[ref]), settings, None)


def test_the_time_plan_counts_the_light_vaes_measured_decode():
    from engine.models.spec import KNOWN_MODELS
    from engine.planning.vae_time import LIGHT_VAE_DECODE_FACTOR, decode_seconds
    from tests.helpers.machines import H200_CALIBRATION, plan_for

    measured = json.loads((ROOT / "docs" / "data" / "light-vae-h200.json").read_text())
    assert LIGHT_VAE_DECODE_FACTOR == pytest.approx(measured["light_vae_factor"], abs=0.01)
    spec = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
    plan = plan_for(spec)
    light, how = decode_seconds(spec, 832, 480, 81, plan, H200_CALIBRATION, "vae_light")
    vae, _ = decode_seconds(spec, 832, 480, 81, plan, H200_CALIBRATION, "vae")
    # Measured on an H200 in bfloat16: 0.667 s against 1.930 s for the VAE (0.35).
    assert light / vae == pytest.approx(measured["light_vs_vae"], rel=0.15), (light, vae)
    assert "the light VAE (width 24)" in how
