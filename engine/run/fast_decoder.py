"""An optional fast video decoder: a tiny 2-D convolution network with a per-frame memory that turns Wan
latents into frames in a fraction of the full VAE's time and memory, at a lower quality. Its files (the
published TAEHV decoders: where they are, their layout, reading and checking one) are
engine/models/fast_decoder_file.py.

How it decodes: the latent frames go through the network as one batch of images; time enters only where a
``MemBlock`` sees, beside each frame, its own input of the frame before, and where a ``TGrow`` turns each
frame into several. The first frames that come out are the causal warm-up and are dropped, so 21 latent
frames give 84 - 3 = 81 frames (4k+1, as Wan counts them).

``stream`` decodes a few latent frames at a time and carries each MemBlock's last input to the next chunk,
so its frames are ``decode``'s while only a chunk's activations are held at once: bit for bit where the conv
kernels do not depend on the batch size, else a pixel may differ by one level (oneDNN and cuDNN pick their
algorithm by batch size). Measured on an H200 in float16, 81 frames of 832x480 from random weights of the
published size: ``decode`` 0.12 s and 8 GiB at its peak, ``stream(chunk=4)`` 0.12 s and 1.9 GiB.

Torch is imported inside the functions (the page and the planner start without it).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from engine.models.fast_decoder_file import (DecoderLayer, FastDecoderError, FastDecoderInfo, check_matches,
                                             read_fast_decoder_layers)
from engine.run.nonfinite import refuse_nonfinite

if TYPE_CHECKING:
    import torch


def _build_module(layers: Sequence[DecoderLayer]):
    """The decoder as an nn.Sequential whose keys are the published ones (classes made here, so torch loads
    only when a decoder does)."""
    import torch
    from torch import nn

    def conv3(n_in: int, n_out: int, bias: bool = True) -> nn.Conv2d:
        return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias)

    class Clamp(nn.Module):
        """Squashes latents softly into (-3, 3): outliers do not blow up the frames."""

        def forward(self, x):
            return torch.tanh(x / 3) * 3

    class MemBlock(nn.Module):
        """Residual convs over a frame beside its own input of the frame before (``past``)."""

        def __init__(self, n_in: int, n_out: int, skip: bool):
            super().__init__()
            self.conv = nn.Sequential(conv3(2 * n_in, n_out), nn.ReLU(), conv3(n_out, n_out), nn.ReLU(),
                                      conv3(n_out, n_out))
            self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if skip else nn.Identity()

        def forward(self, x, past):
            return torch.relu(self.conv(torch.cat([x, past], 1)) + self.skip(x))

    class TGrow(nn.Module):
        """Each frame becomes ``stride`` frames: a 1x1 conv makes their channels side by side."""

        def __init__(self, channels: int, stride: int):
            super().__init__()
            self.stride = stride
            self.conv = nn.Conv2d(channels, channels * stride, 1, bias=False)

        def forward(self, x):
            y = self.conv(x)
            return y.reshape(y.shape[0] * self.stride, y.shape[1] // self.stride, *y.shape[2:])

    def make(layer: DecoderLayer) -> nn.Module:
        return {"clamp": Clamp, "relu": nn.ReLU, "up": lambda: nn.Upsample(scale_factor=2, mode="nearest"),
                "conv": lambda: conv3(layer.channels_in, layer.channels_out, layer.bias),
                "mem": lambda: MemBlock(layer.channels_in, layer.channels_out, layer.skip),
                "tgrow": lambda: TGrow(layer.channels_in, layer.stride)}[layer.kind]()

    return nn.Sequential(*(make(layer) for layer in layers))


def _run_layers(module, layers: Sequence[DecoderLayer], frames, carried: list):
    """Latent frames (F, C, h, w) through the decoder; ``carried`` holds, per MemBlock, its input of the frame
    before these (None: these are the first). Returns the raw output frames and what to carry next."""
    import torch

    x, carry = frames, []
    for layer, block in zip(layers, module):
        if layer.kind == "mem":
            before = carried[len(carry)]
            before = torch.zeros_like(x[:1]) if before is None else before
            carry.append(x[-1:].clone())  # a copy: a view would keep the whole chunk's activations alive
            x = block(x, torch.cat([before, x[:-1]], 0))
        else:
            x = block(x)
    return x, carry


def _to_uint8(x, patch_size: int):
    """Decoder output (F, 3*p*p, H, W) in [0, 1] -> uint8 frames (F, p*H, p*W, 3), rounded as export does."""
    import torch
    import torch.nn.functional as F

    refuse_nonfinite(x, "The fast decoder", "the frames' pixels", ", so the video would be black",
                     "Choose the VAE decoder, or download the fast decoder again.")
    if patch_size > 1:
        x = F.pixel_shuffle(x, patch_size)
    x = x.float().clamp_(0.0, 1.0)
    return (x * 255.0 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


@dataclass(frozen=True)
class FastDecoder:
    """A loaded fast decoder: the network (eval, no grads) on its device and dtype, and what it is."""

    module: Any
    info: FastDecoderInfo
    layers: tuple[DecoderLayer, ...]
    device: Any
    dtype: Any

    def _frames_in(self, latents, latents_mean, latents_std):
        """The transformer's latents (1, C, T, h, w) or (C, T, h, w) -> the decoder's input frames
        (T, C, h, w) on its device and dtype; de-normalised (in float32) for a decoder that takes the VAE's
        own latents."""
        import torch

        if latents.dim() == 5:
            if latents.shape[0] != 1:
                raise FastDecoderError(f"the fast decoder decodes one clip at a time; these latents hold "
                                       f"{latents.shape[0]}: pass them one by one")
            latents = latents[0]
        if latents.dim() != 4 or latents.shape[1] < 1:
            raise FastDecoderError(f"the fast decoder takes latents shaped (1, C, T, h, w); these are "
                                   f"{list(latents.shape)}: pass the pipeline's latents as they are")
        check_matches(self.info, int(latents.shape[0]))
        if self.info.vae_space_latents:
            latents = self._denormalize(latents.to(self.device, torch.float32), latents_mean, latents_std)
        frames = latents.to(self.device, self.dtype).transpose(0, 1)
        if self.device.type == "cuda":
            return frames.contiguous(memory_format=torch.channels_last)
        return frames.contiguous()

    def _denormalize(self, latents, latents_mean, latents_std):
        """(C, T, h, w) normalised latents -> the VAE's own latent space: ``latents * std + mean``."""
        import torch

        if latents_mean is None or latents_std is None:
            raise FastDecoderError(f"{self.info.name} takes the VAE's own latents: pass latents_mean and "
                                   f"latents_std from the VAE's config")
        channels = latents.shape[0]
        mean = torch.as_tensor(latents_mean, dtype=torch.float32, device=latents.device).reshape(-1)
        std = torch.as_tensor(latents_std, dtype=torch.float32, device=latents.device).reshape(-1)
        if mean.numel() != channels or std.numel() != channels:
            raise FastDecoderError(f"latents_mean and latents_std have {mean.numel()} and {std.numel()} values "
                                   f"for {channels} latent channels: pass those of this model's VAE config")
        return latents * std.view(-1, 1, 1, 1) + mean.view(-1, 1, 1, 1)

    def _memblocks(self) -> int:
        return sum(layer.kind == "mem" for layer in self.layers)

    def decode(self, latents, latents_mean: Sequence[float] | None = None,
               latents_std: Sequence[float] | None = None) -> torch.Tensor:
        """The transformer's latents (1, C, T, h, w) -> uint8 frames (4T-3, 8p*h, 8p*w, 3) on the decoder's
        device, all frames in one batch (``stream`` is as fast on a GPU and holds a fraction of the memory).
        ``latents_mean`` / ``latents_std`` (the VAE config's) are needed by, and only used for, a decoder of
        VAE-space latents."""
        import torch

        with torch.inference_mode():
            frames = self._frames_in(latents, latents_mean, latents_std)
            out, _ = _run_layers(self.module, self.layers, frames, [None] * self._memblocks())
            return _to_uint8(out, self.info.patch_size)[self.info.trimmed_frames:]

    def stream(self, latents, chunk: int = 4, latents_mean: Sequence[float] | None = None,
               latents_std: Sequence[float] | None = None) -> Iterator[torch.Tensor]:
        """Like ``decode``, ``chunk`` latent frames at a time: yields uint8 frame batches whose concatenation
        is ``decode``'s output (the warm-up frames dropped from the first; see the module's note on rounding).
        The latents are checked now, not at the first batch."""
        import torch

        if chunk < 1:
            raise FastDecoderError(f"a chunk of {chunk} latent frames decodes nothing: pass 1 or more")
        with torch.inference_mode():
            frames = self._frames_in(latents, latents_mean, latents_std)
        return self._batches(frames, chunk)

    def _batches(self, frames, chunk: int) -> Iterator[torch.Tensor]:
        """The generator behind ``stream``: inference mode is entered per chunk, never across a yield (it would
        leak into the caller's code while suspended)."""
        import torch

        carried: list = [None] * self._memblocks()
        to_drop = self.info.trimmed_frames
        for start in range(0, frames.shape[0], chunk):
            with torch.inference_mode():
                out, carried = _run_layers(self.module, self.layers, frames[start:start + chunk], carried)
                batch = _to_uint8(out, self.info.patch_size)
            batch, to_drop = batch[to_drop:], max(0, to_drop - batch.shape[0])
            if batch.shape[0]:
                yield batch


def load_fast_decoder(path: Path | str, device: Any = "cpu", dtype: Any = None,
                      vae_space_latents: bool | None = None) -> FastDecoder:
    """Reads, checks and loads a fast decoder onto ``device`` (a name or torch.device) in ``dtype`` (None:
    float16 on a GPU, float32 on the CPU, where half-precision convs are slow); channels-last on a GPU,
    where its convs run faster so."""
    import torch

    info, state, layers = read_fast_decoder_layers(Path(path), vae_space_latents)
    device = torch.device(device)
    if dtype is None:
        dtype = torch.float16 if device.type == "cuda" else torch.float32
    with torch.device("meta"):  # no random initialisation of weights that are replaced at once
        module = _build_module(layers)
    module.load_state_dict({key.removeprefix("decoder."): value for key, value in state.items()}, strict=True,
                           assign=True)
    module = module.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if device.type == "cuda":
        module = module.to(memory_format=torch.channels_last)
    return FastDecoder(module=module, info=info, layers=layers, device=device, dtype=dtype)
