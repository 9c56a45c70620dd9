"""The engine runs every mode on tiny real pipelines loaded from disk, timing each phase."""
from __future__ import annotations

import gc
import json
import pickle
import weakref
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.events import (Info, JobCancelled, JobFailed, JobFinished, JobStarted, PhaseFinished, PhaseStarted,
    StepFinished)
from engine.outputs.export import read_video
from engine.run.engine import SELFTEST_NOTE, Engine, reusing_image_embeds
from engine.run.faults import NO_FAULTS
from engine.service.worker import WorkerClient
from tests.conftest import CPU, run_engine, tiny_request
from tests.faults import InjectedFaults


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("engine-models"), CPU)
    yield engine
    engine.unload()


def phases(events):
    return [e.phase for e in events if isinstance(e, PhaseFinished)]


def test_text_to_video_writes_the_requested_frames_and_size(engine, model_dirs, presets, outputs):
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, width=96, height=64, frames=13, steps=3)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    frames, fps = read_video(result.paths[0])
    assert frames.shape == (13, 64, 96, 3) and fps == 16
    assert Path(result.paths[0]).parent.parent == outputs  # outputs/<date>/file
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert set(sidecar["timings"]) == {"load", "transfer", "text_encode", "denoise", "vae_decode", "export"}
    assert all(seconds >= 0 for seconds in sidecar["timings"].values())
    assert sidecar["prompt"] == "a red fox in the snow" and sidecar["seed"] == 1234
    assert sidecar["model"] == {"ref": str(model_dirs["tiny-t2v"]), "source": "local", "revision": "local",
                                "pipeline": "WanPipeline"}
    assert sidecar["parameters"]["width"] == 96 and sidecar["parameters"]["steps"] == 3
    assert sidecar["output"] == {"frames": 13, "height": 64, "width": 96, "fps": 16}
    steps = [e for e in events if isinstance(e, StepFinished)]
    # Each step reports the run's peaks so far: RAM grows or holds, no device memory on the CPU.
    assert all(e.peak_vram_gb is None and e.peak_ram_gb > 0.05 for e in steps)
    assert [e.peak_ram_gb for e in steps] == sorted(e.peak_ram_gb for e in steps)
    assert sidecar["plan"]["device"] == "cpu" and sidecar["plan"]["decisions"]
    assert sidecar["peak_ram_gb"] > 0 and len(sidecar["step_seconds"]) == 3
    assert {"app", "torch", "diffusers", "transformers"} <= set(sidecar["versions"])
    assert sidecar["hardware"]["backend"] == "cpu" and sidecar["preset"] == "selftest-t2v"
    assert list(sidecar)[:2] == ["schema", "app"] and sidecar["schema"] == 1   # the layout's version, first


def test_events_arrive_in_pipeline_order(engine, model_dirs, presets, outputs):
    engine.unload()
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, steps=4))
    assert isinstance(events[0], JobStarted) and isinstance(result, JobFinished)
    order = [(type(e).__name__, getattr(e, "phase", None)) for e in events
             if isinstance(e, (PhaseStarted, PhaseFinished))]
    expected = []
    for phase in ("load", "transfer", "text_encode", "denoise", "vae_decode", "export"):
        expected += [("PhaseStarted", phase), ("PhaseFinished", phase)]
    assert order == expected
    steps = [e for e in events if isinstance(e, StepFinished)]
    assert [s.step for s in steps] == [1, 2, 3, 4] and all(s.total == 4 for s in steps)
    assert steps[-1].eta_seconds == 0
    denoise_start = next(i for i, e in enumerate(events) if isinstance(e, PhaseStarted) and e.phase == "denoise")
    denoise_end = next(i for i, e in enumerate(events) if isinstance(e, PhaseFinished) and e.phase == "denoise")
    assert all(denoise_start < events.index(s) < denoise_end for s in steps)
    assert any(isinstance(e, Info) and e.message.startswith("Plan:") for e in events)


def test_same_seed_gives_the_same_video(engine, model_dirs, presets, outputs):
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, seed=99)
    first, _ = run_engine(engine, request)
    second, events = run_engine(engine, request)
    assert "load" not in phases(events)  # the loaded pipeline is reused
    assert first.paths != second.paths
    assert np.array_equal(read_video(first.paths[0])[0], read_video(second.paths[0])[0])


def test_random_seed_is_recorded(engine, model_dirs, presets, outputs):
    result, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, seed=-1))
    assert 0 <= result.seed < 2**32
    assert json.loads(Path(result.sidecar).read_text())["seed"] == result.seed


def test_text_to_image_writes_one_png(engine, model_dirs, presets, outputs):
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, mode="t2i", frames=1,
                                                     width=80, height=48))
    assert isinstance(result, JobFinished), result
    path = Path(result.paths[0])
    assert path.suffix == ".png"
    with Image.open(path) as img:
        assert img.size == (80, 48)
    assert json.loads(Path(result.sidecar).read_text())["output"]["frames"] == 1


