"""Chunks of a real shared manual cite the page whose text PyMuPDF shows."""

from __future__ import annotations

import re
import shutil

import pymupdf
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.storage.index import open_snapshot

pytestmark = pytest.mark.slow


def normalise(text: str) -> str:
    text = text.replace("\ufb01", "fi").replace("\ufb02", "fl")
    return re.sub(r"[\s\-]+", "", text).lower()


@pytest.mark.parametrize("name", ["project-history.en.pdf"])
def test_every_chunk_cites_the_page_its_text_is_on(tmp_path, shared_pdfs, embedder, name):
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(shared_pdfs / name, docs / name)
    settings = Settings(data_dir=tmp_path / "data", sources=[docs])
    report = run_sync(settings, embedder)
    assert report.summary == "1 added, 0 updated, 0 removed, 0 unchanged, 0 excluded, 0 failed"

    pdf = pymupdf.open(shared_pdfs / name)
    page_texts = [normalise(page.get_text()) for page in pdf]
    conn, _ = open_snapshot(settings.index_dir)
    rows = conn.execute("SELECT page_start, page_end, text, url, section FROM chunks ORDER BY chunk_index").fetchall()
    conn.close()
    assert len(rows) > 20
    covered = {n for r in rows for n in range(r[0], r[1] + 1)}
    pages_with_text = {i + 1 for i, page in enumerate(pdf) if len(page.get_text().strip()) > 200}
    assert covered >= pages_with_text  # every page with real text is cited by some chunk
    checked = 0
    for page_start, page_end, text, url, _section in rows:
        assert url.endswith(f"#page={page_start}")
        assert 1 <= page_start <= page_end <= len(pdf)
        if page_start == page_end:
            head, tail = normalise(text)[:80], normalise(text)[-80:]
        else:  # blocks are joined by blank lines: the first is on page_start, the last on page_end
            blocks = [b for b in text.split("\n\n") if b.strip()]
            head, tail = normalise(blocks[0])[:80], normalise(blocks[-1])[-80:]
        assert head in page_texts[page_start - 1], (page_start, text[:120])
        assert tail in page_texts[page_end - 1], (page_end, text[-120:])
        if page_start == page_end:
            others = [i + 1 for i, t in enumerate(page_texts) if head in t and i + 1 != page_start]
            assert page_start not in others
        checked += 1
    assert checked == len(rows)
    sections = {r[4] for r in rows}
    assert len(sections) > 5  # the outline gives real section paths


def test_a_pasted_span_of_a_page_brings_that_page_first(tmp_path, shared_pdfs, embedder):
    """Known-item lookup (issue 10): 20 seeded 14-word spans, at least 19 rank their page first."""
    from knowledge_store.evaluation.known_item import evaluate_known_items, sample_spans
    from knowledge_store.evaluation.retrieval_eval import NullQueryLog
    from knowledge_store.retrieval.engine import RetrievalEngine

    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(shared_pdfs / "project-history.en.pdf", docs / "project-history.en.pdf")
    settings = Settings(data_dir=tmp_path / "data", sources=[docs])
    run_sync(settings, embedder)
    spans = sample_spans(settings, 20, words=14, seed=3)
    assert len(spans) == 20 and all(len(s.text.split()) == 14 for s in spans)
    with_phrases = evaluate_known_items(RetrievalEngine(settings, embedder=embedder, query_log=NullQueryLog()), spans)
    without = evaluate_known_items(
        RetrievalEngine(settings.model_copy(update={"phrase_boost": False}), embedder=embedder, query_log=NullQueryLog()), spans)
    assert with_phrases.first >= 19, with_phrases.misses
    assert with_phrases.first >= without.first
