"""What every tab needs: the worker client, the presets, where outputs go, and which model folders it may use."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine.device.hardware import HardwareProfile
from engine.folders import inside
from engine.models.loras import Lora, as_lora
from engine.models.refs import REPO_ID, check_ref_length
from engine.errors import ModelError
from engine.models.selftest import SELFTEST_REFS
from engine.models.single_file import TRANSFORMERS_FOLDER, transformer_folder
from engine.planning.job_time import JobCeiling
from engine.service.jobqueue import JobQueue
from engine.service.metrics import ServiceMetrics
from engine.service.engines import Engines
from engine.settings.loras import LORAS_FOLDER, lora_folder
from engine.settings.draft import Paths
from engine.settings.presets import Preset, UserPresets
from engine.models.single_file import TRANSFORMER_FILE_NAMES
from engine.settings.values import InputError

# The end of the message that refuses a model path from the page or the API.
ALLOW_PATHS_HINT = "start the app with --allow-model-paths to use folders outside models/"

def _looks_like_path(ref: str) -> bool:
    """Written as a filesystem path (absolute, home-relative, dotted or with backslashes), not a repo id."""
    return (os.path.isabs(ref) or ref.startswith(("~", ".")) or "\\" in ref or ":" in ref
            or any(part in (".", "..") for part in ref.split("/")))


def checked_model_ref(ref: str | None, models_dir: str | Path, allow_paths: bool = False,
                      trusted: tuple[str, ...] = ()) -> str:
    """The model reference a page or API caller may use, or ModelError saying why not.

    Accepted: a built-in self-test model, a Hugging Face repo id (org/name), a folder inside
    ``models_dir`` (by its name or its path, returned as an absolute path; a link the operator put there is
    theirs, and followed), and the references in ``trusted`` (what the operator chose: --model and the
    presets). Anything else, absolute or relative (``/etc``, ``app.py``, ``engine/models``, ``nothere.py``,
    ``../x``, markup), is refused with one sentence unless ``allow_paths``, the same whether it exists or not,
    so the page cannot be used to probe the disk: paths are compared as written, and the only file system
    question asked outside the models folder is whether a repo id's first name is an entry of the working
    folder (where the engine would read ``engine/nothere`` as a folder, not as a repo id).
    """
    if ref is not None and not isinstance(ref, str):
        raise ModelError(f"the model must be text (a repo id, a folder or a self-test model), got "
                         f"{type(ref).__name__}")
    ref = (ref or "").strip()
    check_ref_length(ref)
    if not ref or allow_paths or ref in SELFTEST_REFS or ref in trusted:
        return ref
    models = Path(models_dir)
    if ".." in ref.replace("\\", "/").split("/"):
        raise _refused_model(ref)
    if not _looks_like_path(ref) and (models / ref).is_dir():   # a folder of the models folder, by its name
        return os.path.abspath(models / ref)
    path = Path(ref).expanduser()
    if inside(path, models, below=True, follow_links=False):    # by its path (the engine says if it is missing)
        return os.path.abspath(path)
    if _looks_like_path(ref) or not REPO_ID.match(ref) or os.path.lexists(ref.split("/")[0]):
        raise _refused_model(ref)
    return ref               # a repo id (one that does not exist is refused by the engine, with its own message)


def _refused_model(ref: str) -> ModelError:
    """The one answer for a model reference that is not accepted, whatever it names and whether it exists."""
    return ModelError(
        f"model {ref!r} is a path outside the app's models folder, which the page does not accept; use a "
        f"Hugging Face repo id (org/name), {' or '.join(SELFTEST_REFS)}, or a folder inside the models "
        f"folder, or {ALLOW_PATHS_HINT}")


def checked_lora_file(file, models_dir: str | Path, allow_paths: bool = False, trusted: tuple[str, ...] = ()) -> str:
    """The path of a LoRA file a page or API caller names, or InputError saying why it may not.

    A name (or a relative path) is looked for in the models folder's loras/; an absolute path is taken inside the
    models folder, or anywhere with ``allow_paths``, or when it is in ``trusted`` (the presets' own LoRAs). As with
    models, the answer for a path elsewhere is the same whether it exists or not. Touches nothing but ``stat``.
    """
    if not isinstance(file, str) or not file.strip():
        raise InputError(f"a LoRA needs a file: give its name in models/{LORAS_FOLDER}/")
    file = file.strip()
    if file in trusted:
        return file
    refused = InputError(f"LoRA file {file!r} is a path outside the app's models folder, which the page does not "
                         f"accept; put the file in models/{LORAS_FOLDER}/ and give its name, or "
                         f"{ALLOW_PATHS_HINT}")
    return _file_in(file, lora_folder(models_dir), models_dir, allow_paths, refused)


def checked_transformer_file(file, models_dir: str | Path, allow_paths: bool = False, trusted: tuple[str, ...] = (),
                             words: str = TRANSFORMER_FILE_NAMES["transformer"]) -> str | None:
    """The path of a single transformer file a page or API caller names (None: the model's own), or InputError
    saying why it may not be used.

    A name (or a relative path) is a file in the models folder's transformers/; an absolute path is taken inside
    the models folder, or anywhere with ``allow_paths``, or when it is in ``trusted`` (the presets' own files).
    As with models and LoRAs, the answer for a path elsewhere is the same whether it exists or not. Touches
    nothing but ``stat``; the settings' check and the catalog then read the file itself.
    """
    if file is None:
        return None
    if not isinstance(file, str):
        raise InputError(f"the {words} must be the name of a file in models/{TRANSFORMERS_FOLDER}/, got "
                         f"{type(file).__name__}")
    file = file.strip()
    if not file:
        return None
    if file in trusted:
        return file
    refused = InputError(f"the {words} {file[:200]!r} is a path outside the app's models folder, which the page does "
                         f"not accept; put the file in models/{TRANSFORMERS_FOLDER}/ and choose it by its name, "
                         f"or {ALLOW_PATHS_HINT}")
    return _file_in(file, transformer_folder(models_dir), models_dir, allow_paths, refused)


def _file_in(file: str, folder: Path, models_dir: str | Path, allow_paths: bool, refused: InputError) -> str:
    """The absolute path of ``file``: a name or relative path in ``folder``; an absolute one inside the models
    folder (anywhere with ``allow_paths``); ``refused`` raised for any other, and for any '..'."""
    path = Path(file).expanduser()
    if ".." in file.replace("\\", "/").split("/"):
        raise refused
    if path.is_absolute() or file.startswith("~"):
        if allow_paths or inside(path, models_dir, follow_links=False):
            return os.path.abspath(path)
        raise refused
    return os.path.abspath(Path(folder) / path)


def forget_served_copies(served_dir: str | None, names: list[str]) -> list[Path]:
    """Remove the copies of the files ``names`` that the page was served from (gradio copies every result
    into its cache, here the app's own folder, ``served_dir``): a deleted output no longer downloads."""
    if not served_dir or not names:
        return []
    gone = []
    for name in set(names):
        for copy in Path(served_dir).glob(f"*/{name}"):
            if copy.is_file() and not copy.is_symlink() and not copy.parent.is_symlink() \
                    and inside(copy, served_dir, below=True):
                copy.unlink(missing_ok=True)
                gone.append(copy)
                if not any(copy.parent.iterdir()):
                    copy.parent.rmdir()
    return gone


@dataclass(frozen=True)
class AppContext:
    client: Engines                 # one engine process (WorkerClient) or one per GPU (EnginePool)
    presets: dict[str, Preset]
    outputs_dir: str
    default_model: str | None = None
    # Page and API callers may name any folder on this machine (serve --allow-model-paths).
    allow_model_paths: bool = False
    # Folders inside it are accepted as models; default: the worker's models folder.
    models_dir: str | None = None
    # Every engine job goes through it: one runs, the others wait their turn (serve --max-queue N).
    jobs: JobQueue = field(default_factory=JobQueue)
    # The user's own presets (saved from the page), kept in ``presets`` too; None: saving is off.
    user_presets: UserPresets | None = None
    # The folder the page's files are served from (gradio's cache, the app's own: see app.serve).
    served_dir: str | None = None
    # How jobs end and what the engines hold, for Prometheus (/metrics); every job of the page and the API counts.
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    # The most one job may take (serve --max-job-minutes); none by default, as on one's own machine.
    ceiling: JobCeiling = field(default_factory=JobCeiling)

    def presets_for(self, mode: str) -> list[str]:
        wanted = "i2v" if mode == "i2v" else "t2v"
        # A snapshot: a user preset may be saved or deleted in another thread meanwhile.
        return [name for name, preset in list(self.presets.items()) if preset.settings.mode == wanted]

    def default_preset(self, mode: str) -> str:
        names = self.presets_for(mode)
        if self.default_model:
            for name in names:
                if self.presets[name].settings.model == self.default_model:
                    return name
        return names[0]

    def fitting_preset(self, mode: str, hardware: HardwareProfile) -> str:
        """The first of the mode's built-in presets whose plan fits ``hardware`` (the presets list the app's
        choices best first), else its self-test preset: what a tab starts on when no --model was given."""
        from engine.service.ahead import plan_settings

        names = self.presets_for(mode)
        for name in names:
            preset = self.presets[name]
            if preset.selftest or (self.user_presets is not None and self.user_presets.is_user(name)):
                continue
            try:
                if plan_settings(preset.settings, hardware, self.client.catalog).fits:
                    return name
            except (InputError, ModelError, OSError):   # a model not known before its download
                continue
        return next((name for name in names if self.presets[name].selftest), names[0])

    def model_for(self, mode: str) -> str:
        """The model a tab starts with: --model, unless presets show it is made for the other kind of tab."""
        preset = self.presets[self.default_preset(mode)]
        if not self.default_model or preset.settings.model == self.default_model:
            return preset.settings.model
        other = [p for n, p in self.presets.items() if p.settings.model == self.default_model and n not in self.presets_for(mode)]
        return preset.settings.model if other else self.default_model

    def preset_or_default(self, name: str | None, mode: str) -> Preset:
        """The named preset, or the mode's default when the name is unknown or empty."""
        found = self.presets.get(name) if isinstance(name, str) else None
        return found or self.presets[self.default_preset(mode)]

    @property
    def paths(self) -> Paths:
        """The page's path policy: models, LoRA and transformer files inside the models folder (unless paths are
        allowed), and the files the presets name."""
        return Paths(self.model_ref, self.lora_files, self.transformer_files)

    def model_ref(self, ref: str | None) -> str:
        """A model reference from the page or the API, checked (ModelError when refused); see checked_model_ref."""
        trusted = tuple(p.settings.model for p in list(self.presets.values())) + ((self.default_model,) if self.default_model else ())
        return checked_model_ref(ref, self.models_dir or self.client.models_dir, self.allow_model_paths, trusted)

    def lora_files(self, loras) -> tuple[Lora, ...]:
        """LoRAs from the page or the API, as written, with each file's path (see checked_lora_file), and where a
        preset's LoRA is published (so a missing one is fetched); InputError naming every file that may not be used."""
        own = [lora for preset in list(self.presets.values()) for lora in preset.settings.loras]
        trusted, published = tuple(lora.file for lora in own), {lora.name: lora for lora in own if lora.fetchable}
        found, problems = [], []
        for lora in map(as_lora, loras):
            try:
                file = checked_lora_file(lora.file, self.models_dir or self.client.models_dir,
                                         self.allow_model_paths, trusted)
            except InputError as exc:
                problems.extend(exc.problems)
                continue
            source = published.get(lora.name) if not lora.fetchable else None
            found.append(replace(lora, file=file, **({"repo": source.repo, "path": source.path} if source else {})))
        if problems:
            raise InputError(problems)
        return tuple(found)

    def transformer_files(self, files: dict) -> dict:
        """{"transformer": path or None, "transformer_2": ...} for the files named on the page or by the API (see
        checked_transformer_file); InputError naming every file that may not be used."""
        trusted = tuple(value for preset in list(self.presets.values()) for name in TRANSFORMER_FILE_NAMES
                        if isinstance(value := getattr(preset.settings, name), str) and value)
        found, problems = {}, []
        for name, file in files.items():
            try:
                found[name] = checked_transformer_file(file, self.models_dir or self.client.models_dir,
                                                       self.allow_model_paths, trusted, TRANSFORMER_FILE_NAMES[name])
            except InputError as exc:
                problems.extend(exc.problems)
        if problems:
            raise InputError(problems)
        return found
