"""What every front end asks for and what it gets back: ``SearchRequest`` and ``SearchResponse``.

The HTTP routes (``/api/knowledge/query``, ``/api/ask``, ``/api/ask-local``), the MCP ``search`` tool, the CLI,
the support tool and the evaluations all build one ``SearchRequest`` (``RetrievalEngine.request`` validates it and
fills in the corpus's defaults) and hand it to ``RetrievalEngine.search``, which runs it through the LlamaIndex
query engine (``retrieval/query_engine.py``).  ``SearchQuery`` is that request on its way through the query
engine: the ``QueryBundle`` LlamaIndex passes from the retriever to the node postprocessors and the response
synthesizer, carrying the snapshot it was read against (once per request) and what each stage found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knowledge_store.retrieval.answer import Answer
from knowledge_store.retrieval.citations import Citation
from knowledge_store.retrieval.filters import SearchFilters
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot
from knowledge_store.retrieval.types import SearchHit
from knowledge_store.storage.query_log import redact
from knowledge_store.storage.tuned import RankingParams

NO_RESULTS = "No relevant content found."
COVERAGE_LEVELS = ("none", "low", "medium", "high")
# an extractive answer quotes from the first this many passages: a unit of the tenth scores under a third of the
# same unit in the first (answer._RANK_DECAY), and reading a hundred passages' units would cost a query ~50 ms
ANSWER_PASSAGES = 10


def retrieval_query(question: str, context: str | None, max_chars: int) -> str:
    """The search text of a question about a selection: the question, then as much of the selected text as the
    query limit allows."""
    question = question.strip()
    context = " ".join((context or "").split())
    if not context:
        return question[:max_chars]
    room = max_chars - len(question) - 2
    return f"{question}\n\n{context[:room]}" if room > 20 else question[:max_chars]


@dataclass
class SearchRequest:
    """One validated request.  ``alpha`` None: the corpus's alpha for the query's form, both resolved against the
    snapshot the search reads (``RetrievalEngine.resolve``).  ``question``, ``selection`` and ``answer_sources``
    are the ask front ends': the answer is written for ``question`` (default: ``query``, which may also hold the
    reader's selection), from the first ``answer_sources`` passages (default: all of them)."""

    query: str
    k: int
    alpha: float | None
    fusion: str
    reranker: str
    filters: SearchFilters
    min_relevance: float
    answer: str = "extractive"  # extractive | llm | none
    client: str = "python"
    section_weight: float = 0.0
    lead_weight: float = 0.0
    # "question", "named_entity" or "other" (retrieval/query_form.py): questions get question_alpha; None until
    # the request is resolved against the snapshot it searches (``RetrievalEngine.resolve``)
    query_form: str | None = None
    question: str | None = None
    selection: str | None = None
    answer_sources: int | None = None

    @property
    def ranking(self) -> RankingParams:
        return RankingParams(self.alpha, self.fusion, self.section_weight, self.lead_weight)

    def logged_params(self) -> dict[str, Any]:
        """The parameters a query ran with, as the response and the query log report them."""
        return {
            "k": self.k, "alpha": self.alpha, "query_form": self.query_form, "fusion": self.fusion,
            "section_weight": self.section_weight,
            "lead_weight": self.lead_weight, "reranker": self.reranker,
            "filters": self.filters.model_dump(exclude_defaults=True), "min_relevance": self.min_relevance,
            "answer": self.answer,
        }


@dataclass
class SearchResponse:
    retrieval_request_id: str
    query: str
    results: list[Citation]
    answer: Answer | None
    coverage: str
    latency_ms: dict[str, float]
    reranker_status: str
    snapshot_version: int
    params: dict[str, Any]
    message: str | None = None
    # the query's words that no document the request could read contains (stopwords aside): a question about
    # something the documents never mention says so, whatever the passages' scores
    missing_terms: list[str] = field(default_factory=list)
    hits: list[SearchHit] = field(default_factory=list)
    snapshot: LoadedSnapshot | None = None  # the snapshot the request read (its documents name the hits' files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "retrieval_request_id": self.retrieval_request_id,
            "query": redact(self.query),  # echoed back: never return a secret someone pasted
            "results": [c.model_dump() for c in self.results],
            "answer": self.answer.model_dump() if self.answer else None,
            "coverage": self.coverage,
            "missing_terms": self.missing_terms,
            "message": self.message,
            "latency_ms": self.latency_ms,
            "reranker_status": self.reranker_status,
            "snapshot_version": self.snapshot_version,
            "params": self.params,
        }


@dataclass
class HybridCandidates:
    """Fused candidates of one query, before reranking."""

    snapshot: LoadedSnapshot
    query_vector: np.ndarray
    hits: list[SearchHit]
    timings: dict[str, float]
    unknown_words: list[str]  # the query's words no document of the searched snapshot contains
    adapted: bool = False  # the corpus's query adapter moved the query vector (``query_adapter.py``)


def coverage_label(best_relevance: float, floor: float) -> str:
    """Coarse confidence for people and agents: how well the best passage matches."""
    if best_relevance < floor:
        return "none"
    if best_relevance >= 0.75:
        return "high"
    if best_relevance >= 0.55:
        return "medium"
    return "low"


def answered_coverage(passages: str, confidence: float) -> str:
    """The coverage a response reports: the passages' label (``coverage_label``), lowered to what the sentences an
    answer would quote support (``Answer.confidence`` on the same 0.55 / 0.75 steps; at least "low" once passages
    passed the floor).  Passages that match the question's words and meaning but whose sentences do not answer it
    (the right document, the wrong section) are not "high"."""
    if passages == "none":
        return passages
    answered = "high" if confidence >= 0.75 else "medium" if confidence >= 0.55 else "low"
    return min(passages, answered, key=COVERAGE_LEVELS.index)
