"""The documented endpoints' trailing inputs, filled in on the server: a raw HTTP caller of
``POST /gradio_api/call/<name>`` may send only the values it cares about, as gradio_client's callers may.

gradio itself refuses a call with fewer values than the event has inputs (its log says "didn't receive enough
input values"; the caller gets ``{"error": null}``); gradio_client fills the rest from the API's own defaults
before it sends. This ASGI middleware does the same for every other caller, from the same defaults
(``Blocks.get_api_info``: each input's value when the page was built). An input without a default (the prompt)
is sent as None, so that the app's own check says what is missing, in its own sentence.
"""
from __future__ import annotations

import json
import re

CALL = re.compile(r"^/gradio_api/call/(?P<name>[A-Za-z0-9_-]+)$")
# A request body larger than this is passed on as it is (an upload goes to gradio's upload route, not here).
MOST_BODY_BYTES = 1 << 20


class TrailingDefaults:
    def __init__(self, app):
        self.app = app
        self._defaults: dict[str, list] | None = None

    async def __call__(self, scope, receive, send):
        found = CALL.match(scope.get("path", "")) if scope["type"] == "http" and scope.get("method") == "POST" else None
        if found is None:
            return await self.app(scope, receive, send)
        body, more = await _read_body(receive)
        padded = None if more else self._padded(scope.get("app"), found["name"], body)
        if padded is None:
            return await self.app(scope, _replay(body, receive, more), send)
        headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(padded)).encode("latin-1")))
        await self.app(dict(scope, headers=headers), _replay(padded, receive, False), send)

    def _padded(self, gradio, name: str, body: bytes) -> bytes | None:
        """The body with the endpoint's missing trailing inputs added; None when nothing is to be added."""
        try:
            request = json.loads(body)
        except ValueError:
            return None
        data = request.get("data") if isinstance(request, dict) else None
        defaults = self._defaults_of(gradio).get(name)
        if not isinstance(data, list) or defaults is None or len(data) >= len(defaults):
            return None
        request["data"] = data + defaults[len(data):]
        return json.dumps(request).encode()

    def _defaults_of(self, gradio) -> dict[str, list]:
        """Each named endpoint's inputs' defaults in order (None where there is none), read once."""
        if self._defaults is None:
            blocks = gradio.get_blocks() if gradio is not None and hasattr(gradio, "get_blocks") else None
            if blocks is None:
                return {}
            info = blocks.get_api_info() or {}
            self._defaults = {name.lstrip("/"): [p.get("parameter_default") if p.get("parameter_has_default") else None
                                                 for p in endpoint.get("parameters", ())]
                              for name, endpoint in info.get("named_endpoints", {}).items()}
        return self._defaults


async def _read_body(receive) -> tuple[bytes, bool]:
    """(the body read so far, whether more follows: a body beyond MOST_BODY_BYTES is not read further here)."""
    body, more = b"", True
    while more and len(body) <= MOST_BODY_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return body, False
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body, more


def _replay(body: bytes, receive, more: bool):
    """A receive that gives ``body`` first, then (when ``more``) what the client still sends."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()
    return replay
