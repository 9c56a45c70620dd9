"""A Hub repository is read before its weights download: its JSON files, then its weight files' headers by range
requests. A repository the app cannot run, or whose plan cannot fit this machine, is refused on that, before any
weight is fetched, by a job (the engine's download phase) and by the Models tab's Download."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.errors import DownloadError, ModelError
from engine.events import JobFailed, JobFinished
from engine.models.catalog import ModelCatalog, cached_snapshot
from engine.models.download import download_snapshot
from engine.models.hub_metadata import FIRST_READ_BYTES
from engine.models.selftest import SELFTEST_T2V, build_selftest_pipeline
from engine.run.engine import Engine
from engine.service.model_files import HUB_DESCRIPTION, HUB_MODEL, list_models
from tests.conftest import CPU, run_engine, tiny_request
from tests.fake_hub import FakeHub, serve_downloads_from

REPO = "org/tiny-wan"


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("tiny-repo")
    build_selftest_pipeline(SELFTEST_T2V).save_pretrained(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _with_index(files: dict[str, bytes], **changes) -> dict[str, bytes]:
    index = json.loads(files["model_index.json"])
    index.update(changes)
    return {**files, "model_index.json": json.dumps(index).encode()}


def _weights(hub: FakeHub) -> list:
    """The requests of weight files that fetch more than their header."""
    return [s for s in hub.seen if s.method == "GET" and s.path.endswith((".safetensors", ".bin"))
            and (s.range is None or s.range.endswith("-"))]


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """The engine's downloads pointed at a FakeHub (given by the test) and a cache of the test's own."""
    return lambda hub: serve_downloads_from(hub, monkeypatch, tmp_path / "hub")


def _run(tmp_path, presets, hardware=CPU, model=REPO):
    engine = Engine(tmp_path / "models", hardware)
    try:
        return run_engine(engine, tiny_request(presets, model, tmp_path / "outputs", frames=5, steps=2))
    finally:
        engine.unload()


def test_a_pipeline_the_app_cannot_run_is_refused_before_any_weight_file_is_asked_for(tiny_files, hub_env, tmp_path,
                                                                                      presets):
    hub = hub_env(FakeHub({REPO: _with_index(tiny_files, _class_name="StableDiffusionPipeline")}).start())
    try:
        result, _ = _run(tmp_path, presets)
    finally:
        hub.stop()
    assert isinstance(result, JobFailed) and result.kind == "model" and result.phase == "download"
    assert "pipeline 'StableDiffusionPipeline' is not supported" in result.message
    assert [s for s in hub.seen if s.method == "GET" and s.path.endswith(".safetensors")] == []
    assert cached_snapshot(REPO) is None          # only its description is in the cache: not a model to load


def test_a_model_whose_plan_cannot_fit_is_refused_on_its_headers_alone(tiny_files, hub_env, tmp_path, presets):
    """The plan runs on the headers' sizes: a machine too small for it refuses it having read only their bytes."""
    hub = hub_env(FakeHub({REPO: tiny_files}).start())
    tiny_ram = replace(CPU, ram_total_gb=0.5, ram_available_gb=0.4)
    try:
        result, _ = _run(tmp_path, presets, tiny_ram)
    finally:
        hub.stop()
    assert isinstance(result, JobFailed) and result.kind == "input", result
    assert "does not fit this machine's memory" in result.message
    assert f"Only the description of {REPO} was downloaded (kilobytes), none of its weights." in result.message
    assert _weights(hub) == []
    reads = [s for s in hub.seen if s.method == "GET" and s.path.endswith(".safetensors")]
    assert len(reads) == 3 and all(s.range.startswith("bytes=0-") for s in reads)   # one header each
    assert all(int(s.range.split("-")[1]) < FIRST_READ_BYTES for s in reads)
    (entry,) = list_models(tmp_path / "models", {}, tmp_path / "hub")      # the Models tab says what it holds
    assert entry.name == REPO and entry.kind == HUB_DESCRIPTION and entry.size_bytes < 20_000


