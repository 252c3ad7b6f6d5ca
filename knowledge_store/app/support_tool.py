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

The query is the message with the intent's words added in parentheses
(``not_hashing`` -> ``... (not hashing)``) when they say something the message
does not and the knowledge base knows at least one of them: an intent label
the documents never use (``billing`` for a thermostat manual) would only lower
every passage's relevance.  An empty message searches for the intent alone.

Timing: ``retrieval_time_ms`` is the time the retrieval took (query formation,
search, formatting), and 0 when it failed (the contract's fallback).  No call
waits past the budget (``GROUNDWORK_SUPPORT_BUDGET_MS``, 100 ms), not even the
first one of a cold process: until the engine is built and its model and index
are loaded, a call answers at once with no sources and the gap "model still
loading; retry in a few seconds", and starts the one background build and
warm-up (idempotent: later calls do not start another).  A warm-up that failed is reported in the next
call's gap (and in ``/health``) and tried again.  Call ``warm_up()`` when the
host starts so the first requests find the model loaded.  Query vectors are
cached by the engine (``cache_stats()``): a repeated question costs no model call.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time
from typing import Any

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.engine import RetrievalEngine

MAX_SOURCES = 3
TITLE_MAX = 200
URL_MAX = 500
EXCERPT_MAX = 150

_engine = None
_build_lock = threading.Lock()  # held while the process-wide engine is built (it opens the index; the model loads later)
_building: concurrent.futures.Future | None = None  # building and warming the engine in the background
_building_lock = threading.Lock()
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="retrieve_knowledge")
LOADING = "model still loading (model and index{so_far}); retry in a few seconds"


def _empty(gap: str) -> dict[str, Any]:
    """The contract's fallback: no sources, coverage none, the reason as a gap, retrieval_time_ms 0."""
    return {"sources_consulted": [], "coverage": "none", "gaps": [gap], "retrieval_time_ms": 0}


def get_engine(settings: Settings | None = None):
    """The process-wide engine used by the support tool (built on first use: this call waits for it)."""
    global _engine
    engine = _engine
    if engine is not None:
        return engine
    with _build_lock:
        if _engine is None:
            _engine = RetrievalEngine(settings or Settings())
        return _engine


def set_engine(engine) -> None:
    """Use a specific engine (tests, servers that already have one)."""
    global _engine, _building
    with _building_lock:
        _engine, _building = engine, None


def warm_up() -> concurrent.futures.Future:
    """Build the process-wide engine if there is none yet and load its model and index, all in the background
    (one thread at a time); the future ends with the warm-up and carries its error."""
    global _building
    engine = _engine
    if engine is not None:
        return engine.warm_up_in_background()
    with _building_lock:
        building = _building
        if building is None or (building.done() and building.exception() is not None):
            building = _building = concurrent.futures.Future()
            threading.Thread(target=_build_and_warm, args=(building,), daemon=True,
                             name="retrieve_knowledge-engine").start()
        return building


def _build_and_warm(future: concurrent.futures.Future) -> None:
    try:
        get_engine().warm_up_in_background().result()
    except BaseException as error:  # noqa: BLE001 - the next call reports it (see retrieve_knowledge)
        future.set_exception(error)
    else:
        future.set_result(None)


def _not_built() -> dict[str, Any]:
    """The answer while the process-wide engine is still being built (then warmed up: its model loaded, the first
    time ever also exported): empty at once, the build started in the background; a failed build is the gap and
    is tried again."""
    building = _building
    error = building.exception() if building is not None and building.done() else None
    warm_up()
    if error is not None:
        return _empty(f"knowledge base unavailable: {type(error).__name__}: {error} (loading again in the background)")
    return _empty(LOADING.format(so_far=""))


