"""The served LlamaIndex query engine: every front end's search is one ``RetrieverQueryEngine.query``.

``build_query_engine(engine)`` assembles it from the project's pieces, each in the LlamaIndex role it plays:

* ``CandidateRetriever`` (``BaseRetriever``): BM25 and vector evidence over the request's snapshot, fused and
  ranked by the ranking pipeline (``RetrievalEngine.candidates``), as nodes (``llama.hit_to_node``); nothing when
  the best passage is under the relevance floor.
* ``RerankStep`` (``BaseNodePostprocessor``): the request's reranker - any ``BaseNodePostprocessor`` the reranker
  registry names (``reranker_registry``), under its time limit, the fused order kept when it fails - then the
  first ``k`` nodes.
* ``synthesis.AnswerSynthesizer`` (``BaseSynthesizer``): citations from the source nodes, the answer, the coverage.
* ``QueryLogHandler`` (an instrumentation ``BaseEventHandler``): on each ``QueryEndEvent`` of a ``SearchQuery``
  it appends the query-log record and gives the response its ``retrieval_request_id``.

The request travels as a ``llama.SearchQuery`` (a ``QueryBundle``), so one query engine serves every request.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.query import QueryEndEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from knowledge_store.retrieval.llama import SearchQuery, hit_to_node
from knowledge_store.retrieval.request import coverage_label
from knowledge_store.retrieval.rerankers import run_reranker
from knowledge_store.retrieval.synthesis import AnswerSynthesizer
from knowledge_store.storage.query_log import QueryLogRecord


def _search_query(bundle: QueryBundle | None) -> SearchQuery:
    if not isinstance(bundle, SearchQuery) or bundle.request is None:
        raise TypeError(f"the served query engine answers a SearchQuery (RetrievalEngine.search), got {bundle!r}")
    return bundle


class CandidateRetriever(BaseRetriever):
    """Hybrid candidates of a ``SearchQuery``: ``candidates(request, pool_size, snapshot)`` is
    ``RetrievalEngine.candidates``; the pool is ``k`` without a reranker, else ``max(4 k, 20)`` for it to reorder."""

    def __init__(self, candidates: Any) -> None:
        super().__init__()
        self._candidates = candidates

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        query = _search_query(query_bundle)
        request = query.request
        pool_size = max(request.k * 4, 20) if query.reranker is not None else request.k
        found = query.found = self._candidates(request, pool_size, query.snapshot)
        query.timings.update(found.timings)
        query.coverage = coverage_label(max((h.relevance for h in found.hits), default=0.0), request.min_relevance)
        if query.coverage == "none":
            return []
        query.embedding = found.query_vector.tolist()  # for postprocessors that compare it with the nodes'
        embeddings = found.snapshot.embeddings
        query.hits_by_id = {h.chunk_id: h for h in found.hits}
        return [hit_to_node(h, embeddings[h.row] if query.reranker is not None else None) for h in found.hits]


class RerankStep(BaseNodePostprocessor):
    """The request's reranker under ``timeout_s`` (``rerankers.run_reranker``: the fused order kept, and said in
    ``reranker_status``, when it fails or is late), then the first ``k`` nodes; each kept hit gets its
    ``rerank_score`` when the reranker ran."""

    timeout_s: float = 2.0

    @classmethod
    def class_name(cls) -> str:
        return "GroundworkRerankStep"

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        query = _search_query(query_bundle)
        started = time.perf_counter()
        if nodes:
            nodes, query.reranker_status = run_reranker(query.reranker, nodes, query_bundle, self.timeout_s)
            nodes = nodes[: query.request.k]
            if query.reranker_status == "ok":
                for node in nodes:
                    query.hits_by_id[node.node.node_id].rerank_score = float(node.score) if node.score is not None else None
        query.timings["rerank"] = (time.perf_counter() - started) * 1000
        return nodes


def query_log_record(query: SearchQuery, response: Any) -> QueryLogRecord:
    """The query log's record of a served ``SearchQuery`` and its ``SearchResponse``."""
    request, pre, post = query.request, query.found.hits if query.found else [], response.hits
    return QueryLogRecord(
        query=request.query,
        client=request.client,
        params=response.params,
        results_pre=[
            {"chunk_id": h.chunk_id, "doc_id": h.doc_id, "content_hash": h.content_hash, "rank": h.fused_rank,
             "score": h.score, "bm25_score": h.bm25_score, "vector_score": h.vector_score, "relevance": h.relevance}
            for h in pre
        ],
        results_post=[
            {"chunk_id": h.chunk_id, "content_hash": h.content_hash, "rank": i + 1, "score": h.score,
             "rerank_score": h.rerank_score, "doc_id": h.doc_id, "url": h.url, "snippet": h.text[:150]}
            for i, h in enumerate(post)
        ],
        latency_ms=response.latency_ms,
        reranker_status=response.reranker_status,
        coverage=response.coverage,
        snapshot_version=response.snapshot_version,
        answer=response.answer.text if response.answer else None,
    )


class QueryLogHandler(BaseEventHandler):
    """Appends each answered ``SearchQuery`` (its ``QueryEndEvent``) to the query log it names
    (``SearchQuery.query_log``; None: not logged) and sets the response's ``retrieval_request_id``.  A logging
    problem never fails the query: the response then gets an id the log does not know."""

    @classmethod
    def class_name(cls) -> str:
        return "GroundworkQueryLogHandler"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if not isinstance(event, QueryEndEvent) or not isinstance(event.query, SearchQuery):
            return
        query, response = event.query, event.response.metadata.get("search_response")
        if query.query_log is None or response is None:
            return
        try:
            response.retrieval_request_id = query.query_log.append(query_log_record(query, response))
        except Exception:  # noqa: BLE001 - logging must never break retrieval
            response.retrieval_request_id = uuid.uuid4().hex


_HANDLER_LOCK = threading.Lock()
_handler: QueryLogHandler | None = None


def query_log_handler() -> QueryLogHandler:
    """The process's one ``QueryLogHandler``, added to LlamaIndex's root dispatcher on first use (every engine's
    queries reach it; each query names its own log)."""
    global _handler
    with _HANDLER_LOCK:
        if _handler is None:
            _handler = QueryLogHandler()
            get_dispatcher().add_event_handler(_handler)
        return _handler


class ServedQueryEngine(RetrieverQueryEngine):
    """The ``RetrieverQueryEngine`` a ``RetrievalEngine`` serves with (``RetrievalEngine.query_engine``)."""


def build_query_engine(engine: Any) -> ServedQueryEngine:
    """The query engine of ``engine`` (a ``RetrievalEngine``): its candidates, the rerank step, the answer."""
    query_log_handler()
    return ServedQueryEngine(
        retriever=CandidateRetriever(engine.candidates),
        response_synthesizer=AnswerSynthesizer(engine.settings),
        node_postprocessors=[RerankStep(timeout_s=engine.settings.reranker_timeout_s)],
    )
