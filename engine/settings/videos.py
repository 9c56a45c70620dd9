"""A user's video: the input of a video-to-video run, or the video an image-to-video run extends.

``read_video`` refuses what cannot be used (missing, empty, not a video, too large, no frames) before any heavy work,
with a sentence naming the file; ``VideoInfo.notes`` says what the preparation changes (scaled, cropped, another
frame rate); ``fitted_frames`` streams the frames a run uses, at the run's frame rate and exactly its size (scaled to
cover it and centre-cropped, as an image-to-video input is); ``last_frame`` is the frame an extension starts from.

Frames are read through ffmpeg one at a time, so a long or large video never sits in RAM whole.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from engine.containers import VIDEO_HINT, NotAContainer, input_options
from engine.errors import InputError
from engine.words import plural

# What a video may be: H.264 holds at most 8192 pixels a side; more frames than an hour at 30 fps is no input.
MAX_VIDEO_SIDE = 8192
MAX_VIDEO_FRAMES = 108_000
# The end of a video read to find its last frame (seconds): ffmpeg seeks there, then decodes to the end.
LAST_FRAME_TAIL_S = 2.0


class VideoError(InputError):
    """A video cannot be used; the message names the file and says what to change."""


@dataclass(frozen=True)
class VideoInfo:
    """A readable video: its file, frame count, size and frame rate."""
    path: Path
    frames: int
    width: int
    height: int
    fps: float

    @property
    def seconds(self) -> float:
        return self.frames / self.fps if self.fps > 0 else 0.0

    def frames_at(self, fps: int) -> int:
        """How many frames reading it at ``fps`` gives: all of them at its own rate, else as many as its length
        holds at that rate (rounded down)."""
        if abs(self.fps - fps) < 0.01:
            return self.frames
        return max(1, int(self.frames * fps / self.fps)) if self.fps > 0 else self.frames

    def usable_frames(self, fps: int) -> int:
        """The most frames a run may take from it at ``fps``: 4k+1 (1, 5, 9, ...), at most ``frames_at``."""
        return (self.frames_at(fps) - 1) // 4 * 4 + 1

    def notes(self, width: int, height: int, fps: int, frames: int | None = None) -> list[str]:
        """What preparing it for a run of ``width`` x ``height`` at ``fps`` changes, as sentences."""
        notes = []
        if abs(self.fps - fps) >= 0.01:
            notes.append(f"it runs at {self.fps:g} fps and is read at {fps} fps, the model's rate (its motion keeps "
                         "its speed)")
        scale = max(width / self.width, height / self.height)
        if scale > 1.25:
            notes.append(f"the video ({self.width}x{self.height}) is smaller than the output ({width}x{height}) and "
                         f"is scaled up {scale:.1f}x")
        covered_w, covered_h = self.width * scale, self.height * scale
        cut = max(1 - width / covered_w, 1 - height / covered_h)
        if cut > 0.1:
            side = "width" if 1 - width / covered_w >= 1 - height / covered_h else "height"
            notes.append(f"its shape ({self.width}x{self.height}) differs from the output's ({width}x{height}): "
                         f"{cut:.0%} of its {side} is cropped away")
        if frames is not None and frames < self.frames_at(fps):
            notes.append(f"the first {frames} of its {self.frames_at(fps)} frames are used")
        return notes


def _label(name: str, path) -> str:
    return f"{name} {Path(path).name!r}"


def read_video(path, name: str = "video") -> VideoInfo:
    """The video at ``path`` as ffmpeg reads it, or VideoError naming the file and what to change."""
    file = Path(path)
    label = _label(name, path)
    if file.is_dir():
        raise VideoError(f"{name} {str(path)!r} is a folder, not a video file; pick a video file")
    if not file.is_file():
        raise VideoError(f"{name} {str(path)!r} does not exist; check the path or upload it again")
    if file.stat().st_size == 0:
        raise VideoError(f"{label} is empty (0 bytes); {VIDEO_HINT}")
    opened = opening(file, label)   # what its bytes say it is, before ffmpeg sees it (engine/containers.py)
    meta = _meta(file, label, opened)
    width, height = meta["size"]
    if max(width, height) > MAX_VIDEO_SIDE:
        raise VideoError(f"{label} is {width}x{height}, more than {MAX_VIDEO_SIDE} pixels a side; scale it down (for "
                         "example to 1920x1080) and upload it again")
    fps = float(meta.get("fps") or 0.0)
    if not fps > 0:
        raise VideoError(f"{label} says no frame rate, so its frames cannot be timed; {VIDEO_HINT}")
    frames = _frame_count(file, label, opened)
    if frames < 1:
        raise VideoError(f"{label} holds no frames; {VIDEO_HINT}")
    if frames > MAX_VIDEO_FRAMES:
        raise VideoError(f"{label} has {frames} frames, more than the {MAX_VIDEO_FRAMES} this app reads; cut it "
                         "shorter and upload it again")
    return VideoInfo(file, frames, width, height, fps)


def opening(path, label: str | None = None) -> list[str]:
    """ffmpeg's input options that open the video at ``path`` as the container its bytes say, local files only;
    VideoError naming it when it is no container the app opens (a playlist or manifest above all)."""
    try:
        return input_options(path, label)
    except NotAContainer as exc:
        raise VideoError(str(exc)) from None
    except OSError as exc:
        raise VideoError(f"{label or Path(path).name!r} cannot be read ({exc.strerror or exc}); check the file") from None


def _meta(file: Path, label: str, opened: list[str]) -> dict:
    """ffmpeg's description of the file's video stream (its size as decoded, rotation applied)."""
    import imageio_ffmpeg

    try:
        reader = imageio_ffmpeg.read_frames(str(file), pix_fmt="rgb24", input_params=opened)
        try:
            return next(reader)
        finally:
            reader.close()
    except (OSError, RuntimeError, StopIteration, ValueError):
        raise VideoError(f"{label} is not a readable video (ffmpeg cannot decode it); {VIDEO_HINT}") from None


def _frame_count(file: Path, label: str, opened: list[str]) -> int:
    """The file's frames: from an mp4's index when it has one, else counted by ffmpeg reading its packets."""
    import subprocess

    from engine.mp4_boxes import video_frame_count

    counted = video_frame_count(file)
    if counted:
        return counted
    import imageio_ffmpeg

    command = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", *opened, "-i", str(file), "-map", "0:v:0",
               "-c", "copy", "-f", "null", "-"]
    done = subprocess.run(command, capture_output=True, text=True, errors="replace")
    said = [line for line in done.stderr.replace("\r", "\n").splitlines() if line.startswith("frame=")]
    if done.returncode != 0 or not said:
        raise VideoError(f"{label} is truncated or damaged (its frames cannot be counted); export it again and "
                         "upload the new file")
    return int(said[-1].split("=", 1)[1].split()[0])


def check_video(path, name: str = "video", width: int | None = None, height: int | None = None,
                fps: int | None = None, frames: int | None = None) -> tuple[VideoInfo, list[str]]:
    """(the video, notes on preparing it): VideoError when it cannot be used, or when it holds fewer than
    ``frames`` frames at ``fps``, saying how many it can give."""
    info = read_video(path, name)
    notes = info.notes(width, height, fps, frames) if width and height and fps else []
    if frames and fps and frames > info.frames_at(fps):
        usable = info.usable_frames(fps)
        raise VideoError(f"{_label(name, path)} has {plural(info.frames_at(fps), 'frame')} at {fps} fps "
                         f"({info.seconds:.1f} s), fewer than the {frames} asked for: make at most "
                         f"{plural(usable, 'frame')}, or pick a longer video")
    return info, notes


def _fitting(width: int, height: int) -> str:
    """ffmpeg's filters that scale a frame to cover ``width`` x ``height`` and crop its centre to exactly that."""
    return (f"scale=w={width}:h={height}:force_original_aspect_ratio=increase:flags=lanczos,"
            f"crop={width}:{height},setsar=1")


