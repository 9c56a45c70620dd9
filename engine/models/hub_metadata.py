"""A Hub repository read before its weights download: its listing, its JSON files, and its weight files' headers.

A model repository is tens of gigabytes of weights described by kilobytes: ``model_index.json``, each component's
config, the shard index files, and the header at the start of every safetensors file (its tensors' names, shapes
and dtypes). Those are fetched first (the JSON files into the Hub cache, the headers by HTTP range requests of a
file's first bytes), so that the folder check and the plan run on them and a repository the app cannot use is
refused in seconds, before a byte of weights. ``HubFiles`` answers the folder check (engine/models/refs.py
``check_model_folder``) as the files on a disk would, from the listing and the fetched headers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import DownloadError, ModelError
from engine.models.hub_errors import hub_failure
from engine.models.refs import NamedModel, ResolvedModel, check_model_folder, hub_cache_dir
from engine.models.spec import spec_for
from engine.models.weights import WEIGHTED_COMPONENTS, MAX_HEADER_BYTES, Headers, WeightFileError, parse_header

# What is fetched first: every JSON file but the tokenizers' vocabularies (megabytes, and not needed to check).
METADATA_PATTERNS = ["*.json"]
METADATA_IGNORED = ["*tokenizer.json", "*vocab.json"]
# A header is read in one request of this many bytes when it fits, else in a second one for the rest: a published
# shard's header is 5-20 kB (tests/fixtures/published/), a whole 1.3B transformer's 84 kB.
FIRST_READ_BYTES = 32 << 10
# Seconds to wait for the Hub's answer to one request.
TIMEOUT_S = 30.0


@dataclass
class HubFiles:
    """A Hub repository's files at one revision as the folder check reads them: names from its listing, safetensors
    headers fetched on first use (each checked against the file's listed size as a file on disk is)."""
    repo: str
    revision: str
    sizes: dict[str, int]                       # path in the repo -> bytes
    endpoint: str | None = None
    fetched: dict[str, dict] = field(default_factory=dict, repr=False)   # path -> its header, once read

    def names(self, part: str) -> list[str] | None:
        inside = [path[len(part) + 1:] for path in self.sizes if path.startswith(part + "/")]
        names = sorted(name for name in inside if "/" not in name)
        return names if inside else None

    def header(self, part: str, name: str) -> dict:
        path = f"{part}/{name}"
        if path not in self.fetched:
            self.fetched[path] = parse_header(_RangeReader(self, path).read, self.sizes[path])
        return self.fetched[path]

    def damaged(self, named: NamedModel, path: str, reason: str) -> ModelError:
        return ModelError(f"{named.label}: weight file {path} on the Hugging Face Hub is damaged: {reason}. None of "
                          "its weights was downloaded; choose another model, or tell the repository's makers")

    # The repository itself lacks what the check misses: nothing of it is downloaded.
    redo = ("the repository on the Hugging Face Hub is published so, and nothing of its weights was downloaded; choose "
            "another model")

    def headers(self) -> dict[str, Headers]:
        """Every weighted component's safetensors headers (fetched now where the check has not yet)."""
        found: dict[str, Headers] = {}
        for part in WEIGHTED_COMPONENTS:
            for name in self.names(part) or ():
                if name.endswith(".safetensors"):
                    found.setdefault(part, {})[name] = self.header(part, name)
        return found


class _RangeReader:
    """Bytes of one file on the Hub, read by HTTP range requests: the first FIRST_READ_BYTES in one, the rest of a
    longer header in another. A server that ignores the range is read no further than the bytes asked for."""

    def __init__(self, files: HubFiles, path: str):
        self.files, self.path = files, path
        self.start, self.data = 0, b""

    def read(self, start: int, count: int) -> bytes:
        end = start + count
        if start < self.start or end > self.start + len(self.data):
            size = self.files.sizes[self.path]
            wanted = max(count, FIRST_READ_BYTES if start == 0 else 0)
            self.start, self.data = start, self._fetch(start, min(start + wanted, size, start + MAX_HEADER_BYTES + 9))
        offset = start - self.start
        return self.data[offset:offset + count]

    def _fetch(self, start: int, end: int) -> bytes:
        import httpx2
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session

        if end <= start:
            return b""
        url = hf_hub_url(self.files.repo, self.path, revision=self.files.revision or None,
                         endpoint=self.files.endpoint)
        headers = build_hf_headers()
        headers["Range"] = f"bytes={start}-{end - 1}"
        data = bytearray()
        try:
            with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                                      timeout=TIMEOUT_S) as response:
                response.raise_for_status()
                skip = start if response.status_code != 206 else 0   # the whole file came: skip to the range
                for chunk in response.iter_bytes():
                    if skip:
                        dropped = min(skip, len(chunk))
                        chunk, skip = chunk[dropped:], skip - dropped
                    data += chunk
                    if len(data) >= end - start:
                        break
        except httpx2.HTTPError as exc:
            raise DownloadError(f"Can't read {self.files.repo}/{self.path} on the Hugging Face Hub "
                                f"({type(exc).__name__}: {exc}); check the connection and try again") from exc
        return bytes(data[:end - start])


