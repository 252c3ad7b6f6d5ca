"""Citations: the numbered sources shown next to an answer.

``Citation`` / ``build_citation(s)`` turn ``SearchHit`` objects into the JSON
the API and CLI show next to an answer.  The snippet of each (which words of
the chunk support the answer, and their exact offsets) comes from
``retrieval.snippets.best_snippet``, which matches words through
``retrieval.terms``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from knowledge_store.core.entities import EntityRef
from knowledge_store.retrieval.snippets import best_snippet
from knowledge_store.retrieval.types import SearchHit


class Citation(BaseModel):
    """One numbered source shown with an answer: ``n`` is the marker ``[n]``."""

    n: int
    chunk_id: str
    doc_id: str
    version: int
    title: str
    section: str
    section_path: list[str] = Field(default_factory=list)
    pages: list[int] = Field(default_factory=list)
    page_start: int | None = None
    page_end: int | None = None
    url: str
    snippet: str
    snippet_start: int
    snippet_end: int
    score: float = 0.0
    bm25_score: float | None = None
    vector_score: float | None = None
    relevance: float = 0.0
    rerank_score: float | None = None
    last_updated: str | None = None
    doc_type: str = ""
    status: str = "active"
    ocr: bool = Field(False, description="The passage was read by OCR from a scanned page.")
    ocr_confidence: float | None = Field(
        None, description="Mean OCR word confidence (0-1) of the passage's least sure page; only set when ocr is true and known."
    )
    low_confidence_ocr: bool = Field(False, description="The passage overlaps a text line OCR read with a mean word "
                                     "confidence under GROUNDWORK_OCR_LOW_CONFIDENCE (0.5): check it against the scan.")
    needs_review: bool = Field(False, description="The cited document has low-confidence OCR regions "
                               "(documents.needs_review) a person should check.")
    # the document model's citation: {doc_id, title, rev_label, section, pages[], chunk_id, source_path} and validity
    source_path: str = Field("", description="The document model's name for url: where the original is, at the passage "
                             "(file:// link with #page=N or #anchor; the page URL for web sources).")
    rev_label: str | None = Field(None, description="The document's revision label (Rev C, v2.1) from its front matter, "
                                  "DOCX/PDF properties, file name or title; null when it has none.")
    valid_from: str | None = Field(None, description="When this version of the document became the valid one (ISO-8601 UTC).")
    valid_to: str | None = Field(None, description="When it stopped being valid (a newer version or revision replaced it, "
                                 "or it was deleted; ISO-8601 UTC); null while it is the valid one.")
    superseded_by: str | None = Field(None, description="doc_id of the newer revision (another file) that superseded "
                                      "this document; null when none did.")
    supersedes: list[str] = Field(default_factory=list, description="doc_ids of older revisions (other files) this "
                                  "document supersedes (relations rel_type supersedes).")
    see_also: list[str] = Field(default_factory=list, description="doc_ids of documents this document links to "
                                "(relations rel_type seeAlso).")
    entities: list[EntityRef] = Field(
        default_factory=list,
        description="Entities the passage mentions (asset, equipment, procedure, standard, ...), first mention first; "
        "each value works in filters.entities.",
    )
    entity_boost: float = Field(
        0.0, description="What the query naming an entity this passage mentions, or an identifier it holds (E47, ext4), added to score (0: none; settings entity_boost, identifier_boost)."
    )


def citation_url(hit: SearchHit) -> str:
    """``hit.url`` as stored (``#page=N`` for PDFs, ``#anchor`` for headings);
    a link without a fragment gets ``#page=N`` when the hit has a page."""
    url = hit.url or ""
    if url and "#" not in url and hit.page_start is not None:
        return f"{url}#page={hit.page_start}"
    return url


def build_citation(hit: SearchHit, query: str, n: int, max_snippet_chars: int = 150) -> Citation:
    snippet, start, end = best_snippet(hit.text, query, max_snippet_chars)
    return Citation(
        n=n,
        chunk_id=hit.chunk_id,
        doc_id=hit.doc_id,
        version=hit.version,
        title=hit.title,
        section=hit.section,
        section_path=list(hit.section_path),
        pages=hit.pages,
        page_start=hit.page_start,
        page_end=hit.page_end,
        url=citation_url(hit),
        snippet=snippet,
        snippet_start=start,
        snippet_end=end,
        score=hit.score,
        bm25_score=hit.bm25_score,
        vector_score=hit.vector_score,
        relevance=hit.relevance,
        rerank_score=hit.rerank_score,
        last_updated=hit.last_updated,
        doc_type=hit.doc_type,
        status=hit.status,
        ocr=hit.ocr,
        ocr_confidence=hit.ocr_confidence if hit.ocr else None,
        low_confidence_ocr=hit.low_confidence_ocr,
        needs_review=hit.needs_review,
        source_path=citation_url(hit),
        rev_label=hit.rev_label,
        valid_from=hit.valid_from,
        valid_to=hit.valid_to,
        superseded_by=hit.superseded_by,
        supersedes=list(hit.supersedes),
        see_also=list(hit.see_also),
        entities=list(hit.entities),
        entity_boost=hit.entity_boost,
    )


def build_citations(hits: Sequence[SearchHit], query: str, max_snippet_chars: int = 150) -> list[Citation]:
    """One citation per hit, numbered 1..len(hits) in rank order."""
    return [build_citation(hit, query, n, max_snippet_chars) for n, hit in enumerate(hits, start=1)]
