"""Denoised latents kept beside the outputs, so a failed decode never costs the denoising again.

A ``.latents.safetensors`` file is written atomically before the VAE decode, with the request and
the model in its metadata. Latents of failed runs stay until the user removes them; latents of
finished runs are removed after a configurable time unless the request asked to keep them. Only latents
that ``bundle.listed`` finds are listed, decoded again or removed: none behind a link.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from engine.atomic import write_atomically
from engine.errors import InputError
from engine.models.weights import read_header
from engine.outputs.bundle import LATENTS_SUFFIX, Bundle, listed

DEFAULT_KEEP_HOURS = 24.0
DECODE_AGAIN_HINT = ("The denoised latents were saved: use Decode again (tiled, or on the CPU) "
                     "to get the video without denoising again.")


def save_latents(latents, path: Path, metadata: dict) -> Path:
    """Write ``latents`` (a tensor) with ``metadata`` in the header, whole or not at all."""
    from safetensors.torch import save_file

    tensors = {"latents": latents.detach().to("cpu").contiguous()}
    header = {"wan_studio": json.dumps(metadata, default=str)}
    return write_atomically(path, lambda temporary: save_file(tensors, str(temporary), metadata=header))


def saved_latents(outputs_dir: Path | str) -> list[Bundle]:
    """The outputs in ``outputs_dir`` (``<day>/<stem>``) that have saved latents, finished or not, newest first."""
    return [Bundle.from_latents(path) for path in listed(outputs_dir, LATENTS_SUFFIX)]


def read_metadata(path: Path) -> dict:
    """The metadata of a latents file, from its header only."""
    return json.loads(read_header(Path(path)).get("__metadata__", {}).get("wan_studio", "{}"))


def check_latents_file(path: Path | str) -> Path:
    """``path`` when it is a latents file the app saved (its header read, no tensor); InputError saying what to
    pick otherwise."""
    path = Path(path).expanduser()
    pick = (f"pick a *{LATENTS_SUFFIX} file from the outputs folder (a run saves one beside its video, and History "
            "lists them)")
    if not path.is_file():
        raise InputError(f"{path} does not exist; {pick}")
    if not path.name.endswith(LATENTS_SUFFIX):
        raise InputError(f"{path.name} is not saved latents; {pick}")
    try:
        holds = "latents" in read_header(path)
    except (OSError, ValueError):
        holds = False
    if not holds:
        raise InputError(f"{path.name} is not latents this app saved (its header is not one), or it is damaged; {pick}")
    return path


def load_latents(path: Path):
    from safetensors.torch import load_file

    path = check_latents_file(path)
    return load_file(str(path))["latents"], read_metadata(path)


def cleanup_latents(outputs_dir: Path, keep_hours: float, now: float | None = None) -> list[Path]:
    """Remove latents of finished runs older than ``keep_hours``; keep failed runs' and kept ones."""
    now = time.time() if now is None else now
    removed = []
    for bundle in saved_latents(outputs_dir):
        path = bundle.latents
        try:
            if not bundle.has_media() or now - path.stat().st_mtime < keep_hours * 3600 or _kept(path):
                continue
            path.unlink(missing_ok=True)
        except OSError:   # gone meanwhile, or not ours to remove: the next clean-up tries again
            continue
        removed.append(path)
    return removed


def _kept(path: Path) -> bool:
    """The run asked to keep its latents (a file whose metadata cannot be read is not kept)."""
    try:
        return bool(read_metadata(path).get("keep"))
    except (OSError, ValueError):
        return False
