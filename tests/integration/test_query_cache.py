"""QueryEmbeddingCache: normalised keys, LRU, one model call per concurrent miss, errors shared, bulk untouched.

The parts that need no model, store or server are in tests/unit/test_query_cache.py.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_engine_embeds_a_repeated_query_once(tmp_path, embedder, shared_sample_index):
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.storage.query_log import QueryLog
    from tests.helpers import CountingEmbedder

    settings = shared_sample_index
    counting = CountingEmbedder(embedder)
    engine = RetrievalEngine(settings, embedder=counting, query_log=QueryLog(tmp_path / "log.duckdb"))
    first = engine.search("how do I reset the Aurora", k=3, log=False)
    second = engine.search("how do I  reset the Aurora ", k=3, log=False)
    assert counting.texts == ["how do I reset the Aurora"]
    assert [r.chunk_id for r in first.results] == [r.chunk_id for r in second.results]
    assert engine.embedder.stats()["hits"] == 1
