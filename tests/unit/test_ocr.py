"""OCR pieces that run no Tesseract: a missing Tesseract or language file is reported, word confidences
are averaged, a chunk's OCR mark (Tesseract itself and the pipeline: tests/integration/test_ocr.py)."""

from __future__ import annotations

import pytest

from knowledge_store.core.errors import NoTextError
from knowledge_store.ingest.chunk import ocr_marks
from knowledge_store.ingest.chunking import ChunkDraft
from knowledge_store.ingest.documents import Page
from knowledge_store.ingest.parsers import OcrOptions, parse_file
from knowledge_store.ingest.parsers.ocr import mean_word_confidence
from knowledge_store.ingest.parsers.pdf import parse_pdf
from tests.helpers import make_pdf


def test_without_tesseract_an_all_scanned_pdf_says_ocr_is_unavailable_and_how_to_install(tmp_path, no_tesseract):
    path = make_pdf(tmp_path / "scan.pdf", ["scanned"])
    with pytest.raises(NoTextError) as caught:
        parse_file(path)
    assert "OCR is unavailable: Tesseract is not installed" in caught.value.reason
    assert "apt-get install tesseract-ocr tesseract-ocr-eng" in caught.value.reason


def test_a_tessdata_dir_without_the_language_file_is_reported(tmp_path):
    empty = tmp_path / "tessdata"
    empty.mkdir()
    parsed = parse_pdf(make_pdf(tmp_path / "mixed.pdf", ["digital", "scanned"]), ocr=OcrOptions(tessdata_dir=empty))
    assert parsed.pages_without_text == [2]
    assert parsed.metadata["ocr_status"] == "unavailable"
    assert parsed.metadata["ocr_unavailable"] == f"OCR is unavailable: eng.traineddata not found in GROUNDWORK_TESSDATA_DIR={empty}"


# --------------------------------------------------------------------------- pieces


def test_mean_word_confidence_averages_word_rows_and_skips_non_words():
    header = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext"
    rows = [
        "1\t1\t0\t0\t0\t0\t0\t0\t100\t100\t-1\t",  # page row
        "4\t1\t1\t1\t1\t0\t5\t5\t90\t10\t-1\t",  # line row
        "5\t1\t1\t1\t1\t1\t5\t5\t20\t10\t96.5\tHeat",
        "5\t1\t1\t1\t1\t2\t30\t5\t20\t10\t83.5\texchanger",
        "5\t1\t1\t1\t1\t3\t60\t5\t20\t10\t95\t ",  # empty word
    ]
    assert mean_word_confidence("\n".join([header, *rows])) == (pytest.approx(0.9), 2)
    assert mean_word_confidence(header) == (None, 0)


def test_a_chunk_is_ocr_if_any_page_it_spans_was_at_its_least_sure_page():
    def draft(start: int, end: int) -> ChunkDraft:
        return ChunkDraft(0, "t", "t", start, end, 0, 1, (), None, 1)

    pages = [
        Page(1, "digital"),
        Page(2, "scan a", has_text_layer=False, ocr=True, ocr_confidence=0.91),
        Page(3, "scan b", has_text_layer=False, ocr=True, ocr_confidence=0.72),
        Page(4, "scan c", has_text_layer=False, ocr=True, ocr_confidence=None),
    ]
    assert ocr_marks(pages, draft(1, 1)) == (False, None)
    assert ocr_marks(pages, draft(1, 2)) == (True, 0.91)
    assert ocr_marks(pages, draft(2, 3)) == (True, 0.72)
    assert ocr_marks(pages, draft(3, 4)) == (True, None)  # the unknown page might be the least sure


def test_tsv_lines_under_the_threshold_are_low_confidence_regions():
    from knowledge_store.ingest.chunk import low_confidence_mark
    from knowledge_store.ingest.chunking import ChunkDraft
    from knowledge_store.ingest.parse import region_span
    from knowledge_store.ingest.parsers.ocr import read_tsv

    header = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext"
    rows = [
        "5\t1\t1\t1\t1\t1\t300\t300\t200\t40\t96\tPump", "5\t1\t1\t1\t1\t2\t520\t300\t300\t40\t94\tinspected",
        "5\t1\t2\t1\t1\t1\t300\t1200\t100\t30\t31\tgasprt", "5\t1\t2\t1\t1\t2\t420\t1200\t120\t30\t44\ttorqe",
        "5\t1\t2\t1\t1\t3\t560\t1200\t50\t30\t-1\t ",
    ]
    reading = read_tsv("\n".join([header, *rows]), dpi=300)
    assert len(reading.lines) == 2
    (low,) = reading.low(0.5)
    assert (low.text, low.words, low.confidence) == ("gasprt torqe", 2, 0.375)
    assert (low.x0, low.y0, low.x1, low.y1) == (72.0, 288.0, 129.6, 295.2)  # pixels at 300 dpi in points
    assert reading.low(0.3) == ()
    page_text = "Pump inspected\n\ngasprt torqe"
    assert region_span(page_text, low.text) == (16, 28) and region_span(page_text, "absent") is None

    def draft(start: int, end: int, page_start: int = 1, page_end: int = 1):
        fields = {name: None for name in ChunkDraft.__dataclass_fields__}
        fields.update(char_start=start, char_end=end, page_start=page_start, page_end=page_end)
        return ChunkDraft(**fields)

    assert low_confidence_mark({1: [(16, 28)]}, draft(0, 14)) is False
    assert low_confidence_mark({1: [(16, 28)]}, draft(10, 20)) is True
    assert low_confidence_mark({2: [(0, 5)]}, draft(10, 3, page_start=1, page_end=2)) is True
    assert low_confidence_mark({1: [(None, None)]}, draft(0, 5)) is True  # not located: the page is in doubt
