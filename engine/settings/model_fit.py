"""Whether a model can make what a job asks: its kind (text or image to video, a last frame), its frame counts
and sizes, its experts. One check, from the model's ``ModelInfo`` (engine/models/catalog.py), wherever it is
known: the app's check of a job before it is queued (a Hub model not downloaded yet is checked from the table of
known models, so it is refused before the download), the plan, and the engine's run once the model's files are
here (the only check for a model nothing was known of before its download).
"""
from __future__ import annotations

from engine.models.catalog import ModelInfo
from engine.models.limits import limits_of
from engine.models.spec import ModelSpec
from engine.settings.values import InputError, Settings, check_experts, check_frames, check_side, window_choices


def check_model_limits(spec: ModelSpec, width: int, height: int, frames: int, mode: str = "t2v") -> None:
    """Raise InputError listing what of (width, height, frames) this model cannot make, each with what to use."""
    problems: list[str] = []
    limits = limits_of(spec)
    for side, value in (("width", width), ("height", height)):
        check_side(side, value, limits.size_multiple, problems, limits)
    check_frames(frames, mode, problems, limits)
    if problems:
        raise InputError(problems)


def check_model_kind(spec: ModelSpec, ref: str, mode: str, last_image: bool | None) -> None:
    """InputError when the model is of another kind than the job: an image-to-video model for text, a text one
    for an image, a last frame for a model that cannot take one, or none for one that needs it (``last_image``
    None: not known yet, as in a plan, and not checked)."""
    if mode == "i2v" and not spec.takes_image:
        raise InputError(f"{ref} is a text-to-video model and cannot start from an image; pick an image-to-video "
                         "model (or leave the image out)")
    if mode == "v2v" and spec.image_to_video:
        raise InputError(f"{ref} is an image-to-video model; video to video makes a video again with a text-to-video "
                         "model (Wan2.1 T2V, Wan2.2 TI2V-5B or T2V A14B): pick one of their presets")
    if mode != "i2v" and spec.image_to_video:
        raise InputError(f"{ref} is an image-to-video model and needs a first frame: use the Image to Video tab "
                         "(or --image)")
    if mode == "i2v" and spec.first_last and last_image is False:
        raise InputError(f"{ref} is a first-and-last-frame model and needs a last frame too; add one")
    if mode == "i2v" and last_image and not spec.first_last:
        raise InputError(f"{ref} cannot use a last frame (only first-and-last-frame models such as "
                         "Wan2.1-FLF2V-14B can); remove the last frame")


def check_model_fits(info: ModelInfo, settings: Settings, last_image: bool | None) -> None:
    """InputError when the model cannot make what the settings ask: its kind, its frames, its size, its experts
    (its single transformer files were checked when ``info`` was read), its window, the light VAE for its latents."""
    check_model_kind(info.spec, info.ref, settings.mode, last_image)
    check_model_limits(info.spec, settings.width, settings.height, settings.frames, settings.mode)
    if settings.decoder == "vae_light" and info.spec.wan22_vae:
        raise InputError(f"{info.ref} makes Wan2.2-5B's 48-channel latents and the light VAE decodes Wan2.1's "
                         "(Wan2.1, Wan2.2-A14B): choose the VAE or the fast decoder")
    problems: list[str] = []
    window_choices(settings, settings.frames, problems, info.limits)   # the model's own window is known now
    if problems:
        raise InputError(problems)
    check_experts(settings, info.limits)
