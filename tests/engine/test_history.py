"""The history reads real sidecars from real runs, survives broken files, and deletes only what it lists."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.events import JobFinished
from engine.outputs.export import read_video
from engine.settings.request import GenerationRequest
from engine.outputs.history import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    HistoryError,
    delete_output,
    find_entry,
    history_limit,
    output_files,
    read_entry,
    read_history,
    reuse_values,
    scan_history,
)
from engine.outputs.kept_inputs import keep_inputs
from engine.run.engine import Engine
from engine.settings.images import fit_image
from tests.conftest import CPU, tiny_request
from tests.faults import InjectedFaults

SMALL = dict(width=64, height=48, frames=5, steps=2)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("history-models"), CPU)
    yield engine
    engine.unload()


@pytest.fixture(scope="module")
def last_image(tmp_path_factory) -> Path:
    """A half-transparent RGBA last frame: kept as RGB on white, as the engine prepares it."""
    img = Image.new("RGBA", (90, 60), (0, 160, 60, 255))
    for x in range(45):
        for y in range(60):
            img.putpixel((x, y), (0, 0, 200, 0 if y % 2 else 128))
    path = tmp_path_factory.mktemp("inputs") / "last.png"
    img.save(path)
    return path


def _run(engine, request) -> JobFinished:
    result = engine.run(request, "job", lambda event: None)
    assert isinstance(result, JobFinished), result
    return result


@pytest.fixture(scope="module")
def made(engine, model_dirs, presets, tmp_path_factory, image_file):
    """Three real runs, oldest first: a video, an image, and an image-to-video.

    (A last frame needs a first-last-frame model: the self-test I2V model, like Wan2.1-I2V, has none,
    so keeping the last image is checked on keep_inputs alone.)
    """
    outputs = tmp_path_factory.mktemp("history-outputs")
    t2v = tiny_request(presets, model_dirs["tiny-t2v"], outputs, prompt="a red fox in the snow", seed=11, **SMALL)
    t2i = tiny_request(presets, model_dirs["tiny-t2v"], outputs, mode="t2i", prompt="a still lake", seed=12,
                       **dict(SMALL, frames=1))
    i2v = tiny_request(presets, model_dirs["tiny-i2v"], outputs, mode="i2v", prompt="waves on a shore", seed=13,
                       negative_prompt="blurry", image=str(image_file), **SMALL)
    results = {name: _run(engine, request) for name, request in (("t2v", t2v), ("t2i", t2i), ("i2v", i2v))}
    return {"outputs": outputs, "requests": {"t2v": t2v, "t2i": t2i, "i2v": i2v}, "results": results}


@pytest.fixture
def outputs(made, tmp_path) -> Path:
    """A private copy of the made outputs, for tests that change files."""
    copy = tmp_path / "outputs"
    shutil.copytree(made["outputs"], copy, symlinks=True)
    return copy


def _key(result: JobFinished) -> str:
    media = Path(result.paths[0])
    return f"{media.parent.name}/{media.name}"


def _stem_files(folder: Path, stem: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(stem))


# ----- listing ------------------------------------------------------------------
def test_scan_lists_every_output_newest_first_with_its_settings(made):
    entries = scan_history(made["outputs"])
    results = made["results"]
    assert [e.key for e in entries] == [_key(results[n]) for n in ("i2v", "t2i", "t2v")]
    by_mode = {e.settings.mode: e for e in entries}
    for mode, request in made["requests"].items():
        entry = by_mode[mode]
        assert entry.media == results[mode].paths[0] and entry.sidecar == results[mode].sidecar
        assert (entry.prompt, entry.negative_prompt, entry.settings.model, entry.preset) == (
            request.prompt, request.negative_prompt, request.settings.model, request.preset)
        assert (entry.settings.width, entry.settings.height, entry.settings.steps, entry.seed) == (64, 48, 2, request.seed)
        assert (entry.settings.guidance, entry.settings.shift) == (request.settings.guidance, request.settings.shift)
        assert entry.strategy == "all_on_device" and entry.peak_ram_gb > 0
        assert {"text_encode", "denoise", "vae_decode", "export"} <= set(entry.timings)
    assert (by_mode["t2v"].kind, by_mode["t2v"].settings.frames, by_mode["t2v"].fps) == ("video", 5, 16)
    assert (by_mode["t2i"].kind, by_mode["t2i"].settings.frames, by_mode["t2i"].fps) == ("image", 1, None)
    assert "image_encode" in by_mode["i2v"].timings
    assert entries[0].label().startswith("waves on a shore · ")
    assert json.loads(json.dumps([e.to_dict() for e in entries]))[0]["key"] == entries[0].key


def test_scan_limit_and_a_missing_folder(made, tmp_path):
    assert [e.settings.mode for e in scan_history(made["outputs"], limit=2)] == ["i2v", "t2i"]
    assert len(scan_history(made["outputs"], limit=None)) == 3
    assert scan_history(tmp_path / "never-made") == []


def test_image_to_video_inputs_are_kept_beside_the_output(made, image_file):
    result = made["results"]["i2v"]
    media = Path(result.paths[0])
    stem = media.name[: -len(".mp4")]
    sidecar = json.loads(Path(result.sidecar).read_text())
    assert sidecar["inputs"] == {"image": f"{stem}.first.png", "last_image": None}
    entry = find_entry(made["outputs"], _key(result))
    assert entry.first_image == str(media.with_name(f"{stem}.first.png")) and entry.last_image is None
    assert np.array_equal(np.asarray(fit_image(entry.first_image, 64, 48)), np.asarray(fit_image(image_file, 64, 48)))
    assert "inputs" not in json.loads(Path(made["results"]["t2v"].sidecar).read_text())
    assert not list(made["outputs"].rglob(".*"))   # no partial files left behind


def test_kept_images_give_the_pixels_the_uploads_gave(made, tmp_path, image_file, last_image):
    request = made["requests"]["i2v"].with_values(last_image=str(last_image))
    kept, problems = keep_inputs(request, tmp_path / "120000_i2v_waves_13")
    assert problems == [] and kept == {"image": "120000_i2v_waves_13.first.png",
                                       "last_image": "120000_i2v_waves_13.last.png"}
    # The last image is RGBA: kept as RGB on white, exactly as the engine prepares it.
    for name, original in ((kept["image"], image_file), (kept["last_image"], last_image)):
        with Image.open(tmp_path / name) as img:
            assert img.mode == "RGB" and img.format == "PNG"
        for size in ((64, 48), (48, 96)):
            assert np.array_equal(np.asarray(fit_image(tmp_path / name, *size)),
                                  np.asarray(fit_image(original, *size)))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept.values())


def test_keeping_inputs_never_fails_the_run(tmp_path, made):
    request = made["requests"]["i2v"].with_values(image=str(tmp_path / "gone.png"), last_image=None)
    kept, problems = keep_inputs(request, tmp_path / "out")
    assert kept == {"image": None, "last_image": None}
    assert len(problems) == 1 and "image could not be kept" in problems[0] and "gone.png" in problems[0]


def test_a_decoded_again_output_is_listed_too(outputs, made, engine):
    """Decode again writes a sidecar of its own shape (no plan, no created); it is listed all the same."""
    key = _key(made["results"]["t2v"])
    latents = outputs / key.replace(".mp4", ".latents.safetensors")
    result = engine.decode_saved(str(latents), "job", lambda event: None, tiled=True)
    assert isinstance(result, JobFinished), result
    entry = scan_history(outputs)[0]
    assert entry.media == result.paths[0] and entry.key != key
    assert (entry.settings.mode, entry.prompt, entry.seed, entry.settings.frames, entry.settings.steps) == ("t2v", "a red fox in the snow", 11, 5, 2)
    assert entry.strategy is None and entry.note.startswith("Decoded again (tiled)") and "vae_decode" in entry.timings
    assert reuse_values(entry).preset == "selftest-t2v"


def test_a_video_decoded_again_keeps_the_input_image_of_its_failed_run(model_dirs, presets, outputs, tmp_path,
                                                                      image_file):
    """The upload is gone by the time its failed run is decoded again: the image kept with the latents is
    the output's, so Reuse settings can repeat it; a second decode (a new name) gets its own copy."""
    upload = tmp_path / "upload.png"
    shutil.copyfile(image_file, upload)
    failing = Engine(tmp_path / "m", CPU, faults=InjectedFaults({"vae_decode": 2}))
    request = tiny_request(presets, model_dirs["tiny-i2v"], outputs, mode="i2v", prompt="waves at night", seed=21,
                           image=str(upload), **SMALL)
    failed = failing.run(request, "job", lambda event: None)
    assert not isinstance(failed, JobFinished) and failed.latents
    upload.unlink()
    runs = [failing.decode_saved(failed.latents, f"again-{n}", lambda event: None) for n in (1, 2)]
    assert all(isinstance(r, JobFinished) for r in runs), runs
    first_images = []
    for result in runs:
        entry = find_entry(outputs, _key(result))
        stem = Path(result.paths[0]).name[: -len(".mp4")]
        assert json.loads(Path(result.sidecar).read_text())["inputs"] == {"image": f"{stem}.first.png",
                                                                         "last_image": None}
        assert reuse_values(entry).image == entry.first_image == str(Path(result.paths[0]).with_name(f"{stem}.first.png"))
        assert np.array_equal(np.asarray(fit_image(entry.first_image, 64, 48)), np.asarray(fit_image(image_file, 64, 48)))
        first_images.append(entry.first_image)
    assert first_images[0] != first_images[1]
    # Deleting the first output leaves the second one's image in place.
    delete_output(outputs, _key(runs[0]))
    assert not Path(first_images[0]).exists() and Path(first_images[1]).is_file()
    assert not list(outputs.rglob(".*"))   # no partial files left behind


