"""The fast video decoder's files: where they are published and looked for, their layout, reading and checking
one, and writing one (with random weights for tests and the self-test models). The network that decodes with
them is engine/run/fast_decoder.py.

The published TAEHV decoder weights: ``taew2_1`` (16 latent channels: Wan2.1 and Wan2.2-A14B) and ``taew2_2``
(48 channels, 2x2 patches: Wan2.2-5B), which take the transformer's normalised latents, and LightX2V's
``lighttaew2_1`` / ``lighttaew2_2``, which have the same layout but take the VAE's own latent space
(``latents * std + mean``). Everything about a file's shape (latent channels, patch size, widths, how each stage
grows time) is read from its weights; only "takes the VAE's own latents" comes from its name.

Torch and safetensors are imported inside the functions (the page and the planner start without them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from engine.models.finite import scan
from engine.models.safe_weights import read_tensors
from engine.models.weights import WeightFileError

# Latent channels of the model's VAE -> the published decoder for them.
FAST_DECODER_FILES = {16: "taew2_1", 48: "taew2_2"}
# Which models make latents of that many channels (for the messages).
LATENT_FAMILIES = {16: "Wan2.1, Wan2.2-A14B", 48: "Wan2.2-5B"}
# Where the files are published on the Hugging Face Hub: taew2_1.safetensors and taew2_2.safetensors in
# Kijai's repo (the author's own copies live on GitHub, madebyollin/taehv, safetensors/ folder); LightX2V's
# lighttaew2_1.safetensors / lighttaew2_2.safetensors (and .pth) in theirs.
FAST_DECODER_HUB_REPO = "Kijai/WanVideo_comfy"
LIGHT_FAST_DECODER_HUB_REPO = "lightx2v/Autoencoders"
FAST_DECODER_SOURCE = "https://github.com/madebyollin/taehv"
# Where find_fast_decoder looks, under the models folder.
FAST_DECODER_FOLDER = "fast_decoders"
# A model folder may carry its own fast decoder here (the self-test models do).
MODEL_OWN_FOLDER = "fast_decoder"
FAST_DECODER_SUFFIXES = (".safetensors", ".pth", ".pt")
# A key every TAEHV decoder has and other files do not (ComfyUI recognises them by it).
SIGNATURE_KEY = "decoder.22.bias"

# The decoder's nn.Sequential, index by index (its keys are decoder.<index>...).
_LAYOUT = ("clamp", "conv", "relu", "mem", "mem", "mem", "up", "tgrow",
           "conv", "mem", "mem", "mem", "up", "tgrow",
           "conv", "mem", "mem", "mem", "up", "tgrow",
           "conv", "relu", "conv")
# The convs whose bias every published file has; the others have none (one is accepted if present).
_BIASED = (1, 22)
# The published widths (after decoder.1, .8, .14, .20) and time strides (decoder.7, .13, .19): taehv.py's
# TGrow(n_f[0], 1), then 2 and 2 for Wan's 4x (its decoder_time_upscale=(True, True)), as in every real file.
_WIDTHS = (256, 128, 64, 64)
_STRIDES = (1, 2, 2)


# What to do with a fast decoder file that cannot be used.
DOWNLOAD_AGAIN = f"download it again (taew2_1 or taew2_2 from {FAST_DECODER_HUB_REPO}), or choose the VAE decoder"


class FastDecoderError(ValueError):
    """A fast decoder file that cannot be used here; the message says what to change."""


@dataclass(frozen=True)
class FastDecoderInfo:
    """What a fast decoder file is, read from its weights: the latents it takes and the frames it gives."""

    path: Path
    latent_channels: int
    patch_size: int
    time_strides: tuple[int, ...]
    vae_space_latents: bool
    parameters: int

    @property
    def name(self) -> str:
        return Path(self.path).stem

    @property
    def time_factor(self) -> int:
        """Frames out per latent frame, before the warm-up frames are dropped."""
        return math.prod(self.time_strides)

    @property
    def trimmed_frames(self) -> int:
        """The leading frames dropped from the output (3 for the published files)."""
        return self.time_factor - 1

    @property
    def scale(self) -> int:
        """Pixels per latent pixel, on each side: three 2x upsamplings, then the patch."""
        return 8 * self.patch_size

    def frames_out(self, latent_frames: int) -> int:
        """How many frames ``latent_frames`` latent frames decode to (21 -> 81)."""
        return max(0, latent_frames * self.time_factor - self.trimmed_frames)


@dataclass(frozen=True)
class DecoderLayer:
    """One entry of the decoder's Sequential, as read from the weights."""

    index: int
    kind: str
    channels_in: int
    channels_out: int
    bias: bool = False
    skip: bool = False
    stride: int = 1


