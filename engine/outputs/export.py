"""Writing outputs: the mp4 or PNG, the JSON sidecar beside it, and the room they need on disk.

Every file is written through ``atomic.write_atomically`` (a temporary name in the same folder,
renamed into place), so a crash never leaves a half-written output behind.
"""
from __future__ import annotations

import contextlib
import errno
import os
import queue
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Iterable

import numpy as np

from engine.atomic import temporary_path, write_atomically
from engine.folders import day_folder, inside
from engine.outputs.bundle import Bundle
from engine.mp4_boxes import video_frame_count

_SLUG = re.compile(r"[^a-z0-9]+")


def output_stem(outputs_dir: Path, mode: str, prompt: str, seed: int, now: float | None = None) -> Path:
    """A new, unused path stem: ``outputs/<date>/<time>_<mode>_<prompt words>_<seed>``; InputError when the day's
    folder is a link (nothing is written through one, wherever it points)."""
    now = time.time() if now is None else now
    day = day_folder(outputs_dir, now)
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
        if _out_of_room(path, len(frames), width, height):
            # ffmpeg's own account of a full disk is pages of its log: say what happened instead.
            raise DiskFull(path.parent, "video") from None
        raise


def _out_of_room(path: Path, frames: int, width: int, height: int) -> bool:
    """Whether a failed video write is explained by the disk: less free than such a video may take."""
    return free_bytes(path.parent) < expected_bytes(frames, width, height)


# Batches that may wait between the decoder and the encoder of a streamed video: enough to ride out a slow
# moment of either, few enough that RAM holds little (a batch of 4 frames of 1280 x 720 is 11 MB).
STREAM_QUEUE_BATCHES = 8
_END = "end of the frames"   # put on a stream's queue after its last batch


class Mp4Stream:
    """An mp4 written while its frames are still being made: ``send`` each batch of uint8 frames (n, H, W, 3)
    as it comes, ``close`` after the last one; the video is at ``path`` whole, or not at all.

    Why a thread: ffmpeg takes frames through a pipe at its own pace; a thread fed by a bounded queue lets the
    caller (the decoder) go on meanwhile, and the bound keeps RAM to a few batches when the encoder is the
    slower. ffmpeg writes under ``atomic.temporary_path`` (from the first batch on); the file is renamed into
    place only once ffmpeg has closed it holding every frame sent. Anything that fails removes it: the caller's
    error (``abort``, or leaving the ``with`` block by an exception, which goes on as it came) or the encoder's
    (raised by the next ``send`` or ``close``; a full disk as DiskFull, as ``write_mp4`` says it).
    ``frames``: how many are coming, when known (the disk-full check counts at least those).
    """

    def __init__(self, path: Path, fps: int, width: int, height: int, frames: int | None = None,
                 depth: int = STREAM_QUEUE_BATCHES):
        self.path, self.temporary = Path(path), temporary_path(Path(path))
        self.temporary.unlink(missing_ok=True)   # as write_atomically: nothing is written through a link there
        self.fps, self.width, self.height, self.expected = fps, width, height, frames or 0
        self.sent = 0
        self.tail_seconds: float | None = None   # from close() (the last batch handed over) to the file in place
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._state = "open"
        self._thread = threading.Thread(target=self._encode, name=f"mp4 {self.path.name}", daemon=True)
        self._thread.start()

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(frames sent, height, width, 3): the video's shape once closed."""
        return self.sent, self.height, self.width, 3

    def send(self, batch: np.ndarray) -> None:
        """Queue uint8 frames (n, H, W, 3); waits while the queue is full. ValueError for a frame of another
        size or type (ffmpeg would drop it silently), the encoder's error if it has failed."""
        if self._state != "open":
            raise RuntimeError(f"the video stream is {self._state}")
        frames = [_checked_frame(frame, self.sent + i, self.width, self.height) for i, frame in enumerate(batch)]
        self._put(frames)
        self.sent += len(frames)

    def close(self) -> Path:
        """After the last batch: wait for ffmpeg to finish, check the file has every frame, rename it into
        place; ``path``. Measures ``tail_seconds``, the encoder's time after the last batch."""
        started = time.monotonic()
        if self._state != "open":
            raise RuntimeError(f"the video stream is {self._state}")
        if self.sent == 0:
            self._fail(ValueError("no frames were sent; nothing was saved"))
        self._put(_END)
        self._thread.join()
        self._raise_encoder_error()
        try:
            _check_written(self.temporary, self.sent)
            os.replace(self.temporary, self.path)
        except Exception as exc:
            self._fail(exc)
        self._state = "closed"
        self.tail_seconds = time.monotonic() - started
        return self.path

    def abort(self) -> None:
        """Give up: stop ffmpeg (killed, not waited for) and remove its file. Nothing after a close."""
        if self._state == "closed":
            return
        self._state = "aborted"
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            while True:   # room for the wake-up below: the caller is the only one who puts
                self._queue.get_nowait()
        self._queue.put(_END)
        self._thread.join()
        with contextlib.suppress(OSError):   # the first error is the one worth reporting
            self.temporary.unlink(missing_ok=True)

    def __enter__(self) -> "Mp4Stream":
        return self

    def __exit__(self, *exc_info) -> None:
        if self._state != "closed":   # an error, or a stream never closed: nothing is left on disk
            self.abort()

    def _put(self, item) -> None:
        """Hand ``item`` to the encoder, waiting for room; the encoder's error instead if it has stopped."""
        while True:
            self._raise_encoder_error()
            if not self._thread.is_alive():
                self._fail(RuntimeError("the video encoder stopped"))
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def _raise_encoder_error(self) -> None:
        if self._error is not None:
            self._fail(self._error)

    def _fail(self, error: BaseException) -> None:
        """Abort, then raise ``error``, or DiskFull when the disk has not the room such a video may take."""
        self.abort()
        if _out_of_room(self.path, max(self.sent, self.expected), self.width, self.height):
            raise DiskFull(self.path.parent, "video") from None
        raise error

    def _encode(self) -> None:
        """The encoder's thread: ffmpeg is started with the first batch and fed until the end or a stop; its
        first error is kept for the caller."""
        writer = None
        try:
            while not self._stop.is_set():
                batch = self._queue.get()
                if batch is _END or self._stop.is_set():
                    break
                writer = writer or _mp4_writer(self.temporary, self.fps, self.width, self.height)
                for frame in batch:
                    if self._stop.is_set():
                        break
                    writer.send(frame)
        except BaseException as exc:   # handed to the caller, who raises it
            self._error = exc
        finally:
            if writer is not None:
                self._finish_encoder(writer)

    def _finish_encoder(self, writer) -> None:
        """Close ffmpeg: waited for when the video is wanted; killed at once when it is to be thrown away
        (imageio_ffmpeg kills instead of waiting when its writer is interrupted)."""
        try:
            if self._stop.is_set() or self._error is not None:
                with contextlib.suppress(KeyboardInterrupt):
                    writer.throw(KeyboardInterrupt)
            else:
                writer.close()
        except BaseException as exc:
            self._error = self._error or exc


