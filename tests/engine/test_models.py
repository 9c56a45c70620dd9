"""Model references resolve to checked folders: local, hub cache (offline) and built-in."""
from __future__ import annotations

import json
import shutil

import pytest

from engine.models.catalog import ModelCatalog
from engine.models.refs import check_model_folder, classify_ref, resolve_model
from engine.errors import ModelError
from engine.models.spec import spec_from_folder

REVISION = "0123456789abcdef0123456789abcdef01234567"


def test_local_folder_resolves(model_dirs, tmp_path):
    resolved = resolve_model(str(model_dirs["tiny-t2v"]), tmp_path)
    assert resolved.source == "local" and resolved.pipeline_class == "WanPipeline"
    assert {"transformer", "vae", "text_encoder", "tokenizer", "scheduler"} <= set(resolved.components)
    i2v = resolve_model(str(model_dirs["tiny-i2v"]), tmp_path)
    assert i2v.image_to_video and "image_encoder" in i2v.components


def test_folder_without_model_index_is_refused(tmp_path):
    (tmp_path / "weights").mkdir()
    with pytest.raises(ModelError, match="has no model_index.json"):
        ModelCatalog().check_folder(str(tmp_path / "weights"))


def test_folder_with_a_missing_component_names_it(model_dirs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(model_dirs["tiny-t2v"], broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(ModelError, match="component 'vae' is missing"):
        check_model_folder(broken)
    shutil.copytree(model_dirs["tiny-t2v"] / "vae", broken / "vae")
    for f in (broken / "transformer").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelError, match="component 'transformer' has no weight files"):
        check_model_folder(broken)


def test_unsupported_pipeline_is_refused(model_dirs, tmp_path):
    other = tmp_path / "sd"
    shutil.copytree(model_dirs["tiny-t2v"], other)
    index = json.loads((other / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusionPipeline"
    (other / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError, match="'StableDiffusionPipeline' is not supported"):
        check_model_folder(other)


@pytest.mark.parametrize("ref, expected", [
    ("", "is not a folder, a Hugging Face repo id"),
    ("just-a-word", "is not a folder, a Hugging Face repo id"),
    ("/no/such/folder", "does not exist"),
    ("./relative/missing", "does not exist"),
])
def test_bad_references(ref, expected):
    with pytest.raises(ModelError, match=expected):
        classify_ref(ref)


def test_reference_kinds(model_dirs):
    assert classify_ref("selftest-t2v") == "selftest"
    assert classify_ref(str(model_dirs["tiny-t2v"])) == "local"
    assert classify_ref("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") == "hub"


def _populate_hub_cache(cache, repo_id, source):
    """Lay out a model the way huggingface_hub stores a download."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(source, repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return repo


def test_hub_reference_resolves_from_the_cache_offline(model_dirs, tmp_path, monkeypatch):
    home = tmp_path / "hf"
    _populate_hub_cache(home / "hub", "tiny-org/tiny-wan", model_dirs["tiny-t2v"])
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    progress = []
    resolved = resolve_model("tiny-org/tiny-wan", tmp_path / "models", lambda *a: progress.append(a))
    assert resolved.source == "hub" and resolved.revision == REVISION
    assert resolved.folder == home / "hub" / "models--tiny-org--tiny-wan" / "snapshots" / REVISION


def test_hub_reference_missing_offline_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="tiny-org/not-downloaded is not in the Hugging Face cache and offline "
                                         "mode is on") as raised:
        resolve_model("tiny-org/not-downloaded", tmp_path / "models")
    assert str(tmp_path) not in str(raised.value)     # where the cache is, is the machine's business


def test_a_model_reached_through_a_link_is_named_as_given_never_by_where_the_link_leads(model_dirs, tmp_path):
    """The messages about a model folder name it by the reference the user gave: a link's target, or the path of
    a hub model's blobs, is never shown (the command line's direct check still names the file to delete)."""
    hidden = tmp_path / "private-disk" / "real-name"
    shutil.copytree(model_dirs["tiny-t2v"], hidden)
    models = tmp_path / "models"
    models.mkdir()
    (models / "wan").symlink_to(hidden, target_is_directory=True)
    ref = str(models / "wan")
    assert resolve_model(ref, models).folder == hidden                  # loaded from where it is
    weights = next((hidden / "transformer").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    for check in (lambda: resolve_model(ref, models), lambda: ModelCatalog().check_folder(ref)):
        with pytest.raises(ModelError) as raised:
            check()
        message = str(raised.value)
        assert message.startswith(f"wan: weight file transformer/{weights.name} is damaged: ")
        assert message.endswith("Delete that file, or the whole model on the Models tab, and download the model again")
        assert "private-disk" not in message and "real-name" not in message
    (hidden / "model_index.json").unlink()
    with pytest.raises(ModelError, match=f"^{ref} has no model_index.json") as raised:
        resolve_model(ref, models)
    assert "private-disk" not in str(raised.value)


def test_selftest_model_is_built_once_and_reused(tmp_path):
    first = resolve_model("selftest-t2v", tmp_path)
    stamp = (first.folder / "model_index.json").stat().st_mtime_ns
    again = resolve_model("selftest-t2v", tmp_path)
    assert first.folder == again.folder == tmp_path / "selftest-t2v"
    assert (again.folder / "model_index.json").stat().st_mtime_ns == stamp
    assert first.source == "selftest" and first.revision == "builtin"


def test_size_multiple_comes_from_the_model(model_dirs):
    assert spec_from_folder(model_dirs["tiny-t2v"]).size_multiple == 16
