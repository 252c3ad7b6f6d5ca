"""Sentence vectors through the real pipeline: stored once per chunk text, carried by the snapshot, kept in step
with the chunks on re-sync, switched on for an existing store by the next sync, and off when asked."""

from __future__ import annotations

from knowledge_store.app.status import chunk_vector_status
from knowledge_store.core.text import sentences_to_embed
from knowledge_store.ingest.run import run_sync
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.retrieval.snapshot_reader import load_snapshot
from knowledge_store.storage.index import read_pointer
from knowledge_store.storage.store import store_connection
from tests.helpers import build_sample_index


def _expected_rows(settings) -> tuple[int, int]:
    """(sentences, chunk texts) the indexed chunk texts should have: sentences_to_embed of each distinct text."""
    with store_connection(settings.store_path, read_only=True) as conn:
        texts = conn.execute(
            "SELECT c.content_hash, any_value(c.text) FROM chunks c JOIN documents d ON d.doc_id = c.doc_id "
            "AND d.version = c.version WHERE d.status IN ('active', 'superseded') GROUP BY c.content_hash").fetchall()
    return sum(len(sentences_to_embed(t)) for _, t in texts), len(texts)


def _stored(settings) -> tuple[int, int, int]:
    with store_connection(settings.store_path, read_only=True) as conn:
        rows, texts = conn.execute("SELECT count(*), count(DISTINCT content_hash) FROM sentence_embeddings").fetchone()
        gaps = conn.execute(  # every text's ordinals are 0..n-1: all of its sentences or none
            "SELECT count(*) FROM (SELECT content_hash, max(ordinal) + 1 AS n, count(*) AS c FROM sentence_embeddings "
            "GROUP BY content_hash) WHERE n <> c").fetchone()[0]
    return rows, texts, gaps


def test_every_chunk_text_has_its_sentences_in_the_store_and_the_snapshot_and_a_resync_adds_none(tmp_path, embedder):
    settings = build_sample_index(tmp_path, embedder)
    sentences, texts = _expected_rows(settings)
    assert _stored(settings) == (sentences, texts, 0) and sentences > texts
    pointer = read_pointer(settings.index_dir)
    assert pointer.fingerprint.endswith(":sentences")
    snapshot = load_snapshot(settings.index_dir)
    try:
        assert snapshot.sentence_index is not None and snapshot.sentence_index.count == sentences
        assert all(snapshot.sentence_index.end > snapshot.sentence_index.start)
        # loaded, the snapshot lets DuckDB keep no more than a serving connection needs of the pages it read
        limit = snapshot.conn.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        assert limit == "488.2 MiB", limit  # SERVING_MEMORY_LIMIT, 512MB, as DuckDB prints it
        assert snapshot.neighbours(snapshot.chunk_ids[0])  # and still answers what it is asked later
    finally:
        snapshot.close()

    again = run_sync(settings, embedder)
    assert again.embed.sentence_texts == 0 and not again.publish.snapshot_built  # nothing new, nothing rebuilt
    assert _stored(settings) == (sentences, texts, 0)

    # an edited document: its new chunk texts get their sentences, the snapshot carries exactly the served ones
    doc = next((tmp_path / "docs").glob("*.md"))
    doc.write_text(doc.read_text() + "\n\n## Added section\n\nA new paragraph. It has two sentences about descaling.\n")
    edited = run_sync(settings, embedder)
    assert edited.embed.sentence_texts >= 1 and edited.publish.snapshot_built and edited.publish.sentence_vectors
    snapshot = load_snapshot(settings.index_dir)
    try:
        assert snapshot.sentence_index.count == _expected_rows(settings)[0]
    finally:
        snapshot.close()


def test_sentence_vectors_off_then_on_for_an_existing_store(tmp_path, embedder):
    off = build_sample_index(tmp_path, embedder, sentence_vectors=False)
    assert _stored(off)[0] == 0 and not read_pointer(off.index_dir).fingerprint.endswith(":sentences")
    engine = RetrievalEngine(off, embedder=embedder)
    assert engine.snapshots.current().sentence_index is None
    response = engine.search("how do I reset the Aurora to factory settings", k=3, log=False)
    assert response.hits  # no sentence vectors: the evidence is skipped, search is unchanged otherwise
    assert chunk_vector_status(off, off.index_dir)["sentence_vectors"] is False

    on = off.model_copy(update={"sentence_vectors": True})
    status = chunk_vector_status(on, on.index_dir)
    assert status["sentence_vectors_pending"] and not status["sentence_evidence"]
    report = run_sync(on, embedder)  # no file changed: the sync embeds the sentences and republishes
    sentences, texts = _expected_rows(on)
    assert report.embed.sentence_texts == texts and report.embed.sentences == sentences
    assert report.publish.snapshot_built and report.publish.sentence_vectors
    assert _stored(on) == (sentences, texts, 0)
    status = chunk_vector_status(on, on.index_dir)
    assert status["sentence_vectors"] and status["sentence_evidence"] and not status["sentence_vectors_pending"]
    engine = RetrievalEngine(on, embedder=embedder)
    assert engine.snapshots.current().sentence_index.count == sentences
