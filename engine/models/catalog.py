"""What the app knows of each model it was asked about, read once per version of the model's files.

The plan panel asks on every change of the form, and every job's check asks again: without this each
question re-read the model's configs and every safetensors header. A model is read again only when its
files change (a file added, removed, resized or rewritten: its stat changes), which costs a directory walk
and no read. One catalog belongs to one app (the worker client owns it): nothing here is module-level.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from engine.models.limits import Limits, limits_of
from engine.models.refs import check_model_folder, classify_ref, hub_cache_dir
from engine.errors import ModelError
from engine.models.single_file import (TransformerFile, check_transformer_files, read_transformer_file,
                                       spec_with_files, transformer_paths)
from engine.models.spec import ModelSpec, spec_for

# Models remembered at once: a person switches between a few; beyond this the oldest is read again.
REMEMBERED = 32


def cached_snapshot(repo_id: str) -> Path | None:
    """The newest downloaded snapshot of ``repo_id`` in the hub cache, without any network access."""
    snapshots = hub_cache_dir() / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    candidates = [p for p in snapshots.iterdir() if (p / "model_index.json").is_file()]
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


def find_spec(ref: str) -> ModelSpec:
    """The model's spec: from its files when they are here, else from the table of known models."""
    spec = spec_for(ref, model_folder(ref))
    if spec is None:
        raise ModelError(f"{ref} is not downloaded and not one of the known Wan models, so its size is unknown; "
                         "download it first or give a local folder")
    return spec


@dataclass
class ModelCatalog:
    """Specs and folder checks of models, each kept while the model's files stay as they were."""
    remembered: int = REMEMBERED
    _specs: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _checked: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _files: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def spec(self, ref: str) -> ModelSpec:
        """The spec of ``ref`` (ModelError when it cannot be known here)."""
        folder = model_folder(ref)
        key = (ref, str(folder), files_stamp(folder) if folder else None)
        found = self._recall(self._specs, key)
        if found is None:
            found = find_spec(ref)
            self._keep(self._specs, key, found)
        return found

    def settings_spec(self, settings) -> ModelSpec:
        """The spec of the settings' model with their single transformer files in place of its own, each checked
        against the model's transformer (InputError saying what to change)."""
        spec = self.spec(settings.model)
        files = tuple(self.transformer_file(path) if path else None for path in transformer_paths(settings))
        check_transformer_files(spec, files, spec.name)
        return spec_with_files(spec, files)

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
        key = (str(folder), files_stamp(folder))
        if self._recall(self._checked, key) is None:
            check_model_folder(folder, ref.strip())
            self._keep(self._checked, key, True)

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
