"""Live preview while denoising: the model's current guess of the clean video, cheaply turned into pixels.

At a step the pipeline's latents are still noisy; the clean estimate x0 (what
the model predicts the final latents to be) looks far better. Each latent
pixel of x0 goes through a linear map to RGB (no VAE decode), and the latent
frames become one small looping animated image.

- ``clean_estimate``: x0 after a step, exact for the two schedulers the engine uses.
- ``preview_map_for``: Wan2.1's known 16-channel factors, or a map fitted to the VAE of
  a model with other latents (Wan2.2-5B has 48 channels).
- ``latents_to_frames`` and ``encode_animation``: x0 to uint8 frames to image bytes.
- ``LivePreview``: one run's state: which steps get a preview, the latents of the step
  before (the Euler estimate needs them), and the thread that encodes a preview while the
  next step runs.
"""
from __future__ import annotations

import io
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from engine.device.runtime import clock
from engine.events import Info, PreviewReady
from engine.run.decoding import decoder_dtype, denormalize

log = logging.getLogger(__name__)

# Wan2.1 z16 latents -> RGB, as ComfyUI and Wan2GP use them (docs/reference-figures.md, "The latent preview"):
# a row of (R, G, B) weights per latent channel, applied to the normalised latent.
WAN21_FACTORS = (
    (-0.1299, -0.1692, 0.2932), (0.0671, 0.0406, 0.0442), (0.3568, 0.2548, 0.1747), (0.0372, 0.2344, 0.1420),
    (0.0313, 0.0189, -0.0328), (0.0296, -0.0956, -0.0665), (-0.3477, -0.4059, -0.2925), (0.0166, 0.1902, 0.1975),
    (-0.0412, 0.0267, -0.1364), (-0.1293, 0.0740, 0.1636), (0.0680, 0.3019, 0.1128), (0.0032, 0.0581, 0.0639),
    (-0.1251, 0.0927, 0.1699), (0.0060, -0.0633, 0.0005), (0.3477, 0.2275, 0.2950), (0.1984, 0.0913, 0.1861),
)
WAN21_BIAS = (-0.1835, -0.0868, -0.3360)

# Default gap between previews: often enough to watch, rarely enough to cost a few percent at most.
PREVIEW_EVERY_SECONDS = 1.0
# Long side of the preview image and the WebP quality: visible on the page yet small enough to
# cross the worker pipe every second. A detailed 21-frame preview (81 video frames) measured
# about 50 KB and 25-50 ms to encode on 2 CPU cores; 320 px and quality 70 doubled the size.
PREVIEW_MAX_SIDE = 256
WEBP_QUALITY = 50
# The fastest WebP encoder effort: slower methods saved 10-15 % of the bytes at twice the time.
WEBP_METHOD = 0
# Random latents decoded to fit a map for a VAE without known factors: 4 latent frames (the first
# frame and the 4-frame groups decode differently) of 12 x 12, 576 samples, about twelve per unknown
# for 48 channels plus a bias. The Wan VAE decodes a latent frame at a time, so frames cost time
# and pixels cost memory: 192 x 192 pixels at Wan2.2's 16x. Measured with a full-size (random-weight)
# Wan2.2 VAE on an H200: 0.08 s (1.1 s the first time in a process), 0.85 GiB above the fp32 weights
# (0.43 GiB in bf16); 16 x 16 pixels took 1.2 GiB.
DERIVE_LATENT_FRAMES = 4
DERIVE_LATENT_SIZE = 12
DERIVE_SEED = 0


@dataclass(frozen=True, eq=False)
class PreviewMap:
    """Latent channel -> RGB: ``rgb = latent @ factors + bias`` per latent pixel, in [-1, 1]."""
    factors: np.ndarray   # (z_dim, 3)
    bias: np.ndarray      # (3,)
    source: str           # "known" (published factors) or "derived" (fitted to this model's VAE)

    @property
    def z_dim(self) -> int:
        return int(self.factors.shape[0])

    def frames(self, x0) -> np.ndarray:
        """The preview frames of the clean estimate ``x0``: one per latent frame, at latent resolution."""
        return latents_to_frames(x0, self)


