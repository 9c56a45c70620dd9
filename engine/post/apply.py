"""Running the steps after a video is written: each reads the file before it, frame by frame, and streams what it
makes to the encoder, so RAM holds a few frames whatever the video's length.

Smoother: RIFE 4.x (engine/post/rife.py) when an interpolator file is in ``models/interpolators/``, put there by hand
or fetched once from the Hugging Face Hub (its own download phase, before the step's); offline, or when the fetch
fails, ffmpeg's ``minterpolate`` filter (motion-compensated, no file needed, softer), said so. Larger: an upscaler
model file in ``models/upscalers/`` read by spandrel (engine/post/upscale.py), else Lanczos. Each step is its own
phase of the job, timed, with its frames counted as it goes; a cancel stops it between frames and leaves no partial
file.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from engine.events import DownloadProgress, Phase
from engine.outputs.export import Mp4Stream, ensure_room, expected_bytes, write_png
from engine.post.steps import INTERPOLATORS_FOLDER, UPSCALERS_FOLDER, PostRecord, PostStep
from engine.settings.videos import opening

# How often a step says how far it is: every this many frames (and at its last).
PROGRESS_EVERY = 4
# The upscaler's tiles, in pixels a side (on the CPU too, so its RAM stays bounded): 1.8 GB at its peak for an
# ESRGAN of RealESRGAN_x4plus's size in float16 (engine/planning/memory.py).
UPSCALE_TILE = 512
MINTERPOLATE = "ffmpeg minterpolate"
LANCZOS = "Lanczos"
# What the page says when a step has no model file and uses its fallback (the smoother's: why none was fetched).
MINTERPOLATE_NOTE = ("Smoother with ffmpeg's minterpolate: there is no RIFE file in models/interpolators/ and {why}; "
                     "put a RIFE 4.x file, such as rife49.pth, there by hand for sharper frames between.")
LANCZOS_NOTE = ("Larger with Lanczos: there is no upscaler model in models/upscalers/ (put an ESRGAN-type file, such "
                "as RealESRGAN_x4plus.pth, there for sharper detail).")


@dataclass(frozen=True)
class Media:
    """A written output as a step reads it: its file and its shape (a still: ``frames`` 1, no fps)."""
    path: Path
    frames: int
    width: int
    height: int
    fps: int | None

    @property
    def still(self) -> bool:
        return self.path.suffix.lower() == ".png"

    @classmethod
    def read(cls, path: Path) -> "Media":
        """The shape of the video or PNG at ``path``, from its header (no frame is decoded)."""
        path = Path(path)
        if path.suffix.lower() == ".png":
            from PIL import Image

            with Image.open(path) as image:
                return cls(path, 1, image.width, image.height, None)
        from engine.mp4_boxes import video_frame_count
        import imageio_ffmpeg

        reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", input_params=opening(path))
        try:
            meta = next(reader)
        finally:
            reader.close()
        width, height = meta["size"]
        return cls(path, int(video_frame_count(path) or 0), width, height, round(float(meta["fps"])))


@dataclass(frozen=True)
class Interpolator:
    """What the smoother runs with: a RIFE file, or none and the sentence that says why ffmpeg's minterpolate."""
    path: Path | None
    note: str = ""


