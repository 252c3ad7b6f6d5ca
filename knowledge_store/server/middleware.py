"""The server's middleware: request metrics (innermost), the body limit, the access policy, CORS, the Host/Origin
policy and the security headers (outermost).

Order matters and is set here once: the origin policy refuses a cross-site or rebinding request
before CORS, routing or body parsing run (docs/ARCHITECTURE.md, "Origin policy"); metrics see every
request that got past it, labelled by route template so ids do not explode the label set.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from knowledge_store.config.settings import Settings
from knowledge_store.server.access import AccessMiddleware
from knowledge_store.server.origin_policy import HSTS, SECURITY_HEADERS, ASGIApp, OriginPolicyMiddleware, refuse
from knowledge_store.server.routes.ingestion import MULTIPART_SLACK_BYTES, UPLOAD_PATH
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


@dataclass(frozen=True)
class BodyLimits:
    """The largest request body each route takes: ``max_body_bytes`` (JSON bodies), uploads their file limit plus
    the multipart framing."""

    default: int
    by_path: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> BodyLimits:
        return cls(settings.max_body_bytes, ((UPLOAD_PATH, settings.max_file_bytes + MULTIPART_SLACK_BYTES),))

    def limit(self, path: str) -> int:
        return next((limit for prefix, limit in self.by_path if path == prefix), self.default)


def too_large_body(limit: int, size: int | None) -> dict[str, str]:
    """The 413 body: the declared size when there was one (a chunked body is stopped at the limit, unmeasured)."""
    said = f"is {size} bytes, over" if size is not None else "passed"
    return {"error": "too_large", "message": f"the request body {said} the {limit}-byte limit of this route "
                                             "(GROUNDWORK_MAX_BODY_BYTES; uploads: GROUNDWORK_MAX_FILE_MB)"}


class BodyLimitMiddleware:
    """Pure ASGI: a body over its route's limit is answered 413 before it is read - at once when ``Content-Length``
    says so, else as soon as the bytes received pass the limit (chunked bodies); the rest is never read."""

    def __init__(self, app: ASGIApp, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.limit(scope.get("path", "/"))
        declared = next((value for name, value in scope.get("headers", []) if name.lower() == b"content-length"), None)
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            await refuse(scope, send, 413, too_large_body(limit, int(declared)))
            return
        received = 0
        refused = False

        async def counted_receive() -> dict:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    await refuse(scope, send, 413, too_large_body(limit, None))
                    return {"type": "http.disconnect"}  # the route stops reading; what it sends is dropped
            return message

        async def guarded_send(message: dict) -> None:
            if not refused:
                await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except ClientDisconnect:
            if not refused:
                raise


class SecurityHeadersMiddleware:
    """Pure ASGI: adds ``SECURITY_HEADERS`` (and HSTS when the request came over TLS - this server's own, or a
    trusted proxy's ``X-Forwarded-Proto: https``) to every HTTP response that does not set them itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = (*SECURITY_HEADERS, HSTS) if scope.get("scheme") == "https" else SECURITY_HEADERS

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in extra if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def install_origin_policy(app: FastAPI, state: ServerState) -> None:
    """The body limit, the access policy (admin token, public rate limit) around it, CORS for
    ``GROUNDWORK_CORS_ORIGINS`` around both (so a 401, 413 or 429 carries CORS headers a widget can read; no
    wildcard, no credentials; a preflight asking for a private network - Chromium's, for a public page reaching a
    server on a private address - is answered for those origins), then the origin policy and the security headers
    around everything: added last, so outermost."""
    metrics = state.metrics
    app.add_middleware(BodyLimitMiddleware, limits=BodyLimits.from_settings(state.settings))
    app.add_middleware(AccessMiddleware, policy=state.access,
                       observe=lambda method, path, status: metrics.observe(method, path, status, 0.0))
    if state.settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(state.settings.cors_origins), allow_credentials=False,
                           allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                           allow_headers=["content-type", "authorization"],
                           expose_headers=["retry-after"], max_age=600, allow_private_network=True)
    app.add_middleware(OriginPolicyMiddleware, policy=state.origin_policy)
    app.add_middleware(SecurityHeadersMiddleware)