# ----- reuse --------------------------------------------------------------------
def test_reuse_values_refill_the_matching_form(made):
    entries = {e.settings.mode: e for e in scan_history(made["outputs"])}
    t2v = reuse_values(entries["t2v"])
    request = made["requests"]["t2v"]
    assert (t2v.tab, t2v.preset, t2v.prompt, t2v.seed) == ("t2v", "selftest-t2v", request.prompt, 11)
    assert t2v.settings == request.settings and t2v.keep == ()   # every setting as it ran, none copied by hand
    assert (t2v.image, t2v.last_image) == (None, None)
    t2i = reuse_values(entries["t2i"])
    assert (t2i.tab, t2i.settings.mode, t2i.settings.frames) == ("t2v", "t2i", 1)
    assert t2i.keep == ("frames",)   # the image button makes one frame: the form's frame count stays
    i2v = reuse_values(entries["i2v"])
    assert (i2v.tab, i2v.negative_prompt, i2v.seed) == ("i2v", "blurry", 13)
    assert i2v.image.endswith(".first.png") and i2v.last_image is None


def test_reused_settings_make_the_same_video_again(made, engine, tmp_path):
    """Running the i2v output's reuse values (kept images, recorded seed) repeats it exactly."""
    entry = find_entry(made["outputs"], _key(made["results"]["i2v"]))
    values = reuse_values(entry)
    again = GenerationRequest(values.settings, values.prompt, values.negative_prompt, values.seed, values.image,
                              values.last_image, values.preset, outputs_dir=str(tmp_path))
    result = _run(engine, again)
    assert np.array_equal(read_video(result.paths[0])[0], read_video(entry.media)[0])


