"""The app's server as an object in the test's own process (ui/serving.py makes it as app.py does) and requests sent
to it through httpx's ASGI transport: no port, no engine process started, and the password throttle on a clock the
test moves. For tests of the request handling (the guard, the routes); what needs a running job, a browser or a
second process still runs against a real server (tests/conftest.py's running_app)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

# The address the requests come from, and the server's own name and port as a browser on this machine writes them.
CALLER = ("127.0.0.1", 50123)
BASE_URL = "http://127.0.0.1:7860/"


@dataclass
class Clock:
    """A monotonic clock that moves only when the test says so."""
    now: float = 1000.0
    moves: list = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.moves.append(seconds)


@contextlib.contextmanager
def app_object(folder: Path, *argv: str, clock: Clock | None = None):
    """The ASGI application of ``python app.py ARGV`` (its outputs, models and user presets under ``folder``), with
    the wrong-password counter on ``clock``; send it requests with ``client(app)``."""
    import app
    from ui.guard.throttle import LoginThrottle
    from ui.serving import asgi_app, make_server
    from ui.startup import api_tokens, resolve_auth

    args = app.parse_args(["--outputs", str(folder / "outputs"), "--models-dir", str(folder / "models"),
                           "--user-presets", str(folder / "user_presets"), *argv])
    served = folder / "served"
    served.mkdir(parents=True, exist_ok=True)
    throttle = LoginThrottle(clock=clock) if clock else None
    server = make_server(args, served, resolve_auth(args), api_tokens(args.api_token), throttle)
    try:
        yield asgi_app(server)
    finally:
        server.engines.close()


def client(asgi, caller: tuple[str, int] = CALLER):
    """An httpx AsyncClient sending requests to ``asgi`` from ``caller``'s address, under the server's own name."""
    import httpx

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi, client=caller), base_url=BASE_URL, timeout=30)
