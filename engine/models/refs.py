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
from typing import Callable

from engine.errors import DownloadError, ModelError
from engine.models.selftest import SELFTEST_REFS, ensure_selftest_model
from engine.models.spec import ModelSpec, spec_for
from engine.models.weights import WeightFileError, read_header

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
# Components whose folder must hold weights, not only a config.
WEIGHTED = {"transformer", "transformer_2", "vae", "text_encoder", "image_encoder"}
PIPELINES = {"WanPipeline": "t2v", "WanImageToVideoPipeline": "i2v"}


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
    def image_to_video(self) -> bool:
        """An image-to-video-only model (it needs a first frame)."""
        return self.pipeline_class == "WanImageToVideoPipeline"

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
class _Named:
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


def check_model_folder(folder: Path, shown: str | None = None) -> tuple[str, tuple[str, ...], bool]:
    """Check a diffusers-layout folder; return its pipeline class, component names and whether it is a
    text-and-image-to-video model (Wan2.2 TI2V-5B: ``expand_timesteps``). ``shown``: the reference the user gave,
    which the messages name the model by, without the folder's own path or a link's target."""
    named = _Named(folder, shown)
    index_file = folder / "model_index.json"
    if not index_file.is_file():
        raise ModelError(
            f"{named.whole} has no model_index.json, so it is not a diffusers model folder; "
            "point to the folder that holds model_index.json (a Wan '-Diffusers' repo)")
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{named.whole}/model_index.json is not valid JSON ({exc}); download the model again") from exc
    if not isinstance(index, dict):
        raise ModelError(f"{named.whole}/model_index.json is not a JSON object; download the model again")
    pipeline_class = index.get("_class_name", "")
    if pipeline_class not in PIPELINES:
        raise ModelError(
            f"{named.label}: pipeline {pipeline_class!r} is not supported; "
            f"use a Wan model for {' or '.join(PIPELINES)}")
    components = tuple(
        name for name, value in index.items()
        if not name.startswith("_") and isinstance(value, list) and value and value[0] is not None)
    for name in components:
        _check_component(named, name)
    return pipeline_class, components, bool(index.get("expand_timesteps", False))


def _check_component(named: _Named, name: str) -> None:
    part = named.folder / name
    if not part.is_dir():
        raise ModelError(f"{named.label}: component '{name}' is missing (no folder {name}/ in it); "
                         "download the model again")
    if name in WEIGHTED:
        if not (part / "config.json").is_file():
            raise ModelError(f"{named.label}: component '{name}' has no config.json; download the model again")
        _check_json(named, part / "config.json")
        if not any(f.name.endswith(WEIGHT_SUFFIXES) for f in part.iterdir()):
            raise ModelError(f"{named.label}: component '{name}' has no weight files; download the model again")
        check_weight_files(named.folder, part, named.shown)


def _damaged(named: _Named, file: Path, reason: str) -> ModelError:
    if named.shown:
        todo = "Delete that file, or the whole model on the Models tab, and download the model again"
    else:   # a hub download is a link into the cache's blobs: that file is the one to delete
        stored = f" (stored at {file.resolve()})" if file.is_symlink() else ""
        todo = f"Delete {file}{stored} and download the model again"
    return ModelError(f"{named.label}: weight file {named.where(file)} is damaged: {reason}. {todo}")


def _check_json(named: _Named, file: Path) -> object:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{named.label}: {named.where(file)} is not valid JSON ({exc.__class__.__name__}); "
                         "download the model again") from exc


def check_weight_files(folder: Path, part: Path, shown: str | None = None) -> None:
    """Refuse a component whose safetensors files are truncated or have a garbage header (``shown``: as in
    check_model_folder).

    Cheap: reads each file's header and size only, never a tensor. A sharded component's index
    must name only shards that exist.
    """
    named = _Named(folder, shown)
    for index_file in sorted(part.glob("*.safetensors.index.json")):
        index = _check_json(named, index_file)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise ModelError(f"{named.label}: {named.where(index_file)} has no weight_map; download the model again")
        for shard in sorted(set(map(str, weight_map.values()))):
            if not (part / shard).is_file():
                raise ModelError(f"{named.label}: weight file {part.name}/{shard} is missing "
                                 f"(named in {index_file.name}); download the model again")
    for file in sorted(part.glob("*.safetensors")):
        try:
            read_header(file)
        except WeightFileError as exc:
            raise _damaged(named, file, str(exc)) from None
        except OSError as exc:
            raise _damaged(named, file, f"it cannot be read ({exc.strerror or exc})") from None


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


def _download(repo_id: str, on_progress) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = hub_offline()
    try:
        path = snapshot_download(
            repo_id, cache_dir=hub_cache_dir(), local_files_only=offline,
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


def locate_model(ref: str, models_dir: Path,
                 on_progress: Callable[[float, float | None, str], None] | None = None) -> tuple[Path, str, str]:
    """(its local folder, its source, its revision) for a model reference: a self-test model built, a Hub model
    downloaded if needed."""
    ref = (ref or "").strip()
    source = classify_ref(ref)
    if source == "selftest":
        return ensure_selftest_model(ref, models_dir), source, "builtin"
    if source == "local":
        return Path(ref).expanduser().resolve(), source, "local"
    folder = _download(ref, on_progress)
    return folder, source, folder.name


def resolve_model(ref: str, models_dir: Path,
                  on_progress: Callable[[float, float | None, str], None] | None = None) -> ResolvedModel:
    """Turn a model reference into a checked local folder (downloading a hub model if needed), its files read
    (the Engine's ModelCatalog.resolve does the same, reading them once per version)."""
    ref = (ref or "").strip()
    folder, source, revision = locate_model(ref, models_dir, on_progress)
    return ResolvedModel(ref, folder, source, revision, *check_model_folder(folder, ref), spec_for(ref, folder))
