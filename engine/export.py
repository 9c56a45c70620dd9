"""Writing outputs atomically: the mp4 or PNG, and the JSON sidecar beside it.

Every file is written under a temporary name in the same folder and renamed
into place, so a crash never leaves a half-written output behind.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np

_SLUG = re.compile(r"[^a-z0-9]+")


def output_stem(outputs_dir: Path, mode: str, prompt: str, seed: int, now: float | None = None) -> Path:
    """A new, unused path stem: ``outputs/<date>/<time>_<mode>_<prompt words>_<seed>``."""
    now = time.time() if now is None else now
    day = Path(outputs_dir) / time.strftime("%Y-%m-%d", time.localtime(now))
    day.mkdir(parents=True, exist_ok=True)
    words = _SLUG.sub("-", prompt.lower()).strip("-")[:40].strip("-") or "untitled"
    base = f"{time.strftime('%H%M%S', time.localtime(now))}_{mode}_{words}_{seed}"
    stem, n = day / base, 1
    while any(stem.with_name(stem.name + s).exists() for s in (".mp4", ".png", ".json", ".latents.safetensors")):
        n += 1
        stem = day / f"{base}_{n}"
    return stem


def _tmp_path(final: Path) -> Path:
    return final.with_name(f".{final.stem}.partial{final.suffix}")


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] (F, H, W, 3) to uint8."""
    return (np.clip(frames, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def write_mp4(frames: np.ndarray, path: Path, fps: int) -> Path:
    """Encode uint8 frames (F, H, W, 3) as H.264 yuv420p."""
    import imageio_ffmpeg

    path = Path(path)
    tmp = _tmp_path(path)
    height, width = frames.shape[1:3]
    writer = imageio_ffmpeg.write_frames(
        str(tmp), (width, height), fps=fps, codec="libx264", pix_fmt_in="rgb24",
        pix_fmt_out="yuv420p", quality=8, macro_block_size=1, ffmpeg_log_level="error",
        output_params=["-movflags", "+faststart"])
    try:
        writer.send(None)
        for index, frame in enumerate(frames):
            if frame.shape != (height, width, 3) or frame.dtype != np.uint8:
                # ffmpeg would silently drop a short frame and leave a truncated video.
                raise ValueError(f"frame {index} is {frame.shape} {frame.dtype}, expected ({height}, {width}, 3) uint8")
            writer.send(np.ascontiguousarray(frame))
        writer.close()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    written, _ = imageio_ffmpeg.count_frames_and_secs(str(tmp))
    if written != len(frames):
        tmp.unlink(missing_ok=True)
        raise OSError(f"the video encoder wrote {written} of {len(frames)} frames; nothing was saved")
    os.replace(tmp, path)
    return path


def write_png(frame: np.ndarray, path: Path) -> Path:
    from PIL import Image

    path = Path(path)
    tmp = _tmp_path(path)
    try:
        Image.fromarray(frame).save(tmp, format="PNG")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def copy_file(source: Path, path: Path) -> Path:
    """Copy ``source`` to ``path`` the way every output is written: in full or not at all."""
    import shutil

    path = Path(path)
    tmp = _tmp_path(path)
    try:
        shutil.copyfile(source, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def write_json(data: dict, path: Path) -> Path:
    path = Path(path)
    tmp = _tmp_path(path)
    try:
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str), encoding="utf-8")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def read_video(path: Path) -> tuple[np.ndarray, float]:
    """Decode an mp4 into uint8 frames (F, H, W, 3) and its fps (used by tests and the history)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    width, height = meta["size"]
    frames = [np.frombuffer(buf, np.uint8).reshape(height, width, 3) for buf in reader]
    return np.stack(frames), float(meta["fps"])