def test_a_weight_file_damaged_on_the_hub_is_named_before_the_download(tiny_files, hub_env, tmp_path, presets):
    shard = "transformer/diffusion_pytorch_model.safetensors"
    hub = hub_env(FakeHub({REPO: {**tiny_files, shard: tiny_files[shard][:-1000]}}).start())
    try:
        result, _ = _run(tmp_path, presets)
    finally:
        hub.stop()
    assert isinstance(result, JobFailed) and result.kind == "model"
    assert f"tiny-wan: weight file {shard} on the Hugging Face Hub is damaged: " in result.message
    assert "cut short" in result.message and "None of its weights was downloaded" in result.message
    assert _weights(hub) == []


def test_a_repo_that_passes_is_downloaded_once_and_read_from_the_cache_after(tiny_files, hub_env, tmp_path, presets):
    hub = hub_env(FakeHub({REPO: tiny_files}).start())
    try:
        first, _ = _run(tmp_path, presets)
        assert isinstance(first, JobFinished), first
        fetched = len(_weights(hub))
        assert fetched == 3
        asked = len(hub.seen)
        again, _ = _run(tmp_path, presets)        # all in the cache: no header read, nothing fetched again
        assert isinstance(again, JobFinished)
        assert len(_weights(hub)) == fetched
        # One question to the Hub (its revision, the cache answering the rest), not a second round to find the folder
        assert [seen.path for seen in hub.seen[asked:]] == [f"/api/models/{REPO}/revision/main"]
    finally:
        hub.stop()
    assert cached_snapshot(REPO) is not None
    assert [entry.kind for entry in list_models(tmp_path / "models", {}, tmp_path / "hub")] == [HUB_MODEL]


def test_the_models_tab_refuses_a_repo_it_cannot_run_before_its_weights(tiny_files, tmp_path):
    hub = FakeHub({REPO: _with_index(tiny_files, _class_name="WanVACEPipeline"),
                   "org/loras": {"ink.safetensors": tiny_files["vae/diffusion_pytorch_model.safetensors"]}}).start()
    try:
        with pytest.raises(ModelError, match="pipeline 'WanVACEPipeline' is not supported"):
            download_snapshot(REPO, endpoint=hub.url, cache_dir=tmp_path / "hub")
        with pytest.raises(DownloadError, match="org/loras has no model_index.json, so it is not a diffusers model .* "
                                                "give the file's path too"):
            download_snapshot("org/loras", endpoint=hub.url, cache_dir=tmp_path / "hub")
    finally:
        hub.stop()
    assert _weights(hub) == []


def test_a_component_the_repo_lacks_is_said_as_the_repo_s_not_as_a_download_to_redo(tiny_files, tmp_path):
    files = {path: data for path, data in tiny_files.items() if path != "vae/config.json"}
    hub = FakeHub({REPO: files}).start()
    try:
        with pytest.raises(ModelError) as refused:
            _described(REPO, hub, tmp_path / "hub")
    finally:
        hub.stop()
    assert str(refused.value) == ("tiny-wan: component 'vae' has no config.json; the repository on the Hugging Face "
                                  "Hub is published so, and nothing of its weights was downloaded; choose another model")
    assert _weights(hub) == []


def test_what_the_description_says_is_what_the_downloaded_folder_says(tiny_files, tmp_path):
    hub = FakeHub({REPO: tiny_files}).start()
    try:
        before = _described(REPO, hub, tmp_path / "hub")
        folder = download_snapshot(REPO, endpoint=hub.url, cache_dir=tmp_path / "hub")
    finally:
        hub.stop()
    after = ModelCatalog().spec(REPO, Path(folder))
    assert before.spec == after and before.pipeline_class == "WanPipeline"
    assert before.folder == Path(folder)     # the same snapshot, its JSON files first


def _described(repo: str, hub, cache):
    """The repository as its description says it is, read from the stand-in Hub as a job reads it before its
    weights (ModelCatalog.read_before_download's own steps)."""
    from engine.models.hub_metadata import list_repo, read_before_weights, read_repo_metadata

    return read_before_weights(read_repo_metadata(list_repo(repo, hub.url, cache), hub.url), repo)
