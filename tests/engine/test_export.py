"""Outputs are written atomically under unique names."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from engine.atomic import discard_temporary, temporary_path
from engine.atomic import write_json
from engine.outputs.export import (Mp4Stream, output_stem, read_video, write_mp4, write_mp4_stream,
    write_png)
from tests.conftest import ROOT


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


# ----- a video streamed while its frames are made -----------------------------------------------------------
def _noise(count: int, height: int = 32, width: int = 48, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((count, height, width, 3)) * 255).astype(np.uint8)


def test_a_streamed_mp4_holds_every_frame_and_is_the_file_write_mp4_makes(tmp_path):
    frames = _noise(21)
    batches = [frames[:1], *(frames[i:i + 4] for i in range(1, 21, 4))]   # as the decoder gives them
    path, tail = write_mp4_stream(iter(batches), tmp_path / "streamed.mp4", 16, 48, 32)
    whole = write_mp4(frames, tmp_path / "whole.mp4", 16)
    streamed, fps = read_video(path)
    assert streamed.shape == (21, 32, 48, 3) and fps == 16 and tail >= 0
    assert np.array_equal(streamed, read_video(whole)[0])
    assert path.read_bytes() == whole.read_bytes()   # the same encoder and options: the same file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streamed.mp4", "whole.mp4"]


def test_a_producer_that_fails_midway_leaves_no_file(tmp_path):
    final = tmp_path / "clip.mp4"

    def decoding():
        yield _noise(5)
        deadline = time.monotonic() + 30
        while not temporary_path(final).exists():   # ffmpeg is writing: the failure comes mid-file
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield _noise(4, seed=1)
        raise MemoryError("out of memory (the decode of the next batch)")

    with pytest.raises(MemoryError, match="next batch"):
        write_mp4_stream(decoding(), final, 16, 48, 32)
    assert list(tmp_path.iterdir()) == []


def test_a_bad_batch_or_nothing_at_all_leaves_no_file(tmp_path):
    with pytest.raises(ValueError, match=r"frame 5 is \(16, 48, 3\)"):
        write_mp4_stream([_noise(5), _noise(2, height=16)], tmp_path / "bad.mp4", 16, 48, 32)
    with pytest.raises(ValueError, match="no frames"):
        write_mp4_stream([], tmp_path / "empty.mp4", 16, 48, 32)
    with Mp4Stream(tmp_path / "left.mp4", 16, 48, 32) as stream:   # never closed: given up on leaving
        stream.send(_noise(3))
    assert list(tmp_path.iterdir()) == []


_STREAM_FOREVER = """
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from engine.outputs.export import write_mp4_stream

def slowly():
    for i in range(100000):
        time.sleep(0.02)
        yield np.full((4, 32, 48, 3), i % 256, np.uint8)

write_mp4_stream(slowly(), sys.argv[2], 16, 48, 32)
"""


def test_a_process_killed_mid_stream_leaves_nothing_under_the_final_name(tmp_path):
    final = tmp_path / "clip.mp4"
    writer = subprocess.Popen([sys.executable, "-c", _STREAM_FOREVER, str(ROOT), str(final)])
    try:
        deadline = time.monotonic() + 60
        while not (temporary_path(final).exists() and temporary_path(final).stat().st_size):
            assert writer.poll() is None and time.monotonic() < deadline, "the stream never started"
            time.sleep(0.02)
        time.sleep(0.2)   # well into the file
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    time.sleep(0.5)   # ffmpeg outlives it: it ends the file it was given, under the temporary name only
    assert not final.exists()
    discard_temporary(final)   # what the worker does once it sees its engine died
    assert list(tmp_path.iterdir()) == []


def test_the_frame_count_comes_from_the_files_index_and_a_cut_file_has_none(tmp_path):
    import imageio_ffmpeg

    from engine.mp4_boxes import video_frame_count

    rng = np.random.default_rng(0)
    path = write_mp4(rng.integers(0, 256, (13, 32, 48, 3), dtype=np.uint8), tmp_path / "clip.mp4", fps=16)
    assert video_frame_count(path) == 13 == imageio_ffmpeg.count_frames_and_secs(str(path))[0]
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 40, 0):   # the index is at the front (faststart): the cut is in mdat
        (tmp_path / "cut.mp4").write_bytes(data[:cut])
        assert video_frame_count(tmp_path / "cut.mp4") is None
    (tmp_path / "text.mp4").write_text("not a video at all")
    assert video_frame_count(tmp_path / "text.mp4") is None
    assert video_frame_count(tmp_path / "missing.mp4") is None
