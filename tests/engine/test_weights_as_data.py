"""Model files that hold code are never run: a TorchScript program (whose ``__setstate__`` runs as it loads) or a
pickle of other objects, put where an upscaler, RIFE, a fast decoder or a light VAE is looked for, under any of the
names those take, is refused in a sentence before any loader sees it; plain weights in the same places still load."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from engine.models.safe_weights import is_torchscript, read_tensors
from engine.models.weights import WeightFileError

SAID = "CODE RAN WHILE LOADING"


def _program(path: Path) -> Path:
    """A TorchScript archive with one 3x3 convolution's weight whose loading prints SAID (its own code)."""
    import torch

    class Program(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(3, 3, 3, 3))

        def forward(self, x):
            return x

        @torch.jit.export
        def __getstate__(self):
            return (self.weight, self.training)

        @torch.jit.export
        def __setstate__(self, state: tuple[torch.Tensor, bool]):
            print("CODE RAN WHILE LOADING")
            self.weight = state[0]
            self.training = state[1]

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(Program()).save(str(path))
    return path


class _Runs:
    def __reduce__(self):
        return (os.system, ("echo CODE RAN WHILE LOADING",))


def _plain_pickle(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"weight": _Runs()}))
    return path


def test_spandrel_s_own_reader_would_run_the_program(tmp_path, capfd):
    """What the guard is for: the loader the upscalers used runs a .pt file's code."""
    from engine.post.upscale import _import_spandrel

    path = _program(tmp_path / "x.pt")
    with pytest.raises(Exception):
        _import_spandrel().ModelLoader().load_from_file(path)
    assert SAID in capfd.readouterr().out


@pytest.mark.parametrize("name", ["x.pt", "RealESRGAN_x4plus.pth", "model.ckpt"])
def test_an_upscaler_file_that_is_a_program_is_refused_and_not_run(name, tmp_path, capfd):
    from engine.errors import ModelError
    from engine.post.upscale import find_upscaler, load_upscaler

    path = _program(tmp_path / "models" / "upscalers" / name)
    assert is_torchscript(path) and find_upscaler(path.parent) == path
    with pytest.raises(ModelError, match=rf"upscalers/{name} is not an upscaler model .*TorchScript program, which "
                                         r"runs its own code when it is loaded.*\.safetensors"):
        load_upscaler(path)
    assert SAID not in capfd.readouterr().out


@pytest.mark.parametrize("make", [_program, _plain_pickle], ids=["program", "pickle"])
def test_rife_fast_decoders_and_light_vaes_refuse_code_too(make, tmp_path, capfd):
    from engine.models.fast_decoder_file import FastDecoderError, read_fast_decoder
    from engine.models.light_vae_file import LightVaeError, read_light_vae
    from engine.post.rife import load_rife

    with pytest.raises(ValueError, match="could not be read as RIFE weights: .*safetensors"):
        load_rife(make(tmp_path / "interpolators" / "rife49.pth"))
    with pytest.raises(FastDecoderError, match="cannot be used: .*safetensors"):
        read_fast_decoder(make(tmp_path / "fast_decoders" / "taew2_1.pth"))
    with pytest.raises(LightVaeError, match="cannot be used: .*safetensors"):
        read_light_vae(make(tmp_path / "fast_decoders" / "lightvaew2_1.pth"), {"dim_mult": [1, 2, 4, 4],
                                                                             "num_res_blocks": 2, "z_dim": 16})
    assert SAID not in capfd.readouterr().out


def test_plain_weights_still_read_from_either_kind_of_file(tmp_path):
    import torch
    from safetensors.torch import save_file

    weights = {"conv.weight": torch.ones(2, 2), "conv.bias": torch.zeros(2)}
    torch.save({"params_ema": weights}, tmp_path / "esrgan.pth")
    save_file(weights, tmp_path / "esrgan.safetensors")
    for path in (tmp_path / "esrgan.pth", tmp_path / "esrgan.safetensors"):
        read = read_tensors(path)
        assert read.keys() == weights.keys() and all(torch.equal(read[k], weights[k]) for k in weights)
    assert not is_torchscript(tmp_path / "esrgan.pth")        # torch.save's own zip is no program
    with pytest.raises(WeightFileError, match=r"\.onnx is not a weights file the app reads"):
        read_tensors(tmp_path / "esrgan.onnx")


def test_a_real_upscaler_from_a_weights_only_pth_still_upscales(tmp_path):
    """A Real-ESRGAN-shaped state dict saved by torch.save loads through the guarded path and runs."""
    import numpy as np
    import torch

    from engine.post.upscale import _import_spandrel, load_upscaler

    spandrel = _import_spandrel()
    from spandrel.architectures.ESRGAN import ESRGAN, ESRGANArch

    net = ESRGAN(in_nc=3, out_nc=3, num_filters=8, num_blocks=1, scale=2)
    torch.save(net.state_dict(), tmp_path / "tiny_x2.pth")
    upscaler = load_upscaler(tmp_path / "tiny_x2.pth")
    assert isinstance(upscaler.model, spandrel.ImageModelDescriptor) and upscaler.model.scale == 2
    assert isinstance(upscaler.model.architecture, ESRGANArch)
    frames = upscaler.upscale(np.zeros((1, 8, 8, 3), dtype=np.uint8), 2)
    assert frames.shape == (1, 16, 16, 3)
