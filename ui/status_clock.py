"""gradio's status trackers' clocks on a timer instead of the browser's frames (a route serving gradio's own file).

A status tracker counts a waiting event's seconds by asking the browser for the next frame, every frame, until the
event ends. The tracker of gradio's own loading overlay leaves the page while its wait is still open, so that count
never ends: every open page asked for 60 frames a second for as long as it stayed open (headless Chromium at rest:
11% of a core; 3.5% with the count on a timer, two pages side by side over 20 s each). The tracker's module keeps
its own reference to the browser's function as it loads, so the change goes in front of it: the module is served
with a few lines first that make such a count (recognised by its source, which reads ``performance.now()`` and
divides by 1e3) run ten times a second on a timer, as often as its tenths of a second change, asking for no frame.
Every other request for a frame is the browser's own. gradio's file is otherwise served unchanged.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

TICK_MS = 100
# Where gradio's page asks for the tracker's module ("/assets/statustracker-<hash>.js").
ROUTE = "/assets/statustracker-{rest}.js"
PRELUDE = """(() => {
  if (window.__countsOnTimer) return;
  window.__countsOnTimer = true;
  const frame = window.requestAnimationFrame.bind(window);
  const isCount = (callback) => { const source = String(callback);
    return source.includes("performance.now()") && source.includes("/1e3"); };
  window.requestAnimationFrame = (callback) => isCount(callback) ? setTimeout(callback, %d) : frame(callback);
})();
""" % TICK_MS


def tracker_route():
    """The route that serves gradio's status tracker module with the prelude first (before gradio's own route for
    its assets, which serves every other file)."""
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    def tracker(request) -> Response:
        text = served_text(request.path_params["rest"])
        if text is None:
            return PlainTextResponse("Not Found", status_code=404)
        return Response(text, media_type="text/javascript", headers={"Cache-Control": "max-age=0, must-revalidate"})

    return Route(ROUTE, tracker, methods=["GET"])


@lru_cache(maxsize=4)
def served_text(rest: str) -> str | None:
    """The prelude and gradio's ``statustracker-<rest>.js`` module, or None when gradio has no such file."""
    from gradio.route_utils import BUILD_PATH_LIB

    folder = Path(BUILD_PATH_LIB).resolve()
    path = (folder / f"statustracker-{rest}.js").resolve()
    if path.parent != folder or not path.is_file():
        return None
    return PRELUDE + path.read_text(encoding="utf-8")
