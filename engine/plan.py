"""The memory plan: where each part of the pipeline runs, and why.

``make_plan`` is a pure function of the hardware and the model's component
sizes, so it is tested without a GPU. This first planner chooses among
whole-model placements; a finer per-phase budget can replace it behind the
same ``Plan`` shape.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .hardware import GIB, HardwareProfile

# Keep this much device memory free for the desktop, the allocator and activations.
DEVICE_MARGIN_FRACTION = 0.15
# Below this much device memory the VAE decode of a full clip does not fit untiled.
VAE_TILING_BELOW_GB = 16.0
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
MODEL_COMPONENTS = ("transformer", "transformer_2", "text_encoder", "image_encoder", "vae")


@dataclass(frozen=True)
class Plan:
    device: str                 # torch device for compute
    dtype: str                  # transformer / encoder compute dtype
    vae_dtype: str
    offload: str                # "none", "model" (whole components moved in turn)
    vae_tiling: bool
    weights_gb: float           # weights at the compute dtype
    decisions: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)


def safetensors_params(path: Path) -> int:
    """Number of parameters in a safetensors file, read from its header only."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in info["shape"]:
            count *= dim
        total += count
    return total


def component_params(folder: Path) -> dict[str, int]:
    """Parameter count per weighted component of a diffusers folder (headers only, no weights loaded)."""
    counts = {}
    for name in MODEL_COMPONENTS:
        files = sorted((Path(folder) / name).glob("*.safetensors"))
        if files:
            counts[name] = sum(safetensors_params(f) for f in files)
    return counts


def _compute_dtype(hw: HardwareProfile) -> str:
    if hw.backend in ("cuda", "rocm"):
        return "bfloat16"
    if hw.backend == "mps":
        return "float16"
    return "float32"


def make_plan(hw: HardwareProfile, params: dict[str, int], *, force_offload: bool | None = None) -> Plan:
    """Choose device, dtypes and offloading for a model with ``params`` parameters per component."""
    decisions: list[str] = []
    dtype = _compute_dtype(hw)
    bytes_per = 4 if dtype == "float32" else 2
    vae_params = params.get("vae", 0)
    weights = (sum(params.values()) - vae_params) * bytes_per + vae_params * 4
    weights_gb = round(weights / GIB, 3)
    if hw.device == "cpu":
        decisions.append(f"No GPU found: everything runs on the CPU in {dtype} (slow, but it works).")
        return Plan("cpu", dtype, "float32", "none", False, weights_gb, tuple(decisions))

    decisions.append(f"{hw.device_name} via {hw.backend.upper()}: computing in {dtype}, VAE in float32 for clean colours.")
    budget = hw.vram_free_gb * (1 - DEVICE_MARGIN_FRACTION)
    offload = "none"
    if force_offload is True or (force_offload is None and weights_gb > budget):
        if hw.unified_memory and hw.ram_available_gb < weights_gb:
            decisions.append(
                f"Weights need {weights_gb:.1f} GB, more than the {budget:.1f} GB device budget, but only "
                f"{hw.ram_available_gb:.1f} GB RAM is left to the OS: offloading to RAM would fail, so everything stays on the device.")
        else:
            offload = "model"
            decisions.append(
                f"Weights need {weights_gb:.1f} GB but {budget:.1f} GB of device memory may be used: "
                "each component moves to the device only while it runs (model offload).")
    else:
        decisions.append(
            f"Weights need {weights_gb:.1f} GB of the {budget:.1f} GB device budget: everything stays on the device.")
    vae_tiling = hw.vram_total_gb < VAE_TILING_BELOW_GB
    if vae_tiling:
        decisions.append(f"Device has under {VAE_TILING_BELOW_GB:.0f} GB: the VAE decodes in tiles to cap its peak.")
    return Plan(hw.device, dtype, "float32", offload, vae_tiling, weights_gb, tuple(decisions))
