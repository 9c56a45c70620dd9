"""Faults in every phase, decode-again from saved latents, a full disk, and memory across runs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from engine.events import JobFailed, JobFinished, LatentsSaved
from engine.outputs.export import read_video
from engine.outputs.latents import cleanup_latents, read_metadata
from engine.run.engine import Engine
from engine.service.worker import WorkerClient
from tests.conftest import CPU, app_main, tiny_request
from tests.faults import CrashWhenAsked, InjectedFaults

pytestmark = pytest.mark.process


def collect(events):
    return list(events)


@pytest.fixture(scope="module")
def crashing(selftest_models_dir, tmp_path_factory):
    """One client for the crash tests: each kills its engine in a phase (named in ``order``), and the fresh engine
    started after it serves the test's next jobs and then the next test's crash."""
    order = tmp_path_factory.mktemp("crash") / "crash-in"
    client = WorkerClient(selftest_models_dir, faults=CrashWhenAsked(str(order)))
    yield client, order
    client.close()


@pytest.mark.parametrize("phase", ["load", "transfer", "text_encode", "denoise", "vae_decode", "export"])
def test_a_crash_in_any_phase_ends_only_that_job(phase, crashing, presets, outputs):
    earlier = outputs / "earlier.txt"
    earlier.write_text("an earlier output")
    client, order = crashing
    client.unload()   # the job loads its model again, so it crosses the load and the transfer too
    order.write_text(phase)
    restarts = client.restarts
    try:
        events = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)))
        failure = events[-1]
        assert isinstance(failure, JobFailed) and failure.kind == "crash" and failure.phase == phase
        assert f"during {phase.replace('_', ' ')}" in failure.message and "SIGKILL" in failure.message
        assert not list(outputs.rglob("*.mp4")) and not list(outputs.rglob(".*partial*"))
        if phase in ("vae_decode", "export"):
            # The denoising had finished: its latents are on disk and the page can decode them again.
            assert failure.latents and Path(failure.latents).is_file() and "Decode again" in failure.hint
            again = collect(client.decode(failure.latents))
            assert isinstance(again[-1], JobFinished), again[-1]
            assert read_video(again[-1].paths[0])[0].shape == (9, 64, 64, 3)
        else:
            assert failure.latents is None
        after = collect(client.submit(tiny_request(presets, "selftest-t2v", outputs, steps=2)))
        assert isinstance(after[-1], JobFinished), after[-1]
        assert earlier.read_text() == "an earlier output"
        assert client.restarts == restarts + 1 and not order.exists()
    finally:
        order.unlink(missing_ok=True)


def test_decode_again_reproduces_the_original_frames(model_dirs, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU)
    request = tiny_request(presets, model_dirs["tiny-t2v"], outputs, seed=77, keep_latents=True)
    events = []
    first = engine.run(request, "a", events.append)
    assert isinstance(first, JobFinished)
    latents = next(e.path for e in events if isinstance(e, LatentsSaved))
    assert read_metadata(latents)["keep"] is True
    assert json.loads(Path(first.sidecar).read_text())["latents"] == latents
    fresh = Engine(tmp_path / "m", CPU)   # nothing loaded: the VAE alone is read from the model folder
    again = fresh.decode_saved(latents, "b", lambda e: None)
    assert isinstance(again, JobFinished), again
    assert fresh.loaded is None
    assert np.array_equal(read_video(first.paths[0])[0], read_video(again.paths[0])[0])
    tiled = engine.decode_saved(latents, "c", lambda e: None, tiled=True)
    assert isinstance(tiled, JobFinished) and "tiled" in tiled.note
    assert read_video(tiled.paths[0])[0].shape == read_video(first.paths[0])[0].shape


def test_a_decode_that_fails_keeps_the_latents_for_later(model_dirs, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU, faults=InjectedFaults({"vae_decode": 2}))
    failed = engine.run(tiny_request(presets, model_dirs["tiny-t2v"], outputs, seed=5), "a", lambda e: None)
    assert isinstance(failed, JobFailed) and failed.phase == "vae_decode" and failed.latents
    assert "Decode again" in failed.hint
    later = engine.decode_saved(failed.latents, "b", lambda e: None)
    assert isinstance(later, JobFinished), later
    reference = Engine(tmp_path / "m", CPU).run(tiny_request(presets, model_dirs["tiny-t2v"], outputs, seed=5), "c",
                                                lambda e: None)
    assert np.array_equal(read_video(later.paths[0])[0], read_video(reference.paths[0])[0])


def test_cli_decode_again(model_dirs, presets, outputs, tmp_path, selftest_models_dir):
    engine = Engine(selftest_models_dir, CPU, faults=InjectedFaults({"vae_decode": 2}))
    failed = engine.run(tiny_request(presets, "selftest-t2v", outputs), "a", lambda e: None)
    # app.main in this process, the engine forked from its fork server (a process of its own would load the
    # libraries twice: about five seconds of CPU each)
    done = app_main("decode", failed.latents, "--tiled", "--models-dir", str(selftest_models_dir))
    assert done.returncode == 0, done.stderr
    assert "Wrote" in done.stdout and "Decoded again (tiled)" in done.stdout
    both = app_main("decode", failed.latents, "--tiled", "--cpu", "--models-dir", str(selftest_models_dir))
    assert both.returncode == 0 and "Decoded again (tiled, on the CPU)" in both.stdout, both.stderr
    bad = app_main("decode", str(tmp_path / "nope.latents.safetensors"))
    assert bad.returncode == 2 and "nope.latents.safetensors does not exist; pick a" in bad.stderr


def test_latents_of_finished_runs_expire_and_failed_ones_stay(model_dirs, presets, outputs, tmp_path):
    engine = Engine(tmp_path / "m", CPU)
    done = engine.run(tiny_request(presets, model_dirs["tiny-t2v"], outputs), "a", lambda e: None)
    kept = engine.run(tiny_request(presets, model_dirs["tiny-t2v"], outputs, keep_latents=True), "b", lambda e: None)
    failing = Engine(tmp_path / "m", CPU, faults=InjectedFaults({"vae_decode": 2}))
    failed = failing.run(tiny_request(presets, model_dirs["tiny-t2v"], outputs), "c", lambda e: None)
    latents = {name: json.loads(Path(r.sidecar).read_text())["latents"] for name, r in (("done", done), ("kept", kept))}
    latents["failed"] = failed.latents
    assert all(Path(p).is_file() for p in latents.values())
    removed = cleanup_latents(outputs, keep_hours=24, now=time.time() + 25 * 3600)
    assert [str(p) for p in removed] == [latents["done"]]
    assert Path(latents["kept"]).is_file() and Path(latents["failed"]).is_file()
    immediate = Engine(tmp_path / "m", CPU, latents_hours=0)
    result = immediate.run(tiny_request(presets, model_dirs["tiny-t2v"], outputs), "d", lambda e: None)
    assert json.loads(Path(result.sidecar).read_text())["latents"] is None


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_fails_clearly_and_keeps_earlier_outputs(small_disk, model_dirs, presets, tmp_path):
    engine = Engine(tmp_path / "m", CPU)
    first = engine.run(tiny_request(presets, model_dirs["tiny-t2v"], small_disk), "a", lambda e: None)
    assert isinstance(first, JobFinished)
    before = {p: p.read_bytes() for p in small_disk.rglob("*") if p.is_file()}
    filler = _fill(small_disk, 2048)   # a little room: the probe passes, the run does not
    failed = engine.run(tiny_request(presets, model_dirs["tiny-t2v"], small_disk, width=128, height=128),
                        "b", lambda e: None)
    assert isinstance(failed, JobFailed) and "disk is full" in failed.message.lower()
    assert "Free some disk space" in failed.hint
    for path, data in before.items():
        assert path.read_bytes() == data
    leftovers = [p.name for p in small_disk.rglob("*") if p.is_file() and p not in before and p != filler]
    assert leftovers == [], leftovers


def _fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` but for about ``leave`` bytes."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def test_a_disk_too_full_for_the_video_keeps_the_latents_and_says_how_much_is_free(small_disk, model_dirs, presets,
                                                                                   tmp_path):
    engine = Engine(tmp_path / "m", CPU)
    filler = _fill(small_disk, 160 * 1024)    # room for the latents (80 kB), not for the video
    failed = engine.run(tiny_request(presets, model_dirs["tiny-t2v"], small_disk, width=128, height=128, frames=17),
                        "a", lambda e: None)
    assert isinstance(failed, JobFailed) and failed.phase == "export"
    assert re.fullmatch(r"The disk is full while writing the video \(0\.\d MB free in \S+, 0\.\d MB needed\)\.",
                        failed.message), failed.message
    assert len(failed.text) < 400 and "FFMPEG" not in failed.text
    assert failed.latents and Path(failed.latents).is_file() and "Decode again" in failed.hint
    assert [p.name for p in small_disk.rglob("*partial*")] == []
    filler.unlink()   # room again: decoding the kept latents gives the video
    again = engine.decode_saved(failed.latents, "b", lambda e: None)
    assert isinstance(again, JobFinished) and read_video(again.paths[0])[0].shape == (17, 128, 128, 3)


def test_a_video_the_disk_cannot_hold_leaves_no_partial_file_and_one_sentence(small_disk):
    from engine.outputs.export import DiskFull, write_mp4

    _fill(small_disk, 64 * 1024)
    noise = (np.random.default_rng(0).random((33, 256, 256, 3)) * 255).astype(np.uint8)   # about 2 MB of mp4
    with pytest.raises(DiskFull) as info:
        write_mp4(noise, small_disk / "clip.mp4", 16)
    assert str(info.value).startswith("the disk is full while writing the video (0.") and "FFMPEG" not in str(info.value)
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_a_streamed_video_the_disk_cannot_hold_leaves_no_partial_file_and_one_sentence(small_disk):
    from engine.outputs.export import DiskFull, write_mp4_stream

    _fill(small_disk, 64 * 1024)
    noise = (np.random.default_rng(0).random((33, 256, 256, 3)) * 255).astype(np.uint8)   # about 2 MB of mp4
    with pytest.raises(DiskFull) as info:
        write_mp4_stream((noise[i:i + 4] for i in range(0, 33, 4)), small_disk / "clip.mp4", 16, 256, 256)
    assert str(info.value).startswith("the disk is full while writing the video (0.") and "FFMPEG" not in str(info.value)
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_every_writer_on_a_full_disk_leaves_no_partial_file(small_disk):
    """A full disk fails the write as before (an ENOSPC error, one the failure messages know as a full disk);
    the temporary file goes with it, whatever writes it."""
    import torch

    from engine.atomic import write_atomically
    from engine.atomic import write_json
    from engine.outputs.export import copy_file, write_png
    from engine.outputs.latents import save_latents
    from engine.run.failures import is_disk_full

    source = small_disk / "source.bin"
    source.write_bytes(os.urandom(96 * 1024))
    _fill(small_disk, 32 * 1024)
    noise = (np.random.default_rng(0).random((256, 256, 3)) * 255).astype(np.uint8)   # about 200 kB of PNG
    writes = {"bytes": lambda: write_atomically(small_disk / "a.bin", lambda tmp: tmp.write_bytes(os.urandom(1 << 20))),
              "png": lambda: write_png(noise, small_disk / "a.png"),
              "copy": lambda: copy_file(source, small_disk / "copy.bin"),
              "json": lambda: write_json({"x": "y" * (1 << 20)}, small_disk / "a.json"),
              "latents": lambda: save_latents(torch.zeros(256, 1024), small_disk / "a.latents.safetensors", {})}
    for name, write in writes.items():
        with pytest.raises(Exception) as info:   # safetensors raises its own error class
            write()
        assert is_disk_full(info.value), (name, info.value)
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "source.bin"], name


def test_memory_does_not_grow_over_runs_and_model_swaps(selftest_models_dir, presets, outputs, image_file):
    client = WorkerClient(selftest_models_dir, latents_hours=0)
    t2v = tiny_request(presets, "selftest-t2v", outputs, steps=2)
    i2v = tiny_request(presets, "selftest-i2v", outputs, mode="i2v", image=str(image_file), steps=2)
    try:
        for request in (t2v, i2v, t2v):   # warm up both models and the allocator
            assert isinstance(collect(client.submit(request))[-1], JobFinished)
        start = psutil.Process(client.pid).memory_info().rss
        order = [t2v] * 3 + [i2v] * 3 + [t2v] * 2 + [i2v] * 2   # 10 runs, 3 model swaps
        for request in order:
            assert isinstance(collect(client.submit(request))[-1], JobFinished)
        growth = psutil.Process(client.pid).memory_info().rss - start
        print(f"engine RSS growth over 10 runs and 3 swaps: {growth / 1024 ** 2:.1f} MB")
        assert growth < 300 * 1024 ** 2, f"RSS grew by {growth / 1024 ** 2:.0f} MB"
    finally:
        client.close()


def test_a_prompt_beyond_the_token_limit_is_warned_about(model_dirs, presets, outputs, tmp_path):
    from engine.events import Info

    engine = Engine(tmp_path / "m", CPU)
    long_prompt = " ".join(["a red fox jumps over the snowy hill"] * 40)   # far more than 512 tokens
    events = []
    result = engine.run(tiny_request(presets, model_dirs["tiny-t2v"], outputs, prompt=long_prompt), "a", events.append)
    assert isinstance(result, JobFinished)
    warnings = [e.message for e in events if isinstance(e, Info) and "tokens long" in e.message]
    assert len(warnings) == 1 and "only the first 512 are used" in warnings[0]
    events.clear()
    engine.run(tiny_request(presets, model_dirs["tiny-t2v"], outputs, prompt="a short prompt"), "b", events.append)
    assert not [e for e in events if isinstance(e, Info) and "tokens long" in e.message]


def test_cli_keeps_latents_on_request(selftest_models_dir, outputs):
    done = app_main("generate", "--model", "selftest-t2v", "--prompt", "a cat", "--keep-latents", "--latents-hours",
                    "0", "--models-dir", str(selftest_models_dir), "--outputs", str(outputs))
    assert done.returncode == 0, done.stderr
    kept = list(outputs.rglob("*.latents.safetensors"))
    assert len(kept) == 1 and read_metadata(kept[0])["keep"] is True
