"""OCR of PDF pages without a text layer (knowledge_store.ingest.parsers.ocr, issue 6).

The scanned PDFs are made here: a text page drawn with PyMuPDF, rendered to a
pixmap and placed as the only content of a new page, so the test knows exactly
which words the image shows and that the page has no text layer.  Tests that
run Tesseract skip when the ``tesseract`` command is absent.

The parts that need no model, store or server are in tests/unit/test_ocr.py.
"""

from __future__ import annotations

import shutil
import time

import pymupdf
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import OcrTimeoutError
from knowledge_store.ingest.parsers import OcrOptions, parse_file
from knowledge_store.ingest.parsers.ocr import INSTALL_HINT
from knowledge_store.ingest.parsers.pdf import parse_pdf
from knowledge_store.ingest.run import run_sync
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.store import store_connection
from tests.helpers import MARKDOWN_FILLER, make_pdf

needs_tesseract = pytest.mark.skipif(
    shutil.which("tesseract") is None,
    reason="tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng; `make test` does it as root)",
)

@pytest.fixture()
def ocr_calls(monkeypatch) -> list[int]:
    """Page numbers (1-based) that PyMuPDF OCR'd, in order; the real OCR still runs."""
    calls: list[int] = []
    real = pymupdf.Page.get_textpage_ocr

    def spy(page, *args, **kwargs):
        calls.append(page.number + 1)
        return real(page, *args, **kwargs)

    monkeypatch.setattr(pymupdf.Page, "get_textpage_ocr", spy)
    return calls


def query(settings: Settings, sql: str, params: list | None = None) -> list[tuple]:
    with store_connection(settings.store_path) as conn:
        return conn.execute(sql, params or []).fetchall()


# --------------------------------------------------------------------------- parser


@needs_tesseract
def test_image_only_page_is_ocrd_into_words_with_a_confidence(tmp_path):
    parsed = parse_pdf(make_pdf(tmp_path / "scan.pdf", ["scanned"]))
    page = parsed.pages[0]
    assert page.has_text_layer is False and page.ocr is True
    for word in ("Quarterly", "exchanger", "inspected", "gasket", "winter"):
        assert word in page.text
    assert page.ocr_confidence is not None and 0 < page.ocr_confidence <= 1
    assert parsed.pages_without_text == []
    assert parsed.metadata["ocr_status"] == "done"
    assert parsed.metadata["pages_ocr"] == [1]
    assert parsed.metadata["ocr_mean_confidence"] == pytest.approx(page.ocr_confidence, abs=1e-4)
    assert parsed.metadata["ocr_seconds"] > 0
    # the OCR page goes through the same block extraction: the big first line is a heading
    assert parsed.blocks[0].kind == "heading" and parsed.blocks[0].text == "Quarterly Maintenance Report"
    assert all(block.kind != "code" for block in parsed.blocks)
    for block in parsed.blocks:
        assert page.text[block.char_start:block.char_end] == block.text


@needs_tesseract
def test_digital_pdf_is_never_ocrd(tmp_path, ocr_calls):
    parsed = parse_pdf(make_pdf(tmp_path / "digital.pdf", ["digital", "digital"]))
    assert ocr_calls == []
    assert all(page.has_text_layer and not page.ocr and page.ocr_confidence is None for page in parsed.pages)
    assert "ocr_status" not in parsed.metadata


@needs_tesseract
def test_mixed_pdf_ocrs_only_the_image_page(tmp_path, ocr_calls):
    parsed = parse_pdf(make_pdf(tmp_path / "mixed.pdf", ["digital", "scanned", "digital"]))
    assert ocr_calls == [2]
    assert [page.ocr for page in parsed.pages] == [False, True, False]
    assert parsed.pages[0].text.startswith("The digital page") and parsed.pages[0].ocr_confidence is None
    assert "gasket" in parsed.pages[1].text
    assert parsed.metadata["pages_ocr"] == [2]