def _not_ready(engine) -> dict[str, Any]:
    """The answer while the engine is not warmed up: empty at once, with the warm-up started (or retried after
    a failure) in the background.  A failed attempt's error is the gap, so the caller learns why."""
    status = engine.warm_up_status()
    engine.warm_up_in_background()
    if status["state"] == "failed":
        return _empty(f"knowledge base unavailable: {status['error']} (loading again in the background)")
    waited = f", {status['seconds']:g} s so far" if status["state"] == "warming" and status["seconds"] else ""
    result = _empty(LOADING.format(so_far=waited))
    if status["error"]:
        result["gaps"].append(f"the previous attempt failed: {status['error']}")
    return result


def cache_stats() -> dict[str, Any] | None:
    """The engine's query-embedding cache counters (hits, coalesced, misses, hit_rate), None without a cache."""
    stats = getattr(get_engine().embedder, "stats", None)
    return stats() if callable(stats) else None


def form_query(intent: str | None, message: str | None, snapshot: Any = None) -> str:
    """The search text for a conversation turn: the message, plus the intent's words when they add
    something the knowledge base knows (see the module docstring); the intent alone for an empty message."""
    message = " ".join((message or "").split()) if isinstance(message, str) else ""
    topic = " ".join(re.split(r"[\s_\-]+", intent)).strip() if isinstance(intent, str) else ""
    if not message or not topic:
        return message or topic
    if snapshot is not None:
        topic_terms = set(snapshot.query_terms(topic).known)
        if not topic_terms - set(snapshot.query_terms(message).known):
            return message  # the KB knows none of the intent's words, or the message already says them
    return f"{message} ({topic})"


def _clip(text: str | None, limit: int) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _run(intent: str, message: str, metadata: dict[str, Any], floor: float) -> dict[str, Any]:
    engine = get_engine()
    query = form_query(intent, message, engine.snapshots.current())
    wanted = {k: v for k, v in (metadata or {}).items() if k in ("device", "product") and isinstance(v, str) and v}
    gaps: list[str] = []
    response = None
    if wanted:
        response = engine.search(request=engine.request(query, k=MAX_SOURCES, filters={"metadata": wanted},
                                                           client="support_tool"))
        if not response.results:
            gaps.append(f"nothing specific to {', '.join(f'{k}={v}' for k, v in wanted.items())}; searched all documents")
            response = None
    if response is None:
        response = engine.search(request=engine.request(query, k=MAX_SOURCES, client="support_tool"))
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
            "retrieval_request_id": response.retrieval_request_id, "query": query}


def retrieve_knowledge(intent: str, message: str, metadata: dict[str, Any] | None = None, *,
                       budget_ms: int | None = None, floor: float | None = None) -> dict[str, Any]:
    """Best sources for a support conversation turn, within a hard time budget; never raises."""
    started = time.perf_counter()
    try:
        if not isinstance(message, str) or not (message.strip() or (isinstance(intent, str) and intent.strip())):
            return _empty("empty message: nothing to search for")
        engine = _engine
        if engine is None:
            return _not_built()  # never wait for the engine to be built either
        settings = engine.settings
        budget = (budget_ms if budget_ms is not None else settings.support_budget_ms) / 1000.0
        floor = settings.support_floor if floor is None else floor
        if not engine.warmed_up:
            return _not_ready(engine)  # never wait for a model load: answer now, warm up in the background
        future = _POOL.submit(_run, intent if isinstance(intent, str) else "", message,
                              metadata if isinstance(metadata, dict) else {}, floor)
        try:
            result = future.result(timeout=max(0.0, budget - (time.perf_counter() - started)))
        except concurrent.futures.TimeoutError:
            future.cancel()  # still queued behind other calls: do not run it for nobody
            return _empty(f"retrieval exceeded the {budget * 1000:.0f} ms budget")
        result["retrieval_time_ms"] = int((time.perf_counter() - started) * 1000)
        return result
    except Exception as error:  # noqa: BLE001 - the contract: never raise
        return _empty(f"retrieval failed: {type(error).__name__}: {error}")