# ----- broken and foreign files -----------------------------------------------------
def test_broken_and_foreign_sidecars_are_skipped(outputs, made):
    day = Path(made["results"]["t2v"].paths[0]).parent.name
    folder = outputs / day
    good = {e.key for e in scan_history(outputs)}
    t2v_sidecar = folder / Path(made["results"]["t2v"].sidecar).name
    data = json.loads(t2v_sidecar.read_text())
    (folder / "cut_t2v_x_1.mp4").write_bytes(b"not really")
    (folder / "cut_t2v_x_1.json").write_text(t2v_sidecar.read_text()[:200])            # cut short
    (folder / "list_t2v_x_1.png").write_bytes(b"png")
    (folder / "list_t2v_x_1.json").write_text("[1, 2, 3]")                                # not an object
    (folder / "binary_t2v_x_1.mp4").write_bytes(b"x")
    (folder / "binary_t2v_x_1.json").write_bytes(b"\xff\xfe\x00garbage")                 # not text
    (folder / "gone_t2v_x_1.json").write_text(json.dumps(dict(data, file="gone_t2v_x_1.mp4")))   # no media
    (folder / "other_t2v_x_1.json").write_text(json.dumps(dict(data, file=Path(made["results"]["t2i"].paths[0]).name)))
    (folder / "up_t2v_x_1.json").write_text(json.dumps(dict(data, file="../up_t2v_x_1.mp4")))
    (folder / "noseed_t2v_x_1.mp4").write_bytes(b"x")
    (folder / "noseed_t2v_x_1.json").write_text(json.dumps({k: v for k, v in data.items() if k != "seed"}
                                                         | {"file": "noseed_t2v_x_1.mp4",
                                                            "parameters": {"mode": "t2v"}}))
    (folder / "config.json").write_text(json.dumps({"file": "config.mp4", "name": "someone else's"}))
    (folder / "config.mp4").write_bytes(b"x")
    (folder / ".123_t2v_x_1.partial.json").write_text(t2v_sidecar.read_text())
    (outputs / "top_t2v_x_1.json").write_text(t2v_sidecar.read_text())                  # not in a day folder
    (outputs / "notes.txt").write_text("hello")
    (outputs / "empty-day").mkdir()
    entries = scan_history(outputs)
    assert {e.key for e in entries} == good


