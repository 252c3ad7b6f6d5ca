"""LlamaIndex extension points: the hybrid ``BaseRetriever`` and an extractive synthesizer.

Use them like any LlamaIndex component::

    engine = RetrievalEngine()
    retriever = engine.as_retriever(k=5, alpha=0.5)          # BaseRetriever
    nodes = retriever.retrieve("how do I reset the hub?")    # NodeWithScore, citation fields in metadata
    response = engine.as_query_engine(reranker="mmr").query("...")
    response.source_nodes[0].node.metadata["url"]            # file:///...#page=4

No LLM is involved: the synthesizer answers with sentences taken verbatim from
the retrieved passages, each followed by its citation marker.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.response.schema import Response
from llama_index.core.llms.mock import MockLLM
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from knowledge_store.retrieval.answer import extractive_answer
from knowledge_store.retrieval.citations import build_citations
from knowledge_store.retrieval.types import SearchHit


class HybridRetriever(BaseRetriever):
    """BM25 (DuckDB fts) + exact vector search over the published snapshot, fused.

    Parameters are those of ``RetrievalEngine.search`` (k, alpha, fusion,
    filters, min_relevance).  Returned nodes carry ``chunk_id``, ``doc_id``,
    ``version``, ``title``, ``section``, ``pages``, ``url`` and every score in
    their metadata, and their embedding (for MMR).  The query embedding is put
    on the ``QueryBundle`` for postprocessors that need it.
    """

    def __init__(self, engine: Any, **params: Any) -> None:
        super().__init__()
        self._engine = engine
        self._params = params

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        from knowledge_store.retrieval.engine import hit_to_node

        params = {k: v for k, v in self._params.items() if k in ("k", "alpha", "fusion", "filters", "min_relevance", "section_weight", "lead_weight")}
        request = self._engine.request(query_bundle.query_str, **params)
        found = self._engine.candidates(request, request.k)
        query_bundle.embedding = found.query_vector.tolist()
        best = max((h.relevance for h in found.hits), default=0.0)
        if best < request.min_relevance:
            return []
        return [hit_to_node(h, found.snapshot.embeddings[h.row]) for h in found.hits]


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
    """Answers with retrieved sentences only, each followed by ``[n]``; citations in metadata."""

    def __init__(self, top_k: int = 5) -> None:
        super().__init__(llm=MockLLM())
        self._top_k = top_k

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
        hits = [node_to_hit(n) for n in nodes]
        answer = extractive_answer(query_str, hits)
        citations = build_citations(hits, query_str)
        return Response(
            response=answer.text,
            source_nodes=nodes,
            metadata={"citations": [c.model_dump() for c in citations], "answer_method": answer.method},
        )

    async def asynthesize(self, query: Any, nodes: list[NodeWithScore], additional_source_nodes: Any = None, **kwargs: Any) -> Response:
        return self.synthesize(query, nodes, additional_source_nodes, **kwargs)
