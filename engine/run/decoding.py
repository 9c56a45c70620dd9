"""Latents to frames: the VAE's own latent space, one decode, and the order of fallbacks when memory runs out."""
from __future__ import annotations

from engine.outputs.export import to_uint8
from engine.run.apply_plan import set_vae_tiling
from engine.run.nonfinite import refuse_nonfinite

# What to do when the VAE decodes finite latents to NaN: in half precision its activations overflow (float16's
# largest value is 65,504), in float32 its weights are wrong.
VAE_OVERFLOW_HINT = ("The VAE overflowed in {dtype}: choose VAE precision float32 (--vae-precision float32 on the "
                     "command line) and run again.")
VAE_DAMAGED_HINT = "The model's VAE weights may be damaged: download the model again."


def check_decoded(vae, decoded) -> None:
    """Refuse the VAE's output when it holds NaN or infinite values (every one would be a black pixel)."""
    import torch

    dtype = decoder_dtype(vae)
    hint = VAE_DAMAGED_HINT if dtype == torch.float32 else VAE_OVERFLOW_HINT.format(dtype=str(dtype).split(".")[-1])
    refuse_nonfinite(decoded, "The VAE decode", "the frames' pixels", " from finite latents, so the video would "
                     "be black", hint)


def denormalize(vae, latents):
    """Normalised latents (as the transformer denoises them) -> the VAE's own latent space."""
    import torch

    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
    return latents / inv_std + mean


def decoder_dtype(vae):
    """The dtype the VAE decodes in: its decoder's (``vae.dtype`` is the encoder's, which an image-to-video
    pipeline keeps in float32: engine/run/apply_plan.py's ``keep_encoder_exact``)."""
    return vae.post_quant_conv.weight.dtype


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
        latents = latents.to(device, dtype=decoder_dtype(vae))
        video = vae.decode(denormalize(vae, latents), return_dict=False)[0]
        check_decoded(vae, video)
        frames = video_processor.postprocess_video(video, output_type="np")[0]
    return to_uint8(frames)


def decoded_shape(vae, latents) -> tuple[int, int, int, int]:
    """(frames, height, width, 3) that ``latents`` (1, C, T, h, w) decode to: known before the decode, so the
    disk's room and the video's size are settled before it spends its time."""
    _, _, count, height, width = latents.shape
    spatial, temporal = vae.config.scale_factor_spatial, vae.config.scale_factor_temporal
    return (count - 1) * temporal + 1, height * spatial, width * spatial, 3


def decode_stream(vae, latents, device: str, window: int = 1):
    """The untiled decode of ``vae.decode`` (AutoencoderKLWan._decode), yielding uint8 frames (n, H, W, 3) as soon
    as each call of the decoder has made them, so the encoder can work while the decoder does.

    Why not ``vae.decode``: it returns only once the whole clip is decoded, one latent frame per call of the
    decoder. Here the first latent frame goes alone (the decoder's first call is special: its temporal upsamplers
    keep one frame instead of doubling it), then ``window`` latent frames a call. The decoder's convolutions are
    causal and carry their last frames in the VAE's cache, so a call of several frames computes what as many
    calls of one compute, in fewer, larger kernels: the GPU kept busier for the activations of ``window`` frames
    at once (the planner sizes it from the free memory: engine/planning/memory.py ``vae_window_gb``). With 1, the
    frames equal ``decode_latents``'s bit for bit. A tiled decode (``vae.use_tiling``) goes through
    ``decode_latents``; the VAE's cache is cleared however the stream ends (closed early included).
    """
    import torch

    if vae.use_tiling:
        raise ValueError("a streamed decode is untiled; a tiled decode goes through decode_latents")
    if window < 1:
        raise ValueError(f"a window must be at least 1 latent frame, not {window}")
    if device != str(vae.device.type):
        vae.to(device)
    _onload(vae)
    with torch.inference_mode():
        latents = latents[:1].to(device, dtype=decoder_dtype(vae))
        vae.clear_cache()
        hidden = vae.post_quant_conv(denormalize(vae, latents))
    try:
        count = hidden.shape[2]
        for start, stop in decoder_calls(count, window):
            with torch.inference_mode():
                decoded = _decode_frames(vae, hidden, start, stop)
                frames = _to_uint8_frames(vae, decoded)
            del decoded
            yield frames
    finally:
        vae.clear_cache()


def decoder_calls(count: int, window: int) -> list[tuple[int, int]]:
    """(start, stop) latent frames of each call of the decoder: the first frame alone, then ``window`` at a time."""
    return [(0, min(1, count))] + [(start, min(start + window, count)) for start in range(1, count, window)]


def _onload(vae) -> None:
    """What ``vae.decode``'s forward hook does first: an accelerate offload hook, if any, puts the VAE on its
    device (the app places the VAE itself; this keeps the stream right for a VAE offloaded another way)."""
    hook = getattr(vae, "_hf_hook", None)
    if hook is not None and hasattr(hook, "pre_forward"):
        hook.pre_forward(vae)


def _decode_frames(vae, hidden, start: int, stop: int):
    """Latent frames ``start`` to ``stop`` through the decoder in one call, its causal cache carried in
    ``vae._feat_map`` as ``_decode`` does (the first frame's call is the first chunk)."""
    vae._conv_idx = [0]
    frames = hidden[:, :, start:stop, :, :]
    return vae.decoder(frames, feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=start == 0)


def _to_uint8_frames(vae, decoded):
    """Decoder output (1, C, n, h, w) -> uint8 frames (n, H, W, 3) on the host, converted on the device.

    The arithmetic of ``_decode``'s tail (unpatchify, clamp to [-1, 1]), of ``postprocess_video`` (x * 0.5 + 0.5,
    clamped to [0, 1], in the VAE's dtype, then float32) and of ``export.to_uint8`` (* 255 + 0.5, truncated), in
    that order: the same bits as the whole decode, and a quarter of the bytes cross to the host.
    """
    import torch
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    check_decoded(vae, decoded)
    if vae.config.patch_size is not None:
        decoded = unpatchify(decoded, patch_size=vae.config.patch_size)
    decoded = torch.clamp(decoded, min=-1.0, max=1.0)
    images = (decoded[0] * 0.5 + 0.5).clamp(0, 1).float()
    pixels = (images.clamp(0.0, 1.0) * 255.0 + 0.5).to(torch.uint8)
    return pixels.permute(1, 2, 3, 0).contiguous().cpu().numpy()