# The fast decoder's preview decodes the clean estimate at half the latent resolution when the latent is
# larger than this (a 832x480 video previews at 416x240, above the preview's size): a quarter of the work.
DECODER_PREVIEW_MAX_LATENT_SIDE = 64


@dataclass(frozen=True, eq=False)
class DecoderPreview:
    """Previews through the fast decoder: pixels like the video's instead of a linear colour map.
    One frame per latent frame (the animation's rate stays the map's), scaled down on the device."""
    decoder: Any                    # engine.run.fast_decoder.FastDecoder
    latents_mean: Any = None
    latents_std: Any = None
    max_side: int = PREVIEW_MAX_SIDE
    source: str = "fast decoder"

    def frames(self, x0) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        latent = x0 if x0.dim() == 5 else x0.unsqueeze(0)
        if max(latent.shape[-2:]) > DECODER_PREVIEW_MAX_LATENT_SIDE:
            latent = F.avg_pool3d(latent.float(), (1, 2, 2))
        frames = self.decoder.decode(latent, self.latents_mean, self.latents_std)   # uint8 (F, H, W, 3)
        step = max(1, self.decoder.info.time_factor)
        kept = torch.cat([frames[:1], frames[step::step]]) if len(frames) > 1 else frames
        width, height = preview_size(kept.shape[1], kept.shape[2], self.max_side)
        if width < kept.shape[2]:
            kept = F.interpolate(kept.permute(0, 3, 1, 2).float(), size=(height, width), mode="bilinear",
                                 antialias=True).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        return kept.cpu().numpy()


def known_map() -> PreviewMap:
    return PreviewMap(np.array(WAN21_FACTORS, dtype=np.float32), np.array(WAN21_BIAS, dtype=np.float32), "known")


def preview_map_for(vae) -> PreviewMap:
    """The known Wan2.1 factors for 16-channel latents; otherwise a map fitted to ``vae``."""
    if vae.config.z_dim == len(WAN21_FACTORS):
        return known_map()
    return derive_map(vae)


def derive_map(vae, latent_frames: int = DERIVE_LATENT_FRAMES, latent_size: int = DERIVE_LATENT_SIZE,
               seed: int = DERIVE_SEED) -> PreviewMap:
    """Fit factors and bias by least squares: random normalised latents against their decoded colours,
    average-pooled down to latent resolution. Runs the VAE where it is, in its dtype."""
    import torch

    z_dim = vae.config.z_dim
    generator = torch.Generator("cpu").manual_seed(seed)
    latents = torch.randn((1, z_dim, latent_frames, latent_size, latent_size), generator=generator)
    with torch.inference_mode():
        video = vae.decode(denormalize(vae, latents.to(vae.device, decoder_dtype(vae))), return_dict=False)[0]
        colours = pool_to_latent_grid(video.float().cpu(), latent_frames, latent_size)
    return fit_map(latents, colours)


def fit_map(latents, colours) -> PreviewMap:
    """The least-squares factors and bias from (B, C, T, h, w) latents to (B, 3, T, h, w) colours."""
    import torch

    z_dim = latents.shape[1]
    x = latents.movedim(1, -1).reshape(-1, z_dim).double().cpu()
    x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
    y = colours.movedim(1, -1).reshape(-1, 3).double().cpu()
    solution = torch.linalg.lstsq(x, y).solution
    return PreviewMap(solution[:z_dim].float().numpy(), solution[z_dim].float().numpy(), "derived")


def pool_to_latent_grid(video, latent_frames: int, latent_size: int):
    """Decoded (B, 3, 1 + k*(T-1), H, W) -> (B, 3, T, h, w): frame 0 alone, then groups of k frames,
    each latent pixel the mean of the pixels it decodes to."""
    import torch

    b, c, frames, height, width = video.shape
    groups = [video[:, :, :1]]
    if latent_frames > 1:
        per = (frames - 1) // (latent_frames - 1)
        rest = video[:, :, 1:1 + per * (latent_frames - 1)]
        groups.append(rest.reshape(b, c, latent_frames - 1, per, height, width).mean(dim=3))
    video = torch.cat(groups, dim=2)
    sh, sw = height // latent_size, width // latent_size
    video = video[..., :sh * latent_size, :sw * latent_size]
    return video.reshape(b, c, latent_frames, latent_size, sh, latent_size, sw).mean(dim=(4, 6))


