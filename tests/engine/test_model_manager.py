"""The Models tab's engine side: downloads from a stand-in Hub on 127.0.0.1 (resumed, refused offline or without
room), the listing of the Hub cache and the models folder, and deletes that never reach what is in use or outside."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.models.download import (DownloadError, DownloadPlan, check_space, download_file, download_snapshot,
                                    partial_file)
from engine.models.hub_metadata import is_metadata
from engine.models.loras import Lora
from engine.service.model_files import (DeleteRefused, LoadedFiles, ModelEntry, check_deletable, delete_entry,
                                   find_entry, list_models)
from engine.settings.presets import load_presets
from tests.fake_hub import FakeHub
from tests.helpers.repos import INDEX, REPO_FILES

REPO = "org/tiny-wan"
REPO_BYTES = sum(len(data) for data in REPO_FILES.values())
# What a download fetches after the repository's description (its JSON files, read first to check it).
WEIGHT_BYTES = sum(len(data) for path, data in REPO_FILES.items() if not is_metadata(path))
WEIGHT = "transformer/diffusion_pytorch_model.safetensors"   # its largest file (113 kB): resumable in the tests
WEIGHTS = REPO_FILES[WEIGHT]
LORA_REPO = "org/loras"
LORA = os.urandom(200_000)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub():
    hub = FakeHub({REPO: REPO_FILES,
                   LORA_REPO: {"styles/ink.safetensors": LORA}}).start()
    yield hub
    hub.stop()


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"   # nothing listens there any more


# ----- downloads ------------------------------------------------------------------------------------------------
def test_a_file_cut_halfway_continues_on_the_next_try_with_a_range_request(hub, tmp_path):
    hub.cut.add((LORA_REPO, "styles/ink.safetensors"))
    folder = tmp_path / "models" / "loras"
    with pytest.raises(DownloadError, match="Download again continues from there"):
        download_file(LORA_REPO, "styles/ink.safetensors", folder, endpoint=hub.url)
    assert not (folder / "ink.safetensors").exists()
    kept = list(folder.glob("ink.safetensors.*.part"))
    assert len(kept) == 1 and kept[0].read_bytes() == LORA[:len(LORA) // 2]

    said = []
    path = download_file(LORA_REPO, "styles/ink.safetensors", folder, lambda done, total: said.append((done, total)),
                         endpoint=hub.url)
    assert path == folder / "ink.safetensors" and path.read_bytes() == LORA
    first, second = hub.gets("styles/ink.safetensors")
    assert first.range is None and second.range == f"bytes={len(LORA) // 2}-"
    assert said[-1] == (len(LORA), len(LORA)) and said[0][0] > len(LORA) // 2 - 1
    assert not list(folder.glob("*.part"))


def test_a_snapshot_s_large_file_cut_halfway_continues_on_the_next_try_with_a_range_request(hub, tmp_path):
    cache = tmp_path / "hub"
    hub.cut.add((REPO, WEIGHT))
    with pytest.raises(DownloadError, match=f"the download of {REPO}/{WEIGHT} stopped after .*"
                                            "Download again continues from there"):
        download_snapshot(REPO, endpoint=hub.url, cache_dir=cache, resumable_bytes=100_000)
    said = []
    folder = download_snapshot(REPO, lambda done, total: said.append((done, total)), endpoint=hub.url,
                               cache_dir=cache, resumable_bytes=100_000)
    first, second = hub.downloads(WEIGHT)
    assert first.range is None and second.range == f"bytes={len(WEIGHTS) // 2}-"
    assert (folder / WEIGHT).read_bytes() == WEIGHTS
    assert (folder / WEIGHT).is_symlink()          # linked from the cache's blob store
    assert (folder / "model_index.json").read_bytes() == INDEX
    total = WEIGHT_BYTES
    assert said[-1] == (total, total) and all(done <= t == total for done, t in said)
    assert not list(cache.rglob("*.part"))
    (entry,) = list_models(tmp_path / "models", {}, cache)
    assert entry.size_bytes == REPO_BYTES


def test_a_file_of_that_name_is_never_overwritten_and_the_same_file_is_not_fetched_again(hub, tmp_path):
    folder = tmp_path / "loras"
    folder.mkdir()
    (folder / "ink.safetensors").write_bytes(b"my own ink")
    with pytest.raises(DownloadError, match="exists already and is not this file; delete or rename it first"):
        download_file(LORA_REPO, "styles/ink.safetensors", folder, endpoint=hub.url)
    assert (folder / "ink.safetensors").read_bytes() == b"my own ink"
    (folder / "ink.safetensors").unlink()
    download_file(LORA_REPO, "styles/ink.safetensors", folder, endpoint=hub.url)
    assert download_file(LORA_REPO, "styles/ink.safetensors", folder, endpoint=hub.url).read_bytes() == LORA
    assert len(hub.gets("ink.safetensors")) == 1


def test_a_snapshot_lands_in_the_hub_cache_and_a_failed_try_keeps_the_files_it_finished(hub, tmp_path):
    cache = tmp_path / "hub"
    hub.broken.add((REPO, WEIGHT))
    with pytest.raises(DownloadError, match="files finished so far are kept"):
        download_snapshot(REPO, endpoint=hub.url, cache_dir=cache)
    kept = next((cache / "models--org--tiny-wan" / "snapshots").iterdir())
    missing = sum(len(data) for path, data in REPO_FILES.items() if not (kept / path).is_file())
    assert len(WEIGHTS) <= missing < REPO_BYTES     # the broken file, and any the failure stopped on the way
    said = []
    folder = download_snapshot(REPO, lambda done, total: said.append((done, total)), endpoint=hub.url,
                               cache_dir=cache)
    assert (folder / "model_index.json").read_bytes() == INDEX
    assert (folder / WEIGHT).read_bytes() == WEIGHTS
    assert len(hub.gets("model_index.json")) == 1          # the second try fetched only what was missing
    # the bytes bar of huggingface_hub's own download reported them as they came, then the end was said
    assert len(said) >= 2 and said[-2] == said[-1] == (missing, missing)
    assert download_snapshot(REPO, endpoint=hub.url, cache_dir=cache) == folder   # all there: nothing fetched
    assert len(hub.downloads(WEIGHT)) == 2


def test_without_the_hub_the_message_says_to_check_the_connection_or_place_the_files(closed_port, tmp_path):
    start = time.monotonic()
    with pytest.raises(DownloadError, match=r"^Can't reach the Hugging Face Hub: .*check the connection or put the "
                                            r"files in .*hub"):
        download_snapshot(REPO, endpoint=closed_port, cache_dir=tmp_path / "hub")
    with pytest.raises(DownloadError, match=r"^Can't reach the Hugging Face Hub: .*put the files in .*loras"):
        download_file(LORA_REPO, "styles/ink.safetensors", tmp_path / "models" / "loras", endpoint=closed_port)
    assert time.monotonic() - start < 10
    assert not (tmp_path / "models").exists()


def test_offline_mode_is_refused_with_the_same_words(monkeypatch, hub, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match=r"^Can't reach the Hugging Face Hub: offline mode is on"):
        download_snapshot(REPO, endpoint=hub.url, cache_dir=tmp_path / "hub")
    assert hub.seen == []


def test_downloads_use_the_hub_that_hf_endpoint_names(tmp_path):
    """In a fresh process, as the app reads HF_ENDPOINT once, at start: the repo lands in HF_HUB_CACHE."""
    hub = FakeHub({REPO: REPO_FILES}).start()
    script = ("import json\nfrom engine.models.download import download_snapshot\n"
              f"said = []\nfolder = download_snapshot({REPO!r}, lambda done, total: said.append((done, total)))\n"
              "print(json.dumps([str(folder), said[-1]]))\n")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0"}
    try:
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    finally:
        hub.stop()
    assert done.returncode == 0, done.stderr
    folder, last = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(folder).parent.parent == tmp_path / "hub" / "models--org--tiny-wan"
    assert (Path(folder) / WEIGHT).read_bytes() == WEIGHTS
    assert last == [REPO_BYTES] * 2
    assert any(s.path.endswith(WEIGHT) for s in hub.seen)


def test_too_little_room_is_refused_before_any_byte_saying_what_is_needed_and_free(hub, tmp_path):
    cache = tmp_path / "hub"
    with pytest.raises(DownloadError, match=r"not enough disk space for org/tiny-wan: it needs .* and .* has "
                                            r"100 B free"):
        download_snapshot(REPO, free_bytes=100, endpoint=hub.url, cache_dir=cache)
    with pytest.raises(DownloadError, match="not enough disk space for org/loras"):
        download_file(LORA_REPO, "styles/ink.safetensors", tmp_path / "loras", free_bytes=100, endpoint=hub.url)
    assert hub.gets("") == []            # sizes were asked (HEAD, the file tree), no file was fetched
    assert not list(cache.rglob("diffusion_pytorch_model.safetensors")) and not (tmp_path / "loras").exists()
    assert list_models(tmp_path / "models", {}, cache) == []      # nor is anything listed


def test_the_space_check_counts_only_the_files_still_to_fetch(tmp_path):
    plan = DownloadPlan("org/x", (("a", 10**9),), tmp_path)
    check_space(plan, free_bytes=2 * 10**9)
    with pytest.raises(DownloadError, match=r"needs 1\.3 GB \(1\.0 GB of files"):
        check_space(plan, free_bytes=10**9)
    check_space(DownloadPlan("org/x", (), tmp_path), free_bytes=0)


@pytest.mark.parametrize("repo, path", [("not a repo", ""), ("org/x", "../../etc/passwd"), ("org/x", "/etc/passwd")])
def test_bad_names_are_refused_before_asking_the_hub(repo, path, tmp_path):
    with pytest.raises(DownloadError, match="repo id|path inside a repo"):
        if path:
            download_file(repo, path, tmp_path, endpoint="http://127.0.0.1:9")
        else:
            download_snapshot(repo, endpoint="http://127.0.0.1:9", cache_dir=tmp_path)


# ----- listing and deleting -------------------------------------------------------------------------------------
@pytest.fixture
def disk(hub, tmp_path):
    """A Hub cache with one downloaded repo and a models folder with one of everything."""
    cache, models = tmp_path / "hub", tmp_path / "models"
    download_snapshot(REPO, endpoint=hub.url, cache_dir=cache)
    download_file(LORA_REPO, "styles/ink.safetensors", models / "loras", endpoint=hub.url)
    (models / "selftest-t2v").mkdir(parents=True)
    (models / "selftest-t2v" / "model_index.json").write_bytes(INDEX)
    (models / "my-wan").mkdir()
    (models / "my-wan" / "model_index.json").write_bytes(INDEX)
    (models / "wan-q4.gguf").write_bytes(b"g" * 1234)
    (models / "fast_decoders").mkdir()
    (models / "fast_decoders" / "taew2_1.safetensors").write_bytes(b"f" * 500)
    (models / ".calibration").mkdir()
    (models / "notes.txt").write_text("not a model")
    presets = load_presets()
    some = presets["selftest-t2v"]
    presets["mine"] = dataclasses.replace(some, name="mine", settings=dataclasses.replace(
        some.settings, model=REPO, loras=(Lora("ink.safetensors"),)))
    presets["folder"] = dataclasses.replace(some, name="folder", settings=dataclasses.replace(
        some.settings, model=str(models / "my-wan"), transformer="wan-q4.gguf"))
    return cache, models, presets


def test_the_list_shows_each_model_with_its_size_kind_and_presets(disk):
    cache, models, presets = disk
    found = {e.key: e for e in list_models(models, presets, cache)}
    assert set(found) == {f"hub:{REPO}", "models:loras/ink.safetensors", "models:selftest-t2v", "models:my-wan",
                          "models:wan-q4.gguf", "models:fast_decoders/taew2_1.safetensors"}
    hub_entry = found[f"hub:{REPO}"]
    assert hub_entry.kind == "diffusers model (Hub)" and hub_entry.size_bytes == REPO_BYTES
    assert hub_entry.presets == ("mine",)
    assert found["models:loras/ink.safetensors"].presets == ("mine",)
    assert found["models:loras/ink.safetensors"].size_bytes == len(LORA)
    assert found["models:selftest-t2v"].kind == "self-test model"
    assert found["models:selftest-t2v"].presets == ("selftest-t2v",)
    assert found["models:my-wan"].presets == ("folder",) and found["models:wan-q4.gguf"].presets == ("folder",)
    assert found["models:wan-q4.gguf"].size_bytes == 1234 and found["models:wan-q4.gguf"].kind == "transformer file"
    assert found["models:fast_decoders/taew2_1.safetensors"].kind == "fast decoder"
    (models / "fast_decoders" / "lightvaew2_1.safetensors").write_bytes(b"l" * 300)
    found = {e.key: e for e in list_models(models, presets, cache)}
    assert found["models:fast_decoders/lightvaew2_1.safetensors"].kind == "light VAE"
    (models / "fast_decoders" / "lightvaew2_1.safetensors").unlink()
    # The page's Transformer file lists models/transformers/ and its folders: so does the Models tab.
    (models / "transformers" / "wan22").mkdir(parents=True)
    (models / "transformers" / "wan22" / "high-q8.gguf").write_bytes(b"\0" * 99)
    found = {e.key: e for e in list_models(models, presets, cache)}
    assert found["models:transformers/wan22/high-q8.gguf"].kind == "transformer file"
    assert found["models:transformers/wan22/high-q8.gguf"].size_bytes == 99
    assert "models:transformers" not in found and "models:transformers/wan22" not in found


def test_the_hub_cache_is_found_through_hf_hub_cache(disk, monkeypatch):
    cache, models, presets = disk
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert [e.name for e in list_models(models, presets) if e.place == "hub"] == [REPO]
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(cache.parent))     # HF_HOME/hub
    assert [e.name for e in list_models(models, presets) if e.place == "hub"] == [REPO]


def test_what_the_engine_uses_is_not_deleted_and_the_rest_is(disk):
    cache, models, presets = disk
    entries = list_models(models, presets, cache)
    hub_entry = find_entry(entries, f"hub:{REPO}")
    in_use = (REPO, str(models / "my-wan"), "ink.safetensors")    # loaded model; running job's folder and LoRA
    for entry in (hub_entry, find_entry(entries, "models:my-wan"), find_entry(entries, "models:loras/ink.safetensors")):
        with pytest.raises(DeleteRefused, match="in use by the engine"):
            delete_entry(entry, models, in_use, cache)
        assert entry.path.exists()
    said = delete_entry(find_entry(entries, "models:wan-q4.gguf"), models, in_use, cache)
    assert said.startswith("Deleted wan-q4.gguf (transformer file, 1.2 kB freed)")
    assert not (models / "wan-q4.gguf").exists()
    delete_entry(hub_entry, models, ("selftest-t2v",), cache)
    assert not hub_entry.path.exists()
    assert [e.key for e in list_models(models, presets, cache) if e.place == "hub"] == []


def test_what_any_engine_s_loaded_pipeline_holds_is_not_deleted(disk):
    """Each engine says which files its pipeline holds (its folder: a hub snapshot or a folder of the models folder,
    transformer files, LoRAs, fast decoders); a file held by any of them is refused, whatever the running job is."""
    cache, models, presets = disk
    entries = list_models(models, presets, cache)
    hub_entry = find_entry(entries, f"hub:{REPO}")
    snapshot = next((hub_entry.path / "snapshots").iterdir())
    engines = [LoadedFiles(None, ()),                                      # an engine with nothing loaded
               LoadedFiles(REPO, (str(snapshot), str(models / "wan-q4.gguf"), str(models / "loras" / "ink.safetensors"),
                                  str(models / "fast_decoders" / "taew2_1.safetensors"))),
               LoadedFiles("my-wan", (str(models / "my-wan"),))]
    for key in (f"hub:{REPO}", "models:wan-q4.gguf", "models:loras/ink.safetensors",
                "models:fast_decoders/taew2_1.safetensors", "models:my-wan"):
        entry = find_entry(entries, key)
        with pytest.raises(DeleteRefused, match=f"^{entry.name} is in use by the engine: it is loaded there, so "
                                                "press Unload first, then delete it$"):
            delete_entry(entry, models, (), cache, engines)
        assert entry.path.exists()
    delete_entry(find_entry(entries, "models:selftest-t2v"), models, (), cache, engines)
    assert not (models / "selftest-t2v").exists()
    delete_entry(find_entry(entries, "models:my-wan"), models, (), cache, engines[:2])     # its engine unloaded it
    assert not (models / "my-wan").exists()


def test_nothing_outside_the_models_folder_or_the_hub_cache_is_deleted(disk, tmp_path):
    cache, models, presets = disk
    entries = list_models(models, presets, cache)
    with pytest.raises(DeleteRefused, match="not in the list"):
        find_entry(entries, "models:../../etc")
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "model_index.json").write_bytes(INDEX)
    sneaky = ModelEntry("models:../../etc", "../../etc", "diffusers model folder", models / ".." / "precious", 1)
    with pytest.raises(DeleteRefused, match="not inside the models folder"):
        delete_entry(sneaky, models, (), cache)
    (models / "linked").symlink_to(outside)       # a link in the models folder to a folder elsewhere
    linked = find_entry(list_models(models, presets, cache), "models:linked")
    with pytest.raises(DeleteRefused, match="not inside the models folder"):
        check_deletable(linked, models, (), cache)
    root = ModelEntry("models:.", ".", "diffusers model folder", models, 1)
    with pytest.raises(DeleteRefused, match="not inside"):
        delete_entry(root, models, (), cache)
    assert (outside / "model_index.json").exists() and models.is_dir()


def test_a_partial_file_is_kept_per_version_of_the_file(tmp_path):
    assert partial_file(tmp_path / "a.gguf", "abc") != partial_file(tmp_path / "a.gguf", "abd")
