"""What the app knows of each model it was asked about, read once per version of the model's files.

The plan panel asks on every change of the form, every job's check asks again, and the engine asks once the
model's files are here: without this each question re-read the model's configs and every safetensors header.
A model is read again only when its files change (a file added, removed, resized or rewritten: its stat
changes), which costs a directory walk and no read. The answer is a ``ModelInfo``: the spec (its kind, shapes
and sizes), its limits, and the single transformer files a job puts in place of its own.

One catalog belongs to one process (the worker client owns the app's, the Engine the engine process's):
nothing here is module-level.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from engine.models.limits import Limits, limits_of
from engine.models.refs import (ResolvedModel, check_model_folder, classify_ref, has_weights, hub_cache_dir,
                                hub_offline, locate_model)
from engine.errors import ModelError
from engine.models.single_file import (TransformerFile, check_transformer_files, read_transformer_file,
                                       spec_with_files, transformer_paths)
from engine.models.spec import ModelSpec, spec_for

# Models remembered at once: a person switches between a few; beyond this the oldest is read again.
REMEMBERED = 32


def cached_snapshot(repo_id: str) -> Path | None:
    """The newest downloaded snapshot of ``repo_id`` in the hub cache, without any network access: one with its
    weights (a repository read before its weights download, or cut short, has only its JSON files)."""
    snapshots = hub_cache_dir() / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    candidates = [p for p in snapshots.iterdir() if (p / "model_index.json").is_file() and has_weights(p)]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def model_folder(ref: str) -> Path | None:
    """Where the model's files are on this machine, or None (a self-test model, a repo not downloaded)."""
    kind = classify_ref(ref)
    if kind == "local":
        return Path(ref.strip()).expanduser()
    return cached_snapshot(ref) if kind == "hub" else None


def files_stamp(folder: Path) -> tuple:
    """Each file's path, size and modification time under ``folder`` (a stat each, following the hub cache's
    links): it changes whenever a file the model is read from changes."""
    stamp = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            try:
                info = os.stat(os.path.join(root, name))
            except OSError:
                continue
            stamp.append((os.path.relpath(os.path.join(root, name), folder), info.st_size, info.st_mtime_ns))
    return tuple(stamp)


def find_spec(ref: str, folder: Path | None) -> ModelSpec:
    """The model's spec: from its files in ``folder`` when they are there, else from the table of known models."""
    spec = spec_for(ref, folder)
    if spec is None:
        raise ModelError(f"{ref} is not downloaded and not one of the known Wan models, so its size is unknown; "
                         "download it first or give a local folder")
    return spec


@dataclass(frozen=True)
class ModelInfo:
    """One model as a job uses it: its spec with the job's single transformer files counted in it (its kind,
    ``spec.image_to_video``, ``takes_image``, ``first_last``; its shapes and sizes), and so its limits."""
    ref: str
    spec: ModelSpec
    files: tuple[TransformerFile | None, ...] = ()   # one per expert, None: its own; () when all are its own

    @property
    def limits(self) -> Limits:
        return limits_of(self.spec)