class StepRunner:
    """Runs post steps for one job (engine/run/job.py's Job: its progress, cancel and notes): ``models_dir`` holds
    the users' interpolator and upscaler files, ``device`` runs them."""

    def __init__(self, models_dir: Path, device: str, job):
        self.models_dir, self.device, self.job = Path(models_dir), device, job
        self._interpolator: Interpolator | None = None    # looked for (and fetched) once, before the smoother's phase

    def prepare(self, step: PostStep) -> None:
        """What ``step`` needs before its own phase: the smoother's RIFE file, found or fetched."""
        if step.kind == "interpolate":
            self.interpolator()

    def interpolator(self) -> Interpolator:
        """The smoother's RIFE file: the one in models/interpolators/, else RIFE_HUB_FILE fetched once from the Hub into
        that folder (a download phase of its own, its bytes said as they come); none when the app is offline or the
        fetch fails, with the sentence saying why. Looked for once per runner."""
        if self._interpolator is None:
            self._interpolator = self._find_or_fetch()
        return self._interpolator

    def _find_or_fetch(self) -> Interpolator:
        from engine.models.refs import hub_offline
        from engine.post.rife import RIFE_HUB_FILE, RIFE_HUB_REPO, find_rife

        folder = self.models_dir / INTERPOLATORS_FOLDER
        found = find_rife(folder)
        if found is not None:
            return Interpolator(found)
        if hub_offline():
            return Interpolator(None, MINTERPOLATE_NOTE.format(
                why=f"the app is offline (HF_HUB_OFFLINE=1), so {RIFE_HUB_FILE} was not fetched from {RIFE_HUB_REPO}"))
        return self._fetched(folder)

    def _fetched(self, folder: Path) -> Interpolator:
        """RIFE_HUB_FILE fetched into ``folder`` as the job's download phase; the fallback's sentence when that fails
        (a cancel while it downloads stops the job)."""
        from engine.models.download import size_words
        from engine.post.rife import RIFE_HUB_FILE, RIFE_HUB_REPO, fetch_rife

        with self.job.in_phase(Phase.DOWNLOAD) as note:
            try:
                path = fetch_rife(folder, self._download_progress)
            except Exception as exc:  # noqa: BLE001 - no network, no such file, another layout: the fallback runs
                self.job.check_cancel()
                note.detail = f"{RIFE_HUB_FILE} not fetched"
                return Interpolator(None, MINTERPOLATE_NOTE.format(
                    why=f"{RIFE_HUB_FILE} could not be fetched from {RIFE_HUB_REPO} on the Hugging Face Hub "
                        f"({_fetch_failure(exc)})"))
            note.detail = f"{RIFE_HUB_FILE}, {size_words(path.stat().st_size)} from {RIFE_HUB_REPO}"
        self.job.info(f"Smoother with RIFE: {RIFE_HUB_FILE} was fetched from {RIFE_HUB_REPO} into "
                      f"models/{INTERPOLATORS_FOLDER}/, where later runs read it.")
        return Interpolator(path)

    def _download_progress(self, done: int, total: int | None) -> None:
        self.job.check_cancel()
        self.job.emit(DownloadProgress(self.job.id, done, total, "B"))

    def run(self, step: PostStep, media: Media, dest: Path) -> tuple[Media, PostRecord]:
        """``step`` on ``media`` into ``dest`` (complete or absent): what it made, and its record (its seconds
        are the caller's to fill in, who times the phase)."""
        frames, width, height, fps = step.shape_after(media.frames, media.width, media.height, media.fps)
        ensure_room(dest.parent, expected_bytes(frames, width, height), "image" if media.still else "video")
        if step.kind == "interpolate":
            method, made = self._interpolated(step, media, frames)
        else:
            method, made = self._upscaled(step, media)
        if media.still:
            write_png(next(iter(made)), dest)
        else:
            self._encode(made, step, dest, fps, width, height, frames)
        record = PostRecord(step.kind, step.factor, method, 0.0, frames, width, height, fps)
        return Media(dest, frames, width, height, fps), record

    def _encode(self, made: Iterator[np.ndarray], step: PostStep, dest: Path, fps: int, width: int, height: int,
                total: int) -> None:
        """The step's frames to an mp4 at ``dest`` as they come, counted and cancellable between frames."""
        with Mp4Stream(dest, fps, width, height, total) as video, contextlib.closing(made) as frames:
            for frame in frames:
                self.job.check_cancel()
                video.send(frame[None])
                if video.sent % PROGRESS_EVERY == 0 or video.sent == total:
                    self.job.post_progress(step, video.sent, total)
            if video.sent != total:   # nothing is saved that is not what the step says it made
                raise RuntimeError(f"{step.title} made {video.sent} of {total} frames; nothing was saved")
            video.close()

    # ----- smoother -----------------------------------------------------------------
    def _interpolated(self, step: PostStep, media: Media, total: int) -> tuple[str, Iterator[np.ndarray]]:
        """(how, the frames): RIFE between each pair when there is a file for it, else ffmpeg's minterpolate."""
        interpolator = self.interpolator()
        if interpolator.path is None:
            fps = media.fps * step.factor
            # minterpolate needs a frame after the last to reach it: the last is repeated, the count cut to size.
            options = ["-vf", f"tpad=stop_mode=clone:stop=2,minterpolate=fps={fps}:mi_mode=mci:mc_mode=aobmc:"
                       "me_mode=bidir:vsbmc=1", "-frames:v", str(total)]
            self.job.info(interpolator.note)
            return MINTERPOLATE, video_frames(media.path, options)
        from engine.post.rife import load_rife

        rife = load_rife(interpolator.path, self.device, _dtype(self.device))
        return rife.name, _rife_frames(video_frames(media.path), step.factor, rife)

    # ----- larger -------------------------------------------------------------------
    def _upscaled(self, step: PostStep, media: Media) -> tuple[str, Iterator[np.ndarray]]:
        """(how, the frames): the upscaler file's model when there is one, else Lanczos."""
        from engine.post.upscale import find_upscaler, lanczos, load_upscaler

        source = still_frames(media.path) if media.still else video_frames(media.path)
        found = find_upscaler(self.models_dir / UPSCALERS_FOLDER)
        if found is None:
            self.job.info(LANCZOS_NOTE)
            return LANCZOS, (lanczos(f[None], step.factor)[0] for f in source)
        upscaler = load_upscaler(found, self.device, tile=UPSCALE_TILE,
                                 half=self.device == "cuda")
        return upscaler.name, (upscaler.upscale(f[None], step.factor)[0] for f in source)


