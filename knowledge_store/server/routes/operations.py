"""Operations routes: ``/health`` (the health contract's ``{"status", "services", "version"}``: 200 healthy or degraded,
503 unhealthy while no index is served) and ``/metrics`` (Prometheus text: request counts and latency per route,
query latency, feedback, the served snapshot)."""

# no ``from __future__ import annotations``: FastAPI reads the parameter annotations as objects
import importlib.metadata
import os
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, PlainTextResponse

from knowledge_store.core.errors import GroundworkError
from knowledge_store.models.loading import PHASE_TEXT
from knowledge_store.server import api_models as out
from knowledge_store.server.access import UNAUTHORIZED
from knowledge_store.server.state import CallerOf, ServerState, State

router = APIRouter(tags=["operations"])

UP = "up"
# without these the server cannot answer a query: any of them not up makes it unhealthy (503)
ESSENTIAL = ("index", "model")


def _version() -> str:
    try:
        return importlib.metadata.version("groundwork")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


VERSION = _version()


def _model_service(state: ServerState) -> tuple[str, str | None, dict[str, Any] | None]:
    """(state, reason, load status) of the served query embedding model, from its load (``ModelLoad.status``):
    ``up``, ``loading`` (what it is doing, for how long, the estimate), ``error`` (the load's error; queries are
    refused until the server is restarted), ``not_loaded`` or ``missing`` (its folder is gone)."""
    try:
        load = state.engine.model_status()
    except GroundworkError as error:  # e.g. the served snapshot's model folder is gone
        return "missing", str(error), None
    if load["state"] == "ready":
        return UP, None, load
    if load["state"] == "loading":
        doing = PHASE_TEXT.get(load["phase"], load["phase"])
        return "loading", (f"the embedding model is loading: {doing}, {load['seconds']:g} s so far; queries are "
                           f"answered once it is ready, in about {load['retry_after_s']} s"), load
    if load["state"] == "failed":
        return "error", (f"the embedding model could not be loaded: {load['error']}; queries are refused (503) "
                         "until it loads: fix the cause and restart the server"), load
    return "not_loaded", "not loaded yet: the warm-up or the first query loads it", load


def _query_graph(engine) -> dict[str, Any] | None:
    try:
        return engine.query_graph()
    except Exception as error:  # noqa: BLE001 - /health reports what it cannot read instead of failing
        return {"error": f"{type(error).__name__}: {error}"}


def _dagster_home() -> tuple[str, str | None]:
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return "not_configured", ("DAGSTER_HOME is not set: `groundwork ingest` records its runs in a temporary "
                                  "Dagster instance the Dagster UI does not show (the Makefile sets data/dagster_home)")
    if not Path(home).is_dir():
        return "missing", f"DAGSTER_HOME={home} is not a folder (`make ingest` or `make dagster` creates it)"
    return UP, None


def health_report(state: ServerState) -> dict[str, Any]:
    """The body of ``/health``: its contract's ``status``, ``services`` and ``version``, each service's reason when
    it is not up, and the details earlier clients read (``index``, ``model_loaded``, ``store``, ...)."""
    engine, settings = state.engine, state.settings
    services: dict[str, str] = {}
    reasons: dict[str, str] = {}

    def record(name: str, status: str, reason: str | None) -> None:
        services[name] = status
        if status != UP and reason:
            reasons[name] = reason

    store = settings.store_path.exists()
    record("store", UP if store else "missing",
           None if store else f"no store at {settings.store_path}: run `groundwork ingest` (queries are answered "
                              "from the published index; documents and sources need the store)")
    index: dict[str, Any] | None = None
    try:
        snapshot = engine.snapshots.current()
        index = {"snapshot_version": snapshot.info.snapshot_version, "chunks": int(snapshot.active.sum()),
                 "documents": snapshot.info.document_count, "published": snapshot.info.created_at}
        record("index", UP, None)
    except GroundworkError as error:
        record("index", "missing", str(error))
    model_state, model_reason, model_load = _model_service(state)
    record("model", model_state, model_reason)
    log_problem = state.query_log.problem()
    record("query_log", UP if log_problem is None else "down", log_problem)
    record("dagster_home", *_dagster_home())

    if any(services[name] != UP and not (name == "model" and services[name] in ("loading", "not_loaded"))
           for name in ESSENTIAL):
        status = "unhealthy"
    elif all(value == UP or (name == "dagster_home" and value == "not_configured") for name, value in services.items()):
        # a server run without Dagster (plain `groundwork serve`) is whole: the home is optional, its reason stays
        status = "healthy"
    else:
        status = "degraded"
    body: dict[str, Any] = {
        "status": status, "services": services, "version": VERSION, "reasons": reasons,
        "uptime_s": round(time.time() - state.started_at, 1), "store": store, "model_loaded": model_state == UP,
        "model_load": model_load, "warm_up": engine.warm_up_status(), "remote": state.access.remote, "tls": state.access.tls,
        # the graph queries run through and why: fp32 where the quantised graph failed its check on this CPU
        "model_graph": _query_graph(engine),
        "admin_token_required": state.access.token_required, "index": index,
    }
    stats = getattr(engine.embedder, "stats", None) if services["model"] != "missing" else None
    if callable(stats):
        body["query_cache"] = stats()  # query-embedding cache: hits, misses, hit_rate
    if reasons:
        body["reason"] = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
    return body


