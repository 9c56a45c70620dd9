"""Model references: a Hugging Face repo id, a local diffusers folder, or a built-in self-test model.

``resolve_model`` turns a reference into a checked local folder before any
weight is loaded, so a broken folder is reported with what to change.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from engine.errors import DownloadError, ModelError
from engine.models.pipelines import PIPELINE_KINDS, PipelineKind, pipeline_kind
from engine.models.selftest import SELFTEST_REFS, ensure_selftest_model
from engine.models.spec import ModelSpec, spec_for
from engine.models.weights import WeightFileError, read_header

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
# Components whose folder must hold weights, not only a config.
WEIGHTED = {"transformer", "transformer_2", "vae", "text_encoder", "image_encoder"}


@dataclass(frozen=True)
class ResolvedModel:
    ref: str
    folder: Path
    source: str          # "selftest", "local" or "hub"
    revision: str        # commit hash for hub models, "local" or "builtin" otherwise
    pipeline_class: str
    components: tuple[str, ...]
    expand_timesteps: bool = False   # Wan2.2 TI2V-5B: one model for text and image to video
    # Read once when the model is resolved (not on every run): its shapes and sizes, and so its kind
    # (ModelSpec.image_to_video, takes_image, first_last).
    spec: ModelSpec | None = None
    # Single files in place of its transformers, one per expert (None: its own), with the spec counting them:
    # engine/models/single_file.py's use_transformer_files, once per run.
    transformer_files: tuple = ()

    @property
    def selftest(self) -> bool:
        return self.source == "selftest"

    @property
    def kind(self) -> PipelineKind:
        """Its pipeline class as the app runs it (engine/models/pipelines.py)."""
        return pipeline_kind(self.pipeline_class)

    @property
    def image_to_video(self) -> bool:
        """An image-to-video-only model (it needs a first frame)."""
        return self.kind.image_to_video

    @property
    def takes_image(self) -> bool:
        """It can start from an image: an image-to-video model, or Wan2.2 TI2V-5B."""
        return self.image_to_video or self.expand_timesteps


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "huggingface")
    return Path(home) / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class NamedModel:
    """How the messages about a model folder name it: by ``shown``, the reference the user gave (a hub model's
    snapshot folder and a link's target are the machine's, not the user's), else by the folder's path."""
    folder: Path
    shown: str | None = None

    @property
    def label(self) -> str:
        return Path(self.shown).name if self.shown else self.folder.name

    @property
    def whole(self) -> str:
        return self.shown or str(self.folder)

    def where(self, file: Path) -> Path:
        return file.relative_to(self.folder) if file.is_relative_to(self.folder) else file


class FolderFiles(Protocol):
    """The weight files of a model folder as the folder check sees them: on this disk (``DiskFiles``), or listed by
    the Hub before they are downloaded, their headers fetched alone (engine/models/hub_metadata.py ``HubFiles``)."""

    def names(self, part: str) -> list[str] | None:
        """The names of the files in the component folder ``part`` (None: there is no such folder)."""

    def header(self, part: str, name: str) -> dict:
        """The safetensors header of ``part/name`` (WeightFileError when it is damaged, OSError when unreadable)."""

    def damaged(self, named: "NamedModel", path: str, reason: str) -> ModelError:
        """The error for a damaged weight file, saying what to do about it."""

    @property
    def redo(self) -> str:
        """What to do about a file that is missing or broken ("download the model again")."""


@dataclass(frozen=True)
class DiskFiles:
    """The files of a model folder on this disk."""
    folder: Path

    def names(self, part: str) -> list[str] | None:
        where = self.folder / part
        return sorted(f.name for f in where.iterdir()) if where.is_dir() else None

    def header(self, part: str, name: str) -> dict:
        return read_header(self.folder / part / name)

    def damaged(self, named: "NamedModel", path: str, reason: str) -> ModelError:
        return _damaged(named, self.folder / path, reason)

    redo = "download the model again"


def check_model_folder(folder: Path, shown: str | None = None,
                       files: FolderFiles | None = None) -> tuple[str, tuple[str, ...], bool]:
    """Check a diffusers-layout folder; return its pipeline class, component names and whether it is a
    text-and-image-to-video model (Wan2.2 TI2V-5B: ``expand_timesteps``). ``shown``: the reference the user gave,
    which the messages name the model by, without the folder's own path or a link's target. ``files``: where its
    weight files are (default: in the folder; a Hub repo's before its weights download: their listing and headers)."""
    named = NamedModel(folder, shown)
    files = files if files is not None else DiskFiles(folder)
    index_file = folder / "model_index.json"
    if not index_file.is_file():
        raise ModelError(
            f"{named.whole} has no model_index.json, so it is not a diffusers model folder; "
            "point to the folder that holds model_index.json (a Wan '-Diffusers' repo)")
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{named.whole}/model_index.json is not valid JSON ({exc}); {files.redo}") from exc
    if not isinstance(index, dict):
        raise ModelError(f"{named.whole}/model_index.json is not a JSON object; {files.redo}")
    pipeline_class = index.get("_class_name", "")
    if pipeline_class not in PIPELINE_KINDS:
        raise ModelError(
            f"{named.label}: pipeline {pipeline_class!r} is not supported; "
            f"use a Wan model for {' or '.join(PIPELINE_KINDS)}")
    components = tuple(
        name for name, value in index.items()
        if not name.startswith("_") and isinstance(value, list) and value and value[0] is not None)
    for name in components:
        _check_component(named, name, files)
    return pipeline_class, components, bool(index.get("expand_timesteps", False))


def has_weights(folder: Path) -> bool:
    """Whether every weighted component model_index.json names has its weight files here, as a finished download
    has (a Hub snapshot read before its weights download holds only its JSON files). Names only, nothing read."""
    try:
        index = json.loads((Path(folder) / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    for name, value in index.items() if isinstance(index, dict) else ():
        if name in WEIGHTED and isinstance(value, list) and value and value[0] is not None:
            part = Path(folder) / name
            if not part.is_dir() or not any(f.name.endswith(WEIGHT_SUFFIXES) for f in part.iterdir()):
                return False
            for index_file in part.glob("*.index.json"):
                try:
                    shards = set(json.loads(index_file.read_text(encoding="utf-8"))["weight_map"].values())
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    return False
                if not all((part / str(shard)).is_file() for shard in shards):
                    return False
    return True


def _check_component(named: NamedModel, name: str, files: FolderFiles) -> None:
    present = files.names(name)
    if present is None:
        raise ModelError(f"{named.label}: component '{name}' is missing (no folder {name}/ in it); {files.redo}")
    if name in WEIGHTED:
        part = named.folder / name
        if not (part / "config.json").is_file():
            raise ModelError(f"{named.label}: component '{name}' has no config.json; {files.redo}")
        _check_json(named, part / "config.json", files.redo)
        if not any(file.endswith(WEIGHT_SUFFIXES) for file in present):
            raise ModelError(f"{named.label}: component '{name}' has no weight files; {files.redo}")
        check_weight_files(named.folder, part, named.shown, files)


def _damaged(named: NamedModel, file: Path, reason: str) -> ModelError:
    if named.shown:
        todo = "Delete that file, or the whole model on the Models tab, and download the model again"
    else:   # a hub download is a link into the cache's blobs: that file is the one to delete
        stored = f" (stored at {file.resolve()})" if file.is_symlink() else ""
        todo = f"Delete {file}{stored} and download the model again"
    return ModelError(f"{named.label}: weight file {named.where(file)} is damaged: {reason}. {todo}")


def _check_json(named: NamedModel, file: Path, redo: str = DiskFiles.redo) -> object:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{named.label}: {named.where(file)} is not valid JSON ({exc.__class__.__name__}); "
                         f"{redo}") from exc


def check_weight_files(folder: Path, part: Path, shown: str | None = None, files: FolderFiles | None = None) -> None:
    """Refuse a component whose safetensors files are truncated or have a garbage header (``shown`` and ``files``:
    as in check_model_folder).

    Cheap: reads each file's header and size only, never a tensor. A sharded component's index
    must name only shards that exist.
    """
    named = NamedModel(folder, shown)
    files = files if files is not None else DiskFiles(folder)
    present = files.names(part.name) or []
    for index_file in sorted(part.glob("*.safetensors.index.json")):
        index = _check_json(named, index_file, files.redo)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise ModelError(f"{named.label}: {named.where(index_file)} has no weight_map; {files.redo}")
        for shard in sorted(set(map(str, weight_map.values()))):
            if shard not in present:
                raise ModelError(f"{named.label}: weight file {part.name}/{shard} is missing "
                                 f"(named in {index_file.name}); {files.redo}")
    for name in present:
        if not name.endswith(".safetensors"):
            continue
        try:
            files.header(part.name, name)
        except WeightFileError as exc:
            raise files.damaged(named, f"{part.name}/{name}", str(exc)) from None
        except OSError as exc:
            raise files.damaged(named, f"{part.name}/{name}", f"it cannot be read ({exc.strerror or exc})") from None


def _progress_class(on_progress: Callable[[float, float | None, str], None]):
    from tqdm.auto import tqdm

    class ReportingTqdm(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = False
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            result = super().update(n)
            on_progress(float(self.n), float(self.total) if self.total else None, str(self.unit))
            return result

    return ReportingTqdm


def _download(repo_id: str, on_progress, cached: str = "") -> Path:
    """``repo_id``'s snapshot folder, downloaded where needed; ``cached``: the revision a listing just found whole in
    the cache (engine/models/hub_metadata.py), read from there without asking the Hub again."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = hub_offline()
    try:
        path = snapshot_download(
            repo_id, cache_dir=hub_cache_dir(), local_files_only=offline or bool(cached), revision=cached or None,
            tqdm_class=_progress_class(on_progress) if on_progress else None)
    except LocalEntryNotFoundError as exc:
        if offline:
            raise DownloadError(
                f"{repo_id} is not in the Hugging Face cache and offline mode is on (HF_HUB_OFFLINE=1); go "
                "online once to download it, or give a local folder") from exc
        # The hub client's own words ("An error happened while trying to locate the files...") name no cause.
        raise DownloadError(f"{repo_id} is not downloaded and the Hugging Face Hub cannot be reached from this "
                            "machine (no network, or a proxy in the way); connect and try again, or pick a model "
                            "that is downloaded") from exc
    except Exception as exc:  # network, auth or unknown-repo errors from the hub client
        raise DownloadError(f"could not download {repo_id} ({exc.__class__.__name__}: {first_line(exc)}); check "
                            "the repo id and the network") from exc
    return Path(path)


def first_line(exc: BaseException) -> str:
    """An error's first line (the hub client's errors run to paragraphs)."""
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]


def is_hub_ref(ref: str) -> bool:
    return bool(REPO_ID.match(ref)) and not Path(ref).expanduser().exists()


# A folder name is at most 255 bytes on the usual file systems; a path at most 4096.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


def check_ref_length(ref: str) -> None:
    """Refuse a model reference too long to be a repo id or a path (before the file system refuses it)."""
    parts = ref.replace("\\", "/").split("/")
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in parts), default=0)
    if longest > MAX_NAME_BYTES or len(ref.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise ModelError(f"the model name {ref[:40]!r}... is {len(ref)} characters long, too long for a repo id "
                         f"or a folder (at most {MAX_NAME_BYTES} per name); give a repo id (org/name), a folder "
                         f"or {' or '.join(SELFTEST_REFS)}")


def classify_ref(ref: str) -> str:
    """'selftest', 'local' or 'hub'; raises ModelError for a reference that is none of them.

    Cheap: touches no weights and no network, so the app can call it before any work.
    """
    if ref is not None and not isinstance(ref, str):
        raise ModelError(f"the model must be text (a repo id, a folder or a self-test model), got "
                         f"{type(ref).__name__}")
    ref = (ref or "").strip()
    check_ref_length(ref)
    if ref in SELFTEST_REFS:
        return "selftest"
    if ref and Path(ref).expanduser().is_dir():
        return "local"
    if is_hub_ref(ref):
        return "hub"
    if ref and (os.sep in ref or "/" in ref or ref.startswith((".", "~"))):
        raise ModelError(f"model folder {ref!r} does not exist; check the path")
    raise ModelError(
        f"model {ref!r} is not a folder, a Hugging Face repo id (org/name) or a built-in "
        f"({', '.join(SELFTEST_REFS)})")


def folder_pipeline_kind(ref: str) -> PipelineKind | None:
    """The pipeline kind a local model folder's model_index.json names (None: not a local folder, or one the folder
    check would refuse). Reads one small file; nothing is checked."""
    try:
        if classify_ref(ref) != "local":
            return None
        index = json.loads((Path(ref.strip()).expanduser() / "model_index.json").read_text(encoding="utf-8"))
        return PIPELINE_KINDS.get(index.get("_class_name")) if isinstance(index, dict) else None
    except (ModelError, OSError, ValueError):
        return None


def locate_model(ref: str, models_dir: Path,
                 on_progress: Callable[[float, float | None, str], None] | None = None,
                 cached: str = "") -> tuple[Path, str, str]:
    """(its local folder, its source, its revision) for a model reference: a self-test model built, a Hub model
    downloaded if needed (``cached``: as _download)."""
    ref = (ref or "").strip()
    source = classify_ref(ref)
    if source == "selftest":
        return ensure_selftest_model(ref, models_dir), source, "builtin"
    if source == "local":
        return Path(ref).expanduser().resolve(), source, "local"
    folder = _download(ref, on_progress, cached)
    return folder, source, folder.name


def resolve_model(ref: str, models_dir: Path,
                  on_progress: Callable[[float, float | None, str], None] | None = None) -> ResolvedModel:
    """Turn a model reference into a checked local folder (downloading a hub model if needed), its files read
    (the Engine's ModelCatalog.resolve does the same, reading them once per version)."""
    ref = (ref or "").strip()
    folder, source, revision = locate_model(ref, models_dir, on_progress)
    return ResolvedModel(ref, folder, source, revision, *check_model_folder(folder, ref), spec_for(ref, folder))
