"""Latents to frames: the VAE's own latent space, one decode, and the order of fallbacks when memory runs out."""
from __future__ import annotations

from engine.outputs.export import to_uint8
from engine.run.apply_plan import set_vae_tiling


def denormalize(vae, latents):
    """Normalised latents (as the transformer denoises them) -> the VAE's own latent space."""
    import torch

    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
    return latents / inv_std + mean


def decode_attempts(vae_tile: int | None, device: str, tiles: tuple[int, ...]) -> list[tuple[str, int | None, str]]:
    """(how, tile, device) to try in order: as planned, then a smaller tile, then on the CPU.

    ``tiles`` are the tile sizes the engine knows, largest first; a step is skipped when it changes nothing.
    """
    smaller = [t for t in tiles if vae_tile is None or t < vae_tile]
    attempts = [("as planned", vae_tile, device)]
    if device != "cpu" or smaller:
        attempts.append(("tiled", smaller[0] if smaller else vae_tile, device))
    if device != "cpu":
        attempts.append(("on the CPU", smaller[0] if smaller else vae_tile, "cpu"))
    return attempts


def decode_latents(vae, video_processor, latents, tile: int | None, device: str):
    """One decode of the whole clip on ``device`` (tiled when ``tile``): uint8 frames (T, H, W, 3)."""
    import torch

    set_vae_tiling(vae, tile)
    if device != str(vae.device.type):
        vae.to(device)
    with torch.inference_mode():
        latents = latents.to(device, dtype=vae.dtype)
        video = vae.decode(denormalize(vae, latents), return_dict=False)[0]
        frames = video_processor.postprocess_video(video, output_type="np")[0]
    return to_uint8(frames)
