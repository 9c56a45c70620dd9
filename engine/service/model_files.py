"""The models on this machine, for the Models tab: what the Hugging Face cache and the app's models folder hold,
each with its size on disk, its kind and the presets that use it; and deleting one, never outside those two
folders (links followed), never one that a running job uses and never one that a loaded pipeline holds (its
folder, transformer files, LoRAs and fast decoders, on any engine).

Reads only names, sizes and small JSON files: no weights, no network.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from engine.folders import inside
from engine.models.download import size_words
from engine.models.fast_decoder_file import FAST_DECODER_FOLDER, FAST_DECODER_SUFFIXES
from engine.models.refs import WEIGHT_SUFFIXES, has_weights, hub_cache_dir
from engine.errors import ModelError
from engine.models.selftest import SELFTEST_REFS
from engine.models.single_file import TRANSFORMERS_FOLDER
from engine.settings.loras import LORAS_FOLDER
from engine.models.single_file import TRANSFORMER_FILE_SUFFIXES
from engine.settings.values import Settings

HUB, LOCAL = "hub", "models"          # the two places, as the first part of an entry's key
# What an entry is, as the tab shows it.
HUB_MODEL = "diffusers model (Hub)"
# A repository read before its weights download (its JSON files alone: a download refused, or cut before its weights).
HUB_DESCRIPTION = "description only (Hub; weights not downloaded)"
HUB_REPO = "Hub repo"
MODEL_FOLDER = "diffusers model folder"
SELFTEST_MODEL = "self-test model"
TRANSFORMER_FILE = "transformer file"
LORA = "LoRA"
FAST_DECODER = "fast decoder"
LIGHT_VAE = "light VAE"
OTHER = "other"


class DeleteRefused(ModelError):
    """A delete that may not happen; the message says why."""


@dataclass(frozen=True)
class LoadedFiles:
    """What an engine process's loaded pipeline holds, as it says (engine/service/worker.py): the model's
    reference (None: nothing loaded) and the paths of its folder, transformer files, LoRAs, fast decoders and light
    VAEs."""
    model: str | None
    paths: tuple[str, ...]

    def holds(self, path: Path) -> bool:
        """Whether ``path`` (a file, or a folder: anything in it) is one of these files, links followed."""
        return any(inside(held, path) for held in self.paths)


@dataclass(frozen=True)
class ModelEntry:
    key: str                    # "hub:org/name" or "models:<path inside the models folder>", unique
    name: str                   # a repo id, or the path inside the models folder
    kind: str
    path: Path                  # the folder or file on disk
    size_bytes: int
    presets: tuple[str, ...] = ()

    @property
    def place(self) -> str:
        return self.key.split(":", 1)[0]


def disk_size(path: Path) -> int:
    """Bytes on disk under ``path`` (a file or a folder), links not followed (the Hub cache's snapshots link to
    its blobs, which count once)."""
    if path.is_symlink() or path.is_file():
        return 0 if path.is_symlink() else path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            file = Path(root, name)
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def hub_entries(cache_dir: Path | None = None) -> list[ModelEntry]:
    """The model repos in the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, read at call time)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    try:
        scanned = scan_cache_dir(cache)
    except CacheNotFound:
        return []
    entries = []
    for repo in sorted(scanned.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model":
            continue
        described = [rev.snapshot_path for rev in repo.revisions if (rev.snapshot_path / "model_index.json").is_file()]
        kind = (HUB_MODEL if any(has_weights(path) for path in described) else HUB_DESCRIPTION) if described \
            else HUB_REPO
        entries.append(ModelEntry(f"{HUB}:{repo.repo_id}", repo.repo_id, kind, Path(repo.repo_path),
                                  repo.size_on_disk))
    return entries


def _kind_of(path: Path, inside: str) -> str | None:
    """What a thing in the models folder is (None: not a model, such as the engine's own notes)."""
    if inside == LORAS_FOLDER:
        return LORA if path.suffix in WEIGHT_SUFFIXES else None
    if inside == FAST_DECODER_FOLDER:
        if path.suffix not in FAST_DECODER_SUFFIXES:
            return None
        return LIGHT_VAE if path.name.lower().startswith("lightvae") else FAST_DECODER
    if inside == TRANSFORMERS_FOLDER:
        return TRANSFORMER_FILE if path.is_file() and path.suffix in TRANSFORMER_FILE_SUFFIXES else None
    if path.is_dir():
        if (path / "model_index.json").is_file():
            return SELFTEST_MODEL if path.name in SELFTEST_REFS else MODEL_FOLDER
        return None
    return TRANSFORMER_FILE if path.suffix in TRANSFORMER_FILE_SUFFIXES else None


def local_entries(models_dir: Path) -> list[ModelEntry]:
    """The models folder's diffusers folders, single transformer files (transformers/, or loose at its top), LoRAs
    (loras/), fast decoders and light VAEs (fast_decoders/); hidden names (the engine's calibration) and unfinished
    downloads are left out."""
    models = Path(models_dir)
    found = []
    subfolders = (LORAS_FOLDER, FAST_DECODER_FOLDER, TRANSFORMERS_FOLDER)
    places = [(models, "")] + [(models / sub, sub) for sub in subfolders]
    for folder, inside in places:
        if not folder.is_dir():
            continue
        # transformers/ may hold files in folders of their own (as the page's Transformer file lists them)
        for path in sorted(folder.rglob("*") if inside == TRANSFORMERS_FOLDER else folder.iterdir()):
            if path.name.startswith(".") or (not inside and path.name in subfolders):
                continue
            kind = _kind_of(path, inside)
            if kind is not None:
                name = path.relative_to(models).as_posix()
                found.append(ModelEntry(f"{LOCAL}:{name}", name, kind, path, disk_size(path)))
    return found


def names_in(settings: Settings) -> tuple[str, ...]:
    """Every model, transformer file and LoRA file that ``settings`` names."""
    files = (settings.transformer, settings.transformer_2, *(lora.file for lora in settings.loras or ()))
    return tuple(name for name in (settings.model, *files) if name)


def named_by(entry: ModelEntry, name: str, models_dir: Path) -> bool:
    """Whether ``name`` (a repo id, a self-test model, a folder or file by its path or its name in the models
    folder or its loras/) means ``entry``."""
    if not isinstance(name, str) or not name.strip():
        return False
    name = name.strip()
    if entry.place == HUB:
        return name == entry.name
    if name == entry.name:
        return True
    candidates = (Path(name).expanduser(), Path(models_dir) / name, Path(models_dir) / LORAS_FOLDER / name)
    target = os.path.abspath(entry.path)
    return any(os.path.abspath(c) == target for c in candidates)


def list_models(models_dir: Path, presets: dict | None = None, cache_dir: Path | None = None) -> list[ModelEntry]:
    """The Hub cache's models, then the models folder's, each with the names of the presets that use it."""
    presets = presets or {}
    entries = hub_entries(cache_dir) + local_entries(models_dir)
    return [ModelEntry(e.key, e.name, e.kind, e.path, e.size_bytes,
                       tuple(p for p, preset in presets.items()
                             if any(named_by(e, n, models_dir) for n in names_in(preset.settings))))
            for e in entries]


def find_entry(entries: Iterable[ModelEntry], key: object) -> ModelEntry:
    """The listed entry whose key is ``key``; DeleteRefused for anything else (a path typed in, ../.., ...)."""
    for entry in entries:
        if entry.key == key:
            return entry
    raise DeleteRefused(f"{str(key)[:80]!r} is not in the list of models on this machine; refresh the list and pick "
                        "one from it")


def check_deletable(entry: ModelEntry, models_dir: Path, in_use: Iterable[str], cache_dir: Path | None = None,
                    loaded: Iterable[LoadedFiles] = ()) -> None:
    """DeleteRefused when ``entry`` lies outside the models folder and the Hub cache once links are followed, a
    loaded pipeline holds it (``loaded``: what each engine holds), or the running job uses it (``in_use``: the
    names it gives)."""
    root = Path(models_dir) if entry.place == LOCAL else (Path(cache_dir) if cache_dir else hub_cache_dir())
    if not (inside(entry.path, root, below=True, follow_links=False) and inside(entry.path, root, below=True)):
        folder = "the models folder" if entry.place == LOCAL else "the Hugging Face cache"
        raise DeleteRefused(f"{entry.name} is not inside {folder} (or is a link to a place outside it); the app "
                            "deletes nothing elsewhere")
    if any(held.holds(entry.path) for held in loaded):
        raise DeleteRefused(f"{entry.name} is in use by the engine: it is loaded there, so press Unload first, "
                            "then delete it")
    if any(named_by(entry, name, models_dir) for name in in_use):
        raise DeleteRefused(f"{entry.name} is in use by the engine: the running job uses it, so wait for the job "
                            "to end, then delete it")


def delete_entry(entry: ModelEntry, models_dir: Path, in_use: Iterable[str], cache_dir: Path | None = None,
                 loaded: Iterable[LoadedFiles] = ()) -> str:
    """Delete ``entry`` from disk once check_deletable lets it; what was freed, in words."""
    check_deletable(entry, models_dir, tuple(in_use), cache_dir, tuple(loaded))
    if entry.place == HUB:
        from huggingface_hub import scan_cache_dir

        cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
        repos = [r for r in scan_cache_dir(cache).repos if r.repo_type == "model" and r.repo_id == entry.name]
        hashes = [rev.commit_hash for repo in repos for rev in repo.revisions]
        scan_cache_dir(cache).delete_revisions(*hashes).execute()
        if entry.path.exists():   # blobs of unfinished downloads, refs with no snapshot
            shutil.rmtree(entry.path)
    elif entry.path.is_dir() and not entry.path.is_symlink():
        shutil.rmtree(entry.path)
    else:
        entry.path.unlink()
    return f"Deleted {entry.name} ({entry.kind}, {size_words(entry.size_bytes)} freed)."