def check_step_files(models_dir: Path, steps: tuple[PostStep, ...]) -> None:
    """Before a run's heavy work: the interpolator and upscaler files its steps will use, read once on the CPU;
    InputError naming the file and what is wrong with it (a run that would fail after its denoise never starts)."""
    from engine.errors import InputError
    from engine.words import sentence

    for step in steps:
        try:
            if step.kind == "interpolate":
                from engine.post.rife import find_rife, load_rife

                found = find_rife(Path(models_dir) / INTERPOLATORS_FOLDER)
                if found is not None:
                    load_rife(found, "cpu")
            else:
                from engine.post.upscale import find_upscaler, load_upscaler

                found = find_upscaler(Path(models_dir) / UPSCALERS_FOLDER)
                if found is not None:
                    load_upscaler(found, "cpu")
        except ValueError as exc:
            raise InputError(f"{sentence(str(exc))} Take it out of the folder (the step then uses its fallback), or put "
                             "a file this app reads there.") from None


def _fetch_failure(exc: Exception) -> str:
    """Why a fetch failed, in a few words: the Hub not reached, no such file there, its answer, a file of another
    layout, or the error's kind."""
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    from engine.post.rife import FetchedFileRefused

    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, LocalEntryNotFoundError):   # how huggingface_hub says the Hub did not answer
        return "it could not be reached"
    if isinstance(exc, (EntryNotFoundError, RepositoryNotFoundError)):
        return "it has no such file now"
    if isinstance(exc, FetchedFileRefused):
        return "the file it gave is not a RIFE 4.x file this app reads"
    return f"it answered {status}" if status else type(exc).__name__


def _dtype(device: str):
    import torch

    return torch.float16 if device == "cuda" else torch.float32


def _rife_frames(frames: Iterator[np.ndarray], factor: int, rife) -> Iterator[np.ndarray]:
    """Each frame, and between each pair ``factor`` - 1 frames at even times (RIFE 4.x takes any time)."""
    import torch

    before = None
    with contextlib.closing(frames):
        for frame in frames:
            now = _tensor(frame, rife.device)
            if before is not None:
                with torch.inference_mode():
                    for i in range(1, factor):
                        yield _uint8(rife.between(before, now, i / factor))
            yield frame
            before = now


def _tensor(frame: np.ndarray, device: str):
    import torch

    return torch.from_numpy(np.array(frame)).to(device).permute(2, 0, 1)[None].float() / 255.0


def _uint8(image) -> np.ndarray:
    return (image[0].clamp(0, 1) * 255.0 + 0.5).to("cpu").byte().permute(1, 2, 0).numpy()


def video_frames(path: Path, output_params: list[str] | None = None) -> Iterator[np.ndarray]:
    """The frames of the video at ``path`` as uint8 (H, W, 3), one at a time (through ffmpeg's filters in
    ``output_params``, when given)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", input_params=opening(path),
                                        output_params=output_params)
    try:
        meta = next(reader)
        width, height = meta["size"]
        for buffer in reader:
            yield np.frombuffer(buffer, np.uint8).reshape(height, width, 3)
    finally:
        reader.close()


def still_frames(path: Path) -> Iterator[np.ndarray]:
    from PIL import Image

    with Image.open(path) as image:
        yield np.asarray(image.convert("RGB"))


def replace_file(made: Path, path: Path) -> None:
    """``made`` takes ``path``'s place (the run's own output, made smoother or larger)."""
    os.replace(made, path)


def work_path(path: Path, number: int) -> Path:
    """Where step ``number`` of a run writes, beside ``path`` under a hidden name (the history lists none), before
    the last one takes that file's place."""
    return path.with_name(f".{path.stem}.step{number}{path.suffix}")


def run_steps(job, runner: StepRunner, steps: tuple[PostStep, ...], media: Media, dest: Path, source: str = ""
              ) -> tuple[Media, list[PostRecord]]:
    """``steps`` one after the other from ``media``, the last one writing ``dest``: each its own phase of ``job``,
    its record timed (the first naming ``source``, the earlier output it read, if any); the files between them are
    removed, and the step's model let go of the device's cache, whatever happens."""
    import time

    records, current, between = [], media, []
    try:
        for number, step in enumerate(steps, 1):
            target = dest if number == len(steps) else work_path(dest, number)
            between += [target] if target != dest else []
            runner.prepare(step)
            with job.in_phase(step.phase) as note:
                started = time.monotonic()
                current, record = runner.run(step, current, target)
                note.detail = record.method
            records.append(replace(record, seconds=round(time.monotonic() - started, 4),
                                   source=source if number == 1 else ""))
    finally:
        for path in between:
            path.unlink(missing_ok=True)
        if runner.device != "cpu":
            from engine.device.runtime import free_device_memory

            free_device_memory()
    return current, records
