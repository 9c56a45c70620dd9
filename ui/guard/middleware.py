"""The ASGI middleware every request passes before gradio: it reads the request once (ui/guard/reading.py) and
decides on that reading, in this order:

1. Host: only the names this app is reached by (ui/guard/hosts.py): no other web page reaches a local app through
   DNS rebinding (400).
2. Origin: a request sent by a web page must come from the app's own page (403), with or without a password, so
   no site the user visits can upload files or start jobs.
3. Route: only the routes the page and the documented API use (ui/guard/routes.py); everything else 404.
4. Login: with a password, every route but the login page's needs a login (401); wrong passwords from one address
   are slowed down (429, ui/guard/throttle.py). The JSON API and /metrics take the same login as a script gives it
   (ui/guard/api_login.py), and hand the caller's login to the API in the request's scope (``LOGIN_KEY``).
5. Ownership, with a password: a page session, an event id and an upload belong to the login that made them
   (ui/guard/holdings.py); naming another login's is refused (403).
6. Uploads: a login's uploads that no job used are bounded (413) and removed after an hour (410 when named again).
7. Files are served one way (ui/guard/responses.py): media inline, everything else as a text download.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from engine.models.download import size_words
from ui.guard.api_login import ApiLogins
from ui.guard.holdings import Holdings
from ui.guard.inputs import check_file_inputs
from ui.guard.hosts import HostAllowList, host_of
from ui.guard.reading import WATCHED_HEADERS, Refused, file_key, plain_path, read_request, single_keys
from ui.guard.responses import answer, one_way_files, status_of, watching_answer
from ui.guard.routes import RouteTable
from ui.guard.throttle import LoginThrottle

# Where the JSON API finds who calls it, in the request's scope.
LOGIN_KEY = "wan_studio.login"
# How often stale uploads and ended logins are looked for (on the next request after this many seconds).
SWEEP_EVERY_S = 60.0
STATE_CHANGING = ("POST", "PUT", "PATCH", "DELETE")


class Guard:
    def __init__(self, app, hosts: HostAllowList, throttle: LoginThrottle, holdings: Holdings | None = None,
                 uploads_folder: str | Path | None = None, routes: RouteTable | None = None,
                 sweep_every_s: float = SWEEP_EVERY_S, api_logins: ApiLogins = ApiLogins()):
        self.app = app
        self.sweep_every_s = sweep_every_s
        self.hosts = hosts
        self.throttle = throttle
        self.holdings = holdings or Holdings(folder=Path(uploads_folder) if uploads_folder else None)
        self.routes = routes or RouteTable.of()
        self.api_logins = api_logins
        self._last_sweep = self.holdings.clock()
        self._sweep_lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":      # neither the page nor the API uses one
            return await send({"type": "websocket.close", "code": 1008})
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            receive, send = await self._check(scope, receive, send)
        except Refused as refused:
            path = scope.get("path", "")
            return await answer(send, refused.status, refused.text, api=path.startswith("/api/") or path == "/metrics")
        await self.app(scope, receive, send)

    async def _check(self, scope, receive, send):
        """(receive, send) for gradio, once the request passed every check; Refused saying why it did not."""
        headers = single_keys((k.lower(), v) for k, v in scope.get("headers", ()) if k.lower() in WATCHED_HEADERS)
        if b"transfer-encoding" in headers:
            # A body in chunks has no length to check before it is read (and beside a Content-Length the chunks win):
            # every limit here is a body's length, so none comes in chunks.
            raise Refused(411, "Send the request's body with its length (Content-Length), not in chunks "
                               "(Transfer-Encoding): every body this app takes is checked against its limit by its "
                               "length.")
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.hosts.allows(host):
            raise Refused(400, f"This app is not served under the name {host_of(host)!r}.")
        method, path = scope.get("method", "GET"), scope.get("path", "")
        self._check_origin(method, headers, host)
        found = self.routes.match(method, path)
        if found is None or not (found[0].file or plain_path(path)):
            raise Refused(404, "Not Found")
        route, params = found
        gradio = scope.get("app")
        if route.api:
            return receive, self._api_caller(scope, headers, gradio, route, send)
        login, logged_in, live = self._login(gradio, headers)
        if not route.public and not logged_in:
            raise Refused(401, "Log in first.")
        if route.template == "/login":
            send = self._throttled(scope, send)
        reading, receive = await read_request(scope, receive, route, params)
        self._sweep(live)
        if getattr(gradio, "auth", None) is not None:
            self._check_owners(reading, login, live)
        if reading.urls:
            raise Refused(404 if route.file else 400, "The app takes files uploaded to it, not web addresses: "
                                                      "upload the file instead.")
        gone = self.holdings.removed(reading.files, login)
        if gone:
            raise Refused(410, f"The upload {Path(gone).name!r} was removed: uploads no job uses are kept an hour. "
                               "Upload it again.")
        self._check_uploaded(gradio, reading)
        if route.gives_event:        # a job (the page's previews, which run unqueued, do not count)
            self.holdings.used(reading.files)
        if route.upload:
            send = self._uploading(reading, login, send)
        if route.gives_event:
            send = watching_answer(send, lambda value: self._claim_event(value, login, live))
        if route.file:
            send = one_way_files(send)
        return receive, send

    def _check_uploaded(self, gradio, reading) -> None:
        """The files a call to the page's functions names are uploads (or the app's own files served to the page),
        all in the served folder: gradio refuses any other path with a message it does not show (and a traceback
        in the console), so it is refused here with what to do instead."""
        folder = self.holdings.folder
        if reading.route.body != "json":
            return
        check_file_inputs(gradio, reading)
        if folder is None:
            return
        served = file_key(str(folder)) + os.sep
        stray = next((path for path in reading.files if not path.startswith(served)), None)
        if stray is not None:
            raise Refused(400, f"The file {Path(stray).name!r} was not uploaded to this app, which takes only files "
                               "uploaded to it: upload it first (POST /gradio_api/upload, or gradio_client's "
                               "handle_file), then send the path that upload answered with.")

    def _api_caller(self, scope, headers: dict, gradio, route, send):
        """A JSON API call: its login (401 without one where one is needed; a wrong one counts as a wrong password,
        429 after too many) put in the scope for the API; its body's length checked (the API reads it itself)."""
        from starlette.requests import cookie_parser

        from ui.guard.api_login import Credentials
        from ui.guard.reading import MAX_API_BODY

        cookies = cookie_parser(headers.get(b"cookie", b"").decode("latin-1"))
        cookie_id = getattr(gradio, "cookie_id", "")
        credentials = Credentials(headers.get(b"authorization", b"").decode("latin-1"),
                                  cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}"))
        accounts = getattr(gradio, "auth", None)
        address = (scope.get("client") or ("?",))[0]
        if credentials.authorization.strip():
            wait = self.throttle.start(address)
            if wait:
                raise Refused(429, f"Too many wrong passwords or tokens from this address: wait {wait} s and try "
                                   "again (until then every try from this address is refused, the right one too).")
        login, wrong = self.api_logins.login(credentials, accounts, getattr(gradio, "tokens", {}))
        if login is None:
            raise Refused(401, "Wrong user, password or token: send the page's user and password (HTTP basic) or a "
                               "token of --api-token (Authorization: Bearer)." if wrong else
                          "Log in first: send the page's user and password (HTTP basic) or a token of --api-token "
                          "(Authorization: Bearer).")
        if credentials.authorization.strip():
            self.throttle.succeeded(address)
        if route.body == "raw":
            length = headers.get(b"content-length", b"").decode("latin-1")
            if not length.isdigit():
                raise Refused(411, "Send the request's body with its length (Content-Length).")
            if int(length) > MAX_API_BODY:
                raise Refused(413, f"The request's body is {int(length) / 1e6:.0f} MB, more than the "
                                   f"{MAX_API_BODY / 1e6:.0f} MB a job with its files may send.")
        scope[LOGIN_KEY] = login
        return send

    def _check_origin(self, method: str, headers: dict, host: str) -> None:
        """A request a web page sent names that page in Origin (every POST does) or Referer: it must be the app's."""
        origin = headers.get(b"origin")
        if origin is None and method in STATE_CHANGING:
            origin = headers.get(b"referer")
        if origin is not None and not self.hosts.same_origin(origin.decode("latin-1"), host):
            raise Refused(403, "This request came from another web page; the app takes requests from its own page "
                               "only.")

    @staticmethod
    def _login(gradio, headers: dict):
        """(the request's login token, whether it is logged in, a test of whether a login still lives), read as
        gradio reads them."""
        if getattr(gradio, "auth", None) is None:
            return None, True, lambda login: True
        from starlette.requests import cookie_parser

        cookies = cookie_parser(headers.get(b"cookie", b"").decode("latin-1"))
        token = (cookies.get(f"access-token-{gradio.cookie_id}")
                 or cookies.get(f"access-token-unsecure-{gradio.cookie_id}"))
        tokens = gradio.tokens
        return token, token is not None and token in tokens, lambda login: login in tokens

    def _check_owners(self, reading, login, live) -> None:
        session = reading.session()
        if session is not None:
            if not isinstance(session, str):
                raise Refused(400, "The session id (session_hash) must be text.")
            if not self.holdings.claim(session, login, live):
                raise Refused(403, "This session belongs to another login.")
        event = reading.event()
        owner = self.holdings.owner(event) if isinstance(event, str) else None
        if owner not in (None, login) and live(owner):
            raise Refused(403, "This job belongs to another login.")
        upload_id = reading.query.get("upload_id")
        if upload_id and not self.holdings.claim("upload:" + upload_id, login, live):
            raise Refused(403, "This upload belongs to another login.")
        if self.holdings.others(reading.files, login):
            raise Refused(403, "This file was uploaded by another login." if reading.route.file else
                               "An input file was uploaded by another login: upload your own.")

    def _claim_event(self, value, login, live) -> None:
        if isinstance(value, dict) and isinstance(value.get("event_id"), str):
            self.holdings.claim(value["event_id"], login, live)

    def _uploading(self, reading, login, send):
        length = reading.headers.get(b"content-length", b"").decode("latin-1")
        if not length.isdigit():
            raise Refused(411, "Send an upload with its length (Content-Length).")
        waiting = self.holdings.room_for(login, int(length))
        if waiting is not None:
            raise Refused(413, f"Your uploads that no job has used yet take {size_words(waiting)}, and this one "
                               f"{size_words(int(length))}; one login may keep {size_words(self.holdings.unused_bytes)} "
                               "of them. Use them in a job, or wait: each is removed an hour after its upload.")
        return watching_answer(send, lambda paths: self.holdings.uploaded(
            [file_key(p) for p in paths if isinstance(p, str)] if isinstance(paths, list) else [], login))

    def _throttled(self, scope, send):
        address = (scope.get("client") or ("?",))[0]
        wait = self.throttle.start(address)
        if wait:
            raise Refused(429, f"Too many wrong passwords from this address: wait {wait} s and try again (until "
                               "then every try from this address is refused, the right password too).")
        return status_of(send, lambda code: self.throttle.succeeded(address) if code < 400 else None)

    def _sweep(self, live) -> None:
        now = self.holdings.clock()
        with self._sweep_lock:
            if now - self._last_sweep < self.sweep_every_s:
                return
            self._last_sweep = now
        self.holdings.sweep(live)
