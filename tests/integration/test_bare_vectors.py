"""``bare_vector_weight`` through the real ingestion path: a change re-embeds every chunk on the next
sync under its own model id, the index switches to the blended vectors with the same rows, and
switching back reuses the cached vectors.  Quality is measured in docs/EVALUATION.md, never here."""

from __future__ import annotations

import numpy as np
import pytest

from knowledge_store.app.status import chunk_vector_status
from knowledge_store.cli import main as status_main
from knowledge_store.ingest.run import run_sync
from knowledge_store.models.embeddings import Embedder
from knowledge_store.retrieval.snapshot_reader import load_snapshot
from knowledge_store.storage.index import read_pointer
from knowledge_store.storage.store import store_connection
from tests.helpers import build_sample_index

pytestmark = pytest.mark.slow


def _snapshot_rows(settings) -> tuple[str, dict[str, np.ndarray]]:
    snapshot = load_snapshot(settings.index_dir)
    try:
        return snapshot.info.model_id, dict(zip(snapshot.chunk_ids, snapshot.embeddings.copy()))
    finally:
        snapshot.conn.close()


def test_changing_the_bare_share_re_embeds_once_and_switching_back_reuses_the_cache(tmp_path, embedder, model_path,
                                                                                   capsys, monkeypatch):
    settings = build_sample_index(tmp_path, embedder)
    plain_id, plain = _snapshot_rows(settings)
    with store_connection(settings.store_path, read_only=True) as conn:
        chunks = conn.execute("SELECT content_hash, embed_text, text FROM chunks c JOIN documents d "
                              "ON d.doc_id = c.doc_id AND d.version = c.version WHERE d.status = 'active'").fetchall()
        chunk_ids = [r[0] for r in conn.execute(
            "SELECT chunk_id FROM chunks c JOIN documents d ON d.doc_id = c.doc_id AND d.version = c.version "
            "WHERE d.status = 'active'").fetchall()]
    distinct = {h for h, _, _ in chunks}
    with_header = [(e, t) for _, e, t in chunks if e != t]
    assert with_header, "the sample corpus's chunks carry a title/section header"

    blended_settings = settings.model_copy(update={"bare_vector_weight": 0.5})
    pending = chunk_vector_status(blended_settings, settings.index_dir)  # set, not yet synced: still header vectors
    keys = ("model_id", "bare_vector_weight", "configured_bare_vector_weight", "re_embed_pending")
    assert {k: pending[k] for k in keys} == {"model_id": plain_id, "bare_vector_weight": 0.0,
                                             "configured_bare_vector_weight": 0.5, "re_embed_pending": True}
    assert pending["sentence_vectors"] is True  # the sentence vectors of the served index are a separate matter
    blend_embedder = Embedder(model_path, batch_size=32, torch_threads=2, bare_weight=0.5)
    report = run_sync(blended_settings, blend_embedder)
    assert report.embed.computed == len(distinct) and report.embed.model_id == plain_id + "+bare0.5"
    assert report.publish.snapshot_built and report.publish.chunk_count == len(chunk_ids)
    blend_id, blended = _snapshot_rows(settings)
    assert blend_id == plain_id + "+bare0.5" and read_pointer(settings.index_dir).model_id == blend_id
    assert sorted(blended) == sorted(plain) == sorted(chunk_ids)  # same rows: nothing duplicated or lost
    assert chunk_vector_status(blended_settings, settings.index_dir)["re_embed_pending"] is False
    monkeypatch.setenv("GROUNDWORK_BARE_VECTOR_WEIGHT", "0.5")
    assert status_main(["status", "--data-dir", str(settings.data_dir)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("chunk vectors:"))
    assert line == f"chunk vectors: {blend_id} (bare-text share 0.5)"  # served = configured: nothing pending
    monkeypatch.setenv("GROUNDWORK_BARE_VECTOR_WEIGHT", "0")
    assert status_main(["status", "--data-dir", str(settings.data_dir)]) == 0
    assert "GROUNDWORK_BARE_VECTOR_WEIGHT is 0: the next sync re-embeds every chunk" in capsys.readouterr().out
    monkeypatch.delenv("GROUNDWORK_BARE_VECTOR_WEIGHT")

    # each stored vector is the blend of the chunk with and without its header, made independently here
    with store_connection(settings.store_path, read_only=True) as conn:
        text_of = dict(conn.execute("SELECT chunk_id, embed_text FROM chunks").fetchall())
        bare_of = dict(conn.execute("SELECT chunk_id, text FROM chunks").fetchall())
    sample = [c for c in chunk_ids if text_of[c] != bare_of[c]][:5]
    header = embedder.embed([text_of[c] for c in sample])
    bare = embedder.embed([bare_of[c] for c in sample])
    expected = header + bare
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    got = np.stack([blended[c] for c in sample])
    assert np.abs(1 - (expected * got).sum(axis=1)).max() < 1e-4
    assert np.abs(1 - (header * got).sum(axis=1)).max() > 1e-3  # and it is not the header vector

    # back to header vectors: nothing embedded, the first vectors served again
    again = run_sync(settings, embedder)
    assert again.embed.computed == 0 and again.publish.chunk_count == len(chunk_ids)
    back_id, back = _snapshot_rows(settings)
    assert back_id == plain_id and sorted(back) == sorted(plain)
    assert max(float(np.abs(back[c] - plain[c]).max()) for c in plain) == 0.0
