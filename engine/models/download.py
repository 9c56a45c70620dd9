"""Downloads from the Hugging Face Hub for the Models tab: a repo's snapshot into the Hub cache, or one file of a
repo into the models folder; each checked against the free disk space before its first byte.

Resuming: huggingface_hub (2.x) writes each file to a temporary name of its own and deletes it when a try fails, so
an interrupted try would start every unfinished file again. Large files therefore go through ``transfer_file``: its
``.part`` file stays when a try is cut, and the next try asks the Hub only for the bytes after it (an HTTP Range
request). A snapshot's large files are fetched that way straight into the Hub cache's blob store (the cache's
documented layout: ``blobs/<etag>``), and then ``snapshot_download``, as the engine's own downloads use it
(engine/models/refs.py), links them into the snapshot and fetches the small files; files a try finished are kept.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from engine.models.hub_errors import hub_failure, unreachable
from engine.models.refs import REPO_ID, hub_cache_dir, hub_offline
from engine.errors import DownloadError, ModelError

# Kept free beyond the files themselves, so that a download never fills the disk to its last byte.
SPARE_BYTES = 256 << 20
# Seconds without a byte from the Hub before a try gives up (the next try resumes).
READ_TIMEOUT_S = 60.0
# A snapshot's files from this size on are fetched so that a cut try resumes (smaller ones start again: cheap).
RESUMABLE_BYTES = 64 << 20

Progress = Callable[[int, int], None]   # (bytes done, bytes in all)


def size_words(size: int) -> str:
    """A size in bytes as people read it: 512 B, 3.4 MB, 12.1 GB (decimal units, as disks are sold)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class DownloadPlan:
    """What a download needs before its first byte: the files still to fetch and their sizes."""
    repo: str
    files: tuple[tuple[str, int], ...]    # (path in the repo, size in bytes) of the files still to fetch
    target: Path                          # the folder they go to (the Hub cache, or a folder in models/)
    revision: str = ""                    # the commit they belong to (a snapshot)

    @property
    def needed_bytes(self) -> int:
        return sum(size for _, size in self.files)


def free_space(folder: Path) -> int:
    """Free bytes on the disk that holds ``folder`` (or its nearest existing parent)."""
    folder = Path(folder).resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def check_space(plan: DownloadPlan, free_bytes: int | None = None) -> None:
    """DownloadError when the plan's files (and a spare margin) do not fit the free space of its target; ``free_bytes``
    stands for the measured free space (tests, or a caller that keeps room for something else)."""
    free = free_space(plan.target) if free_bytes is None else free_bytes
    needed = plan.needed_bytes
    if needed and needed + SPARE_BYTES > free:
        raise DownloadError(f"not enough disk space for {plan.repo}: it needs {size_words(needed + SPARE_BYTES)} "
                            f"({size_words(needed)} of files and {size_words(SPARE_BYTES)} to spare) and "
                            f"{plan.target} has {size_words(free)} free; free some space (delete a model here) or "
                            "download it elsewhere")


def check_repo(repo: str) -> str:
    repo = (repo or "").strip() if isinstance(repo, str) else ""
    if not REPO_ID.match(repo):
        raise DownloadError(f"{repo!r} is not a Hugging Face repo id; write it as org/name")
    return repo


def _offline_check(where: str) -> None:
    if hub_offline():
        raise unreachable("offline mode is on (HF_HUB_OFFLINE=1)", where)


# ----- a snapshot, into the Hub cache --------------------------------------------------------------------------
def plan_snapshot(repo: str, endpoint: str | None = None, cache_dir: Path | None = None) -> DownloadPlan:
    """The files of ``repo`` that are not in the Hub cache yet, with their sizes from the Hub."""
    return _plan(_listing(repo, endpoint, cache_dir))


def _listing(repo: str, endpoint: str | None, cache_dir: Path | None):
    from engine.models.hub_metadata import list_repo

    repo = check_repo(repo)
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    _offline_check(f"{cache} (the Hugging Face cache)")
    return list_repo(repo, endpoint, cache)


def _plan(listing) -> DownloadPlan:
    return DownloadPlan(listing.repo, tuple((path, listing.sizes[path]) for path in listing.missing), listing.cache,
                        listing.revision)


