"""Stage 3: chunk parsed versions, then record the entities their chunks mention.

Works from the stored pages and blocks, not the file, so changing the chunk
settings re-chunks every document on the next sync without re-parsing
(``documents.chunker_signature`` records which settings made the chunks).
Entity mentions (``knowledge_store.ingest.entities``) are extracted last, for
new chunks and for every version when the entity patterns changed
(``documents.entity_signature``).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import dataclass, field

import pyarrow as pa

from knowledge_store.config.settings import Settings
from knowledge_store.core.progress import Sink, stage_progress
from knowledge_store.ingest.chunking import SECTION_SEPARATOR, ChunkDraft, ChunkingConfig, chunk_document
from knowledge_store.ingest.documents import Block, Page, ParsedDocument
from knowledge_store.ingest.entities import EntityResult, delete_mentions_of_chunks, extract_entities
from knowledge_store.ingest.failures import record_failure
from knowledge_store.ingest.sync_runs import add_counts
from knowledge_store.models.embeddings import TokenCounter
from knowledge_store.storage.store import store_connection, transaction, utcnow


@dataclass
class ChunkResult:
    documents: int = 0
    chunks: int = 0
    empty_documents: int = 0
    seconds: float = 0.0
    token_counts: list[int] = field(default_factory=list)
    preview: list[dict[str, object]] = field(default_factory=list)
    entities: EntityResult = field(default_factory=EntityResult)

    @property
    def token_stats(self) -> dict[str, float]:
        if not self.token_counts:
            return {"min": 0, "median": 0, "max": 0}
        return {
            "min": min(self.token_counts),
            "median": float(statistics.median(self.token_counts)),
            "max": max(self.token_counts),
        }


def chunking_config(settings: Settings) -> ChunkingConfig:
    return ChunkingConfig(
        size_tokens=settings.chunk_size_tokens,
        max_tokens=settings.chunk_max_tokens,
        overlap_tokens=settings.chunk_overlap_tokens,
        min_tokens=settings.chunk_min_tokens,
        header_max_tokens=settings.header_max_tokens,
    )


def chunk_id_for(doc_id: str, version: int, chunk_index: int, content_hash: str) -> str:
    """Stable id from content and position: re-running a sync reproduces it exactly."""
    return hashlib.sha256(f"{doc_id}|{version}|{chunk_index}|{content_hash}".encode()).hexdigest()[:32]


def load_parsed(conn, doc_id: str, version: int, title: str, doc_type: str, paginated: bool) -> ParsedDocument:
    pages = [
        Page(page_number=n, text=t, has_text_layer=h, ocr=bool(o), ocr_confidence=c)
        for n, t, h, o, c in conn.execute(
            "SELECT page_number, text, has_text_layer, ocr, ocr_confidence FROM pages "
            "WHERE doc_id = ? AND version = ? ORDER BY page_number",
            [doc_id, version],
        ).fetchall()
    ]
    blocks = [
        Block(kind=k, text=t, page_number=p, char_start=s, char_end=e, section_path=tuple(sp or ()), anchor=a, heading_level=h)
        for p, k, t, s, e, sp, a, h in conn.execute(
            "SELECT page_number, kind, text, char_start, char_end, section_path, anchor, heading_level "
            "FROM blocks WHERE doc_id = ? AND version = ? ORDER BY block_index",
            [doc_id, version],
        ).fetchall()
    ]
    return ParsedDocument(title=title or "", doc_type=doc_type or "", pages=pages, blocks=blocks, paginated=bool(paginated))


def ocr_marks(pages: list[Page], draft: ChunkDraft) -> tuple[bool, float | None]:
    """(ocr, confidence) of a chunk: OCR'd if any page it spans was, at the confidence of its
    least sure OCR'd page (a search hit is as trustworthy as its worst page); None when unknown."""
    spanned = [p for p in pages if p.ocr and draft.page_start <= p.page_number <= draft.page_end]
    if not spanned:
        return False, None
    known = [p.ocr_confidence for p in spanned if p.ocr_confidence is not None]
    return True, (min(known) if len(known) == len(spanned) else None)


RegionSpans = dict[int, list[tuple[int | None, int | None]]]  # page -> (start, end) of its low-confidence regions


def low_region_spans(conn, doc_id: str, version: int) -> RegionSpans:
    """The spans of one version's low-confidence OCR regions in their page texts, by page (None: not located)."""
    spans: RegionSpans = {}
    for page, start, end in conn.execute(
        "SELECT page_number, char_start, char_end FROM low_confidence_regions WHERE doc_id = ? AND version = ?",
        [doc_id, version],
    ).fetchall():
        spans.setdefault(page, []).append((start, end))
    return spans


def low_confidence_mark(spans: RegionSpans, draft: ChunkDraft) -> bool:
    """Whether a chunk overlaps a low-confidence OCR region: a located region overlapping its text on a page it
    spans, or a region of such a page that could not be located (the whole page is then in doubt)."""
    for page in range(draft.page_start, draft.page_end + 1):
        low = draft.char_start if page == draft.page_start else 0
        high = draft.char_end if page == draft.page_end else None
        for start, end in spans.get(page, ()):
            if start is None or end is None:
                return True
            if end > low and (high is None or start < high):
                return True
    return False


