"""One reading of a request: what gradio will act on, read the way gradio reads it, or a refusal.

Every check the guard makes is made on this reading, never on the raw request, so a request written another way
(a key given twice, a content type in capitals, a path with '//' or '/./') is either read the same as its plain
spelling or refused:
- a query, form or JSON key given twice: refused (gradio would take the last, a check might read the first);
- a JSON route's body is parsed whenever gradio would parse it (no content type, or any spelling of
  application/json), and one with another content type is refused;
- a file path is made absolute and its links resolved, as the file system will resolve it;
- a path that is not written plainly ('//', '/./', '..', a backslash) is refused, except a file route's path,
  which is normalised as above.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from ui.guard.routes import Route

# A JSON body the page or the API sends is a few kB (prompts, settings, file records); images are uploads.
MAX_JSON_BODY = 2 * 1024 * 1024
# The JSON API's own bodies (read by the API itself): a job with its images or video, as uploads or base64 (a 50 MB
# file, a third larger in base64).
MAX_API_BODY = 72 * 1024 * 1024
MAX_FORM_BODY = 64 * 1024
URL_SCHEMES = ("http://", "https://", "ftp://", "file:", "data:")


class Refused(Exception):
    """The request cannot be read one way: its status and the sentence that says why."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status, self.text = status, text


@dataclass(frozen=True)
class Reading:
    route: Route
    params: dict[str, str]
    query: dict[str, str]
    headers: dict[bytes, bytes]
    body: bytes = b""
    value: object = None                 # the parsed JSON or form
    files: tuple[str, ...] = ()          # every file path the request names, normalised
    urls: tuple[str, ...] = field(default=())   # file records that name a web address instead of a file

    def session(self) -> object:
        """The page session id, where this route's gradio handler reads it (None: none given)."""
        where = self.route.session
        if where == "query":
            return self.query.get("session_hash")
        if where == "path":
            return self.params.get("session")
        if where == "body":
            return self.value.get("session_hash") if isinstance(self.value, dict) else None
        return None

    def event(self) -> object:
        if self.route.event == "path":
            return self.params.get("event")
        if self.route.event == "body":
            return self.value.get("event_id") if isinstance(self.value, dict) else None
        return None


def plain_path(path: str) -> bool:
    """Whether a request path is written plainly: no empty, '.' or '..' segment, no backslash, no NUL."""
    segments = path.split("/")[1:]
    return (path.startswith("/") and "\\" not in path and "\x00" not in path
            and not any(s in ("", ".", "..") for s in segments[:-1]) and segments[-1] not in (".", ".."))


def file_key(path: str) -> str:
    """A file path as the file system resolves it: absolute, '//', '.' and '..' folded, links followed, and on
    Windows the letter case folded. Two spellings of one file give one key."""
    return os.path.normcase(os.path.realpath(os.path.abspath(path)))


def is_url(path: str) -> bool:
    return path.strip().lower().startswith(URL_SCHEMES)


def single_keys(pairs) -> dict:
    """A dict of ``pairs``, refused where a key comes twice."""
    found = {}
    for key, value in pairs:
        if key in found:
            raise Refused(400, f"The request names {key!r} twice; send each key once.")
        found[key] = value
    return found


def media_type(headers: dict[bytes, bytes]) -> str:
    """The Content-Type's media type, in lower case, without its parameters ('' when none is given)."""
    return headers.get(b"content-type", b"").decode("latin-1").split(";", 1)[0].strip().lower()


def is_json_type(kind: str) -> bool:
    """What FastAPI parses as JSON: no content type, application/json, or application/<anything>+json."""
    return kind == "" or kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


async def read_body(receive, limit: int) -> bytes:
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, "The request ended before its body did.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"The request's body is larger than {limit // 1024} kB, more than the page ever sends.")
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def parse_json(body: bytes) -> object:
    if not body:
        return None
    try:
        return json.loads(body, object_pairs_hook=single_keys)
    except Refused:
        raise
    except (ValueError, RecursionError):
        raise Refused(400, "The request's body is not JSON the app can read.") from None


async def parse_form(scope, body: bytes, kind: str) -> dict:
    """A login form's fields, read by the parser FastAPI hands the login (starlette's), each key once."""
    from starlette.requests import Request

    if kind not in ("application/x-www-form-urlencoded", "multipart/form-data"):
        raise Refused(415, "Send the login as a form.")
    try:
        form = await Request(scope, _replay(body, _nothing_more)).form()
    except Exception:       # the parser's own errors: a form that cannot be read is refused, whatever its fault
        raise Refused(400, "The login form cannot be read.") from None
    fields = single_keys(form.multi_items())
    await form.close()
    return fields


async def _nothing_more():
    return {"type": "http.disconnect"}


def file_records(value) -> tuple[list[str], list[str]]:
    """(every file path a JSON value names in gradio's file records, {"path": ...}; those that are web
    addresses)."""
    paths, urls, stack = [], [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            path = item.get("path")
            if isinstance(path, str):
                (urls if is_url(path) else paths).append(path)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return paths, urls


async def read_request(scope, receive, route: Route, params: dict[str, str]):
    """(the Reading of this request, a receive() that hands gradio the body that was read)."""
    headers = single_keys((k.lower(), v) for k, v in scope.get("headers", ()) if k.lower() in WATCHED_HEADERS)
    query = single_keys(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
    kind, body, value = media_type(headers), b"", None
    if route.body == "json":
        if not is_json_type(kind):
            raise Refused(415, "Send the request's body as JSON (Content-Type: application/json).")
        body = await read_body(receive, MAX_JSON_BODY)
        value = parse_json(body)
    elif route.body == "form":
        body = await read_body(receive, MAX_FORM_BODY)
        value = await parse_form(scope, body, kind)
    paths, urls = file_records(value)
    files = [file_key(p) for p in paths]
    if route.file:
        tail = params.get("file", "")
        if is_url(tail):
            urls.append(tail)
        else:
            files.append(file_key(tail))
    reading = Reading(route, params, query, headers, body, value, tuple(files), tuple(urls))
    return reading, (_replay(body, receive) if route.body in ("json", "form") else receive)


# The headers a check reads; each may come once (gradio would read one of two, the guard might read the other).
WATCHED_HEADERS = (b"host", b"origin", b"referer", b"content-type", b"content-length", b"cookie",
                   b"transfer-encoding", b"authorization")


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return replay