# what /health tells a public caller: nothing about the corpus (counts, sizes, cache figures) or the machine (paths
# in reasons); the rest of the report is the admin's
PUBLIC_HEALTH = ("status", "services", "version")


def public_health(body: dict[str, Any]) -> dict[str, Any]:
    """``health_report``'s body as the public surface shows it: ``PUBLIC_HEALTH`` only."""
    return {key: body[key] for key in PUBLIC_HEALTH}


@router.get("/health", response_model=out.Health,
            responses={"503": {"model": out.Health, "description": "Unhealthy: no index is served, or the model "
                                                               "cannot load (reasons say why)."}})
def health(state: State, caller: CallerOf,
           detail: bool = Query(False, description="The whole report (admin only: 401 without the admin token "
                                                   "where one is required); admin callers always get it.")
           ) -> JSONResponse:
    """The health check: ``status`` is ``healthy`` (200) when every service is ``up``; ``degraded`` (200)
    while the model loads or an optional part (store, query log, Dagster home) is not up - a Dagster home that is
    not configured at all counts as up (a server runs without Dagster); ``unhealthy`` (503)
    without an index or when the model cannot load.  ``services``: ``store``, ``index``, ``model``,
    ``query_log``, ``dagster_home``, each ``up`` or a state (``missing``, ``loading``, ``not_loaded``,
    ``error``, ``down``, ``not_configured``) whose reason is in ``reasons``.  The server answers at once after
    it starts, also while its model loads (on a fresh machine its graphs are first exported to ONNX, quantised
    and checked): ``model_load`` then says what the load is doing (``phase``), for how long (``seconds``) and the
    estimated seconds left (``retry_after_s``), and queries answer 503 ``model_loading`` with ``Retry-After``.

    Public callers (no admin token where one is required) get ``status``, ``services`` and ``version`` only;
    the reasons, the index's counts, the query cache's figures and the rest are the admin's."""
    if detail and not caller.admin:
        return JSONResponse(status_code=401, content=dict(UNAUTHORIZED),
                            headers={"WWW-Authenticate": 'Bearer realm="groundwork"'})
    body = health_report(state)
    return JSONResponse(status_code=503 if body["status"] == "unhealthy" else 200,
                        content=body if caller.admin else public_health(body))


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus_metrics(state: State) -> PlainTextResponse:
    """Prometheus text exposition.  The operations contract's names: ``http_request_duration_seconds{endpoint}`` (latency
    histogram per route template, e.g. ``endpoint="/mcp"`` for its p95) and ``pages_ingested_total`` (pages
    parsed by every ingestion process: Dagster, the CLI and this server's jobs).  Also
    ``groundwork_http_requests_total{method,route,status}``, ``groundwork_http_request_duration_seconds``,
    ``groundwork_http_errors_total``, ``groundwork_query_duration_seconds``, ``groundwork_feedback_total{rating}``
    and ``groundwork_index_snapshot_version``.

    Queries are not metrics: each one is a JSON line in ``<data_dir>/logs/query.log``, from every
    process that answers queries (the server also prints it on stdout), with ``timestamp``, ``query``, ``num_results``, ``latency_ms``, ``reranker``, ``top_score``,
    ``results[{chunk_id, source, score, text_preview}]``, plus ``error``, ``answer``, ``retrieval_request_id``,
    ``client``, ``reranker_status``, ``coverage`` and ``snapshot_version``; e-mail addresses are redacted to
    ``user@[REDACTED]`` and secrets to ``[SECRET]``."""
    metrics = state.metrics
    try:
        metrics.snapshot_version.set(state.engine.snapshots.current().info.snapshot_version)
    except GroundworkError:
        pass
    return PlainTextResponse(metrics.render(), media_type=metrics.content_type)
