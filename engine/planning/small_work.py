"""The time of a model too small for its arithmetic to count (the built-in self-test models): each phase a count of
this machine's small operations (engine/models/spec.py SmallWork) times what one costs here (the calibration's
``small_op_seconds``). Part of the time model (engine/planning/timing.py), which takes, phase by phase, the larger of
this and the work over the calibrated rates."""
from __future__ import annotations

from dataclasses import dataclass

from engine.models.spec import SmallWork


@dataclass(frozen=True)
class SmallRun:
    """What a run asks of the model, as the small work counts it."""
    width: int
    height: int
    frames: int
    steps: int
    passes: int              # transformer passes a step (guidance, windows)
    tokens: int              # a pass's tokens
    prompts: int
    loaded: bool
    image_to_video: bool = False
    video_input: bool = False
    latent_frames: int = 1


def small_seconds(work: SmallWork, op_seconds: float, run: SmallRun) -> dict[str, tuple[float, str]]:
    """phase -> (seconds, how) of the phases ``run`` goes through, by ``work`` at ``op_seconds`` a small operation."""
    pixels = run.width * run.height
    ops: dict[str, tuple[float, str]] = {}
    if not run.loaded:
        ops["load"] = (work.load, "reading and building its components")
        ops["transfer"] = (work.transfer, "placing them")
        ops["text_encode"] = (run.prompts * work.prompt, f"{run.prompts} prompt(s), their first encode")
    if run.image_to_video:
        ops["image_encode"] = (work.image, "the image")
    encode = work.encode_pixel * run.frames * pixels
    if run.video_input:
        ops["video_encode"] = (work.video_fixed + work.video_pixel * run.frames * pixels,
                               f"{run.frames} frames read and through the VAE's encoder")
    a_pass = work.pass_fixed + work.pass_token * run.tokens
    denoise = run.steps * run.passes * a_pass + (encode if run.image_to_video else 0.0)
    ops["denoise"] = (denoise, f"{run.steps} steps x {run.passes} passes x {a_pass:.0f}" +
                      (f", +{encode:.0f} to encode the image condition" if run.image_to_video else ""))
    decode = work.decode_fixed + run.latent_frames * (work.decode_latent + work.decode_pixel * pixels)
    ops["vae_decode"] = (decode, f"{run.latent_frames} latent frames of {pixels} pixels")
    return {phase: (count * op_seconds, f"{count:.0f} small operations of {op_seconds * 1e6:.0f} us ({words}): a "
                                        "model too small for its arithmetic to count")
            for phase, (count, words) in ops.items()}


def step_seconds(work: SmallWork, op_seconds: float, run: SmallRun) -> float:
    """One denoising step (all its passes), by the small work."""
    return run.passes * (work.pass_fixed + work.pass_token * run.tokens) * op_seconds
