"""The routes the app answers: the ones its page and its documented API use, each with how gradio reads it.

Everything else gradio could serve (its older file route, proxies, streams, monitoring, editing tools ...) is
answered 404 before gradio sees it, so no route the guard does not read can serve what the guard never looked at.
The list was taken from the requests the page (in a browser), gradio_client and the README's raw HTTP calls
make; tests/ui/test_guard_probes.py fails when one of them gets a 404.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Where a route carries a page session id or an event id, as gradio reads it.
QUERY, BODY, PATH = "query", "body", "path"


@dataclass(frozen=True)
class Route:
    method: str
    template: str            # {name}: one path segment; {name:path}: the rest of the path
    body: str = ""           # "json", "form" (the login), "multipart" (uploads) or "" (none is read)
    public: bool = False     # reachable before logging in: the login page and what it loads
    session: str = ""        # where gradio reads the page session id ("session_hash")
    event: str = ""          # where it reads an event id
    gives_event: bool = False  # the answer names a new event id, which becomes the caller's
    file: bool = False       # serves a file from disk by its path (the {file:path} part)
    upload: bool = False
    api: bool = False        # the JSON API and /metrics: their own login (ui/guard/api_login.py); the body, if any,
                             # is the app's own to read (body "raw"), within MAX_API_BODY
    def pattern(self) -> re.Pattern:
        parts = re.split(r"(\{[a-z_]+(?::path)?\})", self.template)
        regex = "".join(
            (f"(?P<{p[1:-6]}>.*)" if p.endswith(":path}") else f"(?P<{p[1:-1]}>[^/]+)") if p.startswith("{")
            else re.escape(p) for p in parts)
        return re.compile(regex + r"\Z")


API = "/gradio_api"
ROUTES = (
    # The page and the files it loads.
    Route("GET", "/", public=True), Route("HEAD", "/", public=True),
    Route("GET", "/assets/{file:path}", public=True), Route("GET", "/static/{file:path}", public=True),
    Route("GET", "/favicon.ico", public=True), Route("GET", "/theme.css", public=True),
    Route("POST", "/login", body="form", public=True), Route("GET", "/logout"),
    Route("GET", "/config"), Route("GET", f"{API}/info"),
    # gradio asks for it itself as it starts (it takes no session, no login).
    Route("GET", f"{API}/startup-events", public=True),
    # A page session: its heartbeat (which closes the session's events when it ends), its events, its calls.
    Route("GET", f"{API}/heartbeat/{{session}}", session=PATH),
    Route("POST", f"{API}/queue/join", body="json", session=BODY, gives_event=True),
    Route("GET", f"{API}/queue/data", session=QUERY),
    Route("POST", f"{API}/run/{{api}}", body="json", session=BODY),
    # gradio_client: a job's cancel() calls the cancelling event here, then the (no-op) reset.
    Route("POST", f"{API}/api/{{api}}/", body="json", session=BODY), Route("POST", f"{API}/reset", body="json"),
    Route("POST", f"{API}/cancel", body="json", session=BODY, event=BODY),
    # The raw API: a call, then its events by the event id it was given.
    Route("POST", f"{API}/call/{{api}}", body="json", session=BODY, gives_event=True),
    Route("GET", f"{API}/call/{{api}}/{{event}}", event=PATH),
    # Uploads and files.
    Route("POST", f"{API}/upload", body="multipart", upload=True), Route("GET", f"{API}/upload_progress"),
    Route("GET", f"{API}/file={{file:path}}", file=True), Route("HEAD", f"{API}/file={{file:path}}", file=True),
)


V1 = "/api/v1"
# The JSON API (ui/rest/): its jobs, the lists it reads, its schema and docs.
API_ROUTES = (
    Route("POST", f"{V1}/jobs", body="raw", api=True), Route("GET", f"{V1}/jobs", api=True),
    Route("GET", f"{V1}/jobs/{{job}}", api=True), Route("DELETE", f"{V1}/jobs/{{job}}", api=True),
    Route("GET", f"{V1}/jobs/{{job}}/events", api=True), Route("GET", f"{V1}/jobs/{{job}}/result", api=True),
    Route("GET", f"{V1}/jobs/{{job}}/sidecar", api=True),
    Route("GET", f"{V1}/presets", api=True), Route("GET", f"{V1}/models", api=True),
    Route("GET", f"{V1}/history", api=True), Route("POST", f"{V1}/plan", body="raw", api=True),
    Route("GET", "/api/openapi.json", api=True), Route("GET", "/api/docs", api=True),
    Route("GET", "/api/docs-assets/{file:path}", api=True),
)


def api_routes(metrics_public: bool = False) -> tuple[Route, ...]:
    """The JSON API's routes and /metrics (reachable without a login with serve --metrics-public)."""
    return (*API_ROUTES, Route("GET", "/metrics", api=not metrics_public, public=metrics_public))


@dataclass(frozen=True)
class RouteTable:
    routes: tuple[tuple[Route, re.Pattern], ...]

    @classmethod
    def of(cls, routes=ROUTES) -> "RouteTable":
        return cls(tuple((route, route.pattern()) for route in routes))

    @classmethod
    def with_api(cls, metrics_public: bool = False) -> "RouteTable":
        """The page's routes, the JSON API's and /metrics."""
        return cls.of((*ROUTES, *api_routes(metrics_public)))

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route ``method path`` reaches, and the values of its {names}; None where the app has none."""
        for route, pattern in self.routes:
            if route.method == method:
                found = pattern.match(path)
                if found:
                    return route, found.groupdict()
        return None