def check_model_repo(listing, endpoint: str | None = None) -> None:
    """Refuse a repository the app cannot run before its weights download: one that is no diffusers model (no
    model_index.json), or whose folder check fails on its JSON files and weight headers (ModelError)."""
    from engine.models.hub_metadata import read_before_weights, read_repo_metadata

    if not listing.is_pipeline:
        raise DownloadError(f"{listing.repo} has no model_index.json, so it is not a diffusers model the app can run; "
                            "to download one file of it (a LoRA, a transformer file), give the file's path too")
    if listing.weights_missing:
        read_before_weights(read_repo_metadata(listing, endpoint), listing.repo)


def bytes_progress(on_progress: Progress, total: int | None = None):
    """A tqdm class for huggingface_hub's downloads that prints nothing and reports the bytes written so far (its
    bytes bars; a Xet download's second bar, of the bytes on the wire, is not said), out of ``total`` (None: the
    bar's own size)."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class Reporting(hub_tqdm):
        def __init__(self, *args, **kwargs):
            self.reports = kwargs.get("unit") == "B" and not str(kwargs.get("name") or "").endswith(".transfer")
            self.size = total or kwargs.get("total")
            self.done = int(kwargs.get("initial") or 0)
            kwargs["disable"] = True    # counted here: a disabled bar counts nothing and prints nothing
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            self.done += int(n or 0)
            if self.reports:
                on_progress(min(self.done, self.size) if self.size else self.done, self.size)
            return super().update(n)

    return Reporting


def _prefetch_blob(plan: DownloadPlan, path: str, endpoint: str | None, on_progress: Progress | None) -> None:
    """Fetch one large file of a snapshot into the Hub cache's blob store, resuming a cut try's ``.part`` file."""
    from huggingface_hub.file_download import repo_folder_name

    where = f"{plan.target} (the Hugging Face cache)"
    remote = _remote_file(plan.repo, path, endpoint, where, plan.revision)
    blobs = plan.target / repo_folder_name(repo_id=plan.repo, repo_type="model") / "blobs"
    if remote.etag and not (blobs / remote.etag).is_file():
        blobs.mkdir(parents=True, exist_ok=True)
        transfer_file(remote, blobs / remote.etag, on_progress, f"{plan.repo}/{path}")


def download_snapshot(repo: str, on_progress: Progress | None = None, free_bytes: int | None = None,
                      endpoint: str | None = None, cache_dir: Path | None = None,
                      resumable_bytes: int = RESUMABLE_BYTES) -> Path:
    """Download ``repo`` into the Hub cache (where the engine finds it by its repo id) and return its folder;
    DownloadError, before any byte, when it does not fit, the Hub cannot be reached or the repo is unknown, and
    before any byte of weights (ModelError) when its description says the app cannot run it.
    Files of ``resumable_bytes`` or more resume where a cut try stopped."""
    from huggingface_hub import snapshot_download

    listing = _listing(repo, endpoint, cache_dir)
    plan = _plan(listing)
    check_space(plan, free_bytes)
    check_model_repo(listing, endpoint)   # its JSON files and weight headers, before the weights
    where = f"{plan.target} (the Hugging Face cache)"
    total, before = plan.needed_bytes, 0
    for path, size in plan.files:
        if size >= resumable_bytes:
            def said(done: int, _: int, start: int = before) -> None:
                if on_progress:
                    on_progress(start + done, total)
            _prefetch_blob(plan, path, endpoint, said)
            before += size
    progress = bytes_progress(lambda done, _: on_progress(min(before + done, total), total), total) \
        if on_progress else None
    try:
        folder = snapshot_download(plan.repo, cache_dir=plan.target, endpoint=endpoint, tqdm_class=progress,
                                   revision=plan.revision or None)
    except Exception as exc:   # the files finished so far stay in the cache: the next try fetches the others
        failure = hub_failure(exc, plan.repo, where)
        raise DownloadError(f"{failure}. The files finished so far are kept: Download again fetches the others") \
            from exc
    if on_progress:
        on_progress(plan.needed_bytes, plan.needed_bytes)
    return Path(folder)


# ----- one file, into the models folder ------------------------------------------------------------------------
def check_repo_path(path: str) -> str:
    """A file's path inside a repo: relative, without '..'."""
    path = (path or "").strip().replace("\\", "/") if isinstance(path, str) else ""
    parts = PurePosixPath(path).parts
    if not path or path.startswith("/") or ".." in parts or not parts:
        raise DownloadError(f"{path!r} is not a file's path inside a repo; write it as in the repo, e.g. "
                            "folder/name.safetensors")
    return path