@dataclass(frozen=True)
class RepoListing:
    """A repository's files at one revision, as the Hub lists them, and which of them the cache lacks."""
    repo: str
    revision: str
    sizes: dict[str, int]        # path in the repo -> bytes
    missing: tuple[str, ...]     # paths not in the Hub cache yet
    cache: Path

    @property
    def is_pipeline(self) -> bool:
        return "model_index.json" in self.sizes

    @property
    def weights_missing(self) -> bool:
        return any(path.split("/")[0] in WEIGHTED_COMPONENTS and not is_metadata(path) for path in self.missing)


def list_repo(repo: str, endpoint: str | None = None, cache_dir: Path | None = None) -> RepoListing:
    """The files of ``repo`` with their sizes, from the Hub (no file is fetched); DownloadError when the Hub cannot be
    reached or does not know the repo (worded as the Models tab's downloads word it)."""
    from huggingface_hub import snapshot_download

    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    try:
        infos = snapshot_download(repo, cache_dir=cache, endpoint=endpoint, dry_run=True)
    except Exception as exc:   # the Hub's errors and the network's, worded by hub_failure
        raise hub_failure(exc, repo, f"{cache} (the Hugging Face cache)") from exc
    return RepoListing(repo, next((info.commit_hash for info in infos), ""),
                       {info.filename: int(info.file_size or 0) for info in infos},
                       tuple(info.filename for info in infos if info.will_download), cache)


@dataclass(frozen=True)
class RepoMetadata:
    """What a repository says of itself before its weights download: its JSON files (in its snapshot folder in the
    Hub cache) and its weight files as the folder check reads them (``files``)."""
    listing: RepoListing
    folder: Path
    files: HubFiles

    @property
    def revision(self) -> str:
        return self.listing.revision


def read_repo_metadata(listing: RepoListing, endpoint: str | None = None) -> RepoMetadata:
    """The JSON files of the listed repository fetched into the Hub cache (kilobytes)."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(listing.repo, cache_dir=listing.cache, endpoint=endpoint,
                                   revision=listing.revision or None, allow_patterns=METADATA_PATTERNS,
                                   ignore_patterns=METADATA_IGNORED)
    except Exception as exc:   # the Hub's errors and the network's, worded by hub_failure
        raise hub_failure(exc, listing.repo, f"{listing.cache} (the Hugging Face cache)") from exc
    return RepoMetadata(listing, Path(folder), HubFiles(listing.repo, listing.revision, listing.sizes, endpoint))


def is_metadata(path: str) -> bool:
    """A file fetched before the weights (METADATA_PATTERNS)."""
    from fnmatch import fnmatch

    return (any(fnmatch(path, pattern) for pattern in METADATA_PATTERNS)
            and not any(fnmatch(path, pattern) for pattern in METADATA_IGNORED))


def read_before_weights(meta: RepoMetadata, ref: str) -> ResolvedModel:
    """A Hub repository as its metadata says it is: its folder checked against its listing and its weight files'
    headers, its spec read from them (ModelError when it cannot be used), before any weight is fetched."""
    facts = check_model_folder(meta.folder, ref, meta.files)
    return ResolvedModel(ref, meta.folder, "hub", meta.revision, *facts, spec_for(ref, meta.folder, meta.files.headers()))
