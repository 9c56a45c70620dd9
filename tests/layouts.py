"""Model folders laid out as published repositories are, for the tests that load them through the users' path.

``save_fastwan_layout``: the self-test model saved as FastVideo publishes FastWan (``WanDMDPipeline`` in its
model_index.json, a gate of the sparse attention in every transformer block), in float32 shards with index files as
the Wan2.1 repositories store their weights, so that the whole path a FastWan download takes runs on the CPU in
seconds. The writer is the benchmarks' (bench/realsize.py), which writes the real-size one on a GPU.
"""
from __future__ import annotations

from pathlib import Path

from bench.realsize import FASTWAN_GATE, save_as_fastwan

# Small enough that each of the tiny model's transformer and text encoder is written in several shards.
SHARD_SIZE = "40KB"


def save_fastwan_layout(folder: Path) -> Path:
    """The self-test text-to-video model as a FastWan repository (float32, sharded): returns ``folder``."""
    from engine.models.selftest import SELFTEST_T2V, build_selftest_pipeline

    save_as_fastwan(build_selftest_pipeline(SELFTEST_T2V), folder, family=None, shard_size=SHARD_SIZE)
    return folder


def gate_weights(folder: Path) -> dict:
    """The gate tensors of a FastWan-layout folder's files, by name."""
    from safetensors.torch import load_file

    found = {}
    for shard in sorted((Path(folder) / "transformer").glob("*.safetensors")):
        found.update({name: tensor for name, tensor in load_file(shard).items() if FASTWAN_GATE in name})
    return found


# ----- the published repositories, from their header-only fixtures (tests/fixtures/published/README.md) ----------
PUBLISHED = Path(__file__).resolve().parent / "fixtures" / "published"


def published_repos() -> list[str]:
    """The repo ids whose published layout is kept (org/name)."""
    import json

    return sorted(json.loads((folder / "files.json").read_text())["repo"]
                  for folder in (PUBLISHED / "repos").iterdir() if (folder / "files.json").is_file())


def _fixture(repo: str) -> Path:
    return PUBLISHED / "repos" / repo.replace("/", "--")


def repo_files(repo: str) -> dict:
    """{path in the repo: its published size in bytes} of every file the fixture lists."""
    import json

    return {path: entry["bytes"] for path, entry in json.loads((_fixture(repo) / "files.json").read_text())["files"].items()}


def write_sparse(path: Path, size: int, start: bytes = b"") -> Path:
    """A file of ``size`` bytes beginning with ``start``, the rest a hole (it takes no disk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        file.write(start)
        file.truncate(size)
    return path


def safetensors_start(header: bytes) -> bytes:
    """The bytes a safetensors file begins with: its header's length (8 bytes, little-endian), then the header."""
    import struct

    return struct.pack("<Q", len(header)) + header


def materialize_repo(repo: str, folder: Path) -> Path:
    """The published repository as a folder of its published sizes: its JSON files as kept, each weight file its
    header and a hole to its size, every other file (tokenizer data, README) a hole of its size."""
    source = _fixture(repo)
    for path, size in repo_files(repo).items():
        kept, header = source / path, source / f"{path}.header"
        if header.is_file():
            write_sparse(folder / path, size, safetensors_start(header.read_bytes()))
        elif kept.is_file():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_bytes(kept.read_bytes())
        else:
            write_sparse(folder / path, size)
    return folder


def single_files() -> dict:
    """{"org/name/path": {"bytes", "from", "dtype"}} of the single published files kept (LoRAs, decoders, ...)."""
    import json

    return json.loads((PUBLISHED / "files" / "files.json").read_text())


def materialize_file(key: str, folder: Path, name: str | None = None) -> Path:
    """One single published safetensors file (``key``: "org/name/path") in ``folder``: its header and a hole."""
    org, repo, path = key.split("/", 2)
    header = (PUBLISHED / "files" / f"{org}--{repo}" / f"{path}.header").read_bytes()
    return write_sparse(Path(folder) / (name or Path(path).name), single_files()[key]["bytes"], safetensors_start(header))


def rife_shapes() -> dict:
    """{tensor name: (dtype, shape)} of the published rife49.pth, in its state dict's order."""
    import json

    raw = json.loads((PUBLISHED / "files" / "marduk191--rife" / "rife49.pth.shapes.json").read_text())
    return {name: (dtype, tuple(shape)) for name, (dtype, shape) in raw.items()}