def _layer_shapes(layer: DecoderLayer) -> dict[str, tuple[int, ...]]:
    """Every key of one layer and the shape its tensor has."""
    prefix, n_in, n_out = f"decoder.{layer.index}", layer.channels_in, layer.channels_out
    if layer.kind == "conv":
        shapes = {f"{prefix}.weight": (n_out, n_in, 3, 3)}
        return shapes | ({f"{prefix}.bias": (n_out,)} if layer.bias else {})
    if layer.kind == "mem":
        shapes = {f"{prefix}.conv.0.weight": (n_out, 2 * n_in, 3, 3), f"{prefix}.conv.0.bias": (n_out,)}
        for i in (2, 4):
            shapes |= {f"{prefix}.conv.{i}.weight": (n_out, n_out, 3, 3), f"{prefix}.conv.{i}.bias": (n_out,)}
        return shapes | ({f"{prefix}.skip.weight": (n_out, n_in, 1, 1)} if layer.skip else {})
    if layer.kind == "tgrow":
        return {f"{prefix}.conv.weight": (n_out * layer.stride, n_in, 1, 1)}
    return {}


def _not_taehv(name: str, key: str) -> FastDecoderError:
    return FastDecoderError(f"{name} is not a TAEHV video decoder (it has no key {key}, which every one has): "
                            f"use taew2_1 or taew2_2 from {FAST_DECODER_HUB_REPO} or a lighttaew2 file")


def _out_channels(state: dict, name: str, key: str) -> int:
    """The output channels of the 4-D conv weight at ``key``: how the layout tells each width."""
    if key not in state:
        raise _not_taehv(name, key)
    shape = tuple(state[key].shape)
    if len(shape) != 4 or shape[0] < 1:
        raise FastDecoderError(f"{name} does not have the TAEHV decoder layout ({key} has shape {list(shape)}, "
                               f"not a conv weight): use an unmodified taew2_1 or taew2_2 file")
    return shape[0]


