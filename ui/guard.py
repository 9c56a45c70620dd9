"""What every request passes before it reaches the page's server (an ASGI middleware, and its rules).

- Host: only the names this app is reached by (localhost, the address it listens on, the machine's own
  names and addresses with --listen, the share link's domain with --share, and --allowed-host), so that no
  other web page can reach a local app through DNS rebinding. Others get 400.
- Login: wrong passwords from one address are slowed down, more with each one (429 while it must wait).
- Sessions: with a password, a page session belongs to the login that opened it; a request naming another
  login's session is refused (403), so a session id someone learns neither shows nor cancels their jobs;
  gradio's own route for cancelling an event asks for a login.
- Uploads: with a password, an uploaded file belongs to each login that uploaded it; another login can neither
  download it nor give it as an input (403). Gradio names uploads by a keyed hash of their content, so their
  paths are not guessed; this closes the case of a path that was learnt.
- Files: outputs are served with a content type that a browser will not run as a page (no HTML, no SVG).
"""
from __future__ import annotations

import json
import socket
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
SHARE_DOMAIN = "*.gradio.live"
# Wrong passwords one address may try freely within the window; each one after that doubles the wait.
FREE_LOGIN_TRIES = 5
LOGIN_WINDOW_S = 15 * 60
LONGEST_LOGIN_WAIT_S = 300.0
# File types a browser would run as a page or a script: served as plain downloads instead.
ACTIVE_TYPES = (b"text/html", b"application/xhtml", b"image/svg", b"text/xml", b"application/xml",
                b"text/javascript", b"application/javascript")


def host_of(header: str) -> str:
    """The host name of a Host header, without its port: 'example.com:7860' -> 'example.com', '[::1]:80' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass(frozen=True)
class HostAllowList:
    names: frozenset[str]

    @classmethod
    def for_server(cls, host: str, listen: bool, share: bool, extra=()) -> "HostAllowList":
        names = {*LOOPBACK_NAMES, host_of(host), *(host_of(h) for h in extra)}
        if listen or host_of(host) not in LOOPBACK_NAMES:
            names |= machine_names()
        if share:
            names.add(SHARE_DOMAIN)
        names.discard("0.0.0.0")
        return cls(frozenset(n for n in names if n))

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        host = host_of(header)
        return host in self.names or any(n.startswith("*.") and host.endswith(n[1:]) for n in self.names)


def machine_names() -> set[str]:
    """This machine's own names and addresses (what a colleague on the network types to reach it)."""
    import psutil

    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                names.add(address.address.split("%")[0].lower())
    return names


@dataclass
class LoginThrottle:
    """Wrong passwords per address: after FREE_LOGIN_TRIES in the window, each next try must wait twice as long."""
    clock: Callable[[], float] = time.monotonic
    _failures: dict = field(default_factory=lambda: defaultdict(deque))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, address: str) -> float:
        """Seconds ``address`` must still wait before its next try (0: it may try now)."""
        with self._lock:
            failures = self._recent(address)
            if len(failures) < FREE_LOGIN_TRIES:
                return 0.0
            wait = min(LONGEST_LOGIN_WAIT_S, 2.0 ** (len(failures) - FREE_LOGIN_TRIES))
            return max(0.0, failures[-1] + wait - self.clock())

    def failed(self, address: str) -> None:
        with self._lock:
            self._recent(address).append(self.clock())

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._failures.pop(address, None)

    def _recent(self, address: str) -> deque:
        failures = self._failures[address]
        while failures and self.clock() - failures[0] > LOGIN_WINDOW_S:
            failures.popleft()
        return failures


def login_token(scope) -> str | None:
    """The login token the request's cookies carry (gradio's own), if any."""
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, item = part.strip().partition("=")
                if key.startswith("access-token"):
                    return item
    return None


def logged_in(app, scope) -> bool:
    """Whether the request carries a login of gradio's app ``app`` (always true for an app without a password)."""
    if getattr(app, "auth", None) is None:
        return True
    token = login_token(scope)
    return token is not None and token in getattr(app, "tokens", {})