def _frame(doc: dict, drafts: list[ChunkDraft], pages: list[Page], spans: RegionSpans | None = None) -> pa.Table:
    now = utcnow()
    paginated = bool(doc["paginated"])
    n = len(drafts)
    marks = [ocr_marks(pages, d) for d in drafts]
    low = [low_confidence_mark(spans or {}, d) for d in drafts]
    return pa.table(
        {
            "chunk_id": [chunk_id_for(doc["doc_id"], doc["version"], d.chunk_index, d.content_hash) for d in drafts],
            "doc_id": [doc["doc_id"]] * n,
            "version": [doc["version"]] * n,
            "chunk_index": [d.chunk_index for d in drafts],
            "text": [d.text for d in drafts],
            "embed_text": [d.embed_text for d in drafts],
            "title": pa.array([doc["title"]] * n, type=pa.string()),
            "source_path": [doc["path"]] * n,
            "url": [_link(doc["url"], d, paginated) for d in drafts],
            "page_start": pa.array([d.page_start if paginated else None for d in drafts], type=pa.int32()),
            "page_end": pa.array([d.page_end if paginated else None for d in drafts], type=pa.int32()),
            "section_path": pa.array([list(d.section_path) for d in drafts], type=pa.list_(pa.string())),
            "anchor": pa.array([d.anchor for d in drafts], type=pa.string()),
            "char_start": [d.char_start for d in drafts],
            "char_end": [d.char_end for d in drafts],
            "token_count": [d.token_count for d in drafts],
            "content_hash": [d.content_hash for d in drafts],
            "block_kinds": pa.array([d.block_kinds for d in drafts], type=pa.list_(pa.string())),
            "created_at": pa.array([now] * n, type=pa.timestamp("us")),
            "ocr": [ocr for ocr, _ in marks],
            "ocr_confidence": pa.array([conf for _, conf in marks], type=pa.float64()),
            "low_confidence_ocr": low,
        }
    )


def _link(base_url: str, draft: ChunkDraft, paginated: bool) -> str:
    """The link a citation opens: the page for PDFs, the heading anchor otherwise."""
    if paginated:
        return f"{base_url}#page={draft.page_start}"
    if draft.anchor:
        return f"{base_url}#{draft.anchor}"
    return base_url


def chunk_parsed(settings: Settings, counter: TokenCounter, sync_run_id: str, progress: Sink | None = None) -> ChunkResult:
    """Chunk every parsed pending version, and re-chunk active ones made with other settings."""
    config = chunking_config(settings)
    signature = config.signature
    result = ChunkResult()
    started = time.perf_counter()
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        cursor = conn.execute(
            "SELECT doc_id, version, title, doc_type, paginated, path, url, source_id, checksum FROM documents "
            "WHERE status IN ('pending', 'active') AND parsed_at IS NOT NULL "
            "AND (chunker_signature IS NULL OR chunker_signature <> ?) ORDER BY path",
            [signature],
        )
        columns = [d[0] for d in cursor.description]
        todo = [dict(zip(columns, row)) for row in cursor.fetchall()]
        counts = stage_progress("chunk", "documents", progress).start(len(todo))
        for doc in todo:
            counts.advance()
            parsed = load_parsed(conn, doc["doc_id"], doc["version"], doc["title"], doc["doc_type"], doc["paginated"])
            drafts = chunk_document(parsed, counter, config)
            with transaction(conn):
                delete_mentions_of_chunks(conn, "doc_id = ? AND version = ?", [doc["doc_id"], doc["version"]])
                conn.execute("DELETE FROM chunks WHERE doc_id = ? AND version = ?", [doc["doc_id"], doc["version"]])
                if drafts:
                    frame = _frame(doc, drafts, parsed.pages, low_region_spans(conn, doc["doc_id"], doc["version"]))
                    conn.register("chunks_df", frame)
                    conn.execute(
                        "INSERT INTO chunks (chunk_id, doc_id, version, chunk_index, text, embed_text, title, "
                        "source_path, url, page_start, page_end, section_path, anchor, char_start, char_end, "
                        "token_count, content_hash, block_kinds, created_at, ocr, ocr_confidence, low_confidence_ocr) "
                        "SELECT chunk_id, doc_id, version, chunk_index, text, embed_text, title, "
                        "source_path, url, page_start, page_end, section_path::VARCHAR[], anchor, char_start, char_end, "
                        "token_count, content_hash, block_kinds::VARCHAR[], created_at, ocr, ocr_confidence, "
                        "low_confidence_ocr FROM chunks_df"
                    )
                    conn.unregister("chunks_df")
                else:
                    result.empty_documents += 1
                    record_failure(
                        conn, path=doc["path"], stage="chunk", kind="no_text",
                        reason="the document parsed but contains no indexable text",
                        sync_run_id=sync_run_id, source_id=doc["source_id"], doc_id=doc["doc_id"], checksum=doc["checksum"],
                    )
                conn.execute(  # new chunks: their entities are extracted below
                    "UPDATE documents SET chunker_signature = ?, entity_signature = NULL WHERE doc_id = ? AND version = ?",
                    [signature, doc["doc_id"], doc["version"]],
                )
            result.documents += 1
            result.chunks += len(drafts)
            result.token_counts.extend(d.token_count for d in drafts)
            for draft in drafts[:2]:
                if len(result.preview) < 10:
                    result.preview.append(
                        {"title": (doc["title"] or "")[:40], "section": SECTION_SEPARATOR.join(draft.section_path)[:50],
                         "pages": f"{draft.page_start}-{draft.page_end}" if doc["paginated"] else "",
                         "tokens": draft.token_count, "text": draft.text[:80].replace("\n", " ")}
                    )
        add_counts(conn, sync_run_id, chunks_created=result.chunks)
        counts.finish()
        result.entities = extract_entities(conn, settings.entity_vocabulary)
    result.seconds = time.perf_counter() - started
    return result
