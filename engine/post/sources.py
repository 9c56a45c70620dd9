"""What a run that starts from an existing video takes from it, before anyone types a setting: the command line's
``--extend`` and ``--video`` and the History tab's Extend and Video to Video buttons start from these values, and
what is typed or set in the form wins.

- An extension continues the video as it was made: an output of this app gives its prompts, its size and its
  smoother and larger factors (so the new part joins it as more of the same); any other video gives a size of its
  shape about as large as the preset's.
- A video made again keeps the video's shape (about as many pixels as the preset's size) and as many of its frames
  as the preset makes (4k+1); an output of this app gives its prompts too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.models.limits import MAX_FRAMES
from engine.settings.images import size_for_aspect
from engine.settings.values import Settings
from engine.settings.videos import VideoInfo, read_video


@dataclass(frozen=True)
class FromVideo:
    """The values a run from a video starts with (by field name), and what the video's own sidecar says it was
    made with (its preset's name and its model; None for a video from elsewhere)."""
    values: dict = field(default_factory=dict)
    preset: str | None = None
    model: str | None = None
    info: VideoInfo | None = None


def _sidecar(path: Path, outputs_dir: Path):
    """The sidecar of the output at ``path`` in ``outputs_dir``, or None (another file, or none readable)."""
    from engine.outputs.bundle import Bundle
    from engine.outputs.kept_inputs import in_outputs
    from engine.outputs.sidecar import SidecarError, read_sidecar

    if not in_outputs(path, outputs_dir):
        return None
    try:
        return read_sidecar(Bundle.from_media(Path(path).resolve()).sidecar)
    except (OSError, ValueError, SidecarError):
        return None


def made_with(path: Path, outputs_dir: Path) -> tuple[str | None, str | None]:
    """(the preset, the model) the output at ``path`` was made with, as its sidecar says; (None, None) for a video
    from elsewhere."""
    sidecar = _sidecar(path, outputs_dir)
    return (sidecar.preset, sidecar.model) if sidecar is not None else (None, None)


def extension_preset(presets: dict, path: Path, outputs_dir: Path) -> str | None:
    """The preset an extension of the video at ``path`` starts from: the output's own when it starts from an image,
    else the image-to-video preset of its model (the self-test's for a self-test output); None for a video from
    elsewhere, or a model with no image-to-video preset (the caller keeps its own)."""
    from engine.models.selftest import SELFTEST_I2V, SELFTEST_REFS

    name, model = made_with(path, outputs_dir)
    if name in presets and presets[name].settings.mode == "i2v":
        return name
    for other, preset in presets.items():
        if model and preset.settings.model == model and preset.settings.mode == "i2v":
            return other
    if model in SELFTEST_REFS and SELFTEST_I2V in presets:
        return SELFTEST_I2V
    return None


def extension_start(path: Path, outputs_dir: Path, base: Settings, multiple: int = 16) -> FromVideo:
    """An extension of the video at ``path`` on a preset of ``base`` settings (VideoError when it is no video)."""
    video = read_video(path, "video to extend")
    sidecar = _sidecar(path, outputs_dir)
    if sidecar is None:
        width, height = size_for_aspect((video.width, video.height), base.width, base.height, multiple)
        return FromVideo({"width": width, "height": height, "interpolate": 1, "upscale": 1}, info=video)
    made = sidecar.settings()
    values = {"width": made.width, "height": made.height, "interpolate": made.interpolate, "upscale": made.upscale,
              "prompt": sidecar.prompt, "negative_prompt": sidecar.negative_prompt}
    return FromVideo(values, sidecar.preset, sidecar.model, video)


def remake_start(path: Path, outputs_dir: Path, base: Settings, multiple: int = 16,
                 most: int = MAX_FRAMES) -> FromVideo:
    """The video at ``path`` made again on a preset of ``base`` settings: its shape at about the preset's pixels
    and its whole length up to ``most`` frames (a video longer than the model's window is made in windows), not the
    preset's length (VideoError when it is no video)."""
    video = read_video(path, "video")
    width, height = size_for_aspect((video.width, video.height), base.width, base.height, multiple)
    values = {"width": width, "height": height, "frames": max(1, min(most, video.usable_frames(base.fps)))}
    sidecar = _sidecar(path, outputs_dir)
    if sidecar is not None:
        values |= {"prompt": sidecar.prompt, "negative_prompt": sidecar.negative_prompt}
    return FromVideo(values, sidecar.preset if sidecar else None, sidecar.model if sidecar else None, video)
