"""Approximate (HNSW) vector search for large snapshots (issue 12): same results as exact search,
filters never come up short, the side-file cache is only trusted when it matches its snapshot.

The parts that need no model, store or server are in tests/unit/test_ann_index.py.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

# ------------------------------------------------------------------ through the engine

@pytest.fixture(scope="module")
def sample_settings(tmp_path_factory, embedder):
    from tests.helpers import build_sample_index

    return build_sample_index(tmp_path_factory.mktemp("ann-sample"), embedder)


@pytest.mark.slow
def test_engine_with_ann_answers_like_the_exact_engine(sample_settings, embedder):
    from knowledge_store.config.settings import Settings
    from knowledge_store.retrieval.engine import RetrievalEngine

    settings = sample_settings
    common = dict(data_dir=settings.data_dir, sources=settings.sources, candidate_pool=20, ann_ef_search=20)
    exact = RetrievalEngine(Settings(**common, ann_min_chunks=10**9), embedder=embedder)
    approximate = RetrievalEngine(Settings(**common, ann_min_chunks=1), embedder=embedder)
    snapshot = approximate.snapshots.current()
    assert snapshot.size > 40  # the graph is asked for 20 of them
    ann = approximate.snapshots.wait_for_ann(snapshot, 60)
    assert ann is not None and exact.snapshots.current().ann is None
    calls = []
    real_search = ann.search
    ann.search = lambda query, count: calls.append(count) or real_search(query, count)
    queries = ["how do I reset the Aurora to factory settings", "what does error E42 mean", "thermostat minimum cycle",
               "pairing the hub with wifi", "replace the battery"]
    filters = [None, {"paths": ["*.md"]}]
    for query in queries:
        for flt in filters:
            got = approximate.search(query, k=5, filters=flt, log=False)
            want = exact.search(query, k=5, filters=flt, log=False)
            assert [h.chunk_id for h in got.hits] == [h.chunk_id for h in want.hits]
            assert [h.score for h in got.hits] == pytest.approx([h.score for h in want.hits])
            assert [h.vector_score for h in got.hits] == pytest.approx([h.vector_score for h in want.hits])
    assert calls  # the graph answered (not a silent exact scan)
    # a filter that allows a single document still fills k from it
    doc = snapshot.documents[int(snapshot.doc_index[0])]
    in_doc = int(np.count_nonzero(snapshot.doc_index == snapshot.doc_index[0]))
    got = approximate.search("settings", k=5, filters={"doc_ids": [doc["doc_id"]]}, log=False, min_relevance=0.0)
    assert len(got.hits) == min(5, in_doc) and {h.doc_id for h in got.hits} == {doc["doc_id"]}
    for engine in (exact, approximate):
        engine.query_log.close()


@pytest.mark.slow
def test_large_snapshot_loads_in_the_background_while_the_old_one_answers(sample_settings, embedder, monkeypatch):
    import dataclasses
    import shutil

    import knowledge_store.retrieval.snapshot_reader as reader
    from knowledge_store.config.settings import Settings
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.storage.index import read_pointer, snapshot_file_name, write_pointer

    engine = RetrievalEngine(Settings(data_dir=sample_settings.data_dir, sources=sample_settings.sources,
                                      ann_min_chunks=1, ann_cache=False), embedder=embedder)
    engine.snapshots.check_interval_s = 0.0
    old = engine.snapshots.current()
    # publish a copy of the snapshot as the next version, and hold its load until released
    index_dir = sample_settings.index_dir
    info = read_pointer(index_dir)
    new_info = dataclasses.replace(info, snapshot_version=info.snapshot_version + 1,
                                   file=snapshot_file_name(info.snapshot_version + 1))
    shutil.copy(info.path(index_dir), new_info.path(index_dir))
    release = threading.Event()
    real_load = reader.load_snapshot

    def held_load(*args, **kwargs):
        release.wait(30)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(reader, "load_snapshot", held_load)
    write_pointer(index_dir, new_info)
    try:
        # while it loads, queries are answered from the old snapshot without waiting
        assert engine.snapshots.current() is old
        response = engine.search(RESET_QUERY, k=3, log=False)
        assert response.snapshot_version == info.snapshot_version and response.hits
        release.set()
        assert engine.snapshots.refresh().info.snapshot_version == new_info.snapshot_version  # refresh waits
        assert engine.search(RESET_QUERY, k=3, log=False).snapshot_version == new_info.snapshot_version
    finally:
        release.set()
        write_pointer(index_dir, info)
        engine.snapshots.refresh()
        new_info.path(index_dir).unlink(missing_ok=True)
        engine.query_log.close()


RESET_QUERY = "how do I reset the Aurora to factory settings"
