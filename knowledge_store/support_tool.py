"""The support-tool contract: ``retrieve_knowledge(intent, message, metadata)``.

For agents and support bots that need an answer-or-nothing within a hard time
budget.  It never raises: every failure becomes ``sources_consulted: []``,
``coverage: "none"`` and a gap that says why.

Relevance scale (``relevance_score``, 0-1): the engine's absolute relevance,
the mean of (a) semantic match - cosine similarity of query and passage
embeddings rescaled so 0.2 (unrelated text for MiniLM) is 0 and 0.7 (a close
paraphrase) is 1 - and (b) lexical coverage - the idf-weighted share of the
query's informative words that occur in the passage.  0.7 (the default floor)
means "close in meaning *and* uses most of the query's rare words".

Coverage: ``high`` = two or more sources above the floor, or one at >= 0.85;
``medium`` = one source above the floor; ``low`` = something relevant was found
but under the floor (no sources returned; a gap gives the best score);
``none`` = nothing relevant, or a failure.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

from knowledge_store.settings import Settings

MAX_SOURCES = 3
TITLE_MAX = 200
URL_MAX = 500
EXCERPT_MAX = 150

_engine = None
_engine_lock = threading.Lock()
_warming: concurrent.futures.Future | None = None
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="retrieve_knowledge")


def _empty(gap: str, started: float) -> dict[str, Any]:
    return {
        "sources_consulted": [],
        "coverage": "none",
        "gaps": [gap],
        "retrieval_time_ms": int((time.perf_counter() - started) * 1000),
    }


def get_engine(settings: Settings | None = None):
    """The process-wide engine used by the support tool (created on first use)."""
    global _engine
    with _engine_lock:
        if _engine is None:
            from knowledge_store.retrieval.engine import RetrievalEngine

            _engine = RetrievalEngine(settings or Settings())
        return _engine


def set_engine(engine) -> None:
    """Use a specific engine (tests, servers that already have one)."""
    global _engine, _warming
    with _engine_lock:
        _engine = engine
        _warming = None


def warm_up() -> concurrent.futures.Future:
    """Load the model and index in the background; the first calls inside the budget need it."""
    global _warming
    with _engine_lock:
        if _warming is None:
            _warming = _POOL.submit(lambda: get_engine().warm_up())
        return _warming


def _reset_warm_up() -> None:
    global _warming
    with _engine_lock:
        _warming = None


def _clip(text: str | None, limit: int) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _run(intent: str, message: str, metadata: dict[str, Any], floor: float) -> dict[str, Any]:
    engine = get_engine()
    query = (message or "").strip() or (intent or "").replace("_", " ").strip()
    wanted = {k: v for k, v in (metadata or {}).items() if k in ("device", "product") and isinstance(v, str) and v}
    gaps: list[str] = []
    response = None
    if wanted:
        response = engine.search(query, k=MAX_SOURCES, filters={"metadata": wanted}, client="support_tool")
        if not response.results:
            gaps.append(f"nothing specific to {', '.join(f'{k}={v}' for k, v in wanted.items())}; searched all documents")
            response = None
    if response is None:
        response = engine.search(query, k=MAX_SOURCES, client="support_tool")
    sources = []
    for citation in response.results:
        if citation.relevance < floor:
            continue
        sources.append({
            "title": _clip(citation.title, TITLE_MAX),
            "url": citation.url if len(citation.url) <= URL_MAX else citation.url[:URL_MAX],
            "relevance_score": round(max(0.0, min(1.0, citation.relevance)), 3),
            "excerpt": _clip(citation.snippet, EXCERPT_MAX),
            "last_updated": citation.last_updated,
            "section": citation.section,
            "pages": citation.pages,
            "chunk_id": citation.chunk_id,
        })
    best = max((c.relevance for c in response.results), default=0.0)
    if sources:
        coverage = "high" if len(sources) >= 2 or best >= 0.85 else "medium"
    elif response.results:
        coverage = "low"
        gaps.append(f"best match scored {best:.2f}, under the {floor:.2f} relevance floor")
    else:
        coverage = "none"
        gaps.append("no relevant content found in the knowledge base")
    return {"sources_consulted": sources[:MAX_SOURCES], "coverage": coverage, "gaps": gaps,
            "retrieval_request_id": response.retrieval_request_id}


def retrieve_knowledge(intent: str, message: str, metadata: dict[str, Any] | None = None, *,
                       budget_ms: int | None = None, floor: float | None = None) -> dict[str, Any]:
    """Best sources for a support conversation turn, within a hard time budget; never raises."""
    started = time.perf_counter()
    try:
        settings = get_engine().settings
        budget = (budget_ms if budget_ms is not None else settings.support_budget_ms) / 1000.0
        floor = settings.support_floor if floor is None else floor
        if not isinstance(message, str) or not (message.strip() or (isinstance(intent, str) and intent.strip())):
            return _empty("empty message: nothing to search for", started)
        warming = warm_up()
        if not warming.done():
            return _empty("knowledge base is still loading (model and index); retry in a few seconds", started)
        if warming.exception() is not None:
            _reset_warm_up()  # try again on the next call (e.g. once an index is published)
            return _empty(f"knowledge base unavailable: {warming.exception()}", started)
        future = _POOL.submit(_run, intent or "", message or "", metadata or {}, floor)
        remaining = budget - (time.perf_counter() - started)
        try:
            result = future.result(timeout=max(0.0, remaining))
        except concurrent.futures.TimeoutError:
            return _empty(f"retrieval exceeded the {budget * 1000:.0f} ms budget", started)
        result["retrieval_time_ms"] = int((time.perf_counter() - started) * 1000)
        return result
    except Exception as error:  # noqa: BLE001 - the contract: never raise
        return _empty(f"retrieval failed: {type(error).__name__}: {error}", started)
