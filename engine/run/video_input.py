"""Video to video: the input video as latents, and where its denoise starts.

The input is read at the run's frame rate and size (engine/settings/videos.py), encoded by the model's VAE (the mode
of its distribution, as diffusers' video-to-video pipeline takes it) and normalised as the transformer sees latents.
The run keeps the last ``Settings.denoise_steps`` steps of its schedule (engine/run/schedulers.py) and starts them
from the input noised to the first of them: ``sigma * noise + (1 - sigma) * input``, the flow-matching path that
diffusers' schedulers' ``scale_noise`` and ``add_noise`` follow. The noise is the pipeline's own first draw from the
run's seed. A strength of 1 keeps every step: the input has no say, nothing is encoded, and the run is exactly the
text-to-video run of its seed.
"""
from __future__ import annotations

from engine.settings.request import GenerationRequest


def encode_video(pipe, request: GenerationRequest, device: str):
    """The request's input video as normalised latents (1, channels, latent frames, height / 8, width / 8), float32
    on ``device``: its first ``frames`` frames at the run's fps, fitted to its size, through ``pipe``'s VAE."""
    import numpy as np
    import torch

    from engine.settings.videos import fitted_frames

    settings = request.settings
    frames = np.stack(list(fitted_frames(request.video, settings.width, settings.height, settings.fps,
                                         settings.frames)))
    vae = pipe.vae
    video = torch.from_numpy(frames).to(device).permute(3, 0, 1, 2)[None]   # (1, 3, F, H, W)
    video = video.to(vae.dtype) / 127.5 - 1.0
    latents = vae.encode(video).latent_dist.mode().float()
    del video
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(1, z, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=latents.device).view(1, z, 1, 1, 1)
    return (latents - mean) / std


def starting_latents(pipe, request: GenerationRequest, encoded, sigma: float):
    """Where the denoise starts: the pipeline's own noise for this seed (as a text-to-video run draws it) mixed with
    the ``encoded`` input at the first kept step's ``sigma``."""
    import torch

    settings = request.settings
    model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
    noise = pipe.prepare_latents(1, model.config.in_channels, settings.height, settings.width, settings.frames,
                                 torch.float32, encoded.device, torch.Generator("cpu").manual_seed(request.seed))
    return sigma * noise + (1.0 - sigma) * encoded
