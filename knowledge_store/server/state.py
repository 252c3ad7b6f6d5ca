"""What one app serves from, in one object, and how route handlers reach it.

``create_app`` builds a ``ServerState`` and keeps it at ``app.state.server``; handlers declare
``state: State`` and FastAPI hands it over (``server_state``).  Why not closures over
``create_app``'s locals: the routes then live in one module per domain (``server/routes/``), and two
apps in one process (tests, ``test_multi_server``) never share settings, engine, jobs or metrics.

The one per-app thing a dependency cannot carry is a request body's *type*: the served request
models state this server's limits in the schema (``request_models.served_request_models``), and
FastAPI reads a body's model from the handler's signature.  ``with_body_model`` gives a handler,
for one app, a signature whose ``body`` is that app's model; the handler itself is unchanged.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, AsyncIterator

import anyio
from fastapi import Depends, FastAPI, Request

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import IndexNotBuiltError
from knowledge_store.core.files import make_private
from knowledge_store.retrieval.answer import available_answer_modes
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.access import AccessPolicy, Caller, caller_of
from knowledge_store.server.ingest_jobs import IngestJobs
from knowledge_store.server.metrics import Metrics
from knowledge_store.server.origin_policy import OriginPolicy
from knowledge_store.server.request_models import RequestModels, served_request_models
from knowledge_store.storage.query_log import QueryLines, QueryLog


@dataclass
class ServerState:
    """Everything the routes of one app use: its settings, engine, query log, ingestion jobs, metrics, the
    search worker pool, what it can run (rerankers, answer modes) and the request models that state it."""

    settings: Settings
    engine: RetrievalEngine
    query_log: QueryLog
    jobs: IngestJobs
    metrics: Metrics
    origin_policy: OriginPolicy
    access: AccessPolicy  # the surfaces, the admin token, the public rate limit, the source roots
    # a few search workers, not one thread per request: on 2 cores 40 threads fighting over the GIL and
    # torch is slower; waiting requests still share model calls (BatchingEmbedder)
    search_limiter: anyio.CapacityLimiter
    rerankers: tuple[str, ...]
    answer_modes: tuple[str, ...]  # POST /api/knowledge/query
    ask_modes: tuple[str, ...]  # POST /api/ask, /api/ask-local
    models: RequestModels
    started_at: float = field(default_factory=time.time)
    mcp_lifespan: Callable[[Any], Any] | None = None  # set when MCP is mounted; entered by ``lifespan``

    @classmethod
    def build(cls, settings: Settings, engine: RetrievalEngine | None = None) -> ServerState:
        """The state of a new app: creates the data folder (private: ``make_private``) and the uploads folder,
        opens the query log (the engine's when one is given), and derives what the server can run from the
        settings and the engine."""
        make_private(settings.data_dir)  # 0700, nothing in it readable by other local users
        settings.uploads_dir.mkdir(parents=True, exist_ok=True)
        query_log = engine.query_log if engine is not None else QueryLog(settings.logs_path)
        engine = engine or RetrievalEngine(settings, query_log=query_log)
        # one JSON line per query in the rotated logs/query.log, as every process writes it; the server
        # is the one process that also prints it on stdout (container logs): elsewhere stdout is a command's
        # output or the MCP protocol channel
        if query_log.lines is None:
            query_log.lines = QueryLines.for_file(settings)
        if settings.query_log_stdout:
            query_log.lines.echo_to_stdout()
        # the configured limits are part of the contract: the schema states them
        rerankers = tuple(engine.available_rerankers())
        answer_modes = available_answer_modes(settings)
        ask_modes = available_answer_modes(settings, writing_only=True)
        return cls(
            settings=settings, engine=engine, query_log=query_log,
            jobs=IngestJobs(settings, engine.documents_embedder, on_published=lambda: refresh_quietly(engine)),
            metrics=Metrics(settings.store_path), origin_policy=OriginPolicy.from_settings(settings),
            access=AccessPolicy.from_settings(settings),
            search_limiter=anyio.CapacityLimiter(settings.search_workers),
            rerankers=rerankers, answer_modes=answer_modes, ask_modes=ask_modes,
            models=served_request_models(settings, rerankers, answer_modes, ask_modes),
        )


async def server_state(request: Request) -> ServerState:
    """The dependency behind ``State`` (async, so FastAPI calls it on the event loop, not in a worker thread)."""
    return request.app.state.server


State = Annotated[ServerState, Depends(server_state)]
# who is asking (``access.AccessMiddleware``): admin, or a public caller who sees public sources only
CallerOf = Annotated[Caller, Depends(caller_of)]


def with_body_model(endpoint: Callable[..., Any], model: type, parameter: str = "body") -> Callable[..., Any]:
    """``endpoint`` as FastAPI should see it in one app: its ``parameter`` typed as that app's served ``model``.

    A wrapper, not a changed ``endpoint``: two apps with different limits each get their own signature.
    Name and docstring are kept, so operation ids and descriptions stay those of ``endpoint``."""
    signature = inspect.signature(endpoint, eval_str=True)
    if parameter not in signature.parameters:
        raise TypeError(f"{endpoint.__qualname__} has no parameter {parameter!r} to type as {model.__name__}")
    if inspect.iscoroutinefunction(endpoint):
        @functools.wraps(endpoint)
        async def bound(*args: Any, **kwargs: Any) -> Any:
            return await endpoint(*args, **kwargs)
    else:  # stays synchronous: FastAPI runs it in a worker thread, as it would the endpoint
        @functools.wraps(endpoint)
        def bound(*args: Any, **kwargs: Any) -> Any:
            return endpoint(*args, **kwargs)
    bound.__signature__ = signature.replace(parameters=[  # type: ignore[attr-defined]
        p.replace(annotation=model) if p.name == parameter else p for p in signature.parameters.values()])
    return bound


def refresh_quietly(engine: RetrievalEngine) -> None:
    """Switch to the newest published snapshot, if there is one yet (after an ingestion job published)."""
    try:
        engine.snapshots.refresh()
    except IndexNotBuiltError:
        pass


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Warm the engine up in the background (the server answers meanwhile), run MCP's session manager when
    it is mounted, and flush the query log on the way out."""
    state: ServerState = app.state.server
    state.engine.warm_up_in_background()  # its outcome (and error) is in /health's model service and warm_up
    if state.mcp_lifespan is not None:
        async with state.mcp_lifespan(app):
            yield
    else:
        yield
    state.query_log.flush(timeout_s=5.0)
