"""The Models tab's handlers on an app context (the page-level test runs in tests/ui/test_server.py's app): a
delete needs its confirmation and never reaches a model that the running job uses."""
from __future__ import annotations

import dataclasses

from engine.service.worker import WorkerClient
from tests.engine.test_model_manager import INDEX
from ui.context import AppContext
from ui.tabs.models import CONFIRM_FIRST, delete_model, download, entries, summary, table_rows


def _ctx(presets, tmp_path) -> AppContext:
    (tmp_path / "my-wan").mkdir()
    (tmp_path / "my-wan" / "model_index.json").write_bytes(INDEX)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "model_index.json").write_bytes(INDEX)
    return AppContext(WorkerClient(tmp_path), dict(presets), str(tmp_path / "out"))   # never started


def test_a_delete_needs_its_confirmation_and_spares_the_running_job_s_model(presets, tmp_path):
    ctx = _ctx(presets, tmp_path)
    assert delete_model(ctx, "models:my-wan", False) == CONFIRM_FIRST
    assert delete_model(ctx, "models:my-wan", None) == CONFIRM_FIRST
    ctx.client.running_settings = dataclasses.replace(presets["selftest-t2v"].settings, model=str(tmp_path / "my-wan"))
    assert delete_model(ctx, "models:my-wan", True).startswith("Not deleted: my-wan is in use by the engine")
    assert (tmp_path / "my-wan" / "model_index.json").exists()
    assert delete_model(ctx, "models:other", True).startswith("Deleted other (diffusers model folder")
    assert not (tmp_path / "other").exists()
    assert [row[0] for row in table_rows(entries(ctx)) if row[2] == "models folder"] == ["my-wan"]


def test_a_download_with_a_bad_repo_id_or_folder_says_what_to_write(presets, tmp_path):
    ctx = _ctx(presets, tmp_path)
    assert list(download(ctx, "../../etc", "", None)) == [
        "Not downloaded: '../../etc' is not a Hugging Face repo id; write it as org/name."]
    assert list(download(ctx, "org/x", "a.gguf", "/etc")) == ["Not downloaded: pick where the file goes from the list."]


def test_the_summary_counts_the_models_and_says_the_free_space(presets, tmp_path):
    found = entries(_ctx(presets, tmp_path))
    assert summary(found, {"the models folder": 2_500_000_000}) == (
        f"**2 on disk, {2 * len(INDEX)} B in all** · 2.5 GB free for the models folder")
