"""The one answer path: what a request's answer says, and the response synthesizer that writes it.

``write_answer`` is every front end's answer: the extractive one (sentences of the passages, each followed by its
``[n]`` marker), the configured OpenAI-compatible endpoint's (``answer: "llm"``) or none; for the ask front ends
(``SearchRequest.answer_sources``) written for the question alone - not the question and the reader's selection
that were searched - from the first ``answer_sources`` passages, unless the question only asks about the
selection ("what does this mean?"), which is then what the sentences are picked by.

``AnswerSynthesizer`` is the served query engine's ``BaseSynthesizer``: from the source nodes the rerank step
kept it makes the citations, the answer and the coverage (lowered to what the sentences an answer would quote
support), and returns a LlamaIndex ``Response`` whose metadata holds the ``SearchResponse``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from llama_index.core.base.response.schema import Response
from llama_index.core.llms.mock import MockLLM
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.schema import NodeWithScore

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import QueryValidationError
from knowledge_store.retrieval.answer import Answer, LLMAnswerer, extractive_answer
from knowledge_store.retrieval.citations import build_citations
from knowledge_store.retrieval.llama import SearchQuery
from knowledge_store.retrieval.request import (
    ANSWER_PASSAGES,
    NO_RESULTS,
    SearchRequest,
    SearchResponse,
    answered_coverage,
)
from knowledge_store.retrieval.sentences import sentence_cosines
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot
from knowledge_store.retrieval.terms import query_terms
from knowledge_store.retrieval.types import SearchHit

# words of a question that is about the selected text itself, not about something in it
ABOUT_THE_SELECTION = frozenset({
    "mean", "means", "meaning", "explain", "explained", "explanation", "clarify", "summarize", "summarise",
    "summary", "elaborate", "detail", "details", "simpler", "simply", "words", "say", "says", "saying",
})


def attach_sentence_cosines(snapshot: LoadedSnapshot, hits: list[SearchHit], query_vector: np.ndarray) -> None:
    """Give each hit its embedded sentences' cosines with the query (``SearchHit.sentence_cosines``): the vector
    evidence of each sentence an answer may quote.  Nothing when the snapshot has no sentence vectors."""
    index = snapshot.sentence_index
    if index is None:
        return
    for hit in hits:
        hit.sentence_cosines = sentence_cosines(index, hit.row, hit.text, query_vector)


def _llm(settings: Settings) -> LLMAnswerer:
    if not settings.llm_configured:
        raise QueryValidationError("answer", "llm", "no LLM configured (set GROUNDWORK_LLM_BASE_URL and GROUNDWORK_LLM_MODEL)")
    return LLMAnswerer(settings.llm_base_url, settings.llm_model,
                       settings.llm_api_key.get_secret_value() if settings.llm_api_key else None)


def write_answer(request: SearchRequest, hits: list[SearchHit], settings: Settings, quoted: Answer | None) -> Answer | None:
    """The answer of ``request`` from its final ``hits`` (empty: nothing relevant).  ``quoted``: the extractive
    answer of the query from the first ``ANSWER_PASSAGES`` hits, already written for the coverage."""
    mode = request.answer
    if request.answer_sources is not None:  # the ask front ends: always an answer
        hits = hits[: request.answer_sources]
        if not hits:
            return Answer(text=NO_RESULTS, citations=[], method="llm" if mode == "llm" else "extractive")
        question = request.question or request.query
        if mode == "llm":
            selection = request.selection
            prompt = f"{question}\n\nThe reader selected this text:\n{selection}" if selection else question
            return _llm(settings).answer(prompt, hits)
        if request.selection and not set(query_terms(question)) - ABOUT_THE_SELECTION:
            return extractive_answer(request.query, hits)
        return extractive_answer(question, hits)
    if not hits:
        return Answer(text=NO_RESULTS, citations=[], method="extractive") if mode != "none" else None
    if mode == "extractive":
        return quoted
    if mode == "none":
        return None
    return _llm(settings).answer(request.query, hits)


class AnswerSynthesizer(BaseSynthesizer):
    """The served query engine's synthesizer: citations from the source nodes, the answer (``write_answer``),
    the coverage, and the ``SearchResponse`` in the returned ``Response``'s metadata (``search_response``)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(llm=MockLLM())
        self._settings = settings

    def _get_prompts(self) -> dict:
        return {}

    def _update_prompts(self, prompts: dict) -> None:
        return None

    def get_response(self, query_str: str, text_chunks: Any, **kwargs: Any) -> str:
        raise NotImplementedError("AnswerSynthesizer answers a SearchQuery's source nodes (synthesize), not text chunks")

    async def aget_response(self, query_str: str, text_chunks: Any, **kwargs: Any) -> str:
        return self.get_response(query_str, text_chunks)

    def synthesize(self, query: Any, nodes: list[NodeWithScore], additional_source_nodes: Any = None, **kwargs: Any) -> Response:
        if not isinstance(query, SearchQuery) or query.request is None or query.found is None:
            raise TypeError(f"AnswerSynthesizer needs a SearchQuery that went through the candidate retriever, got {query!r}")
        request, found = query.request, query.found
        t_format = time.perf_counter()
        final = query.hits_of(nodes)
        attach_sentence_cosines(found.snapshot, final[:ANSWER_PASSAGES], found.query_vector)
        citations = build_citations(final, request.query, self._settings.snippet_chars)
        # what the passages' own sentences say to the question: the extractive answer from the first
        # ANSWER_PASSAGES (the one returned in that mode), whose confidence caps the coverage in every mode
        quoted = extractive_answer(request.query, final[:ANSWER_PASSAGES]) if final else None
        coverage = query.coverage
        if quoted is not None:
            coverage = answered_coverage(coverage, quoted.confidence or 0.0)
        answer = write_answer(request, final, self._settings, quoted)
        done = time.perf_counter()
        timings = {**query.timings, "format": (done - t_format) * 1000, "total": (done - query.started) * 1000}
        response = SearchResponse(
            retrieval_request_id="", query=request.query, results=citations, answer=answer, coverage=coverage,
            latency_ms={k: round(v, 3) for k, v in timings.items()}, reranker_status=query.reranker_status,
            snapshot_version=found.snapshot.info.snapshot_version,
            params={**request.logged_params(), "query_adapter": found.adapted},
            message=NO_RESULTS if query.coverage == "none" else None, missing_terms=list(found.unknown_words),
            hits=final, snapshot=query.snapshot,
        )
        return Response(response=answer.text if answer else None, source_nodes=nodes,
                        metadata={"search_response": response})

    async def asynthesize(self, query: Any, nodes: list[NodeWithScore], additional_source_nodes: Any = None, **kwargs: Any) -> Response:
        return self.synthesize(query, nodes, additional_source_nodes, **kwargs)