def _beside(folder: Path, stem: str, data: dict | str) -> str:
    """A sidecar (and a media file for it) named ``stem``; its name as the history names it."""
    (folder / f"{stem}.mp4").write_bytes(b"x")
    text = data if isinstance(data, str) else json.dumps(dict(data, file=f"{stem}.mp4"))
    (folder / f"{stem}.json").write_text(text)
    return f"{folder.name}/{stem}.json"


def test_a_bad_sidecar_is_named_as_unreadable_and_never_hides_the_others(outputs, made):
    """One sidecar nested 200,000 deep (RecursionError), one with "seed": 10**300 or "width": 1e308 (numbers no
    JSON reader holds), one of 50 MB: each once made the History tab say "Error" and list none of the outputs."""
    import orjson

    folder = outputs / Path(made["results"]["t2v"].paths[0]).parent.name
    good = [e.key for e in scan_history(outputs)]
    data = json.loads(Path(made["results"]["t2v"].sidecar).read_text())
    bad = {
        _beside(folder, "deep_t2v_x_1", json.dumps(data)[:-1] + ', "x": ' + "[" * 200_000 + "]" * 200_000 + "}"):
            "it is nested more than 32 levels deep",
        _beside(folder, "seed_t2v_x_1", dict(data, seed=10**300)): "seed 100000000000000000000000... is out of range",
        _beside(folder, "wide_t2v_x_1", dict(data, parameters=dict(data["parameters"], width=1e308))):
            "width 1e+308 is out of range",
        _beside(folder, "big_t2v_x_1", json.dumps(dict(data, note="x" * 50_000_000))):
            "it is 50.0 MB, larger than any sidecar (1 MB at most)",
        _beside(folder, "cut_t2v_x_1", json.dumps(data)[:300]): "it is not JSON",
    }
    found = read_history(outputs)
    assert [e.key for e in found.entries] == good
    assert {u.name: u.why for u in found.unreadable}.keys() == bad.keys()
    for unreadable in found.unreadable:
        assert unreadable.why.startswith(bad[unreadable.name]), unreadable
    assert [e.key for e in scan_history(outputs)] == good
    orjson.dumps([e.to_dict() for e in found.entries])      # what gradio sends: every number fits
    # A foreign JSON file and a sidecar whose media file is gone are no output's: skipped without a word.
    (folder / "config.json").write_text(json.dumps({"name": "another program's"}))
    (folder / "gone_t2v_x_1.json").write_text(json.dumps(dict(data, file="gone_t2v_x_1.mp4")))
    assert {u.name for u in read_history(outputs).unreadable} == bad.keys()


def test_odd_settings_in_a_sidecar_count_as_absent_and_reuse_gets_the_defaults(outputs, made):
    folder = outputs / Path(made["results"]["t2v"].paths[0]).parent.name
    data = json.loads(Path(made["results"]["t2v"].sidecar).read_text())
    odd = dict(data["parameters"], strategy={"x": [1]}, sigmas=[0.5, "high"], loras=[{"file": "a", "strength": "max"}],
               gpus=True, guidance_2=float("nan"), fps=10**20)
    _beside(folder, "odd_t2v_x_1", dict(data, parameters=odd, preset={"name": "x"}, plan={"strategy": [1]}))
    [entry] = [e for e in scan_history(outputs) if e.key.endswith("odd_t2v_x_1.mp4")]
    settings = entry.settings
    assert (settings.strategy, settings.sigmas, settings.loras, settings.gpus, settings.guidance_2) == (
        None, None, (), 0, None)
    assert settings.fps == made["requests"]["t2v"].settings.fps        # from the file written ("output")
    assert entry.preset is None and entry.strategy is None
    assert reuse_values(entry).settings == settings


@pytest.mark.parametrize("value, expected", [
    (None, DEFAULT_LIMIT), ("", DEFAULT_LIMIT), (5, 5), ("7", 7), (3.0, 3), (1e9, MAX_LIMIT), (10**30, MAX_LIMIT),
])
def test_the_history_limit_takes_any_whole_number_and_caps_it(value, expected):
    assert history_limit(value) == expected


@pytest.mark.parametrize("value", ["abc", -1, 0, 1.5, True, [3], float("nan")])
def test_a_history_limit_that_is_no_count_says_what_to_give(value):
    with pytest.raises(HistoryError, match=rf"^limit .* is not a number of outputs: give a whole number from 1 to "
                                           rf"{MAX_LIMIT} \(how many to list, newest first\), or leave it out for the "
                                           rf"newest {DEFAULT_LIMIT}$"):
        history_limit(value)