def test_image_to_video_crops_the_image_and_times_image_encoding(engine, model_dirs, presets, outputs,
                                                                   image_file):
    request = tiny_request(presets, model_dirs["tiny-i2v"], outputs, mode="i2v", image=str(image_file),
                           width=64, height=48, frames=9)
    result, events = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    frames, _ = read_video(result.paths[0])
    assert frames.shape == (9, 48, 64, 3)
    assert "image_encode" in phases(events)
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert "image_encode" in sidecar["timings"] and sidecar["model"]["pipeline"] == "WanImageToVideoPipeline"


def test_a_bfloat16_decode_leaves_the_first_frames_encode_in_float32(engine, model_dirs, presets, outputs, image_file):
    """The VAE's encoder conditions every step of an image-to-video run: it stays float32 when the plan decodes
    in bfloat16, so the latents are the float32 VAE's (diffusers' own) bit for bit."""
    import torch

    from engine.events import LatentsSaved
    from engine.outputs.latents import load_latents

    latents = {}
    for precision in ("float32", "bfloat16"):
        request = tiny_request(presets, model_dirs["tiny-i2v"], outputs, mode="i2v", image=str(image_file), width=64,
                               height=48, frames=9, vae_dtype=precision, keep_latents=True)
        result, events = run_engine(engine, request)
        assert isinstance(result, JobFinished), result
        latents[precision] = load_latents(Path(next(e.path for e in events if isinstance(e, LatentsSaved))))[0]
        assert read_video(result.paths[0])[0].shape == (9, 48, 64, 3)
    vae = engine.loaded.pipe.vae
    assert vae.decoder.conv_in.weight.dtype == torch.bfloat16 and vae.encoder.conv_in.weight.dtype == torch.float32
    assert torch.equal(latents["float32"], latents["bfloat16"])


def test_a_last_frame_needs_a_first_and_last_frame_model(engine, model_dirs, presets, outputs, image_file,
                                                         tmp_path):
    from engine.models.selftest import SELFTEST_I2V, build_selftest_pipeline

    flf = tmp_path / "tiny-flf2v"
    build_selftest_pipeline(SELFTEST_I2V, first_last=True).save_pretrained(flf)
    last = tmp_path / "last.png"
    Image.new("RGB", (80, 60), (20, 200, 40)).save(last)
    both = dict(mode="i2v", image=str(image_file), last_image=str(last), width=64, height=48, frames=9)
    result, _ = run_engine(engine, tiny_request(presets, flf, outputs, **both))
    assert isinstance(result, JobFinished), result
    assert read_video(result.paths[0])[0].shape == (9, 48, 64, 3)
    result, events = run_engine(engine, tiny_request(presets, flf, outputs, **{**both, "last_image": None}))
    assert isinstance(result, JobFailed) and result.kind == "input" and "needs a last frame too" in result.message
    result, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-i2v"], outputs, **both))
    assert isinstance(result, JobFailed) and result.kind == "input"
    assert "cannot use a last frame" in result.message and "remove the last frame" in result.message
    assert "load" not in phases(events), "a refused request loaded the model"


def test_model_swap_frees_the_first_model(engine, model_dirs, presets, outputs, image_file):
    run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs))
    old = weakref.ref(engine.loaded.pipe)
    result, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-i2v"], outputs, mode="i2v",
                                                     image=str(image_file)))
    assert isinstance(result, JobFinished)
    gc.collect()
    assert old() is None, "the first pipeline is still referenced after the swap"
    assert engine.loaded.model.image_to_video
    assert any(isinstance(e, Info) and e.message.startswith("Unloading") for e in events)


def test_cancel_stops_at_a_step_boundary_and_keeps_the_model(engine, model_dirs, presets, outputs):
    steps_seen = []

    def cancel_after_two():
        return len(steps_seen) >= 2

    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, steps=20)
    events = []

    def emit(event):
        events.append(event)
        if isinstance(event, StepFinished):
            steps_seen.append(event.step)

    before = set(outputs.rglob("*"))
    result = engine.run(request, "job", emit, cancel_after_two)
    assert isinstance(result, JobCancelled) and result.at_step == 2 and result.total == 20
    assert steps_seen == [1, 2]
    assert set(outputs.rglob("*")) == before, "a cancelled job wrote files"
    again, events = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, steps=2))
    assert isinstance(again, JobFinished) and "load" not in phases(events)


def test_selftest_outputs_are_labelled_as_noise(engine, presets, outputs):
    result, _ = run_engine(engine, tiny_request(presets, "selftest-t2v", outputs, steps=2))
    assert result.note == SELFTEST_NOTE
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert sidecar["note"] == SELFTEST_NOTE and sidecar["model"]["revision"] == "builtin"


