"""Knowledge routes: hybrid query, ask and ask-local (the ask contract), feedback, and the client config.

The query, ask, ask-local and feedback bodies are the app's served request models (its limits and
what it can run, ``request_models.served_request_models``), so ``router(models)`` builds this router
per app; the handlers are plain functions that take the app's state as a dependency.
"""

# no ``from __future__ import annotations``: FastAPI reads the parameter annotations as objects
from datetime import timezone
from typing import Any

import anyio
from fastapi import APIRouter, HTTPException, Query, Request

from knowledge_store.app.status import chunk_vector_status, embedding_model_status, feedback_learning_status
from knowledge_store.core.errors import QueryValidationError
from knowledge_store.ingest.parsers.detect import EXTENSION_TYPES
from knowledge_store.retrieval.filters import SearchFilters
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.ranking_defaults import ranking_sources, reranker_source
from knowledge_store.retrieval.reranker_registry import reranker_labels
from knowledge_store.server import api_models as out
from knowledge_store.server.access import Caller
from knowledge_store.server.api_models import MODEL_ERRORS, error_responses
from knowledge_store.server.ask import ask
from knowledge_store.server.request_models import (
    AskBody,
    AskLocalBody,
    FeedbackBody,
    IsoDatetime,
    QueryBody,
    RequestModels,
)
from knowledge_store.server.state import CallerOf, State, with_body_model
from knowledge_store.storage.tuned import load_tuned


async def query(body: QueryBody, request: Request, state: State, caller: CallerOf) -> dict[str, Any]:
    """Hybrid retrieval with citations; the response's ``retrieval_request_id`` is what feedback refers to.
    Without the admin token (where one is required) only documents of public sources are searched."""
    filters = caller.scope(body.filters or SearchFilters())
    search = state.engine.request(
        body.query, k=body.k, alpha=body.alpha, fusion=body.fusion, section_weight=body.section_weight,
        lead_weight=body.lead_weight, reranker=body.reranker, filters=filters,
        min_relevance=body.min_relevance, answer=body.answer, client="api",
    )
    response = await anyio.to_thread.run_sync(lambda: state.engine.search(request=search), limiter=state.search_limiter)
    payload = response.to_dict()
    base = str(request.base_url).rstrip("/")
    snapshot = response.snapshot
    for item in payload["results"]:
        fragment = item["url"].split("#", 1)[1] if "#" in item["url"] else ""
        item["source_url"] = f"{base}/api/knowledge/sources/{item['doc_id']}/file" + (f"#{fragment}" if fragment else "")
    name_documents(payload["results"], snapshot)
    if not caller.admin:
        state.access.hide_internal_relations(payload["results"], snapshot)
        link_through_server(payload["results"], "source_url")
    state.metrics.query_latency.observe(response.latency_ms["total"] / 1000.0)
    return payload


def name_documents(items: list[dict[str, Any]], snapshot: Any) -> None:
    """Each result names its document by ``source`` (the source's name) and ``file`` (its path relative to the
    source; the page URL for web sources), as the public surface names documents."""
    documents = {(d["doc_id"], d["version"]): d for d in snapshot.documents}
    for item in items:
        doc = documents.get((item["doc_id"], item["version"]))
        item["source"] = doc["source_name"] if doc else ""
        item["file"] = doc["relative_path"] if doc else ""


def link_through_server(items: list[dict[str, Any]], link: str) -> None:
    """A public caller is never told where a file lies on this machine: ``url`` and ``source_path`` of a file
    (``file://`` links) become ``link``, this server's link to it (``/api/knowledge/sources/{doc_id}/file``);
    a web page keeps its address."""
    for item in items:
        for key in ("url", "source_path"):
            value = item.get(key) or ""
            if not value.startswith(("http://", "https://")):
                item[key] = item[link]