def test_links_are_neither_listed_nor_deleted(outputs, made, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(Path(made["results"]["t2v"].paths[0]).parent, outside)
    before = sorted(p.name for p in outside.iterdir())
    media = Path(made["results"]["t2v"].paths[0])
    os.symlink(outside, outputs / "2000-01-01")                                         # a linked day folder
    day = outputs / media.parent.name
    os.symlink(outside / media.name, day / "link_t2v_x_1.mp4")                          # a linked media file
    data = json.loads(Path(made["results"]["t2v"].sidecar).read_text())
    (day / "link_t2v_x_1.json").write_text(json.dumps(dict(data, file="link_t2v_x_1.mp4")))
    os.symlink(outside / (media.name[:-4] + ".json"), day / "zz_t2v_x_1.json")          # a linked sidecar
    keys = {e.key for e in scan_history(outputs)}
    assert not any(k.startswith("2000-01-01/") or "link_" in k or "zz_" in k for k in keys) and len(keys) == 3
    for key in (f"2000-01-01/{media.name}", f"{day.name}/link_t2v_x_1.mp4"):
        with pytest.raises(HistoryError, match="is not an output of this app"):
            delete_output(outputs, key)
        # Named as an input (the API's {"output": key}), the refusal fits that use too: not "can be deleted".
        with pytest.raises(HistoryError) as refused:
            find_entry(outputs, key)
        assert str(refused.value) == (f"{key!r} is not an output of this app: its outputs are files inside the "
                                      "outputs folder, never links, so it is neither used nor deleted")
    assert sorted(p.name for p in outside.iterdir()) == before


# ----- deleting -----------------------------------------------------------------
def test_delete_removes_the_output_and_everything_that_belongs_to_it(outputs, made, last_image):
    key = _key(made["results"]["i2v"])
    entry = find_entry(outputs, key)
    folder = Path(entry.media).parent
    stem = Path(entry.media).name[: -len(".mp4")]
    keep_inputs(made["requests"]["i2v"].with_values(image=None, last_image=str(last_image)), folder / stem)
    files = _stem_files(folder, stem)
    assert files == sorted(f"{stem}{s}" for s in (".first.png", ".json", ".last.png", ".latents.safetensors", ".mp4"))
    assert sorted(p.name for p in output_files(entry)) == files
    others = {e.key for e in scan_history(outputs)} - {key}
    removed = delete_output(outputs, key)
    assert removed[0] == f"{stem}.mp4" and sorted(removed) == files
    assert _stem_files(folder, stem) == []
    assert {e.key for e in scan_history(outputs)} == others
    for other in others:     # the other outputs are whole
        assert Path(find_entry(outputs, other).media).exists()
    with pytest.raises(HistoryError, match="deleted already"):
        delete_output(outputs, key)


@pytest.mark.parametrize("key, message", [
    ("", "no output given"),
    (None, "no output given"),
    (5, "no output given"),
    ("../etc/passwd", "is not an output key"),
    ("/etc/passwd", "is not an output key"),
    ("..", "is not an output key"),
    ("2025-01-01/../x.mp4", "is not an output key"),
    ("a/b/c.mp4", "is not an output key"),
    ("x.mp4", "is not an output key"),
    ("2025-01-01\\x.mp4", "is not an output key"),
    ("2025-01-01/x.json", "is not an output key"),
    ("2025-01-01/.x.partial.mp4", "is not an output key"),
    ("C:/x.mp4", "is not an output key"),
    ("2025-01-01/x.mp4", "deleted already"),
])
def test_delete_refuses_what_is_not_a_listed_output(outputs, key, message):
    before = sorted(str(p) for p in outputs.rglob("*"))
    with pytest.raises(HistoryError, match=message):
        delete_output(outputs, key)
    assert sorted(str(p) for p in outputs.rglob("*")) == before


def test_delete_leaves_an_output_with_a_broken_sidecar_alone(outputs, made):
    key = _key(made["results"]["t2v"])
    sidecar = outputs / key.replace(".mp4", ".json")
    sidecar.write_text("{ cut")
    before = sorted(str(p) for p in outputs.rglob("*"))
    with pytest.raises(HistoryError, match="missing or unreadable"):
        delete_output(outputs, key)
    assert sorted(str(p) for p in outputs.rglob("*")) == before
    assert read_entry(sidecar) is None
