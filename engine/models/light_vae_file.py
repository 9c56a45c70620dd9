"""The light VAE's files: LightX2V's ``lightvaew2_1``, a Wan2.1 VAE with three quarters of every layer's channels
pruned away (base width 24 where the released VAE has 96: 8.0M parameters against 126.9M), trained to decode the
same latents. It is the model's own VAE architecture at a smaller width, so it runs through the same decode code
(streamed, tiled, on the CPU) as diffusers' AutoencoderKLWan built at that width; the file keeps Wan's original
key layout (``decoder.conv1``, ``decoder.upsamples.4.residual.2``, ``conv2``), turned into diffusers' names here.

Where it is looked for, how its layout is read and checked against the model's VAE, and writing one (the
self-test models carry a random one; tests write others). The decode that uses it is engine/run/decode_stage.py.
Torch and diffusers are imported inside the functions (the page and the planner start without them).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.models.fast_decoder_file import FAST_DECODER_FOLDER, FAST_DECODER_SUFFIXES, fetch_once, load_tensors
from engine.models.finite import scan
from engine.models.weights import WeightFileError

# Latent channels of the model's VAE -> LightX2V's light VAE for them (none is published for Wan2.2-5B's 48).
LIGHT_VAE_FILES = {16: "lightvaew2_1"}
LIGHT_VAE_HUB_REPO = "lightx2v/Autoencoders"
# A model folder may carry its own light VAE here (the self-test models do); else <models>/fast_decoders/.
MODEL_OWN_FOLDER = "light_vae"
DOWNLOAD_AGAIN = f"download lightvaew2_1.safetensors again from {LIGHT_VAE_HUB_REPO}, or choose the VAE decoder"
# Names of a residual block's layers: Wan's ``residual`` Sequential (RMS norm, SiLU, conv, RMS norm, SiLU,
# dropout, conv) and its ``shortcut``, against diffusers' WanResidualBlock.
_RESIDUAL = (("residual.0.gamma", "norm1.gamma"), ("residual.2.", "conv1."), ("residual.3.gamma", "norm2.gamma"),
             ("residual.6.", "conv2."), ("shortcut.", "conv_shortcut."))
_HEAD = (("head.0.gamma", "norm_out.gamma"), ("head.2.", "conv_out."))
_TOP = (("conv1.", "quant_conv."), ("conv2.", "post_quant_conv."))


class LightVaeError(ValueError):
    """A light VAE file that cannot be used here; the message says what to change."""


@dataclass(frozen=True)
class LightVaeInfo:
    """What a light VAE file is: its width, the latents it takes, its size."""
    path: Path
    base_dim: int
    z_dim: int
    parameters: int

    @property
    def name(self) -> str:
        return self.path.stem


# ----- key layout: Wan's original names <-> diffusers' -------------------------------------------------------

def _rename(rest: str, pairs) -> str | None:
    for old, new in pairs:
        if rest.startswith(old):
            return new + rest[len(old):]
    return None


def to_diffusers_key(key: str, num_res_blocks: int, stages: int) -> str | None:
    """diffusers' name of the original key ``key`` of a Wan VAE with ``num_res_blocks`` and ``stages`` (the
    length of dim_mult), or None for a key no Wan VAE has. The decoder's ``upsamples`` are one flat list of
    stages of num_res_blocks + 1 residual blocks and a Resample (none after the last); diffusers groups them."""
    top = _rename(key, _TOP)
    if top is not None:
        return top
    part, _, rest = key.partition(".")
    if part not in ("encoder", "decoder"):
        return None
    if rest.startswith("conv1."):
        return f"{part}.conv_in.{rest[len('conv1.'):]}"
    head = _rename(rest, _HEAD)
    if head is not None:
        return f"{part}.{head}"
    if rest.startswith("middle."):
        index, _, inner = rest[len("middle."):].partition(".")
        if index == "1":
            return f"{part}.mid_block.attentions.0.{inner}"
        if index in ("0", "2"):
            renamed = _rename(inner, _RESIDUAL)
            return None if renamed is None else f"{part}.mid_block.resnets.{int(index) // 2}.{renamed}"
        return None
    flat = "downsamples." if part == "encoder" else "upsamples."
    if not rest.startswith(flat):
        return None
    index, _, inner = rest[len(flat):].partition(".")
    if not index.isdigit():
        return None
    if part == "encoder":   # diffusers keeps the encoder's flat list, residual blocks renamed inside
        renamed = inner if inner.startswith(("resample.", "time_conv.")) else _rename(inner, _RESIDUAL)
        return None if renamed is None else f"encoder.down_blocks.{index}.{renamed}"
    stage, block = divmod(int(index), num_res_blocks + 2)
    if stage >= stages:
        return None
    if block == num_res_blocks + 1:
        if stage == stages - 1 or not inner.startswith(("resample.", "time_conv.")):
            return None
        return f"decoder.up_blocks.{stage}.upsamplers.0.{inner}"
    renamed = _rename(inner, _RESIDUAL)
    return None if renamed is None else f"decoder.up_blocks.{stage}.resnets.{block}.{renamed}"


def to_original_key(key: str, num_res_blocks: int) -> str:
    """The inverse of ``to_diffusers_key``: Wan's original name of a diffusers AutoencoderKLWan key (to write a
    file in the layout LightX2V publishes)."""
    for old, new in _TOP:
        if key.startswith(new):
            return old + key[len(new):]
    part, _, rest = key.partition(".")
    if rest.startswith("conv_in."):
        return f"{part}.conv1.{rest[len('conv_in.'):]}"
    for old, new in _HEAD:
        if rest.startswith(new):
            return f"{part}.{old}{rest[len(new):]}"
    backwards = tuple((new, old) for old, new in _RESIDUAL)
    if rest.startswith("mid_block.attentions.0."):
        return f"{part}.middle.1.{rest[len('mid_block.attentions.0.'):]}"
    if rest.startswith("mid_block.resnets."):
        index, _, inner = rest[len("mid_block.resnets."):].partition(".")
        return f"{part}.middle.{2 * int(index)}.{_rename(inner, backwards)}"
    if rest.startswith("down_blocks."):
        index, _, inner = rest[len("down_blocks."):].partition(".")
        renamed = inner if inner.startswith(("resample.", "time_conv.")) else _rename(inner, backwards)
        return f"encoder.downsamples.{index}.{renamed}"
    stage, _, inner = rest[len("up_blocks."):].partition(".")
    base = int(stage) * (num_res_blocks + 2)
    if inner.startswith("upsamplers.0."):
        return f"decoder.upsamples.{base + num_res_blocks + 1}.{inner[len('upsamplers.0.'):]}"
    block, _, inner = inner[len("resnets."):].partition(".")
    return f"decoder.upsamples.{base + int(block)}.{_rename(inner, backwards)}"


# ----- reading -------------------------------------------------------------------------------------------------

def read_light_vae(path: Path | str, vae_config: dict) -> tuple[LightVaeInfo, dict]:
    """(what the file is, its tensors under diffusers' names) for a model whose VAE has ``vae_config`` (diffusers'
    config: its dim_mult, num_res_blocks and z_dim are the light VAE's too, only the width differs). Every
    decoder key the model's architecture has at the file's width must be there with its shape, and every value
    finite; the encoder's keys may be missing (the decode never uses them). LightVaeError otherwise."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise LightVaeError(f"there is no light VAE file at {path}: put lightvaew2_1.safetensors (Wan2.1, "
                            f"Wan2.2-A14B) from {LIGHT_VAE_HUB_REPO} there, or choose the VAE decoder")
    if path.suffix not in FAST_DECODER_SUFFIXES:
        raise LightVaeError(f"{path.name} is not a .safetensors or .pth file: use lightvaew2_1.safetensors")
    try:
        loaded = load_tensors(path)
    except WeightFileError as exc:
        raise LightVaeError(f"the light VAE {path.name} cannot be used: {exc}; {DOWNLOAD_AGAIN}") from None
    except Exception as exc:  # noqa: BLE001 - any reading error means the same: a damaged or another kind of file
        raise LightVaeError(f"the light VAE {path.name} could not be read as weights ({type(exc).__name__}): "
                            f"{DOWNLOAD_AGAIN}") from None
    tensors = {k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    first = tensors.get("decoder.conv1.weight")
    if first is None or first.dim() != 5:
        raise LightVaeError(f"{path.name} is not a Wan VAE in its original layout (it has no 3-D convolution "
                            f"decoder.conv1.weight, which every one has): use lightvaew2_1.safetensors from "
                            f"{LIGHT_VAE_HUB_REPO}")
    mult, blocks = list(vae_config["dim_mult"]), int(vae_config["num_res_blocks"])
    width, z_dim = int(first.shape[0]), int(first.shape[1])
    if z_dim != int(vae_config["z_dim"]):
        raise LightVaeError(f"this light VAE ({path.name}) takes {z_dim}-channel latents; the model makes "
                            f"{vae_config['z_dim']}-channel ones: it fits Wan2.1 and Wan2.2-A14B only, choose "
                            "the VAE decoder")
    if width % mult[-1]:
        raise LightVaeError(f"{path.name}'s first decoder layer has {width} channels, not a multiple of "
                            f"{mult[-1]} as this VAE's layout needs: {DOWNLOAD_AGAIN}")
    renamed, unknown = {}, []
    for key, value in tensors.items():
        new = to_diffusers_key(key, blocks, len(mult))
        (unknown.append(key) if new is None else renamed.__setitem__(new, value))
    if unknown:
        raise LightVaeError(f"{path.name} does not fit this model's VAE (it has a key {sorted(unknown)[0]} that "
                            f"this VAE's layout has not): {DOWNLOAD_AGAIN}")
    info = LightVaeInfo(path, width // mult[-1], z_dim, sum(int(t.numel()) for t in tensors.values()))
    _check_shapes(renamed, light_vae_config(vae_config, info.base_dim), path.name)
    problem = scan(sorted(renamed.items())).problem(f"the light VAE {path.name}", DOWNLOAD_AGAIN)
    if problem:
        raise LightVaeError(problem)
    return info, renamed


def light_vae_config(vae_config: dict, base_dim: int) -> dict:
    """The model's VAE config at the light VAE's width (its latent statistics kept: it decodes the same latents)."""
    config = {k: v for k, v in dict(vae_config).items() if not k.startswith("_")}
    config.update(base_dim=base_dim, decoder_base_dim=None)
    return config


def build_light_vae(config: dict, state: dict | None = None, dtype: Any = None):
    """diffusers' AutoencoderKLWan from ``config`` (light_vae_config), its weights from ``state`` (diffusers' names;
    the encoder's may be missing), in ``dtype`` (None: float32), eval, no grads."""
    import torch
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_config(config)
    if state is not None:
        vae.load_state_dict(state, strict=False)
    # nn.Module's own cast: diffusers' warns of float32 modules this VAE does not have.
    return torch.nn.Module.to(vae, dtype=dtype or torch.float32).eval().requires_grad_(False)


def _check_shapes(state: dict, config: dict, name: str) -> None:
    """Every decoder key of the model's VAE at the light width is in ``state`` with its shape; so is every
    encoder key the file has."""
    import torch

    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build_light_vae(config).state_dict().items()}
    for key, shape in expected.items():
        needed = not key.startswith(("encoder.", "quant_conv."))
        if key not in state:
            if needed:
                raise LightVaeError(f"{name} does not fit this model's VAE (it has no {key} at its width): "
                                    f"{DOWNLOAD_AGAIN}")
            continue
        if tuple(state[key].shape) != shape:
            raise LightVaeError(f"{name} does not fit this model's VAE ({key} has shape {list(state[key].shape)} "
                                f"where {list(shape)} fits): {DOWNLOAD_AGAIN}")


# ----- finding and fetching ------------------------------------------------------------------------------------

def find_light_vae(models_dir: Path | str, z_dim: int, model_folder: Path | str | None = None) -> Path | None:
    """The light VAE for a VAE of ``z_dim`` latent channels, if any is on disk: the model's own (``light_vae/`` in
    its folder, as the self-test models have) before ``<models_dir>/fast_decoders/``; .safetensors before .pth."""
    stem = LIGHT_VAE_FILES.get(z_dim)
    if stem is None:
        return None
    folders = [Path(model_folder) / MODEL_OWN_FOLDER] if model_folder else []
    for folder in (*folders, Path(models_dir) / FAST_DECODER_FOLDER):
        for suffix in FAST_DECODER_SUFFIXES:
            if (folder / (stem + suffix)).is_file():
                return folder / (stem + suffix)
    return None


def locate_light_vae(models_dir: Path | str, z_dim: int, model_folder: Path | str | None = None,
                     offline: bool = False) -> Path:
    """The light VAE for these latents: found on disk, else downloaded once into ``<models_dir>/fast_decoders/``;
    LightVaeError saying where to put one when neither works, or that none fits this model."""
    found = find_light_vae(models_dir, z_dim, model_folder)
    if found is not None:
        return found
    stem = LIGHT_VAE_FILES.get(z_dim)
    if stem is None:
        raise LightVaeError(f"no light VAE is published for {z_dim}-channel latents (Wan2.2-5B): choose the VAE "
                            "or the fast decoder")
    folder = Path(models_dir) / FAST_DECODER_FOLDER
    where = (f"put {stem}.safetensors (from {LIGHT_VAE_HUB_REPO} on the Hugging Face Hub) in {folder}, or choose the "
             "VAE decoder")
    return fetch_once(LIGHT_VAE_HUB_REPO, f"{stem}.safetensors", folder, "light VAE", where, offline, LightVaeError)


# ----- writing -------------------------------------------------------------------------------------------------

def light_vae_state(vae) -> dict:
    """A diffusers AutoencoderKLWan's tensors under Wan's original names, as LightX2V's files hold them."""
    blocks = int(vae.config.num_res_blocks)
    return {to_original_key(k, blocks): v.detach() for k, v in vae.state_dict().items()}


def write_light_vae(path: Path | str, vae) -> Path:
    """Saves ``vae`` (diffusers' AutoencoderKLWan) in the original layout: .safetensors, or .pth / .pt."""
    from engine.models.fast_decoder_file import write_fast_decoder

    return write_fast_decoder(path, light_vae_state(vae))


def random_light_vae(vae_config: dict, base_dim: int, seed: int = 0):
    """A light VAE for a model whose VAE has ``vae_config``, at ``base_dim``, with diffusers' random weights."""
    import torch

    torch.manual_seed(seed)
    return build_light_vae(light_vae_config(vae_config, base_dim))