async def _ask(body: AskBody, request: Request, state: State, caller: Caller, **local: Any) -> dict[str, Any]:
    if body.answer not in state.ask_modes:
        raise QueryValidationError("answer", body.answer, "no LLM configured (set GROUNDWORK_LLM_BASE_URL and "
                                                          "GROUNDWORK_LLM_MODEL)")
    base = str(request.base_url).rstrip("/")
    scope = None if caller.admin else SearchFilters().public_only()
    result = await anyio.to_thread.run_sync(
        lambda: ask(state.engine, base, body.query, top_k=body.top_k, max_sources=min(body.max_sources, body.top_k),
                    answer=body.answer, scope=scope, **local),
        limiter=state.search_limiter,
    )
    if not caller.admin:
        state.access.hide_internal_relations(result["sources"], state.engine.snapshots.current())
        link_through_server(result["sources"], "url")
    state.metrics.query_latency.observe(result["latency_ms"] / 1000.0)
    return result


async def ask_book(body: AskBody, request: Request, state: State, caller: CallerOf) -> dict[str, Any]:
    """The ask contract's ``/ask``: ``{query}`` -> ``{answer, sources: [{file, section, url, pages}]}``; the answer is
    made from the best ``max_sources`` (3) of the ``top_k`` (10) ranked passages and cites them as ``[n]``.
    Without the admin token (where one is required) only documents of public sources answer."""
    return await _ask(body, request, state, caller, client="api-ask")


async def ask_local(body: AskLocalBody, request: Request, state: State, caller: CallerOf) -> dict[str, Any]:
    """The ask contract's ``/ask-local``: a question about selected text; retrieval only in ``source_file`` (422 when it
    matches no indexed document this caller may read), searching for the question and the selected ``context``."""
    return await _ask(body, request, state, caller, context=body.context, source_file=body.source_file,
                      client="api-ask-local")


def feedback(body: FeedbackBody, state: State, caller: CallerOf) -> dict[str, Any]:
    """Thumbs up/down (and an optional note) on a logged request or one of its passages.  One rating per client
    (its address, kept as a keyed pseudonym), request and passage counts: rating again replaces the earlier one
    (``replaced``).  Public callers share the public rate limit with ask and query."""
    settings, query_log = state.settings, state.query_log
    if body.note is not None and len(body.note) > settings.max_note_chars:
        raise QueryValidationError("note", f"{len(body.note)} characters", f"must be at most {settings.max_note_chars} characters")
    record = query_log.get(body.retrieval_request_id)
    if record is None:
        raise HTTPException(status_code=404, detail=f"unknown retrieval_request_id '{body.retrieval_request_id}'")
    if body.chunk_id is not None:
        shown = {r.get("chunk_id") for r in record.results_post} | {r.get("chunk_id") for r in record.results_pre}
        if body.chunk_id not in shown:
            raise QueryValidationError("chunk_id", body.chunk_id, f"was not among the results of request {body.retrieval_request_id}")
    stored = query_log.add_feedback(body.retrieval_request_id, body.rating, chunk_id=body.chunk_id, note=body.note,
                                    client=query_log.client_pseudonym(caller.address))
    state.metrics.feedback.labels(rating=body.rating).inc()
    state.engine.forget_feedback_cache()
    return stored


def list_feedback(state: State,
                  since: IsoDatetime | None = Query(None, description="ISO-8601; only feedback created after this"),
                  limit: int = Query(100, ge=1, le=10000)) -> dict[str, Any]:
    if since is not None and since.tzinfo is not None:
        since = since.astimezone(timezone.utc).replace(tzinfo=None)
    rows = state.query_log.list_feedback(since=since, limit=limit)
    return {"feedback": rows, "count": len(rows)}


def query_adapter_summary(engine) -> dict[str, Any] | None:
    """The stored query adapter's evidence (``groundwork adapt``), or null when none is stored."""
    adapter = engine.adapters.current()
    if adapter is None:
        return None if engine.adapters.error is None else {"in_use": False, "error": engine.adapters.error}
    return adapter.summary(engine.settings.use_query_adapter)


