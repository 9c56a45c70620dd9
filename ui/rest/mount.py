"""Where the JSON API and /metrics join the page's server: routes of gradio's own FastAPI app from its start (passed
to it as it is made), behind the same guard (ui/guard/: host names, origins, logins, throttling), sharing the page's
queue and engines."""
from __future__ import annotations

from ui.context import AppContext


def service_routes(ctx: AppContext) -> list:
    """/metrics and everything under /api (ui/rest/api.py), as routes for gradio's app (``app_kwargs["routes"]``)."""
    from starlette.responses import Response
    from starlette.routing import Mount, Route

    from ui.rest.api import api_app

    def metrics(request) -> Response:
        body, kind = ctx.metrics.exposition()
        return Response(body, media_type=kind)

    return [Route("/metrics", metrics, methods=["GET"]), Mount("/api", app=api_app(ctx))]
