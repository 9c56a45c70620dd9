"""What the guard answers itself, and the send() wrappers that read or amend gradio's answers."""
from __future__ import annotations

import json
from typing import Callable

# Files a browser shows and never runs: served inline with their own type. Every other file is served as a plain
# text download, whatever its name says (an .html, .svg, .xml or .js among the outputs never runs as a page).
MEDIA_TYPES = (b"image/png", b"image/jpeg", b"image/webp", b"image/gif", b"image/bmp", b"image/avif",
               b"video/mp4", b"video/webm", b"video/quicktime", b"audio/mpeg", b"audio/mp4", b"audio/wav",
               b"audio/ogg", b"audio/webm", b"audio/flac", b"audio/aac")


async def answer(send, status: int, text: str, api: bool = False) -> None:
    """A JSON answer in gradio's own shape ({"detail": ...}), which gradio_client shows as the error; to the JSON
    API and /metrics in the API's ({"error": ...}), a 401 saying how to log in (HTTP basic)."""
    body = json.dumps({"error": text} if api else {"detail": text}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"x-content-type-options", b"nosniff")]
    if api and status == 401:
        headers.append((b"www-authenticate", b'Basic realm="Wan Studio", charset="UTF-8"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def watching_answer(send, seen: Callable):
    """A send() that passes the answer on and hands its JSON to ``seen`` once it is complete and successful."""
    chunks, status = [], {}

    async def wrapped(message):
        if message["type"] == "http.response.start":
            status["code"] = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False) and status.get("code", 500) < 300:
                try:
                    seen(json.loads(b"".join(chunks) or b"null"))
                except ValueError:
                    pass
        await send(message)
    return wrapped


def status_of(send, seen: Callable[[int], None]):
    """A send() that tells ``seen`` the answer's status as it starts."""
    async def wrapped(message):
        if message["type"] == "http.response.start":
            seen(message["status"])
        await send(message)
    return wrapped


def one_way_files(send):
    """A send() that serves a file one way: media inline with its type, everything else as a text/plain download;
    nosniff on both, so no browser second-guesses the type."""
    async def wrapped(message):
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            kind = _header(headers, b"content-type").split(b";")[0].strip().lower()
            name = _header(headers, b"content-disposition").partition(b";")[2]    # its filename, kept
            headers = [(k, v) for k, v in headers
                       if k.lower() not in (b"content-type", b"content-disposition", b"x-content-type-options")]
            if kind in MEDIA_TYPES:
                headers += [(b"content-type", kind), (b"content-disposition", b"inline" + (b";" + name if name else b""))]
            else:
                headers += [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-disposition", b"attachment" + (b";" + name if name else b""))]
            message = {**message, "headers": [*headers, (b"x-content-type-options", b"nosniff")]}
        await send(message)
    return wrapped


def _header(headers, name: bytes) -> bytes:
    return next((v for k, v in headers if k.lower() == name), b"")
