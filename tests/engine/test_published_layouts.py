"""Every preset's repository as it is published (tests/fixtures/published/: its JSON files and the headers of its
weight files at their published names, shapes, dtypes and shard layout, the data left as holes) goes through the
app's own checks: the folder check, the catalog, the plan, and the read of a repository before its weights download;
the single files the app fetches (LoRAs, decoders, the light VAE, RIFE) through their readers."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.models_table import PROFILES
from engine.events import JobFailed
from engine.models.catalog import ModelCatalog
from engine.models.limits import limits_of
from engine.models.refs import check_model_folder
from engine.models.spec import CLIP_VIT_H_PARAMS, KNOWN_MODELS, UMT5_XXL_PARAMS
from engine.models.weights import elements, read_header
from engine.planning.planner import override_for, plan_memory, plan_request_for
from engine.settings.presets import load_presets
from tests.conftest import CPU, run_engine, tiny_request
from tests.fake_hub import FakeHub, serve_downloads_from
from tests.layouts import (materialize_file, materialize_repo, published_repos, repo_files, rife_shapes,
                           single_files)

pytestmark = pytest.mark.slow   # in process, but fifty plans from the published repositories' headers

REPOS = published_repos()
PRESETS = load_presets()
CLOSE = 0.01     # the table's sizes against the published headers'


def test_every_preset_s_repository_has_its_published_layout_kept():
    assert {preset.settings.model for preset in PRESETS.values() if "/" in preset.settings.model} == set(REPOS)
    assert set(REPOS) == set(KNOWN_MODELS)


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> dict[str, Path]:
    """Each repository's folder at its published sizes (sparse: a few MB of headers on disk)."""
    base = tmp_path_factory.mktemp("published")
    return {repo: materialize_repo(repo, base / repo.replace("/", "--")) for repo in REPOS}


def _header_params(folder: Path, component: str) -> int:
    return sum(elements(info["shape"]) for path in sorted((folder / component).glob("*.safetensors"))
               for name, info in read_header(path).items() if name != "__metadata__")


@pytest.mark.parametrize("repo", REPOS)
def test_the_folder_check_and_the_catalog_read_it_as_its_headers_say(repo, published):
    folder = published[repo]
    index = json.loads((folder / "model_index.json").read_text())
    pipeline, components, expand = check_model_folder(folder, repo)
    assert pipeline == index["_class_name"] and expand == bool(index.get("expand_timesteps"))
    assert set(components) == {name for name, value in index.items()
                               if not name.startswith("_") and isinstance(value, list) and value[0] is not None}
    spec = ModelCatalog().spec(repo, folder)
    assert spec.transformer.params == _header_params(folder, "transformer")
    assert spec.text_encoder_params == _header_params(folder, "text_encoder") == UMT5_XXL_PARAMS
    assert spec.vae_params == _header_params(folder, "vae")
    if "image_encoder" in components:
        assert spec.image_encoder_params == _header_params(folder, "image_encoder") == CLIP_VIT_H_PARAMS
    if "transformer_2" in components:
        assert spec.experts == 2 and _header_params(folder, "transformer_2") == spec.transformer.params
    assert spec.transformer.gated == (pipeline == "WanDMDPipeline")


@pytest.mark.parametrize("repo", REPOS)
def test_the_table_the_plan_uses_before_a_download_matches_the_headers(repo, published):
    """Before its download the planner counts the table's sizes: each within 1% of the published headers', its shapes,
    kind, limits and storage the same."""
    known, read = KNOWN_MODELS[repo], ModelCatalog().spec(repo, published[repo])
    for size in ("params", "block_params"):
        assert getattr(known.transformer, size) == pytest.approx(getattr(read.transformer, size), rel=CLOSE)
    for size in ("text_encoder_params", "text_encoder_largest_params", "image_encoder_params", "vae_params"):
        assert getattr(known, size) == pytest.approx(getattr(read, size), rel=CLOSE), size
    for shape in ("layers", "heads", "head_dim", "ffn", "in_channels", "patch", "patch_t", "rope_max_seq_len",
                  "first_last", "gate"):
        assert getattr(known.transformer, shape) == getattr(read.transformer, shape), shape
    for kind in ("experts", "expand_timesteps", "vae_spatial", "vae_temporal", "vae_z", "window_frames"):
        assert getattr(known, kind) == getattr(read, kind), kind
    assert known.stored == read.stored
    assert replace(limits_of(known), name="") == replace(limits_of(read), name="")