@pytest.mark.parametrize("mode, model, expected", [
    ("i2v", "tiny-t2v", "is a text-to-video model"),
    ("t2v", "tiny-i2v", "is an image-to-video model"),
])
def test_mode_and_model_must_match(engine, model_dirs, presets, outputs, image_file, mode, model, expected):
    request = tiny_request(presets, model_dirs[model], outputs, mode=mode,
                           image=str(image_file) if mode == "i2v" else None)
    result, _ = run_engine(engine, request)
    assert isinstance(result, JobFailed) and result.kind == "input" and expected in result.message


def test_earlier_outputs_are_untouched_by_later_runs_and_failures(engine, model_dirs, presets, outputs):
    first, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs))
    snapshot = {p: p.read_bytes() for p in outputs.rglob("*") if p.is_file()}
    failed, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs, width=70))
    assert isinstance(failed, JobFailed) and "multiple of 16" in failed.message
    later, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs))
    assert isinstance(later, JobFinished)
    for path, data in snapshot.items():
        assert path.read_bytes() == data
    assert not list(outputs.rglob(".*partial*")), "temporary files were left behind"


def test_the_old_model_is_gone_before_the_new_one_loads(model_dirs, presets, outputs, tmp_path, image_file):
    """A swap must never hold both pipelines at once (a 14B model beside another would not fit)."""
    seen = {}

    class Watching(Engine):
        def _from_pretrained(self, resolved, plan):
            if "old" in seen:
                gc.collect()
                seen["old_alive_during_load"] = seen["old"]() is not None
            return super()._from_pretrained(resolved, plan)

    engine = Watching(tmp_path / "m", CPU)
    run_engine(engine, tiny_request(presets, model_dirs["tiny-t2v"], outputs))
    seen["old"] = weakref.ref(engine.loaded.pipe)
    result, _ = run_engine(engine, tiny_request(presets, model_dirs["tiny-i2v"], outputs, mode="i2v",
                                                image=str(image_file)))
    assert isinstance(result, JobFinished)
    assert seen["old_alive_during_load"] is False


def test_a_request_the_worker_client_checked_is_not_checked_again(engine, presets, model_dirs, tmp_path, monkeypatch):
    """Validation runs once per job: the client checks, the engine process trusts the checked request."""
    import engine.run.engine as run_module
    from engine.settings.request import check_request

    checks = []
    real = run_module.check_request
    monkeypatch.setattr(run_module, "check_request", lambda request, *rest: checks.append(request) or real(request, *rest))
    request = tiny_request(presets, str(model_dirs["tiny-t2v"]), tmp_path)
    assert isinstance(run_engine(engine, check_request(request))[0], JobFinished) and checks == []
    # A request nobody checked (a direct caller) is checked here, and a changed one counts as unchecked.
    assert isinstance(run_engine(engine, request)[0], JobFinished) and len(checks) == 1
    assert not check_request(request).with_values(steps=3).checked


class _Pipe:
    """A stand-in pipeline: its class's encode_image runs the (absent) image encoder."""

    def encode_image(self, image, device):
        return "encoded by the pipeline"


def test_reusing_image_embeds_hands_over_the_encoding_and_puts_the_pipeline_back():
    pipe = _Pipe()
    with reusing_image_embeds(pipe, "encoded before"):
        assert pipe.encode_image("image", "cpu") == "encoded before"
    assert pipe.encode_image("image", "cpu") == "encoded by the pipeline" and "encode_image" not in vars(pipe)
    with pytest.raises(RuntimeError, match="out of memory"):   # a failed call puts it back as well
        with reusing_image_embeds(pipe, "encoded before"):
            raise RuntimeError("out of memory")
    assert "encode_image" not in vars(pipe)
    with reusing_image_embeds(pipe, None):   # nothing encoded (no image encoder): nothing changes
        assert "encode_image" not in vars(pipe)
    own = pipe.encode_image = lambda image, device: "an instance's own"
    with reusing_image_embeds(pipe, "encoded before"):
        assert pipe.encode_image("image", "cpu") == "encoded before"
    assert pipe.encode_image is own


def test_the_engine_runs_clean_unless_given_faults_which_cross_to_the_engine_process(tmp_path):
    assert Engine(tmp_path).faults == NO_FAULTS
    faults = InjectedFaults({"denoise": 1}, crash_in="export")
    client = WorkerClient(tmp_path, faults=faults)
    assert client.options["faults"] is faults and pickle.loads(pickle.dumps(faults)) == faults
    faults.before_phase("load")
    with pytest.raises(RuntimeError, match="out of memory"):
        faults.before_phase("denoise")
    faults.before_phase("denoise")   # once only