def thumbs_up_now(state: State) -> int | None:
    """Thumbs-up in the query log now; None while the log cannot be read (the page still loads)."""
    try:
        return int(state.query_log.feedback_counts()["up"])
    except Exception:  # noqa: BLE001 - a busy log must not fail the config read
        return None


def config(state: State) -> dict[str, Any]:
    """Defaults and limits clients need (the console reads them); no secrets.

    The ranking defaults are the *effective* ones: a setting set explicitly wins, then a value set in the
    console (PUT /api/knowledge/ranking), then the corpus's self-tuned choice (``groundwork tune``), then the
    built-in default; ``ranking_sources`` / ``reranker_source`` say which applied to each value and ``tuned``
    summarises the tuning run (null when the corpus is not tuned)."""
    settings, engine = state.settings, state.engine
    index_dir = engine.snapshots.index_dir
    ranking = engine.ranking_defaults()
    tuned = load_tuned(index_dir)
    return {
        "default_k": settings.default_k, "max_k": 100, "default_alpha": ranking.alpha,
        "question_alpha": engine.question_alpha(), "default_fusion": ranking.fusion, "section_weight": ranking.section_weight,
        "lead_weight": ranking.lead_weight, "feedback_docs": settings.feedback_docs,
        "feedback_beta": settings.feedback_beta, "fusion_modes": dict(FUSION_MODES),
        "ranking_sources": ranking_sources(engine.settings, index_dir),
        "tuned": None if tuned is None else {
            "created_at": tuned.created_at, "snapshot_version": tuned.snapshot_version,
            "pseudo_queries": tuned.pseudo_queries, "before": tuned.before, "after": tuned.after,
            "seconds": tuned.seconds, "in_use": engine.settings.use_tuned_ranking, "decision": tuned.decision,
        },
        "query_adapter": query_adapter_summary(engine),
        "feedback_learning": feedback_learning_status(engine.settings, thumbs_up_now(state)),
        "chunk_vectors": chunk_vector_status(settings, index_dir),
        "embedding_model": embedding_model_status(settings),
        "default_reranker": engine.default_reranker(), "reranker_source": reranker_source(engine.settings, index_dir),
        "rerankers": list(state.rerankers), "reranker_labels": reranker_labels(state.rerankers),
        "answer_modes": list(state.answer_modes),
        "min_relevance": settings.min_relevance, "max_query_chars": settings.max_query_chars,
        "max_note_chars": settings.max_note_chars, "max_upload_mb": settings.max_file_mb,
        "upload_types": sorted(EXTENSION_TYPES), "llm_answers": settings.llm_configured,
    }


def router(models: RequestModels) -> APIRouter:
    """The knowledge routes of one app, their bodies typed as its served ``models``."""
    routes = APIRouter(tags=["knowledge"])
    # the routes that embed their query: 503 model_loading (Retry-After) until the model is ready
    routes.add_api_route("/api/knowledge/query", with_body_model(query, models.query), methods=["POST"],
                         response_model=out.QueryResponse, responses=MODEL_ERRORS)
    routes.add_api_route("/api/ask", with_body_model(ask_book, models.ask), methods=["POST"],
                         response_model=out.AskResponse, responses=MODEL_ERRORS)
    routes.add_api_route("/api/ask-local", with_body_model(ask_local, models.ask_local), methods=["POST"],
                         response_model=out.AskResponse, responses=MODEL_ERRORS)
    routes.add_api_route("/api/knowledge/feedback", with_body_model(feedback, models.feedback), methods=["POST"],
                         status_code=201, response_model=out.FeedbackStored, responses=error_responses(404))
    routes.add_api_route("/api/knowledge/feedback", list_feedback, methods=["GET"], response_model=out.FeedbackList)
    routes.add_api_route("/api/knowledge/config", config, methods=["GET"], response_model=out.ConfigResponse)
    return routes
