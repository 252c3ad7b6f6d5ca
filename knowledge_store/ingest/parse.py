"""Stage 2: parse pending document versions into pages and blocks.

A parse failure marks only that *version* failed and writes a failure row;
the previously active version (if any) stays in the index (an OCR time-out is
such a failure).  Pages without a text layer are OCR'd when Tesseract is
available (``pages.ocr``/``ocr_confidence`` mark them); those still without
text are stored (empty) and reported with a ``no_text_layer`` row saying why,
never silently dropped.  A transient failure (``ingest.retry``) is parsed again after
each wait of ``GROUNDWORK_INGEST_RETRY_DELAYS_S`` before it becomes a failure row.

Two kinds of document parse but are not indexed, each with a row saying why:

- a Markdown file of a folder source (or the uploads) with fewer words than ``min_markdown_words``
  (``too_short``: a warning, counted as *skipped*, not failed);
- an HTML page of a web source with ``render_js`` off that has fewer than ``web_js_min_words`` words of
  content but loads scripts (``needs_js_rendering``): its content is built by JavaScript, and indexing
  the empty shell would hide that; the reason says to turn ``render_js`` on for the source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import IngestionError, NeedsJsRenderingError, NoTextError, TooShortError
from knowledge_store.core.progress import Sink, stage_progress
from knowledge_store.core.revisions import revision_label
from knowledge_store.ingest.documents import ParsedDocument
from knowledge_store.ingest.failures import failure_id, record_failure, resolve_failures
from knowledge_store.ingest.parsers import OcrOptions, detect_type, parse_file
from knowledge_store.ingest.parsers.ocr import missing_text_reason
from knowledge_store.ingest.parsers.text import count_words
from knowledge_store.ingest.raw_documents import sha256_file
from knowledge_store.ingest.relations import write_links
from knowledge_store.ingest.retry import InputFacts, RetryPolicy, classify, redacted_traceback
from knowledge_store.ingest.sync_runs import add_counts, add_details
from knowledge_store.storage.store import store_connection, transaction, utcnow

log = logging.getLogger(__name__)


@dataclass
class ParseResult:
    parsed: int = 0
    failed: int = 0
    skipped_changed: int = 0
    pages: int = 0
    pages_without_text: int = 0
    pages_ocr: int = 0
    ocr_seconds: float = 0.0
    blocks: int = 0
    seconds: float = 0.0
    by_type: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, object]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # parsed but left out on purpose (too_short)
    preview: list[dict[str, object]] = field(default_factory=list)
    retried: int = 0  # versions whose first attempt failed transiently
    recovered: int = 0  # of them, parsed on a later attempt
    retry_attempts: int = 0  # attempts after the first, over every version
    retry_wait_s: float = 0.0  # time spent waiting between attempts

    @property
    def pages_per_minute(self) -> float:
        return 60.0 * self.pages / self.seconds if self.seconds else 0.0


def _json_safe(value: object) -> object:
    return json.loads(json.dumps(value, default=str))


def ocr_options(settings: Settings) -> OcrOptions:
    """The OCR knobs of ``Settings`` as the parser takes them (parsers never read Settings)."""
    return OcrOptions(
        enabled=settings.ocr_enabled,
        language=settings.ocr_language,
        dpi=settings.ocr_dpi,
        timeout_s=settings.ocr_timeout_s,
        tessdata_dir=settings.tessdata_dir,
        confidence_pass=settings.ocr_confidence_pass,
        low_confidence=settings.ocr_low_confidence,
    )


def write_parsed(conn, doc_id: str, version: int, parsed: ParsedDocument) -> None:
    """Replace the pages and blocks of one version (idempotent) and fill its document fields."""
    conn.execute("DELETE FROM pages WHERE doc_id = ? AND version = ?", [doc_id, version])
    conn.execute("DELETE FROM blocks WHERE doc_id = ? AND version = ?", [doc_id, version])
    n_pages = len(parsed.pages)
    pages = pa.table(
        {
            "doc_id": [doc_id] * n_pages,
            "version": [version] * n_pages,
            "page_number": [p.page_number for p in parsed.pages],
            "text": [p.text for p in parsed.pages],
            "has_text_layer": [p.has_text_layer for p in parsed.pages],
            "ocr": [p.ocr for p in parsed.pages],
            "ocr_confidence": pa.array([p.ocr_confidence for p in parsed.pages], type=pa.float64()),
            "ocr_regions": pa.array([p.ocr_lines for p in parsed.pages], type=pa.int32()),
            "low_confidence_regions": pa.array(
                [len(p.low_confidence_regions) if p.ocr_lines is not None else None for p in parsed.pages],
                type=pa.int32()),
        }
    )
    conn.register("pages_df", pages)
    conn.execute(
        "INSERT INTO pages (doc_id, version, page_number, text, has_text_layer, ocr, ocr_confidence, ocr_regions, "
        "low_confidence_regions) SELECT doc_id, version, page_number, text, has_text_layer, ocr, ocr_confidence, "
        "ocr_regions, low_confidence_regions FROM pages_df"
    )
    conn.unregister("pages_df")
    low_regions = write_low_confidence_regions(conn, doc_id, version, parsed)
    if parsed.blocks:
        n_blocks = len(parsed.blocks)
        blocks = pa.table(
            {
                "doc_id": [doc_id] * n_blocks,
                "version": [version] * n_blocks,
                "block_index": list(range(n_blocks)),
                "page_number": [b.page_number for b in parsed.blocks],
                "kind": [b.kind for b in parsed.blocks],
                "text": [b.text for b in parsed.blocks],
                "char_start": [b.char_start for b in parsed.blocks],
                "char_end": [b.char_end for b in parsed.blocks],
                "section_path": pa.array([list(b.section_path) for b in parsed.blocks], type=pa.list_(pa.string())),
                "anchor": pa.array([b.anchor for b in parsed.blocks], type=pa.string()),
                "heading_level": pa.array([b.heading_level for b in parsed.blocks], type=pa.int32()),
            }
        )
        conn.register("blocks_df", blocks)
        conn.execute(
            "INSERT INTO blocks SELECT doc_id, version, block_index, page_number, kind, text, char_start, char_end, "
            "section_path::VARCHAR[], anchor, heading_level FROM blocks_df"
        )
        conn.unregister("blocks_df")
    relative_path = conn.execute(
        "SELECT relative_path FROM documents WHERE doc_id = ? AND version = ?", [doc_id, version]).fetchone()
    label = revision_label(parsed.title, parsed.metadata, relative_path[0] if relative_path else "")
    conn.execute(
        "UPDATE documents SET title = ?, doc_type = ?, paginated = ?, page_count = ?, metadata = ?, parsed_at = ?, "
        "chunker_signature = NULL, rev_label = ?, rev_label_source = ?, low_confidence_regions = ?, needs_review = ? "
        "WHERE doc_id = ? AND version = ?",
        [parsed.title, parsed.doc_type, parsed.paginated, len(parsed.pages),
         json.dumps(_json_safe(parsed.metadata)), utcnow(), label.label if label else None,
         label.source if label else "none", low_regions, low_regions > 0, doc_id, version],
    )
    write_links(conn, doc_id, version, parsed.links)


@dataclass
class _Outcome:
    """One version's parse, as written: the document or the error of its last attempt, and the attempts made."""

    doc_id: str
    version: int
    label: str  # the path, or the page URL of a web page
    checksum: str
    source_id: str
    parsed: ParsedDocument | None = None
    error: IngestionError | None = None
    attempts: int = 1
    traceback: str | None = None
    input: InputFacts | None = None