def clean_estimate(scheduler, latents, previous=None):
    """The model's clean estimate x0 after the step just taken, or None where the scheduler cannot give it.

    ``latents``: the pipeline's latents after the step (what ``callback_on_step_end`` gets);
    ``previous``: its latents after the step before (the input of this step), or None.

    - UniPC in predict-x0 mode converts each model output to x0 = x_t - sigma_t * v before it
      steps, and keeps it in ``model_outputs[-1]``: exact at every step, the first one included.
    - Flow-match Euler steps x_next = x_t + (sigma_next - sigma_t) * v, so with x_t known
      x0 = x_t - sigma_t * v = (sigma_next * x_t - sigma_t * x_next) / (sigma_next - sigma_t).
      The first step's x_t (the initial noise) is not seen, and a stochastic Euler step
      cannot be inverted: None there.
    """
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    if isinstance(scheduler, UniPCMultistepScheduler):
        if not scheduler.config.predict_x0 or not scheduler.model_outputs or scheduler.model_outputs[-1] is None:
            return None
        return scheduler.model_outputs[-1]
    if isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
        if previous is None or scheduler.config.stochastic_sampling or not scheduler.step_index:
            return None
        index = scheduler.step_index - 1   # step_index already points at the next step
        sigma, sigma_next = float(scheduler.sigmas[index]), float(scheduler.sigmas[index + 1])
        if sigma_next == sigma:
            return None
        x_t, x_next = previous.to(torch.float32), latents.to(torch.float32)
        return (sigma_next * x_t - sigma * x_next) / (sigma_next - sigma)
    return None


