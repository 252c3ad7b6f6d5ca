"""BEIR loading, corpus materialisation and ingestion into an evaluation store.

The parts that need no model, store or server are in tests/unit/test_beir.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from knowledge_store.evaluation.beir import beir_ids_by_doc_id, chunk_to_beir_id, ingest_beir, load_beir
from knowledge_store.storage.index import open_snapshot
from knowledge_store.storage.store import store_connection


@pytest.mark.slow
def test_ingest_beir_end_to_end(tiny_beir: Path, tmp_path: Path, embedder) -> None:
    data_root = tmp_path / "eval"
    settings, report = ingest_beir(tiny_beir, data_root, embedder=embedder)
    ds = load_beir(tiny_beir)
    root = data_root / ds.store_dir_name
    assert settings.data_dir == root / "store" and settings.source_dirs == [(root / "corpus").resolve()]
    assert report.raw.added == 5 and report.parse.failed == 0
    with store_connection(settings.store_path, read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM documents WHERE status = 'active'").fetchone()[0] == 5
    conn, info = open_snapshot(settings.index_dir)
    try:
        rows = conn.execute("SELECT doc_id, title, section, text, metadata FROM chunks").fetchall()
    finally:
        conn.close()
    assert info.document_count == 5
    by_beir: dict[str, list[str]] = {}
    for _doc_id, title, section, text, metadata in rows:
        beir_id = chunk_to_beir_id(metadata)
        assert title == ds.corpus[beir_id].title
        assert not section  # no headings: the title is only in the front matter
        by_beir.setdefault(beir_id, []).append(text)
    assert set(by_beir) == set(ds.corpus)
    for beir_id, texts in by_beir.items():
        assert " ".join(ds.corpus[beir_id].text.split()) in " ".join(" ".join(texts).split())
    assert set(beir_ids_by_doc_id(settings).values()) == set(ds.corpus)

    # a second run costs only hashes: nothing re-parsed, re-embedded or re-published
    _, again = ingest_beir(tiny_beir, data_root, embedder=embedder)
    assert again.raw.unchanged == 5 and again.raw.added == again.raw.updated == 0
    assert again.embed.computed == 0 and not again.publish.snapshot_built
