"""Operations routes: ``/health`` (200 ok, 503 degraded while no index is published) and ``/metrics``
(Prometheus text: request counts and latency per route, query latency, feedback, the served snapshot)."""

# no ``from __future__ import annotations``: FastAPI reads the parameter annotations as objects
import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from knowledge_store.core.errors import GroundworkError
from knowledge_store.server import api_models as out
from knowledge_store.server.state import State

router = APIRouter(tags=["operations"])


@router.get("/health", response_model=out.Health,
            responses={"503": {"model": out.Health, "description": "Degraded: no index yet (reason says why)."}})
def health(state: State) -> JSONResponse:
    engine = state.engine
    body: dict[str, Any] = {"status": "ok", "uptime_s": round(time.time() - state.started_at, 1),
                            "store": state.settings.store_path.exists(), "model_loaded": engine.embedder.loaded,
                            "remote": state.access.remote, "tls": state.access.tls,
                            "admin_token_required": state.access.token_required}
    if callable(getattr(engine.embedder, "stats", None)):
        body["query_cache"] = engine.embedder.stats()  # query-embedding cache: hits, misses, hit_rate
    try:
        snapshot = engine.snapshots.current()
        body["index"] = {"snapshot_version": snapshot.info.snapshot_version, "chunks": int(snapshot.active.sum()),
                         "documents": snapshot.info.document_count, "published": snapshot.info.created_at}
    except GroundworkError as error:
        body.update(status="degraded", index=None, reason=str(error))
    return JSONResponse(status_code=200 if body["status"] == "ok" else 503, content=body)


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus_metrics(state: State) -> PlainTextResponse:
    """Prometheus text exposition.  Seed 004's names: ``http_request_duration_seconds{endpoint}`` (latency
    histogram per route template, e.g. ``endpoint="/mcp"`` for its p95) and ``pages_ingested_total`` (pages
    parsed by every ingestion process: Dagster, the CLI and this server's jobs).  Also
    ``groundwork_http_requests_total{method,route,status}``, ``groundwork_http_request_duration_seconds``,
    ``groundwork_http_errors_total``, ``groundwork_query_duration_seconds``, ``groundwork_feedback_total{rating}``
    and ``groundwork_index_snapshot_version``.

    Queries are not metrics: each one is a JSON line (seed 004) in ``<data_dir>/logs/query.log``, from every
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
