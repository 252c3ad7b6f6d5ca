"""Values passed between the retrieval stages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from knowledge_store.core.entities import EntityRef


@dataclass
class SearchHit:
    """One retrieved chunk with every score that produced its rank.

    ``bm25_score`` / ``vector_score`` are the raw scores (BM25 from the fts
    index; cosine similarity in [-1, 1]); ``bm25_rank`` / ``vector_rank`` are
    1-based ranks in each list (None when the chunk was not in that list).
    ``score`` is the fused score (min-max weighted sum or RRF), ``relevance`` the
    absolute 0-1 relevance used for thresholds (see docs/ARCHITECTURE.md), and
    ``rerank_score`` what a reranker assigned, if one ran.  ``ocr`` is True when
    the passage's text was read by OCR from a scanned page; ``ocr_confidence``
    is then the mean Tesseract word confidence (0-1) of its least sure page, or
    None when unknown.  ``entities`` are the entities the chunk's text mentions
    (``knowledge_store.core.entities``), in order of first mention; ``entity_boost``
    is what the query naming one of them, or an identifier the chunk holds, added to ``score`` (0 when none); a
    passage naming every entity of the query has ``relevance`` at least the
    query's ``min_relevance`` (see ``RetrievalEngine.candidates``).
    """

    chunk_id: str
    doc_id: str
    version: int
    title: str
    section: str
    section_path: tuple[str, ...]
    page_start: int | None
    page_end: int | None
    url: str
    source_path: str
    source_id: str
    text: str
    doc_type: str
    metadata: dict[str, Any] = field(default_factory=dict)
    last_updated: str | None = None
    status: str = "active"
    score: float = 0.0
    bm25_score: float | None = None
    vector_score: float | None = None
    bm25_rank: int | None = None
    vector_rank: int | None = None
    fused_rank: int | None = None
    relevance: float = 0.0
    rerank_score: float | None = None
    content_hash: str = ""
    ocr: bool = False
    ocr_confidence: float | None = None
    low_confidence_ocr: bool = False  # the passage overlaps a text line OCR read with low confidence
    needs_review: bool = False  # its document has such lines
    # the document model (knowledge_store/core/revisions.py, ingest/relations.py): the document's revision label,
    # when its version became valid / stopped being valid (ISO-8601 UTC; valid_to None while active), the newer
    # revision (another file) that superseded it, and the documents its relations name
    rev_label: str | None = None
    valid_from: str | None = None
    valid_to: str | None = None
    superseded_by: str | None = None
    supersedes: list[str] = field(default_factory=list)
    see_also: list[str] = field(default_factory=list)
    entities: list[EntityRef] = field(default_factory=list)
    entity_boost: float = 0.0
    row: int = -1  # position in the snapshot's arrays (internal)
    # (start, end, cosine with the query) of each embedded sentence of ``text`` (``retrieval.sentences``), attached
    # by the engine to the hits it answers from: the vector evidence of each answer sentence (internal)
    sentence_cosines: tuple[tuple[int, int, float], ...] = ()

    @property
    def pages(self) -> list[int]:
        if self.page_start is None:
            return []
        return list(range(self.page_start, (self.page_end or self.page_start) + 1))