@needs_tesseract
def test_confidence_is_none_not_invented_when_the_confidence_pass_is_off(tmp_path):
    parsed = parse_pdf(make_pdf(tmp_path / "scan.pdf", ["scanned"]), ocr=OcrOptions(confidence_pass=False))
    assert parsed.pages[0].ocr is True and "gasket" in parsed.pages[0].text
    assert parsed.pages[0].ocr_confidence is None
    assert parsed.metadata["ocr_mean_confidence"] is None


@needs_tesseract
def test_ocr_past_the_document_budget_raises_a_typed_error_naming_page_and_setting(tmp_path, monkeypatch):
    real = pymupdf.Page.get_textpage_ocr

    def slow(page, *args, **kwargs):
        result = real(page, *args, **kwargs)
        time.sleep(0.3)  # the first page alone uses up the 0.2 s budget
        return result

    monkeypatch.setattr(pymupdf.Page, "get_textpage_ocr", slow)
    path = make_pdf(tmp_path / "scan.pdf", ["scanned", "scanned", "scanned"])
    with pytest.raises(OcrTimeoutError) as caught:
        parse_file(path, ocr=OcrOptions(timeout_s=0.2, confidence_pass=False))
    error = caught.value
    assert error.kind == "ocr_timeout"
    assert (error.page_number, error.page_count, error.pages_done) == (2, 3, 1)
    assert "page 2 of 3" in error.reason and "0.2 s" in error.reason
    assert "GROUNDWORK_OCR_TIMEOUT_S" in error.reason


# --------------------------------------------------------------------------- pipeline


@pytest.mark.slow
@needs_tesseract
def test_scanned_page_text_is_found_by_search_and_cited_as_ocr(tmp_path, embedder):
    docs = tmp_path / "docs"
    docs.mkdir()
    make_pdf(docs / "maintenance.pdf", ["digital", "scanned"])
    (docs / "pumps.md").write_text("# Circulation pumps\n\nBleed the circulation pump through its vent screw after refilling.\n"
                                + MARKDOWN_FILLER)
    settings = Settings(data_dir=tmp_path / "data", sources=[docs])
    report = run_sync(settings, embedder)
    assert report.parse.failed == 0 and report.parse.pages_ocr == 1

    pages = query(settings, "SELECT page_number, has_text_layer, ocr, ocr_confidence FROM pages "
                            "JOIN documents USING (doc_id, version) WHERE path LIKE '%maintenance.pdf' ORDER BY page_number")
    assert [(n, h, o) for n, h, o, _ in pages] == [(1, True, False), (2, False, True)]
    assert pages[0][3] is None and 0 < pages[1][3] <= 1
    assert query(settings, "SELECT bool_or(ocr) FROM chunks WHERE source_path LIKE '%pumps.md'")[0][0] is False
    assert query(settings, "SELECT count(*) FROM ingestion_failures WHERE resolved_at IS NULL")[0][0] == 0

    engine = RetrievalEngine(settings, embedder=embedder)
    try:
        response = engine.search("when should the gasket be replaced before winter", k=2, log=False)
        top = response.results[0]
        assert 2 in top.pages and "gasket" in top.snippet.lower()
        assert top.ocr is True and 0 < top.ocr_confidence <= 1  # the chunk spans the OCR'd page
        assert top.ocr_confidence == pytest.approx(pages[1][3])
        assert response.to_dict()["results"][0]["ocr"] is True  # what the API returns
        digital = engine.search("bleed the circulation pump vent screw", k=1, log=False).results[0]
        assert digital.title == "Circulation pumps" and digital.ocr is False and digital.ocr_confidence is None
    finally:
        engine.query_log.close()


