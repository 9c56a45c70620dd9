"""FastWan as FastVideo publishes it: ``WanDMDPipeline`` in its model_index.json, the gate of its sparse attention in
every block, float32 shards with an index file. The folder loads from a local folder, the Hub cache and the Hub, runs
end to end with the gate kept, and a folder of one's own picks a preset made for its steps."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from engine.events import Info, JobFinished
from engine.models.catalog import ModelCatalog
from engine.models.refs import check_model_folder, folder_pipeline_kind
from engine.models.spec import SELFTEST_SPECS, spec_for
from engine.outputs.export import read_video
from engine.run.engine import Engine
from tests.conftest import CPU, run_engine, tiny_request
from tests.fake_hub import FakeHub, serve_downloads_from
from tests.layouts import FASTWAN_GATE, gate_weights, save_fastwan_layout

REPO = "FastVideo/FastWan2.1-T2V-1.3B-Diffusers"
DMD = dict(steps=3, scheduler="flow_dmd", sigmas=(1.0, 0.757, 0.522), guidance=1.0, shift=1.0)
TINY = SELFTEST_SPECS["selftest-t2v"].transformer
GATE_PARAMS = TINY.layers * (TINY.dim * TINY.dim + TINY.dim)


@pytest.fixture(scope="module")
def fastwan_dir(tmp_path_factory) -> Path:
    return save_fastwan_layout(tmp_path_factory.mktemp("fastwan") / "FastWan2.1-T2V-1.3B-Diffusers")


@pytest.fixture
def diffusers_warnings():
    """What diffusers logs at warning level meanwhile (where it says which weights of a file 'were not used')."""
    from diffusers.utils import logging as diffusers_logging

    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    handler, logger = Keep(level=logging.WARNING), diffusers_logging.get_logger("diffusers")
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


def test_the_folder_is_accepted_and_its_gate_counted(fastwan_dir, diffusers_warnings):
    assert check_model_folder(fastwan_dir)[0] == "WanDMDPipeline"
    assert folder_pipeline_kind(str(fastwan_dir)).runs_as == "WanPipeline"
    shards = sorted(p.name for p in (fastwan_dir / "transformer").glob("*.safetensors"))
    assert len(shards) > 1 and (fastwan_dir / "transformer" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    spec = spec_for(str(fastwan_dir), fastwan_dir)
    assert spec.transformer.gate == FASTWAN_GATE and spec.transformer.gated
    assert len(gate_weights(fastwan_dir)) == 2 * TINY.layers
    assert spec.transformer.params == TINY.params + GATE_PARAMS
    assert spec.transformer.block_params == TINY.block_params + TINY.dim * TINY.dim + TINY.dim
    assert spec.stored_width("transformer") == 4.0 and spec.stored_width("text_encoder") == 4.0
    from diffusers import WanTransformer3DModel   # diffusers' own class drops the gate, and says so

    WanTransformer3DModel.from_pretrained(fastwan_dir / "transformer")
    assert any("were not used" in said and FASTWAN_GATE in said for said in diffusers_warnings)


def test_it_runs_end_to_end_with_the_gate_kept_and_nothing_dropped(fastwan_dir, presets, outputs, tmp_path,
                                                                   diffusers_warnings):
    engine = Engine(tmp_path / "models", CPU)
    try:
        result, events = run_engine(engine, tiny_request(presets, fastwan_dir, outputs, frames=9, **DMD))
        assert isinstance(result, JobFinished), result
        frames, _ = read_video(result.paths[0])
        assert frames.shape[0] == 9
        sidecar = json.loads(Path(result.sidecar).read_text())
        assert sidecar["model"]["pipeline"] == "WanDMDPipeline"
        transformer = engine.loaded.pipe.transformer
        assert type(transformer).__name__ == "GatedWanTransformer3DModel"
        kept = {name: tensor for name, tensor in transformer.state_dict().items() if FASTWAN_GATE in name}
        published = gate_weights(fastwan_dir)
        assert kept.keys() == published.keys()
        assert all(kept[name].float().equal(published[name].to(kept[name].dtype).float()) for name in kept)
        assert not any("were not used" in said for said in diffusers_warnings)
        assert not any(isinstance(e, Info) and "distilled for" in e.message for e in events)
    finally:
        engine.unload()


def test_other_steps_than_it_was_distilled_for_run_and_are_said(fastwan_dir, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "models", CPU)
    try:
        result, events = run_engine(engine, tiny_request(presets, fastwan_dir, outputs, frames=5, steps=2))
        assert isinstance(result, JobFinished), result
        (note,) = [e.message for e in events if isinstance(e, Info) and "distilled for" in e.message]
        assert "distilled for 3 steps of flow_dmd at guidance 1" in note and "2 steps of unipc" in note
    finally:
        engine.unload()


def _into_hub_cache(cache: Path, repo: str, folder: Path, revision: str = "0" * 40) -> Path:
    """``folder`` laid out as huggingface_hub stores a download of ``repo``."""
    stored = cache / ("models--" + repo.replace("/", "--"))
    shutil.copytree(folder, stored / "snapshots" / revision)
    (stored / "refs").mkdir()
    (stored / "refs" / "main").write_text(revision)
    return stored / "snapshots" / revision


def test_it_loads_from_the_hub_cache_offline(fastwan_dir, presets, outputs, tmp_path, monkeypatch):
    snapshot = _into_hub_cache(tmp_path / "hub", REPO, fastwan_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved = ModelCatalog().resolve(REPO, tmp_path / "models")
    assert resolved.folder == snapshot and resolved.kind.runs_as == "WanPipeline"
    assert resolved.spec.transformer.gated
    engine = Engine(tmp_path / "models", CPU)
    try:
        result, _ = run_engine(engine, tiny_request(presets, REPO, outputs, frames=5, **DMD))
        assert isinstance(result, JobFinished), result
        assert json.loads(Path(result.sidecar).read_text())["model"]["source"] == "hub"
    finally:
        engine.unload()


def test_it_downloads_from_the_hub_after_its_description_passed_and_runs(fastwan_dir, presets, outputs, tmp_path,
                                                                         monkeypatch):
    files = {p.relative_to(fastwan_dir).as_posix(): p.read_bytes() for p in fastwan_dir.rglob("*") if p.is_file()}
    hub = serve_downloads_from(FakeHub({REPO: files}).start(), monkeypatch, tmp_path / "hub")
    engine = Engine(tmp_path / "models", CPU)
    try:
        result, _ = run_engine(engine, tiny_request(presets, REPO, outputs, frames=5, **DMD))
        assert isinstance(result, JobFinished), result
        shard = "transformer/diffusion_pytorch_model-00001-of-00004.safetensors"
        header_read, download = hub.gets(shard)
        assert header_read.range.startswith("bytes=0-") and download.range is None   # its header first, then it
        first_weights = min(i for i, s in enumerate(hub.seen) if s.method == "GET" and s.path.endswith(shard)
                            and s.range is None)
        index_read = max(i for i, s in enumerate(hub.seen) if s.method == "GET" and s.path.endswith("model_index.json"))
        assert index_read < first_weights
    finally:
        engine.unload()
        hub.stop()


def test_the_command_line_picks_a_preset_made_for_its_steps_for_a_folder_of_ones_own(fastwan_dir, tmp_path):
    import app

    args = app.parse_args(["generate", "--model", str(fastwan_dir), "--prompt", "a fox", "--outputs", str(tmp_path)])
    preset, settings = app._settings(args)
    assert settings.scheduler == "flow_dmd" and settings.steps == 3 and settings.guidance == 1.0
    assert settings.model == str(fastwan_dir)
    plain = app.parse_args(["generate", "--model", str(tmp_path), "--prompt", "a fox", "--outputs", str(tmp_path)])
    assert app._settings(plain)[1].scheduler == "unipc"   # not a model folder: the usual preset
