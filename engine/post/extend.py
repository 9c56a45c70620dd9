"""Extending a video: a new part made from its last frame, colour-matched to it, joined after it into one mp4.

The run is an image-to-video run whose first frame is the video's last (``start_image``). Once its part is written
(with the smoother and larger steps it asked for), ``join`` makes the video whole:

1. the colours: the part's first frame is the model's remaking of the video's last, so the difference between the
   two is how the part's colours drifted; each channel of the part is moved, in CIE Lab (a space where equal steps
   look equal), to the mean and spread the video's last frame has (``ColourMatch``);
2. the part's frames after its first (that one is the video's own last frame again), matched and scaled to the
   video's size when they differ, are encoded as the app encodes every video;
3. the two are joined: when the video's codec set-up is the part's (a video this app made at that size and rate),
   by copying both streams one after the other, so the joined file's first frames are the video's own, bit for bit;
   else the video's frames are encoded again with the part's (and the record says so).

Nothing is left at the output's name that is not whole: every file is written under a temporary name first.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from engine.atomic import write_atomically
from engine.mp4_boxes import video_codec_config, video_frame_count
from engine.outputs.export import Mp4Stream, ensure_room, expected_bytes, write_png
from engine.settings.videos import VideoInfo, last_frame, read_video

# How often the join says how far it is: every this many frames (and at its last).
PROGRESS_EVERY = 8
# A channel's spread is scaled by at most this much either way: a flat first frame (a fade from black) says little
# about how the rest should look.
MAX_SPREAD_SCALE = 2.0
# How the two ways of joining are recorded.
COPIED = "streams copied: the video's frames are its own"
ENCODED_AGAIN = "encoded again: the video's codec set-up differs from this app's"


# ----- the start ---------------------------------------------------------------------------------------------------
def start_image(video: Path, folder: Path) -> Path:
    """The video's last frame as a PNG in ``folder`` (a temporary file of the run's, which keeps it as its first
    frame like any image-to-video input)."""
    handle, name = tempfile.mkstemp(prefix=".extend-start-", suffix=".png", dir=folder)
    os.close(handle)
    return write_png(last_frame(video, "video to extend"), Path(name))


# ----- the colours -------------------------------------------------------------------------------------------------
_TO_XYZ = np.array([[0.4124564, 0.3575761, 0.1804375],
                    [0.2126729, 0.7151522, 0.0721750],
                    [0.0193339, 0.1191920, 0.9503041]], dtype=np.float64)
_FROM_XYZ = np.linalg.inv(_TO_XYZ)
_WHITE = np.array([0.95047, 1.0, 1.08883])   # D65, the white of sRGB
_EPSILON = (6 / 29) ** 3


# sRGB's 256 levels as linear light (the exact curve, looked up rather than computed for every pixel).
_LINEAR = np.where(np.arange(256) / 255.0 <= 0.04045, np.arange(256) / 255.0 / 12.92,
                   ((np.arange(256) / 255.0 + 0.055) / 1.055) ** 2.4).astype(np.float32)


def to_lab(frame: np.ndarray) -> np.ndarray:
    """uint8 sRGB (H, W, 3) as CIE Lab (float32, L 0-100)."""
    xyz = _LINEAR[frame] @ (_TO_XYZ.T / _WHITE).astype(np.float32)
    f = np.where(xyz > _EPSILON, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


def from_lab(lab: np.ndarray) -> np.ndarray:
    """CIE Lab as uint8 sRGB, clipped to what sRGB holds."""
    fy = (lab[..., 0] + 16) / 116
    f = np.stack([fy + lab[..., 1] / 500, fy, fy - lab[..., 2] / 200], axis=-1)
    xyz = np.where(f > 6 / 29, f ** 3, 3 * (6 / 29) ** 2 * (f - 4 / 29))
    linear = np.clip(xyz @ (_FROM_XYZ * _WHITE).T.astype(np.float32), 0.0, 1.0)
    rgb = np.where(linear <= 0.0031308, 12.92 * linear, 1.055 * np.power(linear, 1 / 2.4, dtype=np.float32) - 0.055)
    return (np.clip(rgb, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


@dataclass(frozen=True)
class ColourMatch:
    """Per Lab channel: the part's mean and spread there, and the video's, at the frame they share."""
    part_mean: tuple[float, float, float]
    part_spread: tuple[float, float, float]
    video_mean: tuple[float, float, float]
    video_spread: tuple[float, float, float]

    @classmethod
    def between(cls, video_frame: np.ndarray, part_frame: np.ndarray) -> "ColourMatch":
        """The match that moves ``part_frame`` (the part's first frame) to ``video_frame`` (the video's last)."""
        video, part = (to_lab(frame).reshape(-1, 3).astype(np.float64) for frame in (video_frame, part_frame))
        return cls(*(tuple(float(v) for v in values) for values in (part.mean(0), part.std(0), video.mean(0),
                                                                      video.std(0))))

    def scale(self) -> np.ndarray:
        ratio = np.array(self.video_spread) / np.maximum(np.array(self.part_spread), 1e-6)
        return np.clip(ratio, 1 / MAX_SPREAD_SCALE, MAX_SPREAD_SCALE)

    def apply(self, frame: np.ndarray) -> np.ndarray:
        """``frame`` of the part with each Lab channel moved: (value - the part's mean) x scale + the video's."""
        lab = to_lab(frame)
        scale = self.scale().astype(np.float32)
        moved = (lab - np.array(self.part_mean, np.float32)) * scale + np.array(self.video_mean, np.float32)
        return from_lab(moved)

    def to_dict(self) -> dict:
        return {"space": "CIE Lab", **{key: [round(v, 4) for v in value] for key, value in asdict(self).items()},
                "scale": [round(float(v), 4) for v in self.scale()]}


# ----- the join ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JoinRecord:
    """How an extension was joined, for the sidecar's "extend"."""
    source: str                      # the video extended: an output's key, or the file's name
    source_frames: int
    part_frames: int                 # the frames the part added (its first, shared with the video, left out)
    frames: int                      # of the joined video
    how: str                         # COPIED or ENCODED_AGAIN
    colours: dict                    # ColourMatch.to_dict()
    scaled_from: tuple[int, int] | None   # the part's size, when it was scaled to the video's
    seconds: float = 0.0
    parts: list = field(default_factory=list)   # every part of the joined video, in order (see parts_of)

    def to_dict(self) -> dict:
        return asdict(self)


def join(job, video: VideoInfo, part: Path, dest: Path, source: str, parts: list) -> JoinRecord:
    """The video and its new part (the mp4 at ``part``, its first frame the video's last) as one mp4 at ``dest``,
    as a timed phase of ``job`` (engine/run/job.py); its record."""
    from engine.events import Phase

    made = read_video(part, "new part")
    with job.in_phase(Phase.JOIN) as phase:
        started = time.monotonic()
        total = video.frames + made.frames - 1
        ensure_room(dest.parent, expected_bytes(total, video.width, video.height), "video")
        with tempfile.TemporaryDirectory(prefix=".join-", dir=dest.parent) as work:
            tail = Path(work) / "tail.mp4"
            match = _encode_tail(job, video, made, tail)
            if video_codec_config(video.path) == video_codec_config(tail):
                how = COPIED
                write_atomically(dest, lambda temporary: _copy_streams(video.path, tail, temporary, Path(work)))
            else:
                how = ENCODED_AGAIN
                _encode_both(job, video, tail, dest, total)
        written = video_frame_count(dest)
        if written != total:
            raise RuntimeError(f"the joined video holds {written} of its {total} frames")
        phase.detail = "streams copied" if how == COPIED else "encoded again"
    scaled = (made.width, made.height) if (made.width, made.height) != (video.width, video.height) else None
    return JoinRecord(source, video.frames, made.frames - 1, total, how, match.to_dict(), scaled,
                      round(time.monotonic() - started, 4), parts)


def _frames(path: Path) -> Iterator[np.ndarray]:
    from engine.post.apply import video_frames

    return video_frames(path)


def _fitted(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """``frame`` scaled to cover ``width`` x ``height`` and centre-cropped (as a run's input is), or as it is at
    that size."""
    if frame.shape[:2] == (height, width):
        return frame
    from PIL import Image

    from engine.settings.images import fit_rgb

    return np.asarray(fit_rgb(Image.fromarray(frame), width, height))


def _encode_tail(job, video: VideoInfo, made: VideoInfo, tail: Path) -> ColourMatch:
    """The part's frames after its first, colour-matched and at the video's size, encoded at ``tail``."""
    reference = last_frame(video.path, "video to extend")
    count = made.frames - 1
    match = None
    with Mp4Stream(tail, round(video.fps), video.width, video.height, count) as stream, \
            contextlib.closing(_frames(made.path)) as frames:
        for index, frame in enumerate(frames):
            job.check_cancel()
            frame = _fitted(frame, video.width, video.height)
            if index == 0:
                match = ColourMatch.between(reference, frame)
                continue
            stream.send(match.apply(frame)[None])
            if stream.sent % PROGRESS_EVERY == 0 or stream.sent == count:
                job.post_progress("join", stream.sent, count)
        stream.close()
    return match


def _copy_streams(video: Path, tail: Path, dest: Path, work: Path) -> None:
    """ffmpeg's concat demuxer: ``video``'s packets then ``tail``'s, copied into ``dest`` (the index up front)."""
    import imageio_ffmpeg

    listing = work / "parts.txt"
    listing.write_text("".join(f"file '{_quoted(path)}'\n" for path in (video, tail)), encoding="utf-8")
    done = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-y", "-f", "concat", "-safe", "0",
                           "-protocol_whitelist", "file", "-i", str(listing), "-map", "0:v:0", "-c", "copy",
                           "-movflags", "+faststart", str(dest)],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ffmpeg could not join the parts: {done.stderr.strip()[-300:]}")


def _quoted(path: Path) -> str:
    """A path as the concat demuxer's list file quotes it."""
    return str(Path(path).resolve()).replace("'", "'\\''")


def _encode_both(job, video: VideoInfo, tail: Path, dest: Path, total: int) -> None:
    """The video's frames then the tail's, encoded again into ``dest`` (a video of another codec set-up)."""
    with Mp4Stream(dest, round(video.fps), video.width, video.height, total) as stream:
        for path in (video.path, tail):
            with contextlib.closing(_frames(path)) as frames:
                for frame in frames:
                    job.check_cancel()
                    stream.send(_fitted(frame, video.width, video.height)[None])
        stream.close()


def join_extension(job, request, media: Path) -> tuple[tuple, dict]:
    """An extension's new part (the mp4 at ``media``, made for ``request``) joined after the video it extends,
    taking that file's place: (the joined video's shape, the sidecar's "extend")."""
    from engine.post.apply import replace_file, work_path

    source, video, sidecar = source_of(Path(request.extend), Path(request.outputs_dir))
    dest = work_path(media, "join")
    try:
        made = join(job, video, media, dest, source, [])
        record = replace(made, parts=parts_of(source, video, sidecar, request, made.part_frames))
        replace_file(dest, media)
    finally:
        dest.unlink(missing_ok=True)
    return (record.frames, video.height, video.width, 3), record.to_dict()


def joined_note(joined: dict) -> str:
    """What a run's note says of its join."""
    return (f"It extends {joined['source']}: its {joined['source_frames']} frames and {joined['part_frames']} new "
            f"({joined['frames']} in all).")


# ----- the parts ---------------------------------------------------------------------------------------------------
def source_of(path: Path, outputs_dir: Path) -> tuple[str, VideoInfo, object]:
    """(how the extension names the video: an output's key ``<day>/<file>``, else the file's name; the video; its
    sidecar when it is an output of this app, else None)."""
    from engine.outputs.bundle import Bundle
    from engine.outputs.kept_inputs import in_outputs
    from engine.outputs.sidecar import SidecarError, read_sidecar

    video = read_video(path, "video to extend")
    if not in_outputs(path, outputs_dir):
        return Path(path).name, video, None
    resolved, root = Path(path).resolve(), Path(outputs_dir).resolve()
    key = resolved.relative_to(root).as_posix()
    try:
        sidecar = read_sidecar(Bundle.from_media(resolved).sidecar)
    except (OSError, ValueError, SidecarError):
        sidecar = None
    return key, video, sidecar



def parts_of(source: str, video: VideoInfo, sidecar, request, added: int) -> list[dict]:
    """Every part of the joined video, in order: the extended video's own parts (an extension of an extension lists
    all of them), or the video as one part (with its settings, prompt and seed when it is an output of this app),
    then the new part: the frames it added, its prompt, seed and settings."""
    before = None
    if sidecar is not None:
        before = (sidecar.extend or {}).get("parts") if isinstance(sidecar.extend, dict) else None
        if not before:
            before = [{"file": source, "frames": video.frames, "prompt": sidecar.prompt, "seed": sidecar.seed,
                       "settings": sidecar.parameters}]
    parts = list(before or [{"file": source, "frames": video.frames}])
    settings = {k: v for k, v in request.to_dict().items() if k not in ("prompt", "negative_prompt", "outputs_dir")}
    return parts + [{"file": None, "frames": added, "prompt": request.prompt, "seed": request.seed,
                     "settings": settings}]
