"""A stand-in for the Hugging Face Hub on 127.0.0.1 (http.server in a thread): the few endpoints that
huggingface_hub's snapshot and file downloads ask (repo info, the file tree, HEAD and GET of a file with Range),
recording every request. Tests pass its ``url`` as the downloads' endpoint; nothing leaves the machine.

A file is its bytes, or a path on disk (a published layout's sparse weight files: gigabytes that take no disk), served
in pieces so that a range request of a header reads only its bytes."""
from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes | Path]]                # repo id -> {path in the repo: its bytes, or a file}
    # Faults of a file's download (a GET of the file, or of its rest: a range with no end; a read of its header, a
    # range with an end, is answered as usual): the next one sends half, then hangs up (cut), or answers 500 (broken).
    cut: set = field(default_factory=set)
    broken: set = field(default_factory=set)
    seen: list[Seen] = field(default_factory=list)

    def start(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, name="fake-hub", daemon=True).start()
        self._offline = _go_online()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        _back_offline(self._offline)

    def gets(self, path_end: str) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and "/resolve/" in s.path and s.path.endswith(path_end)]

    def downloads(self, path_end: str) -> list[Seen]:
        """The GETs of the files whose path ends so that fetch a file or its rest (not a header's range)."""
        return [s for s in self.gets(path_end) if not s.range or s.range.endswith("-")]

    def bytes_sent(self, path_end: str) -> int:
        """Bytes the GETs of files whose path ends so asked for (a whole file counts as its size)."""
        total = 0
        for seen in self.gets(path_end):
            size = next(_size(data) for files in self.repos.values() for name, data in files.items()
                        if seen.path.endswith("/" + name))
            start, end = _range(seen.range, size)
            total += end - start
        return total

    def _answer(self, handler, body: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        self.seen.append(Seen(handler.command, path, handler.headers.get("Range")))
        for repo, files in self.repos.items():
            if path.startswith(f"/api/models/{repo}/revision/"):
                return _json(handler, {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]})
            if path.startswith(f"/api/models/{repo}/tree/"):
                return _json(handler, [{"type": "file", "path": f, "size": _size(data), "oid": _oid(data)}
                                       for f, data in files.items()])
            if path.startswith(f"/{repo}/resolve/"):
                name = path[len(f"/{repo}/resolve/"):].split("/", 1)[1]
                if name in files:
                    return self._file(handler, repo, name, files[name], body)
        handler.send_response(404)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _file(self, handler, repo: str, name: str, data: bytes | Path, body: bool) -> None:
        asked = handler.headers.get("Range")
        download = not asked or asked.endswith("-")
        if body and download and (repo, name) in self.broken:
            self.broken.discard((repo, name))
            handler.send_response(500)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        size = _size(data)
        start, end = _range(asked, size)
        handler.send_response(206 if asked else 200)
        handler.send_header("ETag", f'"{_etag(data)}"')
        handler.send_header("X-Repo-Commit", COMMIT)
        handler.send_header("Content-Length", str(end - start))
        if asked:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        handler.end_headers()
        if not body:
            return
        if download and (repo, name) in self.cut:
            self.cut.discard((repo, name))
            handler.wfile.write(_read(data, start, start + (end - start) // 2))
            handler.wfile.flush()
            handler.close_connection = True
            return
        try:
            for at in range(start, end, 1 << 20):   # in pieces: a client that has what it asked for may hang up
                handler.wfile.write(_read(data, at, min(at + (1 << 20), end)))
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True


def _size(data: bytes | Path) -> int:
    return os.path.getsize(data) if isinstance(data, Path) else len(data)


def _etag(data: bytes | Path) -> str:
    """A file's ETag: the hash of its bytes (of its path and size for a file on disk: gigabytes are not hashed)."""
    if isinstance(data, Path):
        return hashlib.sha256(f"{data}:{_size(data)}".encode()).hexdigest()
    return hashlib.sha256(data).hexdigest()


def _oid(data: bytes | Path) -> str:
    return hashlib.sha1(f"{data}:{_size(data)}".encode() if isinstance(data, Path) else data).hexdigest()


def _read(data: bytes | Path, start: int, end: int) -> bytes:
    if isinstance(data, Path):
        with open(data, "rb") as file:
            file.seek(start)
            return file.read(end - start)
    return data[start:end]


def _go_online() -> tuple:
    """The tests run offline (tests/conftest.py sets HF_HUB_OFFLINE=1): while a stand-in Hub runs, this process is
    online, as the app and huggingface_hub each see it (the app reads the variable, huggingface_hub its value at
    import). Returns what to put back."""
    from huggingface_hub import constants

    before = (os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE)
    os.environ["HF_HUB_OFFLINE"] = "0"
    constants.HF_HUB_OFFLINE = False
    return before


def _back_offline(before: tuple) -> None:
    from huggingface_hub import constants

    variable, constant = before
    if variable is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = variable
    constants.HF_HUB_OFFLINE = constant


def _range(asked: str | None, size: int) -> tuple[int, int]:
    """(first byte, one past the last) of a Range header's ``bytes=a-`` or ``bytes=a-b`` (the whole file without)."""
    if not asked:
        return 0, size
    first, _, last = asked.split("=", 1)[1].partition("-")
    return int(first), min(int(last) + 1, size) if last else size


def _json(handler, value) -> None:
    data = json.dumps(value).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def serve_downloads_from(hub: FakeHub, monkeypatch, cache: Path) -> FakeHub:
    """This process's Hub downloads (huggingface_hub reads its endpoint once, at import) pointed at ``hub``, into
    the Hub cache ``cache``, online: what the engine's downloads of a job then reach."""
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", hub.url)
    monkeypatch.setattr("huggingface_hub.constants.HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    return hub
