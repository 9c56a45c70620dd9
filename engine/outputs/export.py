"""Writing outputs: the mp4 or PNG, the JSON sidecar beside it, and the room they need on disk.

Every file is written through ``atomic.write_atomically`` (a temporary name in the same folder,
renamed into place), so a crash never leaves a half-written output behind.
"""
from __future__ import annotations

import errno
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np

from engine.outputs.atomic import write_atomically
from engine.outputs.bundle import Bundle

_SLUG = re.compile(r"[^a-z0-9]+")


def output_stem(outputs_dir: Path, mode: str, prompt: str, seed: int, now: float | None = None) -> Path:
    """A new, unused path stem: ``outputs/<date>/<time>_<mode>_<prompt words>_<seed>``."""
    now = time.time() if now is None else now
    day = Path(outputs_dir) / time.strftime("%Y-%m-%d", time.localtime(now))
    day.mkdir(parents=True, exist_ok=True)
    words = _SLUG.sub("-", prompt.lower()).strip("-")[:40].strip("-") or "untitled"
    base = f"{time.strftime('%H%M%S', time.localtime(now))}_{mode}_{words}_{seed}"
    stem, n = day / base, 1
    while Bundle(stem).in_use():
        n += 1
        stem = day / f"{base}_{n}"
    return stem


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] (F, H, W, 3) to uint8."""
    return (np.clip(frames, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


class DiskFull(OSError):
    """Not enough room in the outputs folder for what is being written; says how much is free, and where."""

    def __init__(self, folder: Path, what: str, needed: int | None = None):
        self.folder = Path(folder)
        self.free = free_bytes(folder)
        need = f", {needed / 1e6:.1f} MB needed" if needed else ""
        super().__init__(errno.ENOSPC, f"the disk is full while writing the {what} ({self.free / 1e6:.1f} MB free "
                                       f"in {self.folder}{need})")

    def __str__(self) -> str:
        return self.strerror


def free_bytes(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


# An H.264 file of this app's quality takes up to about a byte per pixel per frame (measured 0.95-1.03 on
# noise, the worst case; real footage takes a tenth of that): what must be free before a video is written.
VIDEO_BYTES_PER_PIXEL = 1.1
# Room for the sidecar and the file system's own blocks.
FILE_SLACK_BYTES = 256 * 1024


def expected_bytes(frames: int, width: int, height: int) -> int:
    """The most an output of ``frames`` frames (1: a PNG still) is expected to take on disk, sidecar included."""
    per_pixel = 3.1 if frames == 1 else VIDEO_BYTES_PER_PIXEL   # an incompressible PNG: 3 bytes a pixel
    return int(frames * width * height * per_pixel) + FILE_SLACK_BYTES


def ensure_room(folder: Path, needed: int, what: str) -> None:
    """DiskFull before anything is written when ``folder`` has less than ``needed`` bytes free."""
    if free_bytes(folder) < needed:
        raise DiskFull(folder, what, needed)


def write_mp4(frames: np.ndarray, path: Path, fps: int) -> Path:
    """Encode uint8 frames (F, H, W, 3) as H.264 yuv420p: the whole file or nothing (no partial file is left,
    whatever fails, a full disk included)."""
    path = Path(path)
    height, width = frames.shape[1:3]
    try:
        return write_atomically(path, lambda temporary: _encode_mp4(frames, temporary, fps))
    except Exception:
        if free_bytes(path.parent) < expected_bytes(len(frames), width, height):
            # ffmpeg's own account of a full disk is pages of its log: say what happened instead.
            raise DiskFull(path.parent, "video") from None
        raise


def _encode_mp4(frames: np.ndarray, path: Path, fps: int) -> None:
    """ffmpeg writes ``path`` itself; OSError when the file it wrote has not every frame."""
    import imageio_ffmpeg

    height, width = frames.shape[1:3]
    writer = imageio_ffmpeg.write_frames(
        str(path), (width, height), fps=fps, codec="libx264", pix_fmt_in="rgb24",
        pix_fmt_out="yuv420p", quality=8, macro_block_size=1, ffmpeg_log_level="error",
        output_params=["-movflags", "+faststart"])
    try:
        writer.send(None)
        for index, frame in enumerate(frames):
            if frame.shape != (height, width, 3) or frame.dtype != np.uint8:
                # ffmpeg would silently drop a short frame and leave a truncated video.
                raise ValueError(f"frame {index} is {frame.shape} {frame.dtype}, expected ({height}, {width}, 3) uint8")
            writer.send(np.ascontiguousarray(frame))
    finally:
        writer.close()
    written, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
    if written != len(frames):
        raise OSError(f"the video encoder wrote {written} of {len(frames)} frames; nothing was saved")


def write_png(frame: np.ndarray, path: Path) -> Path:
    from PIL import Image

    return write_atomically(path, lambda temporary: Image.fromarray(frame).save(temporary, format="PNG"))


def copy_file(source: Path, path: Path) -> Path:
    """Copy ``source`` to ``path`` the way every output is written: in full or not at all."""
    return write_atomically(path, lambda temporary: shutil.copyfile(source, temporary))


def write_json(data: dict, path: Path) -> Path:
    text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    return write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def read_video(path: Path) -> tuple[np.ndarray, float]:
    """Decode an mp4 into uint8 frames (F, H, W, 3) and its fps (used by tests and the history)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    width, height = meta["size"]
    frames = [np.frombuffer(buf, np.uint8).reshape(height, width, 3) for buf in reader]
    return np.stack(frames), float(meta["fps"])
