"""The tiny model repository a fake Hub serves: the self-test model's files by path, and its model_index.json."""
from __future__ import annotations

from pathlib import Path


def _tiny_repo_files() -> dict[str, bytes]:
    """The self-test model's files as a repository holds them (a model the downloads' checks accept)."""
    import tempfile

    from engine.models.selftest import SELFTEST_T2V, build_selftest_pipeline

    folder = Path(tempfile.mkdtemp(prefix="tiny-repo-"))
    build_selftest_pipeline(SELFTEST_T2V).save_pretrained(folder)
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file()}


REPO_FILES = _tiny_repo_files()
INDEX = REPO_FILES["model_index.json"]
