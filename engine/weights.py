"""Sizes of weights on disk, read from safetensors headers only (no tensor is loaded)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

WEIGHTED_COMPONENTS = ("transformer", "transformer_2", "text_encoder", "image_encoder", "vae")


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def safetensors_tensor_params(folder: Path) -> dict[str, int]:
    """Parameter count of every tensor in the ``*.safetensors`` files of ``folder``."""
    counts: dict[str, int] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        for name, info in _header(path).items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info["shape"]:
                count *= dim
            counts[name] = count
    return counts


def component_params(folder: Path) -> dict[str, int]:
    """Parameter count per weighted component of a diffusers folder."""
    counts = {}
    for name in WEIGHTED_COMPONENTS:
        part = Path(folder) / name
        if part.is_dir() and any(part.glob("*.safetensors")):
            counts[name] = sum(safetensors_tensor_params(part).values())
    return counts