def write_mp4_stream(batches: Iterable[np.ndarray], path: Path, fps: int, width: int, height: int,
                     frames: int | None = None) -> tuple[Path, float]:
    """``write_mp4`` for frames that come in batches (uint8 (n, H, W, 3)), each encoded while the next is
    made; (the path, the seconds the encoder needed after the last batch). Complete or absent: an error
    raised while making a batch leaves no file and goes on as it came."""
    with Mp4Stream(path, fps, width, height, frames) as stream:
        for batch in batches:
            stream.send(batch)
        return stream.close(), stream.tail_seconds


def _encode_mp4(frames: np.ndarray, path: Path, fps: int) -> None:
    """ffmpeg writes ``path`` itself; OSError when the file it wrote has not every frame."""
    height, width = frames.shape[1:3]
    writer = _mp4_writer(path, fps, width, height)
    try:
        for index, frame in enumerate(frames):
            writer.send(_checked_frame(frame, index, width, height))
    finally:
        writer.close()
    _check_written(path, len(frames))


# x264's "veryfast" preset: about three times the default's speed for a slightly larger file, and a 10-frame
# lookahead instead of 40, so a streamed video is finished soon after its last frame arrives (with the default
# lookahead half of an 81-frame clip was still encoding when the decode ended).
X264_SPEED = ["-preset", "veryfast"]


def _mp4_writer(path: Path, fps: int, width: int, height: int):
    """An ffmpeg encoder of rgb24 frames into ``path`` (H.264 yuv420p), started: ``send`` it each frame, then
    ``close`` it. One set of options, so a streamed video is the same file as one written whole."""
    import imageio_ffmpeg

    writer = imageio_ffmpeg.write_frames(
        str(path), (width, height), fps=fps, codec="libx264", pix_fmt_in="rgb24",
        pix_fmt_out="yuv420p", quality=8, macro_block_size=1, ffmpeg_log_level="error",
        output_params=[*X264_SPEED, "-movflags", "+faststart"])
    writer.send(None)
    return writer


def _checked_frame(frame: np.ndarray, index: int, width: int, height: int) -> np.ndarray:
    """``frame``, contiguous: ValueError when it is not (height, width, 3) uint8, which ffmpeg would silently
    drop, leaving a truncated video."""
    if frame.shape != (height, width, 3) or frame.dtype != np.uint8:
        raise ValueError(f"frame {index} is {frame.shape} {frame.dtype}, expected ({height}, {width}, 3) uint8")
    return np.ascontiguousarray(frame)


def _check_written(path: Path, count: int) -> None:
    """OSError unless the video ffmpeg closed at ``path`` holds ``count`` frames (read from the file's index,
    which ffmpeg writes last)."""
    written = video_frame_count(path)
    if written != count:
        raise OSError(f"the video encoder wrote {written or 0} of {count} frames; nothing was saved")


def write_png(frame: np.ndarray, path: Path) -> Path:
    from PIL import Image

    return write_atomically(path, lambda temporary: Image.fromarray(frame).save(temporary, format="PNG"))


def copy_file(source: Path, path: Path) -> Path:
    """Copy ``source`` to ``path`` the way every output is written: in full or not at all."""
    return write_atomically(path, lambda temporary: shutil.copyfile(source, temporary))


def read_video(path: Path) -> tuple[np.ndarray, float]:
    """Decode an mp4 into uint8 frames (F, H, W, 3) and its fps (used by tests and the history)."""
    import imageio_ffmpeg

    from engine.containers import input_options

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", input_params=input_options(path))
    meta = next(reader)
    width, height = meta["size"]
    frames = [np.frombuffer(buf, np.uint8).reshape(height, width, 3) for buf in reader]
    return np.stack(frames), float(meta["fps"])