class _NotTheSizeNote(logging.Filter):
    """Leaves out imageio-ffmpeg's warning that frames are read at another size than the file's: they are scaled
    on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "different from the source frame size" not in record.getMessage()


@contextmanager
def _scaling_on_purpose():
    logger, note = logging.getLogger("imageio_ffmpeg"), _NotTheSizeNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


def fitted_frames(path, width: int, height: int, fps: int, frames: int) -> Iterator:
    """The first ``frames`` frames of the video at ``path``, read at ``fps`` and fitted to ``width`` x ``height``,
    one uint8 (height, width, 3) array at a time; VideoError when the file gives fewer."""
    import numpy as np
    import imageio_ffmpeg

    options = ["-vf", f"fps={fps},{_fitting(width, height)}", "-frames:v", str(frames)]
    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", input_params=opening(path),
                                        output_params=options)
    given = 0
    try:
        with _scaling_on_purpose():
            next(reader)
        for buffer in reader:
            given += 1
            yield np.frombuffer(buffer, np.uint8).reshape(height, width, 3)
    finally:
        reader.close()
    if given < frames:
        raise VideoError(f"{_label('video', path)} gave {given} of the {frames} frames asked for at {fps} fps: make at "
                         f"most {max(1, (given - 1) // 4 * 4 + 1)} frames")


def last_frame(path, name: str = "video"):
    """The video's last frame as decoded (uint8 (height, width, 3)): ffmpeg seeks near the end and decodes from
    there (the whole file when it is shorter)."""
    import numpy as np
    import imageio_ffmpeg

    info = read_video(path, name)
    width, height = info.width, info.height
    seek = ["-sseof", f"-{LAST_FRAME_TAIL_S}"] if info.seconds > LAST_FRAME_TAIL_S * 2 else []
    last = None
    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", input_params=[*opening(path, name), *seek])
    try:
        meta = next(reader)
        width, height = meta["size"]
        for buffer in reader:
            last = buffer
    finally:
        reader.close()
    if last is None:
        raise VideoError(f"{_label(name, path)} gave no frame to start from; {VIDEO_HINT}")
    return np.frombuffer(last, np.uint8).reshape(height, width, 3).copy()