def _read_layer(state: dict, name: str, index: int, kind: str, channels: int) -> DecoderLayer:
    """The layer at ``index`` given the channels coming into it; its output width comes from its weights."""
    prefix = f"decoder.{index}"
    if kind == "conv":
        out = _out_channels(state, name, f"{prefix}.weight")
        return DecoderLayer(index, kind, channels, out, bias=index in _BIASED or f"{prefix}.bias" in state)
    if kind == "mem":
        out = _out_channels(state, name, f"{prefix}.conv.0.weight")
        skip = f"{prefix}.skip.weight" in state
        if not skip and out != channels:
            raise FastDecoderError(f"{name} does not have the TAEHV decoder layout ({prefix} turns {channels} "
                                   f"channels into {out} without a skip conv): use an unmodified taew2_1 or taew2_2 file")
        return DecoderLayer(index, kind, channels, out, skip=skip)
    if kind == "tgrow":
        out = _out_channels(state, name, f"{prefix}.conv.weight")
        if out % channels:
            raise FastDecoderError(f"{name} does not have the TAEHV decoder layout ({prefix}.conv makes {out} "
                                   f"channels, not a multiple of {channels}): use an unmodified taew2_1 or taew2_2 file")
        return DecoderLayer(index, kind, channels, channels, stride=out // channels)
    return DecoderLayer(index, kind, channels, channels)


def _check_shapes(state: dict, name: str, layers: Sequence[DecoderLayer]) -> None:
    """Every key the layers need is there with its shape, and there is no other."""
    expected = {key: shape for layer in layers for key, shape in _layer_shapes(layer).items()}
    for key, shape in expected.items():
        if key not in state:
            raise _not_taehv(name, key)
        actual = tuple(state[key].shape)
        if actual != shape:
            raise FastDecoderError(f"{name} does not have the TAEHV decoder layout ({key} has shape {list(actual)} "
                                   f"where {list(shape)} fits): use an unmodified taew2_1 or taew2_2 file")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise FastDecoderError(f"{name} does not have the TAEHV decoder layout (it has a key {unexpected[0]} that "
                               f"no TAEHV decoder has): use an unmodified taew2_1 or taew2_2 file")


def _layers_of(state: dict, name: str) -> tuple[DecoderLayer, ...]:
    """The decoder's layers read from its weights, the whole layout checked."""
    for key in (SIGNATURE_KEY, "decoder.1.weight"):
        if key not in state:
            raise _not_taehv(name, key)
    first = tuple(state["decoder.1.weight"].shape)
    if len(first) != 4:
        raise FastDecoderError(f"{name} does not have the TAEHV decoder layout (decoder.1.weight has shape "
                               f"{list(first)}, not a conv weight): use an unmodified taew2_1 or taew2_2 file")
    layers, width = [], first[1]
    for index, kind in enumerate(_LAYOUT):
        layers.append(_read_layer(state, name, index, kind, width))
        width = layers[-1].channels_out
    _check_shapes(state, name, layers)
    patch = math.isqrt(width // 3)
    if width != 3 * patch * patch:
        raise FastDecoderError(f"{name} makes {width} output channels, not 3 colours times a square patch: "
                               f"use an unmodified taew2_1 or taew2_2 file")
    return tuple(layers)


def _info_of(path: Path, state: dict, layers: Sequence[DecoderLayer], vae_space_latents: bool | None) -> FastDecoderInfo:
    if vae_space_latents is None:
        vae_space_latents = path.name.lower().startswith("light")
    return FastDecoderInfo(
        path=path, latent_channels=layers[1].channels_in, patch_size=math.isqrt(layers[-1].channels_out // 3),
        time_strides=tuple(layer.stride for layer in layers if layer.kind == "tgrow"),
        vae_space_latents=bool(vae_space_latents), parameters=sum(int(t.numel()) for t in state.values()))


def load_tensors(path: Path) -> dict:
    """The tensors of a .safetensors or .pth file on the CPU as stored, read as data only
    (engine/models/safe_weights.py: a TorchScript program or a pickle of other objects is WeightFileError in a
    sentence of ours). Decoder files of either kind use it."""
    return read_tensors(path)


def fetch_once(repo: str, name: str, folder: Path, what: str, where: str, offline: bool, error: type) -> Path:
    """``name`` from the Hub repo ``repo`` downloaded into ``folder``; ``error`` (a ValueError kind) saying
    ``where`` to put it by hand when the app is offline or the download fails."""
    if offline:
        raise error(f"no {what} is on disk and the app is offline: {where}")
    try:
        from huggingface_hub import hf_hub_download

        folder.mkdir(parents=True, exist_ok=True)
        return Path(hf_hub_download(repo, name, local_dir=folder))
    except Exception as exc:   # no network, no such file: the user can still place it by hand
        raise error(f"the {what} could not be downloaded ({type(exc).__name__}): {where}") from exc


def read_fast_decoder(path: Path | str, vae_space_latents: bool | None = None) -> tuple[FastDecoderInfo, dict]:
    """The decoder's description and its ``decoder.*`` tensors (on the CPU, as stored); the layout is checked.

    ``vae_space_latents`` None: the decoder takes the VAE's own latents when its file name starts with
    "light" (LightX2V's files), the transformer's normalised latents otherwise.
    """
    info, state, _ = read_fast_decoder_layers(Path(path), vae_space_latents)
    return info, state



def read_fast_decoder_layers(path: Path,
                             vae_space_latents: bool | None) -> tuple[FastDecoderInfo, dict, tuple[DecoderLayer, ...]]:
    """read_fast_decoder, and the layers it found (what engine/run/fast_decoder.py's load_fast_decoder builds)."""
    import torch

    if not path.is_file():
        raise FastDecoderError(f"there is no fast decoder file at {path}: put taew2_1.safetensors (Wan2.1, "
                               f"Wan2.2-A14B) or taew2_2.safetensors (Wan2.2-5B) from {FAST_DECODER_HUB_REPO} there")
    if path.suffix not in FAST_DECODER_SUFFIXES:
        raise FastDecoderError(f"{path.name} is not a .safetensors or .pth file: use taew2_1 or taew2_2 "
                               f"as .safetensors or .pth")
    try:
        loaded = load_tensors(path)
    except WeightFileError as exc:
        raise FastDecoderError(f"the fast decoder {path.name} cannot be used: {exc}; {DOWNLOAD_AGAIN}") from None
    except Exception as exc:  # noqa: BLE001 - any reading error means the same thing: a damaged or other file
        # Only the error's kind: its words may quote the file's bytes (pickle's "invalid load key, '\x8f'").
        raise FastDecoderError(f"the fast decoder {path.name} could not be read as weights ({type(exc).__name__}): "
                               f"{DOWNLOAD_AGAIN}") from None
    state = {key: value for key, value in loaded.items()
             if isinstance(key, str) and key.startswith("decoder.") and isinstance(value, torch.Tensor)}
    layers = _layers_of(state, path.name)
    problem = scan(sorted(state.items())).problem(f"the fast decoder {path.name}", DOWNLOAD_AGAIN)
    if problem:
        raise FastDecoderError(problem)
    return _info_of(path, state, layers, vae_space_latents), state, layers


def check_matches(info: FastDecoderInfo, z_dim: int) -> None:
    """Refuses a decoder whose latent channels are not those of the model's VAE (``z_dim``)."""
    if info.latent_channels == z_dim:
        return
    family = LATENT_FAMILIES.get(info.latent_channels)
    takes = f"{info.latent_channels}-channel latents" + (f" ({family})" if family else "")
    fits = FAST_DECODER_FILES.get(z_dim)
    change = f"use {fits}" if fits else "no published fast decoder fits it, decode with the VAE"
    raise FastDecoderError(f"this decoder ({info.name}) takes {takes}; the model makes {z_dim}-channel latents: "
                           f"{change}")


def find_fast_decoder(models_dir: Path | str, z_dim: int, model_folder: Path | str | None = None) -> Path | None:
    """The fast decoder file for a VAE of ``z_dim`` latent channels, if any: the model's own (a
    ``fast_decoder/`` folder inside the model's, as the self-test models have) before the shared
    ``<models_dir>/fast_decoders/``; the taew file before LightX2V's lighttaew one, .safetensors before .pth."""
    stem = FAST_DECODER_FILES.get(z_dim)
    if stem is None:
        return None
    folders = [Path(model_folder) / MODEL_OWN_FOLDER] if model_folder else []
    for folder in (*folders, Path(models_dir) / FAST_DECODER_FOLDER):
        for name in (stem, "light" + stem):
            for suffix in FAST_DECODER_SUFFIXES:
                if (folder / (name + suffix)).is_file():
                    return folder / (name + suffix)
    return None


def locate_fast_decoder(models_dir: Path | str, z_dim: int, model_folder: Path | str | None = None,
                        offline: bool = False) -> Path:
    """The fast decoder file for these latents: found on disk, else downloaded once from the Hub into
    ``<models_dir>/fast_decoders/``; FastDecoderError saying where to put one when neither works."""
    found = find_fast_decoder(models_dir, z_dim, model_folder)
    if found is not None:
        return found
    stem = FAST_DECODER_FILES.get(z_dim)
    folder = Path(models_dir) / FAST_DECODER_FOLDER
    if stem is None:
        raise FastDecoderError(f"no fast decoder is known for {z_dim}-channel latents: choose the VAE decoder")
    where = (f"put {stem}.safetensors (from {FAST_DECODER_HUB_REPO} on the Hugging Face Hub, or "
             f"{FAST_DECODER_SOURCE}) in {folder}, or choose the VAE decoder")
    return fetch_once(FAST_DECODER_HUB_REPO, f"{stem}.safetensors", folder, "fast decoder for this model", where,
                      offline, FastDecoderError)


def _published_layers(latent_channels: int, patch_size: int,
                      time_strides: Sequence[int] = _STRIDES) -> tuple[DecoderLayer, ...]:
    """The layers of a published file for these latents: the widths the real files have, and their time
    strides unless others are given."""
    if len(time_strides) != _LAYOUT.count("tgrow") or min(time_strides) < 1:
        raise ValueError(f"time strides {tuple(time_strides)}: give one of 1 or more per TGrow "
                         f"({_LAYOUT.count('tgrow')})")
    widths, strides = iter(_WIDTHS), iter(time_strides)
    layers, channels = [], latent_channels
    for index, kind in enumerate(_LAYOUT):
        if kind == "conv":
            out = 3 * patch_size ** 2 if index == len(_LAYOUT) - 1 else next(widths)
            layers.append(DecoderLayer(index, kind, channels, out, bias=index in _BIASED))
        else:
            layers.append(DecoderLayer(index, kind, channels, channels, stride=next(strides) if kind == "tgrow" else 1))
        channels = layers[-1].channels_out
    return tuple(layers)


def random_fast_decoder_state(latent_channels: int = 16, patch_size: int = 1, seed: int = 0,
                              dtype: Any = None, time_strides: Sequence[int] = _STRIDES) -> dict:
    """A decoder with random weights in the full published layout (and, as the real files have, an encoder
    key), for tests and the self-test model: about 10M parameters, scaled so the frames are neither flat
    nor saturated. ``dtype`` None: float32. ``time_strides``: the published (1, 2, 2) unless a test wants
    another order (the reader takes them from the weights)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    state = {}
    for layer in _published_layers(latent_channels, patch_size, time_strides):
        for key, shape in _layer_shapes(layer).items():
            if key.endswith("bias"):
                value = torch.randn(shape, generator=generator) * 0.02
            else:
                fan_in = math.prod(shape[1:])
                value = torch.randn(shape, generator=generator) * (0.7 / fan_in) ** 0.5
            state[key] = value
    state[f"decoder.{len(_LAYOUT) - 1}.bias"] += 0.5  # frames around mid-grey, so both ends stay reachable
    state["encoder.0.weight"] = torch.randn((64, 3 * patch_size ** 2, 3, 3), generator=generator) * 0.1
    return {key: value.to(dtype or torch.float32) for key, value in state.items()}


def write_fast_decoder(path: Path | str, state_dict: dict) -> Path:
    """Saves a decoder's tensors: .safetensors (what the app reads first), or .pth / .pt."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {key: value.detach().contiguous().cpu() for key, value in state_dict.items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(tensors, str(path))
    else:
        torch.save(tensors, path)
    return path