@dataclass
class Owners:
    """Which logins a key belongs to, for the last ``most`` keys. A page session belongs to the login that
    opened it (``claim``: the first wins), so a session id someone learns is of no use to them (not to read
    that session's events, nor to cancel its jobs). An uploaded file belongs to each login that uploaded it
    (``add``: uploads carry no session id, the login is what the request proves; the same content uploaded
    twice has one path)."""
    most: int = 50_000
    _owners: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self, key: str, token: str | None) -> bool:
        """False when ``key`` belongs to another login; the first login to use it owns it."""
        with self._lock:
            owners = self._owners.setdefault(key, {token})
            self._forget_oldest()
            return token in owners

    def add(self, keys, token: str | None) -> None:
        with self._lock:
            for key in keys:
                if isinstance(key, str):
                    self._owners.setdefault(key, set()).add(token)
            self._forget_oldest()

    def others(self, keys, token: str | None) -> bool:
        """Whether any of ``keys`` belongs to other logins only."""
        with self._lock:
            return any(key in self._owners and token not in self._owners[key] for key in keys)

    def _forget_oldest(self) -> None:
        while len(self._owners) > self.most:
            self._owners.pop(next(iter(self._owners)))


class Guard:
    """The ASGI middleware: see the module's docstring."""

    def __init__(self, app, hosts: HostAllowList, throttle: LoginThrottle, sessions: Owners | None = None,
                 uploads: Owners | None = None):
        self.app = app
        self.hosts = hosts
        self.throttle = throttle
        self.sessions = sessions or Owners()
        self.uploads = uploads or Owners()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.hosts.allows(host):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            return await _answer(send, 400, f"This app is not served under the name {host_of(host)!r}.")
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if method == "POST" and path.endswith("/login"):
            return await self._login(scope, receive, send)
        app = scope.get("app")
        if method == "POST" and path.endswith("/gradio_api/cancel") and not logged_in(app, scope):
            return await _answer(send, 401, "Log in first.")
        if getattr(app, "auth", None) is not None and "/gradio_api/" in path:
            token = login_token(scope)
            if "/file=" in path:
                if self.uploads.others([path.split("/file=", 1)[1]], token):
                    return await _answer(send, 403, "This file was uploaded by another login.")
            elif method == "POST" and path.endswith("/gradio_api/upload"):
                return await self.app(scope, receive, _keeping_answer(send, lambda paths: self.uploads.add(
                    paths if isinstance(paths, list) else (), token)))
            else:
                receive, session_hash, body = await _session_of(scope, receive)
                if session_hash and not self.sessions.claim(session_hash, token):
                    return await _answer(send, 403, "This session belongs to another login.")
                if self.uploads.others(_file_paths(body), token):
                    return await _answer(send, 403, "An input file was uploaded by another login: upload your own.")
        if "/file=" in path:
            return await self.app(scope, receive, _safe_types(send))
        return await self.app(scope, receive, send)

    async def _login(self, scope, receive, send):
        address = (scope.get("client") or ("?",))[0]
        wait = self.throttle.wait_for(address)
        if wait > 0:
            return await _answer(send, 429, f"Too many wrong passwords from this address: wait {wait:.0f} s and "
                                            "try again.")
        status = {}

        async def watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        if status.get("code", 500) < 400:
            self.throttle.succeeded(address)
        else:
            self.throttle.failed(address)


async def _session_of(scope, receive):
    """(a receive() that replays the request body, the session id the request names in its query or its JSON
    body or None, the JSON body or None)."""
    from urllib.parse import parse_qs

    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    named = query["session_hash"][0] if query.get("session_hash") else None
    if scope.get("method") != "POST" or b"json" not in dict(scope.get("headers", ())).get(b"content-type", b""):
        return receive, named, None
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        value = json.loads(body or b"{}")
    except ValueError:
        return replay, named, None
    session_hash = value.get("session_hash") if isinstance(value, dict) else None
    return replay, named or (session_hash if isinstance(session_hash, str) else None), value


def _file_paths(value) -> list[str]:
    """Every file path a request's JSON names (gradio's file records: {"path": ...})."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("path"), str):
                found.append(item["path"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _keeping_answer(send, seen: Callable):
    """A send() that passes the response on and hands its JSON body to ``seen`` once it is complete."""
    chunks = []

    async def wrapped(message):
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                try:
                    seen(json.loads(b"".join(chunks) or b"null"))
                except ValueError:
                    pass
        await send(message)
    return wrapped


def _safe_types(send):
    """A send() that turns a page or script file into a plain download."""
    async def wrapped(message):
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", ())]
            kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            if kind.lower().startswith(ACTIVE_TYPES):
                headers = [(k, v) for k, v in headers if k.lower() not in (b"content-type", b"content-disposition")]
                headers += [(b"content-type", b"text/plain; charset=utf-8"), (b"content-disposition", b"attachment"),
                            (b"x-content-type-options", b"nosniff")]
                message = {**message, "headers": headers}
        await send(message)
    return wrapped


async def _answer(send, status: int, text: str) -> None:
    body = json.dumps({"detail": text}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