@pytest.mark.parametrize("repo", REPOS)
def test_its_presets_plan_alike_from_the_table_and_from_the_headers(repo, published):
    known, read = KNOWN_MODELS[repo], ModelCatalog().spec(repo, published[repo])
    presets = [preset for preset in PRESETS.values() if preset.settings.model == repo]
    assert presets
    for preset in presets:
        request, override = plan_request_for(preset.settings), override_for(preset.settings)
        for machine, hardware in PROFILES.items():
            before, after = plan_memory(known, request, hardware, override), plan_memory(read, request, hardware,
                                                                                      override)
            where = f"{preset.name} on {machine}"
            assert (before.strategy, before.fits, before.text_encoder) == (after.strategy, after.fits,
                                                                           after.text_encoder), where
            for peak in ("predicted_peak_vram_gb", "predicted_peak_ram_gb"):
                assert getattr(before, peak) == pytest.approx(getattr(after, peak), rel=CLOSE, abs=0.02), where
            loads = [next(p for p in plan.phases if p.phase == "load") for plan in (before, after)]
            assert loads[0].mapped_gb == pytest.approx(loads[1].mapped_gb, rel=CLOSE, abs=0.02), where


@pytest.mark.parametrize("repo", REPOS)
def test_read_on_the_hub_before_its_weights_it_is_what_its_files_say(repo, published, tmp_path):
    """The read of a repository before its weights download, against the published layout served by a stand-in
    Hub: the same folder facts and spec as the whole folder gives, from its JSON files and header ranges alone."""
    folder = published[repo]
    hub = FakeHub({repo: {path: (folder / path) for path in repo_files(repo)}}).start()
    try:
        found = _described(repo, hub, tmp_path / "hub")
    finally:
        hub.stop()
    assert found.spec == ModelCatalog().spec(repo, folder)
    assert found.pipeline_class == check_model_folder(folder, repo)[0]
    weights = [path for path in repo_files(repo) if path.endswith(".safetensors")]
    reads = [seen for seen in hub.seen if seen.method == "GET" and seen.path.endswith(".safetensors")]
    assert all(seen.range and not seen.range.endswith("-") for seen in reads)   # header ranges only
    assert sorted({seen.path.split("/", 5)[5] for seen in reads}) == sorted(weights)     # a request or two each
    assert len(reads) <= 2 * len(weights)
    fetched = sum(hub.bytes_sent(path) for path in repo_files(repo))
    assert fetched < 2_000_000 < sum(repo_files(repo).values()) // 1000     # kilobytes of a many-GB repository


def test_a_published_model_too_big_for_this_machine_is_refused_before_its_weights(published, presets, tmp_path,
                                                                                  monkeypatch):
    """Wan2.1 T2V 14B (57 GB of float32 transformer) on a CPU with 24 GB of RAM: the job is refused in its download
    phase on what the headers say, and none of its weight files is fetched."""
    from engine.run.engine import Engine

    repo = "Wan-AI/Wan2.1-T2V-14B-Diffusers"
    folder = published[repo]
    hub = serve_downloads_from(FakeHub({repo: {path: (folder / path) for path in repo_files(repo)}}).start(),
                               monkeypatch, tmp_path / "hub")
    engine = Engine(tmp_path / "models", CPU)
    try:
        result, _ = run_engine(engine, tiny_request(presets, repo, tmp_path / "outputs", frames=5, steps=2))
    finally:
        engine.unload()
        hub.stop()
    assert isinstance(result, JobFailed) and result.phase == "download", result
    assert "does not fit this machine's memory" in result.message
    assert f"Only the description of {repo} was downloaded" in result.message
    assert not [s for s in hub.seen if s.method == "GET" and s.path.endswith(".safetensors")
                and (s.range is None or s.range.endswith("-"))]