@dataclass(frozen=True)
class _Remote:
    url: str
    size: int
    etag: str


def _remote_file(repo: str, path: str, endpoint: str | None, where: str, revision: str | None = None) -> _Remote:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        url = hf_hub_url(repo, path, revision=revision or None, endpoint=endpoint)
        meta = get_hf_file_metadata(url, endpoint=endpoint)
    except Exception as exc:   # the Hub's errors and the network's, worded by hub_failure
        raise hub_failure(exc, repo, where) from exc
    if meta.size is None:
        raise DownloadError(f"the Hub did not say how large {repo}/{path} is, so the free space cannot be checked; "
                            f"try again later, or put the file in {where}")
    return _Remote(meta.location, int(meta.size), (meta.etag or "").strip('"'))


def partial_file(target: Path, etag: str) -> Path:
    """Where the bytes of an unfinished download of ``target`` wait for the next try (one per version of the file)."""
    return target.with_name(f"{target.name}.{etag[:16] or 'unknown'}.part")


def plan_file(repo: str, path: str, folder: Path, endpoint: str | None = None) -> tuple[DownloadPlan, _Remote]:
    repo, path = check_repo(repo), check_repo_path(path)
    where = str(folder)
    _offline_check(where)
    remote = _remote_file(repo, path, endpoint, where)
    target = Path(folder) / PurePosixPath(path).name
    if target.exists() and not (target.is_file() and target.stat().st_size == remote.size):
        raise DownloadError(f"{target} exists already and is not this file; delete or rename it first")
    part = partial_file(target, remote.etag)
    have = part.stat().st_size if part.is_file() else 0
    missing = 0 if target.is_file() else max(remote.size - have, 0)
    return DownloadPlan(repo, ((path, missing),) if missing else (), Path(folder)), remote


def download_file(repo: str, path: str, folder: Path, on_progress: Progress | None = None,
                  free_bytes: int | None = None, endpoint: str | None = None) -> Path:
    """Download the file ``path`` of ``repo`` into ``folder`` and return it; an interrupted try leaves a partial file
    that the next one continues. DownloadError, before any byte, when it does not fit or the Hub cannot be reached."""
    plan, remote = plan_file(repo, path, folder, endpoint)
    target = Path(folder) / PurePosixPath(plan.files[0][0] if plan.files else path).name
    if not plan.files:
        return target
    check_space(plan, free_bytes)
    Path(folder).mkdir(parents=True, exist_ok=True)
    transfer_file(remote, target, on_progress)
    return target


def transfer_file(remote: _Remote, target: Path, on_progress: Progress | None = None, label: str = "") -> None:
    """Fetch ``remote`` into ``target`` through its partial file, from where the last try stopped; ``label`` names
    it in messages (default: the target's name)."""
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session

    label = label or target.name
    part = partial_file(target, remote.etag)
    done = part.stat().st_size if part.is_file() else 0
    if done > remote.size:    # not this version's bytes: start again
        part.unlink()
        done = 0
    headers = build_hf_headers()
    if done:
        headers["Range"] = f"bytes={done}-"
    try:
        with get_session().stream("GET", remote.url, headers=headers, follow_redirects=True,
                                  timeout=READ_TIMEOUT_S) as response:
            response.raise_for_status()
            if response.status_code != 206:    # the whole file came back: write it from the start
                done = 0
            with part.open("ab" if done else "wb") as out:
                for chunk in response.iter_bytes():   # as they come: a cut keeps every byte that arrived
                    out.write(chunk)
                    done += len(chunk)
                    if on_progress:
                        on_progress(done, remote.size)
    except httpx2.HTTPError as exc:   # a cut connection, a timeout, an error status: the partial file stays
        raise DownloadError(f"the download of {label} stopped after {size_words(done)} of "
                            f"{size_words(remote.size)} ({type(exc).__name__}: {exc}); Download again continues "
                            "from there") from exc
    if done != remote.size:
        raise DownloadError(f"the download of {label} ended after {done} of {remote.size} bytes; "
                            "Download again continues from there")
    os.replace(part, target)
