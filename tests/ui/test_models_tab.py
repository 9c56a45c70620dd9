"""The Models tab's handlers on an app context, then on a real app: a delete needs its confirmation and never
reaches a model that the running job uses or that a loaded pipeline holds."""
from __future__ import annotations

import dataclasses
import shutil

import pytest

from engine.service.worker import WorkerClient
from tests.conftest import selftest_app
from tests.helpers.repos import INDEX
from ui.context import AppContext
from ui.tabs.models import CONFIRM_FIRST, delete_model, download, entries, summary, table_rows

pytestmark = pytest.mark.server


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


# ----- what a loaded pipeline holds, on a real app ---------------------------------------------------------------
@pytest.fixture(scope="module")
def held(tmp_path_factory, selftest_models_dir):
    """An app whose models folder holds a GGUF transformer of the self-test model, two LoRAs and a fast decoder;
    one still is made with the GGUF file, one LoRA and the fast decoder, and the model stays loaded."""
    import torch
    from gradio_client import Client
    from safetensors.torch import save_file

    from engine.models.fast_decoder_file import random_fast_decoder_state, write_fast_decoder
    from engine.models.selftest import SELFTEST_T2V
    from tests.helpers.loras import diffusers_lora
    from tests.helpers.weights import original_state, write_gguf

    models = tmp_path_factory.mktemp("held-models")
    shutil.copytree(selftest_models_dir / SELFTEST_T2V, models / SELFTEST_T2V)
    for folder in ("transformers", "loras", "fast_decoders"):
        (models / folder).mkdir()
    write_gguf(original_state(models / SELFTEST_T2V), models / "transformers" / "tiny-Q8_0.gguf")
    save_file(diffusers_lora(), models / "loras" / "used.safetensors")
    save_file(diffusers_lora(seed=2), models / "loras" / "idle.safetensors")
    write_fast_decoder(models / "fast_decoders" / "taew2_1.safetensors",
                       random_fast_decoder_state(latent_channels=16, patch_size=1, seed=0))
    with torch.no_grad(), selftest_app(tmp_path_factory, models, "held") as app:
        client = Client(app["url"], verbose=False)
        _, status, *_ = client.predict("selftest-t2v", "a fox", "", "selftest-t2v", 64, 64, 1, 2, 5.0, 3.0, 7,
                                       transformer="tiny-Q8_0.gguf", loras="used.safetensors: 0.5", decoder="fast",
                                       api_name="/text_to_image")
        assert "LoRAs on: used.safetensors at 0.5" in status and "fast decoder" in status, status
        yield {**app, "client": client, "models": models}


def _delete(app, key: str) -> str:
    return app["client"].predict(key, True, api_name="/delete_model")[0]


@pytest.mark.parametrize("key, name", [
    ("models:transformers/tiny-Q8_0.gguf", "transformers/tiny-Q8_0.gguf"),
    ("models:loras/used.safetensors", "loras/used.safetensors"),
    ("models:fast_decoders/taew2_1.safetensors", "fast_decoders/taew2_1.safetensors"),
    ("models:selftest-t2v", "selftest-t2v"),
])
def test_what_the_loaded_pipeline_holds_is_not_deleted_until_it_is_unloaded(held, key, name):
    assert _delete(held, key) == (f"Not deleted: {name} is in use by the engine: it is loaded there, so press Unload "
                                  "first, then delete it")
    assert (held["models"] / name).exists()


def test_the_model_list_keeps_its_choice_through_the_tab_s_own_messages(held):
    """Delete without the tick says to tick it and keeps the choice (it emptied the list, and a second Delete then
    said "'None' is not in the list"); nothing chosen says to pick one."""
    key = "models:loras/idle.safetensors"
    said, confirm, _, _, choice = held["client"].predict(key, False, api_name="/delete_model")
    assert said == CONFIRM_FIRST and choice["value"] == key and confirm["value"] is False
    said, *_, choice = held["client"].predict(key, True, api_name="/delete_model")
    assert said.startswith("Deleted loras/idle.safetensors (LoRA, ") and choice["value"] is None
    for nothing in (None, ""):
        said, *_ = held["client"].predict(nothing, True, api_name="/delete_model")
        assert said == "Pick the model to delete in the Model list first."
    from safetensors.torch import save_file

    from tests.helpers.loras import diffusers_lora

    save_file(diffusers_lora(seed=2), held["models"] / "loras" / "idle.safetensors")   # for the next test


def test_a_file_the_pipeline_does_not_hold_is_deleted_and_after_unload_the_rest_too(held):
    assert _delete(held, "models:loras/idle.safetensors").startswith("Deleted loras/idle.safetensors (LoRA, ")
    assert not (held["models"] / "loras" / "idle.safetensors").exists()
    held["client"].predict(api_name="/unload")
    for name in ("transformers/tiny-Q8_0.gguf", "loras/used.safetensors", "fast_decoders/taew2_1.safetensors"):
        assert _delete(held, f"models:{name}").startswith(f"Deleted {name} ("), name
        assert not (held["models"] / name).exists()