# ----- the single files the app fetches -------------------------------------------------------------------------
LORAS = [key for key in single_files() if "lora" in key.lower() or "Lightning" in key]
LORA_MODELS = {"I2V_14B": "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", "T2V_14B": "Wan-AI/Wan2.1-T2V-14B-Diffusers",
               "I2V-A14B": "Wan-AI/Wan2.2-I2V-A14B-Diffusers", "T2V-A14B": "Wan-AI/Wan2.2-T2V-A14B-Diffusers"}


def test_every_file_a_preset_fetches_has_its_published_layout_kept():
    fetched = {f"{lora.repo}/{lora.path}" for preset in PRESETS.values() for lora in preset.settings.loras}
    assert fetched and fetched <= set(single_files())
    assert {"Kijai/WanVideo_comfy/taew2_1.safetensors", "Kijai/WanVideo_comfy/taew2_2.safetensors",
            "lightx2v/Autoencoders/lightvaew2_1.safetensors"} <= set(single_files())


@pytest.mark.parametrize("key", LORAS)
def test_each_published_lora_reads_as_a_wan_lora_whose_layers_its_model_has(key, tmp_path, published):
    from engine.models.lora_layout import diffusers_layer
    from engine.models.loras import lora_file_problem

    path = materialize_file(key, tmp_path)
    assert lora_file_problem(str(path)) is None
    model = next(repo for marker, repo in LORA_MODELS.items() if marker in key)
    own = {name for name in read_header(next((published[model] / "transformer").glob("*00001-of*.safetensors")))}
    own |= {name for shard in (published[model] / "transformer").glob("*.safetensors") for name in read_header(shard)}
    layers = {key.split("diffusion_model.", 1)[1].rsplit(".lora_down", 1)[0]
              for key in read_header(path) if ".lora_down." in key}
    assert layers and all(f"{diffusers_layer(layer)}.weight" in own for layer in layers)


@pytest.mark.parametrize("key, channels", [("Kijai/WanVideo_comfy/taew2_1.safetensors", 16),
                                           ("Kijai/WanVideo_comfy/taew2_2.safetensors", 48),
                                           ("lightx2v/Autoencoders/lighttaew2_1.safetensors", 16),
                                           ("lightx2v/Autoencoders/lighttaew2_2.safetensors", 48)])
def test_each_published_fast_decoder_reads_with_its_latent_channels(key, channels, tmp_path):
    from engine.models.fast_decoder_file import check_matches, read_fast_decoder

    info, _ = read_fast_decoder(materialize_file(key, tmp_path))
    check_matches(info, channels)
    assert info.vae_space_latents == Path(key).name.startswith("light")


def test_the_published_light_vae_reads_against_the_wan21_vae(tmp_path, published):
    from engine.models.light_vae_file import read_light_vae

    config = json.loads((published["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"] / "vae" / "config.json").read_text())
    info, _ = read_light_vae(materialize_file("lightx2v/Autoencoders/lightvaew2_1.safetensors", tmp_path), config)
    assert info.base_dim == 24 and info.z_dim == 16


def test_the_published_rife_file_loads_as_rife_4_7_to_4_9(tmp_path):
    import torch

    from engine.post.rife import load_rife

    path = tmp_path / "rife49.pth"
    torch.save({name: torch.zeros(shape, dtype=torch.float32) for name, (_, shape) in rife_shapes().items()}, path)
    assert load_rife(path).layout.version.startswith("4.7")


def _described(repo: str, hub, cache):
    """The repository as its description says it is, read from the stand-in Hub as a job reads it before its
    weights (ModelCatalog.read_before_download's own steps)."""
    from engine.models.hub_metadata import list_repo, read_before_weights, read_repo_metadata

    return read_before_weights(read_repo_metadata(list_repo(repo, hub.url, cache), hub.url), repo)
