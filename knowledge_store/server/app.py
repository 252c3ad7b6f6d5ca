"""The HTTP API and the Knowledge Grounding Console (FastAPI).

    groundwork serve            # http://127.0.0.1:8080  (console at /, OpenAPI at /docs, MCP at /mcp)

Who writes what: the server is the only writer of the query log and feedback
(``logs.duckdb``); it reads index snapshots and switches to a newer one as soon
as a sync publishes it, without a restart.  Uploads land in
``<data_dir>/uploads`` and are ingested in this process by the same code path
the Dagster assets use (``run_sync``), one job at a time.

Layout: ``create_app`` only assembles.  The routes are one ``APIRouter`` per domain in
``server/routes/`` (plus ``admin_api.py``); what they share lives in one ``ServerState``
(``state.py``) that handlers receive as a dependency; request and response models are in
``request_models.py`` and ``api_models.py``; errors, middleware and ingestion jobs have their
own modules (``errors.py``, ``middleware.py``, ``ingest_jobs.py``).
"""


import ipaddress
import logging
import os
import sys

import uvicorn
from fastapi import FastAPI

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError, GroundworkError
from knowledge_store.core.files import PRIVATE_UMASK
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server import admin_api
from knowledge_store.server.access import document_surfaces
from knowledge_store.server.api_models import COMMON_ERRORS
from knowledge_store.server.errors import install_error_handlers, openapi_with_json_errors
from knowledge_store.server.middleware import install_origin_policy, install_request_metrics
from knowledge_store.server.origin_policy import mcp_transport_security
from knowledge_store.server.routes import console, documents, ingestion, knowledge, operations, sources
from knowledge_store.server.routes.console import STATIC_DIR  # noqa: F401 - where the console's files are
from knowledge_store.server.state import ServerState, lifespan


def create_app(settings: Settings | None = None, engine: RetrievalEngine | None = None, mount_mcp: bool = True) -> FastAPI:
    """The server: API routes, console, MCP at ``/mcp`` (``mount_mcp``), over ``settings`` (default: the
    environment) and ``engine`` (default: a new one; pass one to share its loaded model and query log)."""
    state = ServerState.build(settings or Settings(), engine)
    # the interactive API docs load Swagger UI and ReDoc from a CDN (no copy is installed): not in remote mode,
    # where a reader's browser would run third-party script in this server's origin; /openapi.json stays
    remote = state.settings.allow_remote
    app = FastAPI(
        title="Groundwork",
        version="0.1.0",
        docs_url=None if remote else "/docs", redoc_url=None if remote else "/redoc",
        description="Grounded retrieval with citations: query, feedback, ingestion, documents, articles. "
                    "Every error has the body {error, message} (422 adds errors: [{field, message}]).",
        lifespan=lifespan,
        responses=COMMON_ERRORS,
    )
    app.state.server = state
    install_request_metrics(app)
    install_error_handlers(app)
    # the order of the schema's paths and of the reference's sections (docs/API.md)
    app.include_router(knowledge.router(state.models))
    app.include_router(ingestion.router)
    app.include_router(sources.router)
    app.include_router(documents.router)
    app.include_router(admin_api.router(state.models))
    app.include_router(operations.router)
    app.openapi = lambda: _schema(app, state)  # type: ignore[method-assign]
    if mount_mcp:
        try:
            from knowledge_store.server.mcp_server import mount_mcp as _mount  # noqa: PLC0415 - the MCP SDK, ~0.7 s

            state.mcp_lifespan = _mount(app, state.engine, transport_security=mcp_transport_security(state.origin_policy))
        except ImportError:  # the MCP module is optional for the HTTP API
            state.mcp_lifespan = None
    install_origin_policy(app, state)  # outermost last: refuses before CORS, routing or body parsing run
    console.install_console(app)
    app.openapi()  # built now: a route without a surface (access.ROUTE_SURFACES) stops the server here
    return app


def _schema(app: FastAPI, state: ServerState) -> dict:
    """The OpenAPI document: errors as JSON, and each operation's surface, security and 401/429 answers."""
    if app.openapi_schema is None:
        document_surfaces(openapi_with_json_errors(app), state.access)
    return app.openapi_schema


class _UvicornLike(logging.Formatter):
    """``INFO:     message``: the model's load reads like the server's own lines around it."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname + ':':<9} {record.getMessage()}"


def show_model_load_progress() -> None:
    """Print the embedding model's background load (``models.loading``: its steps, when it is ready, why it failed)
    on stderr beside uvicorn's lines: the port is bound long before an export finishes."""
    logger = logging.getLogger("knowledge_store.models.loading")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_UvicornLike())
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def serve(settings: Settings | None = None, announce=print) -> None:
    """Run the API with uvicorn on the configured host/port (loopback unless allowed), with TLS when a
    certificate and key are configured; ``announce`` says where the admin token is in remote mode."""
    settings = settings or Settings()
    host = settings.server_host
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost
        loopback = False
    if not loopback and not settings.allow_remote:
        raise GroundworkError(
            f"refusing to bind to {host}: set GROUNDWORK_ALLOW_REMOTE=true to serve beyond this machine"
        )
    for name in ("ssl_certfile", "ssl_keyfile"):
        path = getattr(settings, name)
        if path is not None and not path.is_file():
            raise ConfigError(name, str(path), "no such file")
    # everything this process writes (store, query log, snapshots, query.log, uploads) is its user's alone
    os.umask(PRIVATE_UMASK)
    app = create_app(settings)
    access = app.state.server.access
    if access.remote:
        where = (f"generated, stored in {access.token_file} (mode 0600)" if access.token_file is not None
                 else "GROUNDWORK_ADMIN_TOKEN")
        announce(f"remote mode: the admin surface needs the admin token ({where}); public callers see public "
                 f"sources only{'' if access.tls else '; no TLS: put a TLS reverse proxy in front or pass --ssl-certfile/--ssl-keyfile'}")
    show_model_load_progress()
    # uvicorn believes X-Forwarded-For/-Proto from 127.0.0.1 unless told otherwise: only the configured proxies
    # may name the client (and the scheme of the links the server writes)
    trusted = settings.trusted_proxies
    uvicorn.run(app, host=host, port=settings.server_port, log_level="info", access_log=False,
                proxy_headers=bool(trusted), forwarded_allow_ips=",".join(trusted) if trusted else "",
                ssl_certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
                ssl_keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None)