def latents_to_frames(x0, preview_map: PreviewMap) -> np.ndarray:
    """(B, C, T, h, w) or (C, T, h, w) normalised latents -> uint8 (T, h, w, 3) of the first video.
    The arithmetic runs where ``x0`` is; only the small uint8 result is copied to the CPU."""
    import torch

    latent = x0[0] if x0.dim() == 5 else x0
    if latent.shape[0] != preview_map.z_dim:
        raise ValueError(f"the preview map is for {preview_map.z_dim} latent channels, "
                         f"these latents have {latent.shape[0]}")
    factors = torch.from_numpy(preview_map.factors).to(latent.device, torch.float32)
    bias = torch.from_numpy(preview_map.bias).to(latent.device, torch.float32)
    rgb = torch.einsum("cthw,cr->thwr", latent.to(torch.float32), factors) + bias
    rgb = ((rgb.clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    return rgb.cpu().numpy()


def preview_size(height: int, width: int, max_side: int = PREVIEW_MAX_SIDE) -> tuple[int, int]:
    """(width, height) of the preview: the long side scaled to ``max_side``, the aspect kept."""
    scale = max_side / max(height, width)
    return max(1, round(width * scale)), max(1, round(height * scale))


def animation_format() -> tuple[str, str]:
    """(Pillow format, mime type): animated WebP where this Pillow has WebP, else GIF."""
    from PIL import features

    return ("WEBP", "image/webp") if features.check("webp") else ("GIF", "image/gif")


def encode_animation(frames: np.ndarray, fps: float, max_side: int = PREVIEW_MAX_SIDE) -> bytes:
    """uint8 (T, h, w, 3) -> a looping animated image (a still for one frame), scaled bilinearly
    to ``max_side`` on the long side."""
    from PIL import Image

    fmt, _ = animation_format()
    size = preview_size(frames.shape[1], frames.shape[2], max_side)
    images = [Image.fromarray(frame).resize(size, Image.Resampling.BILINEAR) for frame in frames]
    options = {"quality": WEBP_QUALITY, "method": WEBP_METHOD} if fmt == "WEBP" else {}
    if len(images) > 1:
        options.update(save_all=True, append_images=images[1:], loop=0,
                       duration=max(20, round(1000 / fps)) if fps > 0 else 100)
    out = io.BytesIO()
    images[0].save(out, fmt, **options)
    return out.getvalue()


@dataclass(frozen=True)
class TakenFrames:
    """A preview's frames, copied off the device after a step and waiting to be encoded."""
    step: int                 # 1-based
    frames: np.ndarray        # uint8 (T, h, w, 3)
    source: str               # of the colour map
    started: float            # clock() when the preview began


@dataclass
class LivePreview:
    """One run's previews. After every step ``emit_after_step`` decides whether to make one (at most once
    every ``every_seconds``; 0: every step; negative: never; the first step that can give x0 always
    included), copies its frames off the device, and encodes and emits it on a background thread while
    the next step runs. ``settle`` waits for that thread: call it before emitting anything else, and
    ``close`` at the end of the denoising, so events keep their order and none is left behind."""
    job_id: str
    total: int
    every_seconds: float
    fps: float                               # of the animation: the video's fps over the VAE's temporal factor
    preview_map: Callable[[], PreviewMap | DecoderPreview]   # called at the first preview (a derived map
    #                                                               costs a VAE decode)
    max_side: int = PREVIEW_MAX_SIDE
    off: bool = False
    last_at: float | None = None
    previous: tuple[int, Any] | None = None  # (step, latents after it): the next step's x_t
    _pool: ThreadPoolExecutor | None = None
    _pending: Future | None = None

    def emit_after_step(self, scheduler, step: int, latents, emit: Callable) -> None:
        """``step``: the 0-based index of the step just taken; ``latents``: the pipeline's latents after it.
        A failing preview never fails the run: the first error is said once (an Info) and turns previews
        off for the rest of it."""
        self.settle()
        try:
            taken = self.take(scheduler, step, latents)
        except Exception as exc:
            self._failed(step + 1, exc, emit)
            return
        if taken is not None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="live-preview")
            self._pending = self._pool.submit(self._encode_and_emit, taken, emit)

    def settle(self) -> None:
        """Wait until the preview being encoded (if any) has been emitted."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Emit the last preview and stop the encoding thread."""
        self.settle()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def take(self, scheduler, step: int, latents) -> TakenFrames | None:
        """This step's frames if it gets a preview: the clean estimate mapped to RGB on the device,
        only the small uint8 frames copied to the CPU."""
        previous = self.previous[1] if self.previous is not None and self.previous[0] == step - 1 else None
        self.previous = (step, latents)
        start = clock()
        if self.off or self.every_seconds < 0:
            return None
        if self.last_at is not None and start - self.last_at < self.every_seconds:
            return None
        x0 = clean_estimate(scheduler, latents, previous)
        if x0 is None:
            return None
        preview_map = self.preview_map()
        self.last_at = start
        return TakenFrames(step + 1, preview_map.frames(x0), preview_map.source, start)

    def encode(self, taken: TakenFrames) -> PreviewReady:
        frames = taken.frames
        image = encode_animation(frames, self.fps, self.max_side)
        width, height = preview_size(frames.shape[1], frames.shape[2], self.max_side)
        return PreviewReady(self.job_id, taken.step, self.total, image, animation_format()[1], width, height,
                            int(frames.shape[0]), taken.source, round(clock() - taken.started, 4))

    def _encode_and_emit(self, taken: TakenFrames, emit: Callable) -> None:
        try:
            event = self.encode(taken)
        except Exception as exc:
            self._failed(taken.step, exc, emit)
            return
        emit(event)

    def _failed(self, step: int, exc: Exception, emit: Callable) -> None:
        self.off = True
        log.warning("live preview failed at step %d; previews are off for this run", step, exc_info=exc)
        emit(Info(self.job_id, f"The live preview failed at step {step} ({type(exc).__name__}: {exc}); "
                               "previews are off for this run, which goes on."))
