"""Weight files read as data, never as code.

People put files from anywhere into the models folder: upscalers, interpolators, fast decoders, light VAEs. A
``.safetensors`` file holds tensors only. A ``.pth``/``.pt``/``.ckpt`` file is a pickle, which can name any Python
callable to run while it is read, or a TorchScript archive, a whole program that torch runs as it loads it
(``torch.load`` hands such an archive to ``torch.jit.load`` unless asked for weights only, and spandrel's loader does
not ask). Here a pickle is read only by torch's weights-only unpickler, and a TorchScript archive is refused from its
zip's table of contents before any loader opens it. Every file of that kind in the app goes through ``read_tensors``.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

from engine.models.weights import WeightFileError, read_header

PICKLE_SUFFIXES = (".pth", ".pt", ".ckpt", ".pkl", ".bin")
TENSOR_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)
# What the app asks for instead, in every refusal.
CONVERT = "use the model's .safetensors file (or a .pth that holds its weights alone)"


def is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive: a zip whose entries hold code (``<name>/code/``) or the constants
    table TorchScript writes beside it, which no file of weights has. Only the zip's directory is read."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    return any("/code/" in name or name.endswith("constants.pkl") for name in names)


def read_tensors(path: Path | str) -> dict:
    """The tensors of a weights file by name, on the CPU, as stored (a pickle's dict under "state_dict", "params_ema",
    "params" or "model" taken out); WeightFileError saying what the file is and what to use instead when it is not
    plain weights (a program, a pickle of other objects, a damaged or unknown file)."""
    import pickle

    import torch

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        read_header(path)   # a file that is no safetensors one, or one cut short, said in a sentence of ours
        return load_file(str(path), device="cpu")
    if suffix not in PICKLE_SUFFIXES:
        raise WeightFileError(f"{suffix or 'a file without a suffix'} is not a weights file the app reads: {CONVERT}")
    if is_torchscript(path):
        raise WeightFileError(f"it is a TorchScript program, which runs its own code when it is loaded, not a file "
                              f"of weights; the app does not load it: {CONVERT}")
    try:
        loaded = torch.load(path, weights_only=True, map_location="cpu")
    except MemoryError:
        raise
    except pickle.UnpicklingError as exc:
        if _pickled(path):   # a pickle the weights-only unpickler refused: it holds something other than tensors
            raise WeightFileError(f"it holds more than tensors: Python objects that could run code when read "
                                  f"({type(exc).__name__}); the app reads weights only: {CONVERT}") from None
        raise WeightFileError(f"it cannot be read as weights ({type(exc).__name__}): it is damaged or cut short, or "
                              f"no weights file; download it again, or {CONVERT}") from None
    except Exception as exc:  # noqa: BLE001 - any other reading error: a damaged file, or no pickle at all
        # Only the error's kind: its words may quote the file's bytes (pickle's "invalid load key, '\x8f'").
        raise WeightFileError(f"it cannot be read as weights ({type(exc).__name__}): it is damaged or cut short, "
                              f"or no weights file; download it again, or {CONVERT}") from None
    return _tensors_of(loaded)


def _pickled(path: Path) -> bool:
    """Whether the file is a pickle at all: torch.save's zip, or a bare pickle (its protocol mark first)."""
    with open(path, "rb") as file:
        return zipfile.is_zipfile(path) or file.read(1) == b"\x80"


def _tensors_of(loaded) -> dict:
    """The dict of tensors a weights pickle holds, unwrapped from the containers training tools save them in."""
    import torch

    for key in ("state_dict", "params_ema", "params", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            loaded = loaded[key]
            break
    if not isinstance(loaded, dict):
        return {}
    return {key: value for key, value in loaded.items() if isinstance(key, str) and isinstance(value, torch.Tensor)}