@dataclass
class ModelCatalog:
    """Specs and folder checks of models, each kept while the model's files stay as they were."""
    remembered: int = REMEMBERED
    _specs: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _checked: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _files: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def spec(self, ref: str, folder: Path | None = None) -> ModelSpec:
        """The spec of ``ref``, read from ``folder`` (default: where the model is on this machine, if anywhere);
        ModelError when it cannot be known here."""
        folder = model_folder(ref) if folder is None else folder
        return self._spec(ref, folder, files_stamp(folder) if folder else None)

    def _spec(self, ref: str, folder: Path | None, stamp: tuple | None) -> ModelSpec:
        key = (ref, str(folder), stamp)
        found = self._recall(self._specs, key)
        if found is None:
            found = find_spec(ref, folder)
            self._keep(self._specs, key, found)
        return found

    def info(self, settings, folder: Path | None = None) -> ModelInfo:
        """The settings' model with their single transformer files in place of its own, each checked against the
        model's transformer (InputError saying what to change; ModelError when the model cannot be known)."""
        spec = self.spec(settings.model, folder)
        files = self.transformer_files(settings)
        check_transformer_files(spec, files, spec.name)
        return ModelInfo(settings.model, spec_with_files(spec, files), files)

    def transformer_files(self, settings) -> tuple[TransformerFile | None, ...]:
        """The settings' single transformer files, one per expert (None: its own); () when there are none."""
        files = tuple(self.transformer_file(path) if path else None for path in transformer_paths(settings))
        return files if any(files) else ()

    def transformer_file(self, path: str) -> TransformerFile:
        """A transformer file's header, read again only when the file changes (InputError when it cannot be used)."""
        where = Path(path).expanduser()
        try:
            info = where.stat()
            key = (str(where.resolve()), info.st_size, info.st_mtime_ns)
        except OSError:
            key = None
        found = self._recall(self._files, key) if key else None
        if found is None:
            found = read_transformer_file(where)
            if key:
                self._keep(self._files, key, found)
        return found

    def known_spec(self, ref) -> ModelSpec | None:
        """The spec of ``ref`` when it can be known here without a download, else None (the run finds out)."""
        try:
            return self.spec(ref)
        except (ModelError, ValueError, OSError, TypeError, KeyError):
            return None

    def limits(self, ref) -> Limits | None:
        """What ``ref`` can make (frames, sizes), or None when that is not known here (a model not downloaded
        yet, or a reference that cannot be used: the run says why)."""
        spec = self.known_spec(ref)
        return None if spec is None else limits_of(spec)

    def check_folder(self, ref: str) -> None:
        """Refuse a bad reference or a broken local folder (ModelError saying what to change) before any
        heavy work; a folder that passed is not read again until its files change."""
        if classify_ref(ref) != "local":
            return
        folder = Path(ref.strip()).expanduser()
        self._folder_facts(ref.strip(), folder, files_stamp(folder))

    def resolve(self, ref: str, models_dir: Path,
                on_progress: Callable[[float, float | None, str], None] | None = None,
                vet: Callable[[ResolvedModel], None] | None = None) -> ResolvedModel:
        """``ref`` as a checked local folder (a self-test model built, a Hub model downloaded if needed), its folder
        checked and its spec read once per version of its files (the Engine's way to a model).

        A Hub model whose weights are not all here yet is read first as its metadata (engine/models/hub_metadata.py):
        its folder checked and ``vet`` (the job's own checks: does it fit the request, does its plan fit this
        machine) run on what its JSON files and weight headers say, so that a repository the job cannot use is
        refused before a byte of its weights downloads."""
        ref = (ref or "").strip()
        cached = ""
        if classify_ref(ref) == "hub" and not hub_offline():
            listing = self.read_before_download(ref, vet)
            cached = listing.revision if not listing.missing else ""   # whole in the cache: no second round
        folder, source, revision = locate_model(ref, models_dir, on_progress, cached)
        stamp = files_stamp(folder)
        return ResolvedModel(ref, folder, source, revision, *self._folder_facts(ref, folder, stamp),
                             self._known(ref, folder, stamp))

    def read_before_download(self, ref: str, vet: Callable[[ResolvedModel], None] | None = None,
                             endpoint: str | None = None, cache_dir: Path | None = None):
        """The Hub repository ``ref``'s listing (engine/models/hub_metadata.py RepoListing); where its weights are not
        all in the cache, the repository as its metadata says it is is checked first: its JSON files fetched, its
        folder checked against its listing, its spec read from its weight files' headers, and ``vet`` run on it
        (ModelError or the vet's error before any weight is fetched)."""
        from engine.models.hub_metadata import list_repo, read_before_weights, read_repo_metadata

        listing = list_repo(ref, endpoint, cache_dir)
        if listing.weights_missing:
            found = read_before_weights(read_repo_metadata(listing, endpoint), ref)
            if vet is not None:
                vet(found)
        return listing

    def _folder_facts(self, ref: str, folder: Path, stamp: tuple) -> tuple:
        """(pipeline class, components, expand_timesteps) of a checked folder (ModelError when it is broken)."""
        key = (str(folder), stamp)
        facts = self._recall(self._checked, key)
        if facts is None:
            facts = check_model_folder(folder, ref)
            self._keep(self._checked, key, facts)
        return facts

    def _known(self, ref: str, folder: Path, stamp: tuple) -> ModelSpec | None:
        try:
            return self._spec(ref, folder, stamp)
        except ModelError:
            return None

    def _recall(self, memory: OrderedDict, key):
        with self._lock:
            if key in memory:
                memory.move_to_end(key)
                return memory[key]
        return None

    def _keep(self, memory: OrderedDict, key, value) -> None:
        with self._lock:
            memory[key] = value
            while len(memory) > self.remembered:
                memory.popitem(last=False)
