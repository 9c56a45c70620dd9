"""A stand-in for the Hugging Face Hub on 127.0.0.1 (http.server in a thread): the few endpoints that
huggingface_hub's snapshot and file downloads ask (repo info, the file tree, HEAD and GET of a file with Range),
recording every request. Tests pass its ``url`` as the downloads' endpoint; nothing leaves the machine."""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes]]                       # repo id -> {path in the repo: its bytes}
    cut: set = field(default_factory=set)                    # (repo, path): the next GET sends half, then hangs up
    broken: set = field(default_factory=set)                 # (repo, path): the next GET answers 500
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
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def gets(self, path_end: str) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and "/resolve/" in s.path and s.path.endswith(path_end)]

    def _answer(self, handler, body: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        self.seen.append(Seen(handler.command, path, handler.headers.get("Range")))
        for repo, files in self.repos.items():
            if path.startswith(f"/api/models/{repo}/revision/"):
                return _json(handler, {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]})
            if path.startswith(f"/api/models/{repo}/tree/"):
                return _json(handler, [{"type": "file", "path": f, "size": len(data),
                                        "oid": hashlib.sha1(data).hexdigest()} for f, data in files.items()])
            if path.startswith(f"/{repo}/resolve/"):
                name = path[len(f"/{repo}/resolve/"):].split("/", 1)[1]
                if name in files:
                    return self._file(handler, repo, name, files[name], body)
        handler.send_response(404)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _file(self, handler, repo: str, name: str, data: bytes, body: bool) -> None:
        if body and (repo, name) in self.broken:
            self.broken.discard((repo, name))
            handler.send_response(500)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        asked = handler.headers.get("Range")
        start = int(asked.split("=")[1].split("-")[0]) if asked else 0
        part = data[start:]
        handler.send_response(206 if asked else 200)
        handler.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        handler.send_header("X-Repo-Commit", COMMIT)
        handler.send_header("Content-Length", str(len(part)))
        if asked:
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        handler.end_headers()
        if not body:
            return
        if (repo, name) in self.cut:
            self.cut.discard((repo, name))
            handler.wfile.write(part[: len(part) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            return
        handler.wfile.write(part)


def _json(handler, value) -> None:
    data = json.dumps(value).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
