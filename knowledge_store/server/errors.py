"""One error shape on every route, ``{error, message}`` (422 adds ``errors: [{field, message}]``).

``install_error_handlers`` maps FastAPI's validation errors, HTTP errors, the library's typed errors
and unexpected exceptions to that shape; ``openapi_with_json_errors`` makes the schema say so, also
on routes whose success body is not JSON (``/metrics``, the original-file route).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from knowledge_store.core.errors import (
    GroundworkError,
    IndexNotBuiltError,
    InvalidSourceError,
    ModelLoadFailedError,
    ModelLoadingError,
    QueryValidationError,
    SourceExistsError,
    SourceNotFoundError,
)
from knowledge_store.ingest.source_actions import FailureNotFoundError
from knowledge_store.server.access import caller_of
from knowledge_store.server.origin_policy import SECURITY_HEADERS
from knowledge_store.storage.query_log import redact
from knowledge_store.storage.tuned import InvalidRankingError

# the server's log, under the name it has always had (log filters and handlers configured for it keep working)
server_log = logging.getLogger("knowledge_store.server.app")

HTTP_ERROR_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 410: "gone"}
# typed errors that are not about one field: status and the stable error code clients branch on
PLAIN_ERRORS: tuple[tuple[type[Exception], int, str], ...] = (
    (IndexNotBuiltError, 503, "index_not_built"),
    # the query model's load failed: 503 like the other parts a query needs and the server lacks (a server with
    # its model is "unavailable", not broken by this request); no Retry-After: waiting does not fix it
    (ModelLoadFailedError, 503, "model_load_failed"),
    (SourceNotFoundError, 404, "source_not_found"),
    (FailureNotFoundError, 404, "failure_not_found"),
    (SourceExistsError, 409, "source_conflict"),
)
# typed errors that name the offending field (``exc.field``): a 422 like pydantic's
FIELD_ERRORS: tuple[type[Exception], ...] = (QueryValidationError, InvalidSourceError, InvalidRankingError)


def field_of(loc: tuple | list) -> str:
    """``("body", "filters", "paths")`` -> ``filters.paths``; the first element is where it came from."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "form", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def field_error(error: dict) -> dict[str, str]:
    """One pydantic error as ``{field, message}``; malformed JSON names the body and the position."""
    if error.get("type") == "json_invalid":
        loc = error.get("loc", ())
        position = loc[-1] if loc and isinstance(loc[-1], int) else None
        detail = (error.get("ctx") or {}).get("error", "invalid JSON")
        where = f" at character {position}" if position is not None else ""
        return {"field": "body", "message": f"the body is not valid JSON{where}: {detail}"}
    return {"field": field_of(error.get("loc", ())), "message": error.get("msg", "invalid")}


def _leaf_routes(routes: list[Any]) -> Iterator[Any]:
    """Every route, those of included routers too: FastAPI keeps an included ``APIRouter`` as one route
    (``original_router``), so a path's methods are spread over the routers that serve it."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _leaf_routes(included.routes)
        else:
            yield route


def allowed_methods(request: Request) -> list[str]:
    """The methods every route of this path accepts (for the Allow header of a 405)."""
    methods: set[str] = set()
    for route in _leaf_routes(request.app.router.routes):
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match != Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return sorted(methods - {"HEAD"}) or ["GET"]


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [field_error(e) for e in exc.errors()]
    message = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return JSONResponse(status_code=422, content={"error": "validation_error", "message": message, "errors": errors})


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # one error shape everywhere: {error, message} (detail kept for FastAPI-style clients)
    kind = HTTP_ERROR_CODES.get(exc.status_code, "http_error")
    detail = told(request, exc.detail) if isinstance(exc.detail, str) else exc.detail
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:  # every method of this path, not only those of the first route that matched it
        headers["Allow"] = ", ".join(allowed_methods(request))
    return JSONResponse(status_code=exc.status_code, content={"error": kind, "message": str(detail), "detail": detail},
                        headers=headers or None)


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # the {error, message} promise holds for bugs too; the traceback goes to the server log, never the client
    server_log.exception("unhandled error on %s %s", request.method, request.url.path)
    # answered outside the middleware (Starlette's outermost error handler): the security headers are added here
    return JSONResponse(status_code=500, content={"error": "internal_error", "message": (
        f"unexpected {type(exc).__name__} while handling {request.method} {request.url.path}; "
        "the server log has the details")}, headers={name.decode(): value.decode() for name, value in SECURITY_HEADERS})


def invalid_field(request: Request, exc: QueryValidationError | InvalidSourceError | InvalidRankingError) -> JSONResponse:
    message = told(request, str(exc))
    return JSONResponse(status_code=422, content={"error": "validation_error", "message": message,
                                                  "errors": [{"field": exc.field, "message": message}]})


def told(request: Request, message: str) -> str:
    """``message`` as this request's caller may read it: a public caller is never told this machine's folders
    (``AccessPolicy.scrub``: ``no published index snapshot in <server folder>/index``)."""
    state = getattr(request.app.state, "server", None)
    if state is None or caller_of(request).admin:
        return message
    return state.access.scrub(message)


def _plain_error(status: int, code: str):
    def handler(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": code, "message": told(request, str(exc))})
    return handler


def model_loading(request: Request, exc: ModelLoadingError) -> JSONResponse:
    # the query model is still loading: come back when it should be ready (the load's own estimate)
    return JSONResponse(status_code=503, headers={"Retry-After": str(exc.retry_after_s)}, content={
        "error": "model_loading", "message": str(exc), "retry_after_s": exc.retry_after_s})


async def unavailable(request: Request, exc: GroundworkError) -> JSONResponse:
    # any other library error: the store or index cannot serve now (secrets in paths/URLs redacted)
    return JSONResponse(status_code=503, content={"error": type(exc).__name__, "message": told(request, redact(str(exc)))})


def install_error_handlers(app: FastAPI) -> None:
    """Every error answers ``{error, message}``; the most specific handler wins (Starlette looks them up
    along the exception's class hierarchy)."""
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
    for error_type in FIELD_ERRORS:
        app.add_exception_handler(error_type, invalid_field)
    for error_type, status, code in PLAIN_ERRORS:
        app.add_exception_handler(error_type, _plain_error(status, code))
    app.add_exception_handler(ModelLoadingError, model_loading)
    app.add_exception_handler(GroundworkError, unavailable)


def openapi_with_json_errors(app: FastAPI) -> dict[str, Any]:
    """``app.openapi``: the generated schema, with every 4xx/5xx answer stated as ``ErrorBody`` JSON (errors are
    JSON on every route, also where the success body is not: ``/metrics``, ``/file``).  Built once per app."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for code, response in operation.get("responses", {}).items():
                    declared = (response.get("content") or {}).get("application/json", {}).get("schema", {}).get("$ref", "")
                    if declared and not declared.endswith(("/ErrorBody", "/HTTPValidationError")):
                        continue  # a route that states its own error body (/health's 503 is its Health report)
                    if code[0] in "45":
                        response["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        app.openapi_schema = schema
    return app.openapi_schema
