"""LlamaIndex adapters: ranked chunks as nodes (``hit_to_node``), the ``SearchQuery`` bundle the served query
engine passes along (``query_engine.py``), and for LlamaIndex users the hybrid ``BaseRetriever`` over a full
``search`` with an extractive synthesizer.

Use those like any LlamaIndex component::

    engine = RetrievalEngine()
    retriever = engine.as_retriever(k=5, alpha=0.5)          # BaseRetriever
    nodes = retriever.retrieve("how do I reset the hub?")    # NodeWithScore, citation fields in metadata
    response = engine.as_query_engine(reranker="mmr").query("...")
    response.source_nodes[0].node.metadata["url"]            # file:///...#page=4

No LLM is involved: the synthesizer answers with sentences taken verbatim from
the retrieved passages, each followed by its citation marker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llama_index.core.base.response.schema import Response
from llama_index.core.llms.mock import MockLLM
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from knowledge_store.core.errors import QueryValidationError
from knowledge_store.retrieval.answer import extractive_answer
from knowledge_store.retrieval.citations import build_citations
from knowledge_store.retrieval.request import HybridCandidates, SearchRequest
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot
from knowledge_store.retrieval.types import SearchHit

SEARCH_PARAMS = ("k", "alpha", "fusion", "reranker", "filters", "min_relevance", "section_weight", "lead_weight")


def hit_to_node(hit: SearchHit, embedding: np.ndarray | None) -> NodeWithScore:
    """A ranked chunk as a LlamaIndex node: citation fields and every score in its metadata
    (scores and ids kept out of what an embedding model or LLM would read)."""
    node = TextNode(
        id_=hit.chunk_id,
        text=hit.text,
        embedding=embedding.tolist() if embedding is not None else None,
        metadata={
            "chunk_id": hit.chunk_id, "doc_id": hit.doc_id, "version": hit.version, "title": hit.title,
            "section": hit.section, "pages": hit.pages, "url": hit.url, "content_hash": hit.content_hash,
            "bm25_score": hit.bm25_score, "vector_score": hit.vector_score, "bm25_rank": hit.bm25_rank,
            "vector_rank": hit.vector_rank, "fused_score": hit.score, "relevance": hit.relevance,
            "rerank_score": hit.rerank_score,
        },
        excluded_embed_metadata_keys=["chunk_id", "content_hash", "bm25_score", "vector_score", "bm25_rank",
                                      "vector_rank", "fused_score", "relevance", "rerank_score"],
        excluded_llm_metadata_keys=["chunk_id", "content_hash", "bm25_score", "vector_score", "bm25_rank",
                                    "vector_rank", "fused_score", "relevance", "rerank_score", "url"],
    )
    return NodeWithScore(node=node, score=hit.score)


@dataclass
class SearchQuery(QueryBundle):
    """One ``SearchRequest`` on its way through the served query engine (``query_engine.py``): the
    ``QueryBundle`` LlamaIndex hands from the retriever to the node postprocessors, the response synthesizer and
    the instrumentation events, with what each stage found.  ``snapshot`` is read once, when the request starts;
    ``query_log`` None: the request is not logged."""

    request: SearchRequest | None = None
    snapshot: LoadedSnapshot | None = None
    reranker: Any = None  # the request's reranker (a BaseNodePostprocessor), None: keep the fused order
    query_log: Any = None
    started: float = field(default_factory=time.perf_counter)
    found: HybridCandidates | None = None
    coverage: str = "none"
    reranker_status: str = "none"
    timings: dict[str, float] = field(default_factory=dict)
    hits_by_id: dict[str, SearchHit] = field(default_factory=dict)

    def hits_of(self, nodes: list[NodeWithScore]) -> list[SearchHit]:
        """The ranked chunks ``nodes`` stand for, in their order."""
        return [self.hits_by_id[node.node.node_id] for node in nodes]


class HybridRetriever(BaseRetriever):
    """The engine's ``search`` as a LlamaIndex retriever.

    Parameters are those of ``RetrievalEngine.search`` (k, alpha, fusion, reranker,
    filters, min_relevance, section_weight, lead_weight).  Each retrieval *is* a
    ``search`` call with ``answer="none"``: the same ranking, the same reranker with
    its timeout and fallback, and the same query-log record (client ``llamaindex``)
    as the API, CLI and MCP - so feedback and replays see LlamaIndex traffic too.
    Returned nodes carry ``chunk_id``, ``doc_id``, ``version``, ``title``,
    ``section``, ``pages``, ``url``, every score and ``retrieval_request_id`` in
    their metadata, and their embedding; the query embedding is put on the
    ``QueryBundle`` for postprocessors that need it.
    """

    def __init__(self, engine: Any, **params: Any) -> None:
        super().__init__()
        unknown = sorted(set(params) - set(SEARCH_PARAMS))
        if unknown:
            raise QueryValidationError(unknown[0], params[unknown[0]], f"not a search parameter ({', '.join(SEARCH_PARAMS)})")
        self._engine = engine
        self._params = {k: v for k, v in params.items() if v is not None}
        self.last_request_id: str | None = None
        # the last retrieval's ranked chunks as the search returned them (section path, sentence cosines), by
        # chunk id: what ``ExtractiveSynthesizer`` answers from, as the served answers do
        self.hits_by_id: dict[str, SearchHit] = {}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        response = self._engine.search(query_bundle.query_str, answer="none", client="llamaindex", **self._params)
        self.last_request_id = response.retrieval_request_id
        self.hits_by_id = {hit.chunk_id: hit for hit in response.hits}
        snapshot = response.snapshot or self._engine.snapshots.current()  # the one the search read
        same = snapshot.info.snapshot_version == response.snapshot_version  # rows index that snapshot only
        vector = self._engine.embedder.embed([query_bundle.query_str])[0]  # cached: the search just embedded it
        query_bundle.embedding = vector.tolist()
        nodes = []
        for hit in response.hits:
            node = hit_to_node(hit, snapshot.embeddings[hit.row] if same and 0 <= hit.row < snapshot.size else None)
            node.node.metadata["retrieval_request_id"] = response.retrieval_request_id
            nodes.append(node)
        return nodes


def node_to_hit(item: NodeWithScore) -> SearchHit:
    meta = item.node.metadata
    pages = meta.get("pages") or []
    return SearchHit(
        chunk_id=meta.get("chunk_id", item.node.node_id), doc_id=meta.get("doc_id", ""), version=meta.get("version", 0),
        title=meta.get("title", ""), section=meta.get("section", ""), section_path=tuple(),
        page_start=pages[0] if pages else None, page_end=pages[-1] if pages else None, url=meta.get("url", ""),
        source_path="", source_id="", text=item.node.get_content(), doc_type="", score=item.score or 0.0,
        bm25_score=meta.get("bm25_score"), vector_score=meta.get("vector_score"), relevance=meta.get("relevance", 0.0),
        content_hash=meta.get("content_hash", ""),
    )


class ExtractiveSynthesizer(BaseSynthesizer):
    """Answers with retrieved sentences only, each followed by ``[n]``; citations in metadata.  ``retriever``: the
    ``HybridRetriever`` whose nodes it answers: their chunks as the search ranked them (section path, sentence
    cosines) are quoted as the served answers quote them; other nodes are read from their metadata."""

    def __init__(self, top_k: int = 5, retriever: HybridRetriever | None = None) -> None:
        super().__init__(llm=MockLLM())
        self._top_k = top_k
        self._retriever = retriever

    def _get_prompts(self) -> dict:
        return {}

    def _update_prompts(self, prompts: dict) -> None:
        return None

    def get_response(self, query_str: str, text_chunks: Any, **kwargs: Any) -> str:
        hits = [SearchHit(chunk_id=str(i), doc_id="", version=0, title="", section="", section_path=(), page_start=None,
                          page_end=None, url="", source_path="", source_id="", text=t, doc_type="")
                for i, t in enumerate(text_chunks)]
        return extractive_answer(query_str, hits).text

    async def aget_response(self, query_str: str, text_chunks: Any, **kwargs: Any) -> str:
        return self.get_response(query_str, text_chunks)

    def synthesize(self, query: Any, nodes: list[NodeWithScore], additional_source_nodes: Any = None, **kwargs: Any) -> Response:
        query_str = query.query_str if isinstance(query, QueryBundle) else str(query)
        nodes = nodes[: self._top_k]
        known = self._retriever.hits_by_id if self._retriever is not None else {}
        hits = [known.get(n.node.node_id) or node_to_hit(n) for n in nodes]
        answer = extractive_answer(query_str, hits)
        citations = build_citations(hits, query_str)
        return Response(
            response=answer.text,
            source_nodes=nodes,
            metadata={"citations": [c.model_dump() for c in citations], "answer_method": answer.method,
                      "retrieval_request_id": next((n.node.metadata.get("retrieval_request_id") for n in nodes), None)},
        )

    async def asynthesize(self, query: Any, nodes: list[NodeWithScore], additional_source_nodes: Any = None, **kwargs: Any) -> Response:
        return self.synthesize(query, nodes, additional_source_nodes, **kwargs)