def region_span(page_text: str, text: str) -> tuple[int, int] | None:
    """Where an OCR line's text is in the page text (the confidence pass and MuPDF's OCR read the same
    rendering, so they agree on nearly every line); None when it is not found there."""
    start = page_text.find(text) if text else -1
    return (start, start + len(text)) if start >= 0 else None


def write_low_confidence_regions(conn, doc_id: str, version: int, parsed: ParsedDocument) -> int:
    """Replace one version's low-confidence OCR regions (``low_confidence_regions`` table); returns how many.

    A region's id hashes its document, version, page and box; its span in the page text lets a chunk that
    overlaps it be flagged (``chunk.ocr_marks``)."""
    conn.execute("DELETE FROM low_confidence_regions WHERE doc_id = ? AND version = ?", [doc_id, version])
    rows = []
    for page in parsed.pages:
        for region in page.low_confidence_regions:
            box = f"{region.x0:.2f},{region.y0:.2f},{region.x1:.2f},{region.y1:.2f}"
            region_id = hashlib.sha256(f"{doc_id}|{version}|{page.page_number}|{box}".encode()).hexdigest()[:24]
            span = region_span(page.text, region.text)
            rows.append([doc_id, version, page.page_number, region_id, region.x0, region.y0, region.x1, region.y1,
                         region.confidence, region.words, region.text, span[0] if span else None,
                         span[1] if span else None])
    if rows:
        conn.executemany("INSERT OR REPLACE INTO low_confidence_regions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         rows)
    return len(rows)


def _store_outcome(conn, outcome: _Outcome, sync_run_id: str, result: ParseResult) -> None:
    doc_id, version, path, checksum, source_id = (outcome.doc_id, outcome.version, outcome.label, outcome.checksum,
                                                  outcome.source_id)
    parsed, error = outcome.parsed, outcome.error
    if error is not None:
        conn.execute(
            "UPDATE documents SET status = 'failed', parsed_at = ?, parse_attempts = ? WHERE doc_id = ? AND version = ?",
            [utcnow(), outcome.attempts, doc_id, version],
        )
        facts = outcome.input or InputFacts(None, None)
        record_failure(
            conn, path=path, stage="parse", kind=error.kind, reason=error.reason,
            sync_run_id=sync_run_id, source_id=source_id, doc_id=doc_id, checksum=checksum,
            attempts=outcome.attempts, failure_class=classify(error).value, traceback=outcome.traceback,
            input_size_bytes=facts.size_bytes, input_sha256=facts.sha256,
        )
        row = {"path": path, "kind": error.kind, "reason": error.reason}
        if isinstance(error, TooShortError):
            result.skipped.append(row)
            return
        add_counts(conn, sync_run_id, failed=1)
        result.failed += 1
        result.failures.append({**row, "attempts": outcome.attempts, "failure_class": classify(error).value})
        return
    assert parsed is not None
    write_parsed(conn, doc_id, version, parsed)
    conn.execute("UPDATE documents SET parse_attempts = ? WHERE doc_id = ? AND version = ?",
                 [outcome.attempts, doc_id, version])
    if outcome.attempts > 1:
        result.recovered += 1
    missing = parsed.pages_without_text
    keep: set[str] = set()
    if missing:
        reason = missing_text_reason(missing, len(parsed.pages), parsed.metadata)
        record_failure(
            conn, path=path, stage="parse", kind="no_text_layer", reason=reason,
            sync_run_id=sync_run_id, source_id=source_id, doc_id=doc_id, checksum=checksum,
        )
        keep.add(failure_id(path, "parse", "no_text_layer", checksum))
    resolve_failures(conn, path, keep_ids=keep)
    add_counts(conn, sync_run_id, pages_parsed=len(parsed.pages))
    result.parsed += 1
    result.pages += len(parsed.pages)
    result.pages_without_text += len(missing)
    result.pages_ocr += sum(1 for page in parsed.pages if page.ocr)
    result.ocr_seconds += float(parsed.metadata.get("ocr_seconds") or 0.0)
    result.blocks += len(parsed.blocks)
    result.by_type[parsed.doc_type] = result.by_type.get(parsed.doc_type, 0) + 1
    if len(result.preview) < 10:
        result.preview.append(
            {"title": parsed.title[:60], "type": parsed.doc_type, "pages": len(parsed.pages),
             "blocks": len(parsed.blocks), "path": Path(path).name}
        )


def parse_pending(settings: Settings, sync_run_id: str, batch_size: int = 64, batch_seconds: float = 2.0,
                  progress: Sink | None = None, retry: RetryPolicy | None = None) -> ParseResult:
    """Parse every pending version that has no pages yet.

    Parsing happens with the store closed; results are written in short
    transactions of up to ``batch_size`` documents (or ``batch_seconds`` of
    work), so a kill loses at most one batch and readers rarely wait.

    A version whose parse fails transiently (``retry.classify``: an I/O error, an OCR time-out) is tried again
    after each wait of ``retry`` (default ``GROUNDWORK_INGEST_RETRY_DELAYS_S``), in rounds: every version that
    failed transiently in a round waits the round's delay together, so a stage waits at most the sum of the
    delays however many files fail.  A permanent failure, or a transient one after the last wait, is written
    with its attempts, class, redacted traceback and input size/sha256.
    """
    result = ParseResult()
    started = time.perf_counter()
    ocr = ocr_options(settings)
    policy = retry or RetryPolicy.from_settings(settings)
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        todo = conn.execute(
            # failures of web pages are reported under the page URL, not the cache file
            "SELECT doc_id, version, path, checksum, source_id, "
            "CASE WHEN url LIKE 'http%' THEN url ELSE path END AS label, size_bytes FROM documents "
            "WHERE status = 'pending' AND parsed_at IS NULL ORDER BY path"
        ).fetchall()
        # web sources reading pages as served (render_js off): name -> checked for script-built pages
        unrendered = dict(conn.execute(
            "SELECT source_id, name FROM sources WHERE kind = 'web' "
            "AND NOT coalesce(TRY_CAST(json_extract(config, '$.render_js') AS BOOLEAN), FALSE)"
        ).fetchall())
    buffer: list[_Outcome] = []
    last_flush = time.perf_counter()
    counts = stage_progress("parse", "documents", progress).start(len(todo))

    def flush() -> None:
        nonlocal buffer, last_flush
        if buffer:
            with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn, transaction(conn):
                for outcome in buffer:
                    _store_outcome(conn, outcome, sync_run_id, result)
        buffer = []
        last_flush = time.perf_counter()

    def attempt(row: tuple, attempts: int) -> _Outcome | None:
        """One parse of one version; None when the file changed or vanished meanwhile (the next sync sees it)."""
        doc_id, version, path, checksum, source_id, label, size_bytes = row
        outcome = _Outcome(doc_id, version, label, checksum, source_id, attempts=attempts)
        try:
            no_text: NoTextError | None = None
            try:
                outcome.parsed = parse_file(Path(path), max_bytes=settings.max_file_bytes, ocr=ocr)
            except NoTextError as exc:
                if source_id not in unrendered:
                    raise
                no_text = exc  # unless the page is a script-built one (needs_js_rendering)
            if sha256_file(Path(path)) != checksum:
                result.skipped_changed += 1  # changed while we read it: the next sync records the new bytes
                return None
            left_out = _left_out(settings, Path(path), label, outcome.parsed, unrendered.get(source_id)) or no_text
            if left_out is not None:
                outcome.parsed = None
                raise left_out
        except IngestionError as exc:
            outcome.parsed = None
            outcome.error = exc
            outcome.traceback = redacted_traceback(exc)
            facts = InputFacts.of_file(path)
            outcome.input = facts if facts.sha256 else InputFacts(size_bytes, checksum)  # unreadable: as recorded
        except FileNotFoundError:
            result.skipped_changed += 1
            return None
        return outcome

    def keep(outcome: _Outcome) -> None:
        buffer.append(outcome)
        if len(buffer) >= batch_size or time.perf_counter() - last_flush > batch_seconds:
            flush()

    again: list[tuple] = []
    for row in todo:
        counts.advance()
        outcome = attempt(row, 1)
        if outcome is None:
            continue
        if outcome.error is not None and outcome.error.transient and policy.delays:
            again.append(row)
            result.retried += 1
            continue
        keep(outcome)
    for number, delay in enumerate(policy.delays, start=2):
        if not again:
            break
        flush()  # what is done is written before the wait
        log.info("parse: %d version(s) failed transiently; attempt %d of %d in %g s", len(again), number,
                 policy.max_attempts, delay)
        policy.sleep(delay)
        result.retry_wait_s += delay
        rows, again = again, []
        for row in rows:
            outcome = attempt(row, number)
            result.retry_attempts += 1
            if outcome is None:
                continue
            if outcome.error is not None and outcome.error.transient and number < policy.max_attempts:
                again.append(row)
                continue
            keep(outcome)
    flush()
    if result.skipped:
        kinds: dict[str, int] = {}
        for row in result.skipped:
            kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
        with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
            add_details(conn, sync_run_id, "skipped", kinds)
    counts.finish()
    result.seconds = time.perf_counter() - started
    return result


def _content_words(parsed: ParsedDocument | None) -> int:
    return sum(count_words(block.text) for block in parsed.blocks) if parsed is not None else 0


def _loads_scripts(path: Path) -> bool:
    with open(path, "rb") as handle:
        return b"<script" in handle.read(4 * 1024 * 1024).lower()


def _left_out(settings: Settings, path: Path, label: str, parsed: ParsedDocument | None,
              unrendered_source: str | None) -> IngestionError | None:
    """Why a document that parsed (or, for a web page read as served, had no text) must not be indexed:
    a Markdown stub (``too_short``) or a page built by JavaScript (``needs_js_rendering``); None to index it."""
    if unrendered_source is not None:
        if settings.web_js_min_words and (parsed.doc_type if parsed is not None else detect_type(path)) == "html":
            words = _content_words(parsed)
            if words < settings.web_js_min_words and _loads_scripts(path):
                return NeedsJsRenderingError(label, words, unrendered_source)
        return None
    if parsed is not None and parsed.doc_type == "markdown" and settings.min_markdown_words \
            and not label.startswith(("http://", "https://")):
        words = _content_words(parsed)
        if words < settings.min_markdown_words:
            return TooShortError(label, words, settings.min_markdown_words)
    return None
