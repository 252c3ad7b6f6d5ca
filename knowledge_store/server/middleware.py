"""The server's middleware: request metrics (innermost), the access policy, CORS, and the Host/Origin policy
(outermost).

Order matters and is set here once: the origin policy refuses a cross-site or rebinding request
before CORS, routing or body parsing run (docs/ARCHITECTURE.md, "Origin policy"); metrics see every
request that got past it, labelled by route template so ids do not explode the label set.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from starlette.responses import Response

from knowledge_store.server.access import AccessMiddleware
from knowledge_store.server.origin_policy import OriginPolicyMiddleware
from knowledge_store.server.state import ServerState


def route_template(request: Request) -> str:
    """``/api/sources/{name}`` rather than ``/api/sources/docs``: the matched route's path, else the URL's."""
    route = request.scope.get("route")
    return getattr(route, "path", None) or request.url.path


async def observe_requests(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Count and time every request (``/metrics``); an exception counts as a 500 and is re-raised."""
    metrics = request.app.state.server.metrics
    began = time.perf_counter()
    route = request.url.path
    try:
        response = await call_next(request)
    except Exception:
        metrics.observe(request.method, route_template(request), 500, time.perf_counter() - began)
        raise
    metrics.observe(request.method, route_template(request) or route, response.status_code, time.perf_counter() - began)
    return response


def install_request_metrics(app: FastAPI) -> None:
    """Add ``observe_requests`` first, so it is the innermost middleware."""
    app.middleware("http")(observe_requests)


def install_origin_policy(app: FastAPI, state: ServerState) -> None:
    """The access policy (admin token, public rate limit), CORS for ``GROUNDWORK_CORS_ORIGINS`` around it (so
    its 401 and 429 carry CORS headers a widget can read; no wildcard, no credentials), then the origin policy
    around both: added last, so outermost."""
    metrics = state.metrics
    app.add_middleware(AccessMiddleware, policy=state.access,
                       observe=lambda method, path, status: metrics.observe(method, path, status, 0.0))
    if state.settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(state.settings.cors_origins), allow_credentials=False,
                           allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                           allow_headers=["content-type", "authorization"],
                           expose_headers=["retry-after"], max_age=600)
    app.add_middleware(OriginPolicyMiddleware, policy=state.origin_policy)