@pytest.mark.slow
@needs_tesseract
def test_ocr_timeout_fails_the_new_version_and_keeps_the_previous_one_searchable(tmp_path, embedder):
    docs = tmp_path / "docs"
    docs.mkdir()
    make_pdf(docs / "report.pdf", ["digital"])
    # a time-out is transient: one quick retry, not the shipped 10 + 60 + 300 s of waits
    settings = Settings(data_dir=tmp_path / "data", sources=[docs], ocr_timeout_s=0.01, ocr_confidence_pass=False,
                        ingest_retry_delays_s=[0.01])
    run_sync(settings, embedder)

    make_pdf(docs / "report.pdf", ["scanned", "scanned"])  # the file is replaced by a scan
    report = run_sync(settings, embedder)
    assert report.parse.failed == 1

    versions = query(settings, "SELECT version, status FROM documents ORDER BY version")
    assert versions == [(1, "active"), (2, "failed")]
    kind, reason = query(
        settings, "SELECT kind, reason FROM ingestion_failures WHERE resolved_at IS NULL AND stage = 'parse'"
    )[0]
    assert kind == "ocr_timeout"
    assert "page 2 of 2" in reason and "GROUNDWORK_OCR_TIMEOUT_S" in reason
    engine = RetrievalEngine(settings, embedder=embedder)
    try:
        hit = engine.search("boiler thermostat schedule", k=1, log=False).results[0]
        assert hit.version == 1 and hit.ocr is False
    finally:
        engine.query_log.close()


@pytest.mark.slow
def test_without_tesseract_scanned_pages_get_a_no_text_layer_row_with_install_hint(tmp_path, embedder, no_tesseract):
    docs = tmp_path / "docs"
    docs.mkdir()
    make_pdf(docs / "mixed.pdf", ["digital", "scanned"])
    settings = Settings(data_dir=tmp_path / "data", sources=[docs])
    report = run_sync(settings, embedder)
    assert report.parse.failed == 0 and report.parse.pages_without_text == 1 and report.parse.pages_ocr == 0

    kind, reason = query(settings, "SELECT kind, reason FROM ingestion_failures WHERE resolved_at IS NULL")[0]
    assert kind == "no_text_layer"
    assert reason.startswith("1 of 2 pages have no text layer (scanned?): pages 2; OCR is unavailable")
    assert INSTALL_HINT in reason
    assert query(settings, "SELECT bool_or(ocr) FROM chunks")[0][0] is False
    assert query(settings, "SELECT status FROM documents")[0][0] == "active"  # the digital page is indexed


def test_a_snapshot_published_before_ocr_loads_as_not_ocrd():
    import duckdb

    from knowledge_store.retrieval.snapshot_reader import _ocr_columns

    conn = duckdb.connect()
    conn.execute("CREATE TABLE chunks (chunk_id VARCHAR, text VARCHAR)")
    conn.execute("INSERT INTO chunks VALUES ('a', 'old text')")
    assert conn.execute(f"SELECT {_ocr_columns(conn)} FROM chunks").fetchall() == [(False, None)]
    conn.execute("ALTER TABLE chunks ADD COLUMN ocr BOOLEAN DEFAULT TRUE")
    conn.execute("ALTER TABLE chunks ADD COLUMN ocr_confidence DOUBLE DEFAULT 0.5")
    assert conn.execute(f"SELECT {_ocr_columns(conn)} FROM chunks").fetchall() == [(True, 0.5)]


@pytest.mark.slow
@needs_tesseract
def test_retrying_a_no_text_layer_failure_once_ocr_is_available_ocrs_that_version(tmp_path, embedder):
    from knowledge_store.ingest.source_actions import retry_failure

    docs = tmp_path / "docs"
    docs.mkdir()
    make_pdf(docs / "mixed.pdf", ["digital", "scanned"])
    without = Settings(data_dir=tmp_path / "data", sources=[docs], ocr_enabled=False)
    run_sync(without, embedder)
    (failure_id, kind), = query(without, "SELECT failure_id, kind FROM ingestion_failures WHERE resolved_at IS NULL")
    assert kind == "no_text_layer"

    outcome = retry_failure(without.model_copy(update={"ocr_enabled": True}), failure_id, embedder)
    assert outcome["resolved"], outcome
    assert query(without, "SELECT version, status FROM documents ORDER BY version") == [(1, "superseded"), (2, "active")]
    assert query(without, "SELECT bool_or(c.ocr) FROM chunks c JOIN documents d USING (doc_id, version) "
                          "WHERE d.status = 'active'")[0][0] is True
