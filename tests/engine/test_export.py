"""Outputs are written atomically under unique names."""
from __future__ import annotations

import numpy as np
import pytest

from engine.outputs.export import output_stem, read_video, write_json, write_mp4, write_png


def test_mp4_round_trip_is_h264_yuv420p(tmp_path):
    frames = np.zeros((5, 32, 48, 3), np.uint8)
    frames[:, :, 24:] = 255
    path = write_mp4(frames, tmp_path / "clip.mp4", fps=24)
    decoded, fps = read_video(path)
    assert decoded.shape == (5, 32, 48, 3) and fps == 24
    assert abs(int(decoded[0, 16, 40, 0]) - 255) < 16 and decoded[0, 16, 4, 0] < 16
    import subprocess

    import imageio_ffmpeg
    info = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-i", str(path)], capture_output=True, text=True).stderr
    assert "h264" in info and "yuv420p" in info


def test_failed_write_leaves_no_file(tmp_path):
    frames = [np.zeros((32, 32, 3), np.uint8), np.zeros((32, 32, 3), np.uint8), np.zeros((16, 16, 3), np.uint8)]

    class Frames(list):
        shape = (3, 32, 32, 3)

    with pytest.raises(Exception):
        write_mp4(Frames(frames), tmp_path / "broken.mp4", fps=16)
    assert list(tmp_path.iterdir()) == []


def test_png_and_json_are_atomic(tmp_path):
    write_png(np.zeros((8, 8, 3), np.uint8), tmp_path / "a.png")
    write_json({"x": 1}, tmp_path / "a.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.png"]


def test_output_names_never_collide(tmp_path):
    first = output_stem(tmp_path, "t2v", "A cat / on the moon!", 7, now=0)
    first.with_suffix(".mp4").write_bytes(b"x")
    second = output_stem(tmp_path, "t2v", "A cat / on the moon!", 7, now=0)
    assert first != second and second.name.endswith("_2")
    assert "a-cat-on-the-moon" in first.name and first.parent.name == "1970-01-01"
