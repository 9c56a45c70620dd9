"""Denoised latents kept beside the outputs, so a failed decode never costs the denoising again.

A ``.latents.safetensors`` file is written atomically before the VAE decode, with the request and
the model in its metadata. Latents of failed runs stay until the user removes them; latents of
finished runs are removed after a configurable time unless the request asked to keep them.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

SUFFIX = ".latents.safetensors"
DEFAULT_KEEP_HOURS = 24.0
DECODE_AGAIN_HINT = ("The denoised latents were saved: use Decode again (tiled, or on the CPU) "
                     "to get the video without denoising again.")


def latents_path(stem: Path) -> Path:
    return stem.with_name(stem.name + SUFFIX)


def stem_of(path: Path) -> Path:
    """The output stem a latents file belongs to (the same name without the suffix)."""
    path = Path(path)
    return path.with_name(path.name[: -len(SUFFIX)]) if path.name.endswith(SUFFIX) else path.with_suffix("")


def save_latents(latents, path: Path, metadata: dict) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        save_file({"latents": latents.detach().to("cpu").contiguous()}, str(tmp),
                  metadata={"wan_studio": json.dumps(metadata, default=str)})
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def read_metadata(path: Path) -> dict:
    """The metadata of a latents file, from its header only."""
    from engine.models.weights import _header

    return json.loads(_header(Path(path)).get("__metadata__", {}).get("wan_studio", "{}"))


def load_latents(path: Path):
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file() or not path.name.endswith(SUFFIX):
        raise FileNotFoundError(f"{path} is not a saved latents file (*{SUFFIX})")
    return load_file(str(path))["latents"], read_metadata(path)


def cleanup_latents(outputs_dir: Path, keep_hours: float, now: float | None = None) -> list[Path]:
    """Remove latents of finished runs older than ``keep_hours``; keep failed runs' and kept ones."""
    now = time.time() if now is None else now
    removed = []
    for path in Path(outputs_dir).glob(f"*/*{SUFFIX}"):
        stem = stem_of(path)
        finished = stem.with_suffix(".mp4").exists() or stem.with_suffix(".png").exists()
        if not finished or now - path.stat().st_mtime < keep_hours * 3600:
            continue
        try:
            if read_metadata(path).get("keep"):
                continue
        except (OSError, ValueError):
            pass
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed
