"""The files of one output (Bundle) and the one atomic write every output file goes through."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.atomic import temporary_path, write_atomically
from engine.outputs.bundle import LATENTS_SUFFIX, Bundle, RemovalError, listed, media_kind
from engine.atomic import write_json
from engine.outputs.export import copy_file, output_stem, write_png
from engine.outputs.kept_inputs import carry_inputs
from engine.outputs.latents import cleanup_latents, load_latents, save_latents, saved_latents
from engine.settings.values import InputError

STEM = "120000_i2v_a-fox_7"


def _make(folder: Path, *suffixes: str) -> Bundle:
    for suffix in suffixes:
        (folder / f"{STEM}{suffix}").write_bytes(b"x")
    return Bundle(folder / STEM)


# ----- where the files are, and which exist ----------------------------------------
def test_a_bundle_names_every_file_of_its_output(tmp_path):
    bundle = Bundle(tmp_path / STEM)
    assert [p.name for p in bundle.paths()] == [f"{STEM}{s}" for s in (
        ".mp4", ".png", ".json", ".latents.safetensors", ".first.png", ".last.png", ".input.mp4", ".source.mp4")]
    assert (bundle.video.name, bundle.image.name, bundle.sidecar.name) == (f"{STEM}.mp4", f"{STEM}.png", f"{STEM}.json")
    assert bundle.latents.name == f"{STEM}.latents.safetensors"
    assert (bundle.input("image").name, bundle.input("last_image").name) == (f"{STEM}.first.png", f"{STEM}.last.png")
    assert all(p.parent == tmp_path for p in bundle.paths())


def test_a_bundle_is_found_from_any_of_its_named_files(tmp_path):
    bundle = Bundle(tmp_path / STEM)
    for path in (bundle.video, bundle.image):
        assert Bundle.from_media(path) == bundle
    assert Bundle.from_sidecar(bundle.sidecar) == bundle and Bundle.from_latents(bundle.latents) == bundle
    # A kept input's name ends like an image: as a media file it is another output's, never this one's.
    assert Bundle.from_media(bundle.input("image")).stem.name == f"{STEM}.first"
    for make, path in ((Bundle.from_media, tmp_path / "x.json"), (Bundle.from_sidecar, tmp_path / "x.mp4"),
                       (Bundle.from_latents, tmp_path / "x.safetensors"), (Bundle.from_sidecar, tmp_path / ".json")):
        with pytest.raises(ValueError):
            make(path)


def test_media_kind_and_media_named(tmp_path):
    bundle = Bundle(tmp_path / STEM)
    assert (media_kind("a.mp4"), media_kind("a.png"), media_kind("a.json"), media_kind("a")) == ("video", "image",
                                                                                                 None, None)
    assert bundle.media_named(f"{STEM}.mp4") == bundle.video and bundle.media_named(f"{STEM}.png") == bundle.image
    for name in (f"{STEM}.json", f"{STEM}.first.png", f"../{STEM}.mp4", "other.mp4", None, 5):
        assert bundle.media_named(name) is None


def test_which_files_exist_and_whether_the_output_is_complete(tmp_path):
    bundle = Bundle(tmp_path / STEM)
    assert bundle.existing() == [] and bundle.media is None
    assert not (bundle.has_media() or bundle.is_complete() or bundle.has_output() or bundle.in_use())
    _make(tmp_path, ".latents.safetensors", ".first.png")      # a run whose decode failed
    assert bundle.in_use() and not bundle.has_output() and not bundle.is_complete()
    assert bundle.existing() == [bundle.latents, bundle.input("image")]
    _make(tmp_path, ".mp4")                                      # the video, not yet its sidecar
    assert bundle.media == bundle.video and bundle.has_output() and not bundle.is_complete()
    _make(tmp_path, ".json")
    assert bundle.is_complete()
    assert bundle.existing() == [bundle.video, bundle.sidecar, bundle.latents, bundle.input("image")]
    other = Bundle(tmp_path / "other")
    other.sidecar.write_text("{}")                              # a sidecar without its media
    assert other.has_output() and not other.has_media() and not other.is_complete()


# ----- removing ---------------------------------------------------------------------
def test_remove_deletes_every_file_and_nothing_else(tmp_path):
    bundle = _make(tmp_path, ".mp4", ".json", ".latents.safetensors", ".first.png", ".last.png")
    _make(tmp_path, ".mp4.bak")                                  # not a file of the output
    (tmp_path / f"{STEM}_2.mp4").write_bytes(b"x")              # another output
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"kept")
    os.symlink(outside, bundle.image)                           # a link among the files: removed, not its target
    removed = bundle.remove()
    assert removed == [f"{STEM}{s}" for s in (".mp4", ".png", ".json", ".latents.safetensors", ".first.png",
                                              ".last.png")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{STEM}.mp4.bak", f"{STEM}_2.mp4", "outside.png"])
    assert outside.read_bytes() == b"kept" and bundle.existing() == [] and bundle.remove() == []


def test_remove_stops_at_a_file_it_cannot_remove_and_says_what_it_did(tmp_path):
    bundle = _make(tmp_path, ".mp4", ".json")
    bundle.latents.mkdir()                                      # unlink() of a folder fails
    (bundle.latents / "inside").write_bytes(b"x")
    with pytest.raises(RemovalError) as info:
        bundle.remove()
    assert info.value.path == bundle.latents and info.value.removed == [f"{STEM}.mp4", f"{STEM}.json"]
    assert isinstance(info.value.error, OSError) and bundle.existing() == [bundle.latents]


# ----- the modules that use it ---------------------------------------------------------
def test_a_new_stem_avoids_every_stem_in_use(tmp_path):
    first = Bundle(output_stem(tmp_path, "t2v", "a fox", 7, now=0))
    for path in (first.video, first.image, first.sidecar, first.latents):
        path.write_bytes(b"x")
        assert output_stem(tmp_path, "t2v", "a fox", 7, now=0) == first.stem.with_name(first.stem.name + "_2")
        path.unlink()
    assert output_stem(tmp_path, "t2v", "a fox", 7, now=0) == first.stem


def test_saved_latents_and_their_cleanup_go_by_the_bundle(tmp_path):
    day = tmp_path / "2025-01-01"
    day.mkdir()
    finished, failed = Bundle(day / "a"), Bundle(day / "b")
    for bundle in (finished, failed):
        save_latents(torch.zeros(2, 3), bundle.latents, {"keep": False})
    write_png(np.zeros((4, 4, 3), np.uint8), finished.image)
    assert sorted(b.stem.name for b in saved_latents(tmp_path)) == ["a", "b"]
    tensor, meta = load_latents(failed.latents)
    assert tensor.shape == (2, 3) and meta == {"keep": False}
    assert cleanup_latents(tmp_path, keep_hours=0, now=os.path.getmtime(finished.latents) + 1) == [finished.latents]
    assert [b.stem.name for b in saved_latents(tmp_path)] == ["b"]
    assert not [p for p in day.iterdir() if p.name.startswith(".")]


def _finished_long_ago(bundle: Bundle) -> Bundle:
    """Latents of a finished run (its media beside them), two days old: what the clean-up removes."""
    save_latents(torch.zeros(2, 3), bundle.latents, {"keep": False})
    bundle.video.write_bytes(b"mp4")
    old = os.path.getmtime(bundle.latents) - 2 * 86400
    os.utime(bundle.latents, (old, old))
    return bundle


def test_a_linked_folder_in_the_outputs_is_neither_listed_nor_cleaned_up(tmp_path):
    """outputs/leakdir -> a folder elsewhere: the latents clean-up after a job once deleted the latents there, and
    Decode again took them. Links are not followed, wherever they point: out of the folder or back into it."""
    outputs, elsewhere = tmp_path / "outputs", tmp_path / "elsewhere"
    (outputs / "2025-01-01").mkdir(parents=True)
    elsewhere.mkdir()
    victim = _finished_long_ago(Bundle(elsewhere / "victimfile"))
    save_latents(torch.zeros(2, 3), elsewhere / f"x{LATENTS_SUFFIX}", {"keep": False})     # pending, as if failed
    (outputs / "leakdir").symlink_to(elsewhere, target_is_directory=True)
    (outputs / "alias").symlink_to(outputs / "2025-01-01", target_is_directory=True)
    own = _finished_long_ago(Bundle(outputs / "2025-01-01" / "a"))
    (outputs / "2025-01-01" / f"linked{LATENTS_SUFFIX}").symlink_to(victim.latents)     # a linked file
    assert listed(outputs, LATENTS_SUFFIX) == [own.latents]
    assert [b.latents for b in saved_latents(outputs)] == [own.latents]
    assert cleanup_latents(outputs, keep_hours=24) == [own.latents]
    assert victim.latents.is_file() and (elsewhere / f"x{LATENTS_SUFFIX}").is_file()
    assert (outputs / "2025-01-01" / f"linked{LATENTS_SUFFIX}").is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victimfile.latents.safetensors", "victimfile.mp4",
                                                           "x.latents.safetensors"]


def test_nothing_is_written_through_a_linked_day_folder(tmp_path):
    outputs, elsewhere = tmp_path / "outputs", tmp_path / "elsewhere"
    outputs.mkdir()
    elsewhere.mkdir()
    now = 2 * 86400.0
    day = time.strftime("%Y-%m-%d", time.localtime(now))
    (outputs / day).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InputError, match=f"^The outputs folder's {day} is a link, and the app writes nothing through "
                                         rf"links: make {day} a plain folder \(or remove the link\) and run again\.$"):
        output_stem(outputs, "t2v", "a fox", 7, now=now)
    assert list(elsewhere.iterdir()) == []
    (outputs / day).unlink()
    assert output_stem(outputs, "t2v", "a fox", 7, now=now).parent == outputs / day


def test_no_writer_writes_through_a_link_at_its_temporary_name_and_no_input_is_copied_through_one(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious.png").write_bytes(b"precious")
    day = tmp_path / "outputs" / "2025-01-01"
    day.mkdir(parents=True)
    bundle = Bundle(day / STEM)
    temporary_path(bundle.image).symlink_to(outside / "precious.png")
    write_png(np.zeros((4, 4, 3), np.uint8), bundle.image)
    assert (outside / "precious.png").read_bytes() == b"precious" and bundle.image.read_bytes()[:4] == b"\x89PNG"
    (day / "old.first.png").symlink_to(outside / "precious.png")       # a kept input that is a link
    assert carry_inputs({"image": "old.first.png"}, day, day / "new") == {"image": None, "last_image": None}
    assert not (day / "new.first.png").exists()


def test_carried_inputs_are_named_by_the_new_bundle(tmp_path):
    (tmp_path / "old.first.png").write_bytes(b"png")
    carried = carry_inputs({"image": "old.first.png", "last_image": None}, tmp_path, tmp_path / "new")
    assert carried == {"image": "new.first.png", "last_image": None}
    assert (tmp_path / "new.first.png").read_bytes() == b"png"


# ----- the atomic write ----------------------------------------------------------------
def test_the_temporary_name_is_hidden_beside_the_file_and_keeps_its_suffix(tmp_path):
    assert temporary_path(tmp_path / "a.mp4") == tmp_path / ".a.partial.mp4"
    assert temporary_path(tmp_path / "a.latents.safetensors") == tmp_path / ".a.latents.partial.safetensors"


def test_a_write_that_fails_halfway_leaves_nothing(tmp_path):
    (tmp_path / "a.json").write_text("old")

    def half(temporary: Path):
        temporary.write_text("half of it")
        raise RuntimeError("the writer broke")

    with pytest.raises(RuntimeError, match="the writer broke"):
        write_atomically(tmp_path / "a.json", half)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "b.json", lambda temporary: (temporary.write_text("x"), _interrupt()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"] and (tmp_path / "a.json").read_text() == "old"


def _interrupt():
    raise KeyboardInterrupt


def test_a_rename_that_fails_leaves_no_temporary_file(tmp_path):
    taken = tmp_path / "a.png"
    taken.mkdir()                                               # a folder with this name: the rename fails
    (taken / "inside").write_bytes(b"x")
    with pytest.raises(OSError):
        write_png(np.zeros((4, 4, 3), np.uint8), taken)
    with pytest.raises(OSError):
        copy_file(Path(__file__), taken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"] and taken.is_dir()


def test_a_write_into_a_missing_folder_fails_cleanly(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_json({"x": 1}, tmp_path / "missing" / "a.json")
    with pytest.raises(FileNotFoundError):
        copy_file(tmp_path / "no-such-source.png", tmp_path / "copy.png")
    assert list(tmp_path.iterdir()) == []


def test_every_writer_leaves_the_whole_file_and_nothing_else(tmp_path):
    write_png(np.zeros((4, 4, 3), np.uint8), tmp_path / "a.png")
    copy_file(tmp_path / "a.png", tmp_path / "b.png")
    write_json({"x": "é"}, tmp_path / "a.json")
    save_latents(torch.ones(1), tmp_path / "a.latents.safetensors", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.latents.safetensors", "a.png", "b.png"]
    assert json.loads((tmp_path / "a.json").read_text(encoding="utf-8")) == {"x": "é"}
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
