"""The models' specs and folder checks, read once per version of the model's files."""
from __future__ import annotations

import os
import shutil

import pytest

import engine.models.refs as refs
import engine.models.weights as weights
from engine.models.catalog import ModelCatalog, files_stamp
from engine.errors import ModelError


@pytest.fixture
def folder(tmp_path, model_dirs):
    copy = tmp_path / "my-wan"
    shutil.copytree(model_dirs["tiny-t2v"], copy)
    return copy


@pytest.fixture
def header_reads(monkeypatch):
    """Every safetensors header read, counted (the real reader still does the reading)."""
    reads = []
    for module in (weights, refs):
        real = module.read_header
        monkeypatch.setattr(module, "read_header", lambda path, real=real: reads.append(path) or real(path))
    return reads


def test_a_model_is_read_once_until_its_files_change(folder, header_reads):
    catalog = ModelCatalog()
    spec = catalog.spec(str(folder))
    first = len(header_reads)
    assert first > 0
    for _ in range(5):   # the plan panel asks on every change of the form
        assert catalog.spec(str(folder)) == spec and catalog.limits(str(folder)).max_window == 125
    assert len(header_reads) == first
    config = folder / "transformer" / "config.json"
    config.write_text(config.read_text().replace('"num_layers": 2', '"num_layers": 3'))
    os.utime(config, ns=(1, 1))   # a new version of the file, whatever the clock's resolution
    changed = catalog.spec(str(folder))
    assert len(header_reads) > first and changed.transformer.layers == 3 != spec.transformer.layers


def test_a_folder_that_passed_is_not_read_again_and_a_damaged_one_is_refused(folder, header_reads):
    catalog = ModelCatalog()
    catalog.check_folder(str(folder))
    first = len(header_reads)
    catalog.check_folder(str(folder))
    assert len(header_reads) == first
    weight = next((folder / "transformer").glob("*.safetensors"))
    with open(weight, "r+b") as f:
        f.truncate(weight.stat().st_size // 2)
    with pytest.raises(ModelError, match="is damaged"):
        catalog.check_folder(str(folder))


def test_the_stamp_follows_every_file(folder):
    before = files_stamp(folder)
    (folder / "vae" / "extra.txt").write_text("x")
    assert files_stamp(folder) != before and len(files_stamp(folder)) == len(before) + 1


def test_a_catalog_keeps_only_its_last_models(tmp_path, model_dirs):
    catalog = ModelCatalog(remembered=2)
    for name in ("a", "b", "c"):
        shutil.copytree(model_dirs["tiny-t2v"], tmp_path / name)
        catalog.spec(str(tmp_path / name))
    assert len(catalog._specs) == 2


@pytest.mark.parametrize("model, mode, last, said", [
    ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "i2v", False, "is a text-to-video model and cannot start from an image; pick an image-to-video model"),
    ("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", "t2v", False, "is an image-to-video model and needs a first frame: use the Image to Video tab"),
    ("Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers", "i2v", False, "is a first-and-last-frame model and needs a last frame"),
    ("Wan-AI/Wan2.2-I2V-A14B-Diffusers", "i2v", True, "cannot use a last frame"),
])
def test_a_known_hub_model_of_another_kind_is_refused_before_it_is_queued_or_downloaded(
        tmp_path, monkeypatch, selftest_models_dir, image_file, model, mode, last, said):
    """The job's check knows a Hub model's kind from the table of known models: nothing is downloaded (the hub
    cache is empty and the engine process never starts) before the sentence."""
    from engine.service.worker import WorkerClient
    from engine.settings.request import GenerationRequest
    from engine.settings.values import InputError, Settings

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    client = WorkerClient(selftest_models_dir)
    settings = Settings(model, mode, 832, 480, 81, 40, 5.0, 5.0)
    images = {"image": str(image_file), "last_image": str(image_file) if last else None} if mode == "i2v" else {}
    with pytest.raises(InputError, match=said):
        client.check(GenerationRequest(settings, "a fox", outputs_dir=str(tmp_path / "out"), **images))
    assert client.pid is None and not (tmp_path / "empty-cache").exists()
    # a model of the right kind passes the same check
    right = {"t2v": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "i2v": "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"}[mode]
    if not last:
        client.check(GenerationRequest(Settings(right, mode, 832, 480, 81, 40, 5.0, 5.0), "a fox",
                                       outputs_dir=str(tmp_path / "out"), **images))


def test_the_engine_reads_a_model_and_its_transformer_file_once_until_they_change(folder, header_reads, tmp_path):
    """Every job resolves its model again: the engine's catalog reads the configs and headers only when the files
    changed, as the app's does."""
    from engine.run.engine import Engine
    from engine.run.job import Job
    from engine.settings.values import Settings

    engine = Engine(tmp_path / "models")
    job = Job("job-1", lambda event: None)
    first = engine.resolve(str(folder), job)
    reads = len(header_reads)
    assert reads > 0 and first.spec.name and first.pipeline_class == "WanPipeline"
    for _ in range(3):
        again = engine.resolve(str(folder), job)
        assert again == first and again.spec is first.spec
    assert len(header_reads) == reads
    config = folder / "transformer" / "config.json"
    config.write_text(config.read_text().replace('"num_layers": 2', '"num_layers": 2 '))
    assert engine.resolve(str(folder), job).spec is not first.spec and len(header_reads) > reads
    weights_file = next((folder / "transformer").glob("*.safetensors"))
    settings = Settings(str(folder), "t2v", 64, 64, 5, 2, 1.0, 5.0, transformer=str(weights_file))
    one = engine.catalog.transformer_files(settings)
    assert one[0].path == str(weights_file.resolve()) and engine.catalog.transformer_files(settings)[0] is one[0]
    os.utime(weights_file, ns=(1, 1))
    assert engine.catalog.transformer_files(settings)[0] is not one[0]


def test_a_job_on_a_known_model_is_planned_once_and_reads_no_header(folder, header_reads, presets, tmp_path,
                                                                    monkeypatch):
    """The planner runs once per job (no step down), and a second job on the same files reads nothing again."""
    import engine.run.engine as engine_module
    from engine.events import JobFinished
    from engine.run.engine import Engine
    from tests.conftest import CPU, run_engine, tiny_request

    plans = []
    real = engine_module.plan_memory
    monkeypatch.setattr(engine_module, "plan_memory", lambda *a, **k: plans.append(a[1]) or real(*a, **k))
    engine = Engine(tmp_path / "models", CPU)
    request = tiny_request(presets, str(folder), tmp_path / "out", mode="t2i", frames=1, steps=2)
    first, _ = run_engine(engine, request)
    assert isinstance(first, JobFinished) and len(plans) == 1
    engine.unload()   # the next job loads again: only the files' headers are not read again
    reads = len(header_reads)
    second, _ = run_engine(engine, request)
    assert isinstance(second, JobFinished) and len(plans) == 2
    assert len(header_reads) == reads
