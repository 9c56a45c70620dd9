"""The one containment check (engine/folders.py), on real links: a path is inside a folder only if it stays there
once every link is followed, and, when asked, as it is written."""
from __future__ import annotations

import os

from engine.folders import inside


def test_a_link_out_of_the_folder_is_outside_and_one_into_it_is_inside(tmp_path):
    folder, elsewhere = tmp_path / "outputs", tmp_path / "elsewhere"
    (folder / "day").mkdir(parents=True)
    elsewhere.mkdir()
    (folder / "leakdir").symlink_to(elsewhere, target_is_directory=True)
    (folder / "alias").symlink_to(folder / "day", target_is_directory=True)
    (tmp_path / "door").symlink_to(folder / "day", target_is_directory=True)
    assert inside(folder / "day" / "x.mp4", folder, below=True)
    assert not inside(folder / "leakdir" / "victimfile.latents.safetensors", folder)
    assert inside(folder / "leakdir" / "x", folder, follow_links=False)       # as written it is, as it leads not
    assert inside(folder / "alias" / "x", folder, below=True)                 # a link that stays inside
    assert inside(tmp_path / "door" / "x", folder) and not inside(tmp_path / "door" / "x", folder, follow_links=False)
    assert not inside(folder / "day" / ".." / ".." / "elsewhere", folder)
    assert not inside(folder / "day/../../elsewhere", folder, follow_links=False)   # '..' taken as written


def test_the_folder_itself_is_inside_unless_below_is_asked_and_a_linked_folder_counts_as_itself(tmp_path):
    real = tmp_path / "disk" / "outputs"
    real.mkdir(parents=True)
    (tmp_path / "outputs").symlink_to(real, target_is_directory=True)      # the operator's outputs on another disk
    assert inside(real, real) and not inside(real, real, below=True)
    assert inside(tmp_path / "outputs" / "day" / "x.mp4", tmp_path / "outputs", below=True)
    assert not inside(tmp_path / "disk", real)


def test_a_loop_of_links_is_never_inside(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    assert not inside(tmp_path / "a" / "x", tmp_path)
