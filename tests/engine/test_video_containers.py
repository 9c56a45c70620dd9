"""A video input is opened as the container its own bytes say and nothing else: a playlist or manifest under any name
(an HLS .m3u8, a DASH .mpd named video.mp4, an ffconcat list) is refused before ffmpeg sees it, so a job never reads
a file its manifest names; MP4, MOV, WebM, MKV, AVI and GIF files still read."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from engine.containers import NotAContainer, container, input_options
from engine.settings.videos import VideoError, fitted_frames, last_frame, read_video
from tests.helpers.containers import FRAMES, dash, hls, video


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> Path:
    """A video outside every folder the app serves, which a manifest names."""
    return video(tmp_path_factory.mktemp("private") / "secret.mp4")


def _concat(secret: Path) -> str:
    return f"ffconcat version 1.0\nfile '{secret}'\n"


LISTS = {"dash": (dash, "a DASH manifest"), "hls": (hls, "an HLS playlist"),
         "concat": (_concat, "an ffmpeg concat list")}


def test_ffmpeg_alone_reads_the_files_a_manifest_names(secret, tmp_path):
    """What the check is for: without it, ffmpeg guesses from the content (a DASH manifest under any name, an HLS
    playlist by its .m3u8 name) and reads the secret through the list."""
    import imageio_ffmpeg

    for kind, name in (("dash", "video.bin"), ("hls", "clip.m3u8")):
        upload = tmp_path / name
        upload.write_text(LISTS[kind][0](secret))
        reader = imageio_ffmpeg.read_frames(str(upload), pix_fmt="rgb24")
        next(reader)
        assert sum(1 for _ in reader) == FRAMES, kind


@pytest.mark.parametrize("kind", LISTS)
@pytest.mark.parametrize("name", ["video.mp4", "video.bin", "clip.m3u8", "film.mpd", "movie.webm"])
def test_a_playlist_or_manifest_under_any_name_is_refused_before_ffmpeg_sees_it(kind, name, secret, tmp_path):
    make, said = LISTS[kind]
    upload = tmp_path / name
    upload.write_text(make(secret))
    with pytest.raises(VideoError, match=rf"Video {name!r} is {said}.*names other files.*upload an MP4"):
        read_video(upload)
    for reading in (lambda: last_frame(upload, "video to extend"), lambda: list(fitted_frames(upload, 64, 64, 16, 5))):
        with pytest.raises(VideoError, match=said):
            reading()


def test_text_and_other_files_are_no_video_whatever_their_name(tmp_path):
    for content in (b"just some text", b"\x00" * 64, b"\x89PNG\r\n\x1a\n" + b"\x00" * 32):
        upload = tmp_path / "video.mp4"
        upload.write_bytes(content)
        with pytest.raises(NotAContainer, match="is not a readable video: its contents are no MP4.* whatever its name"):
            container(upload)


def test_the_containers_that_hold_their_frames_still_read(tmp_path):
    made = {"mov": video(tmp_path / "a.mp4"), "matroska": video(tmp_path / "a.webm", "libvpx-vp9"),
            "avi": video(tmp_path / "a.avi", "mjpeg"), "gif": video(tmp_path / "a.gif", "gif", extra=["-f", "gif"])}
    made["mov2"] = Path(shutil.copy(made["mov"], tmp_path / "renamed.bin"))   # by its bytes, not its name
    for demuxer, path in made.items():
        assert container(path) == demuxer.rstrip("2")
        info = read_video(path)
        assert info.frames == FRAMES and (info.width, info.height) == (64, 64), demuxer
        assert last_frame(path).shape == (64, 64, 3)


def test_an_mp4_is_opened_with_its_demuxer_forced_and_local_files_only(tmp_path):
    import imageio_ffmpeg

    mp4 = video(tmp_path / "a.mp4")
    options = input_options(mp4)
    assert options == ["-f", "mov", "-protocol_whitelist", "file"]
    done = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", *options, "-i", str(mp4), "-f", "null",
                           "-"], capture_output=True)
    assert done.returncode == 0, done.stderr
