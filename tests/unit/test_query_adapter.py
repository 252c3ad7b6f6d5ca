"""The query adapter's parts that need no model, store or server: the map, learning it on synthetic
vectors, the held-out split, the stored file and the engine's cache of it.  On a real index, with
``groundwork adapt``, the Dagster asset and ``/api/knowledge/config``: tests/integration/test_tuning.py."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from knowledge_store.learning.adapter_training import RatedQuery, assign_folds, fit_adapter, fold_of
from knowledge_store.retrieval.query_adapter import (
    AdapterCache,
    QueryAdapter,
    QueryAdapterError,
    adapter_path,
    read_adapter,
    reset_adapter,
    save_adapter,
)


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def test_a_zero_matrix_leaves_vectors_as_they_are_and_output_is_unit_length() -> None:
    rng = np.random.default_rng(0)
    q = unit(rng.normal(size=(3, 8)))
    assert np.allclose(QueryAdapter(np.zeros((8, 8), np.float32)).apply(q), q, atol=1e-6)
    moved = QueryAdapter(rng.normal(size=(8, 8)).astype(np.float32)).apply(q)
    assert np.allclose(np.linalg.norm(moved, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(moved, q)


def test_a_vector_of_another_width_is_refused_with_both_widths() -> None:
    with pytest.raises(QueryAdapterError, match="5 dimensions, the adapter 8"):
        QueryAdapter(np.zeros((8, 8), np.float32)).apply(np.ones(5, np.float32))


def test_the_folds_are_stable_and_about_a_quarter_each() -> None:
    queries = [f"how do I configure thing {i}?" for i in range(2000)]
    folds = [fold_of(q) for q in queries]
    assert folds == [fold_of(q) for q in queries]
    assert all(0.2 < folds.count(f) / len(folds) < 0.3 for f in range(4))


def test_a_few_rated_queries_still_fill_every_fold() -> None:
    # four queries whose hashes share a fold would leave a fold with nothing to hold out
    rated = [RatedQuery(f"q{i}", np.zeros(4, np.float32), frozenset({i})) for i in range(200)]
    same = [r for r in rated if fold_of(r.query) == 0][:5]
    assert sorted(assign_folds(same).tolist()) == [0, 0, 1, 2, 3]
    many = rated[:40]
    assert assign_folds(many).tolist() == [fold_of(r.query) for r in many]  # the hash decides when it can


def synthetic_corpus(seed: int = 1, sections: int = 60, dim: int = 16):
    """Two chunks per section.  Users' queries are the section's vector seen through a fixed distortion
    (a rotation of most of the space plus noise): the plain nearest chunk is often wrong, the same
    distortion holds for every query - what a linear adapter can learn and carry to unseen queries."""
    rng = np.random.default_rng(seed)
    centres = unit(rng.normal(size=(sections, dim)))
    chunks = unit(np.repeat(centres, 2, axis=0) + 0.15 * rng.normal(size=(2 * sections, dim)))
    group = np.repeat(np.arange(sections), 2).astype(np.int32)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    distortion = (0.35 * np.eye(dim) + 0.65 * rotation).astype(np.float32)

    def asked(section: int) -> np.ndarray:
        return unit(centres[section] @ distortion + 0.05 * rng.normal(size=dim))

    snapshot = SimpleNamespace(embeddings=chunks, sections=SimpleNamespace(group=group))
    rated = [RatedQuery(f"q{s}-{k}", asked(s), frozenset({s})) for s in range(sections) for k in range(2)]
    return snapshot, rated, group


def first_hit_rate(snapshot, rated, group, adapter: QueryAdapter | None) -> float:
    hits = 0
    for r in rated:
        vector = r.vector if adapter is None else adapter.apply(r.vector)
        hits += int(group[np.argmax(snapshot.embeddings @ vector)] in r.targets)
    return hits / len(rated)


def test_the_adapter_learns_a_distortion_shared_by_queries_and_carries_it_to_unseen_ones() -> None:
    snapshot, rated, group = synthetic_corpus()
    train = [r for i, r in enumerate(rated) if i % 2 == 0]
    unseen = [r for i, r in enumerate(rated) if i % 2 == 1]  # the other question of each section
    before = first_hit_rate(snapshot, unseen, group, None)
    matrix = fit_adapter(snapshot, train, l2=0.001, steps=300, nearest=20)
    after = first_hit_rate(snapshot, unseen, group, QueryAdapter(matrix))
    assert before < 0.7  # the distortion really hurts plain search
    assert after >= before + 0.2, (before, after)


def test_a_strong_penalty_keeps_the_map_near_the_identity() -> None:
    snapshot, rated, _ = synthetic_corpus()
    loose = fit_adapter(snapshot, rated, l2=0.001, steps=100, nearest=20)
    tight = fit_adapter(snapshot, rated, l2=10.0, steps=100, nearest=20)
    assert np.linalg.norm(tight) < 0.2 * np.linalg.norm(loose)


def test_stored_adapter_round_trips_and_reset_removes_it(tmp_path) -> None:
    matrix = np.arange(16, dtype=np.float32).reshape(4, 4) / 100
    path = save_adapter(tmp_path, QueryAdapter(matrix, {"l2": 0.1, "rated_queries": 40}))
    assert path == adapter_path(tmp_path) and not list(tmp_path.glob("*.tmp-*"))
    loaded = read_adapter(path)
    assert np.array_equal(loaded.matrix, matrix) and loaded.info == {"l2": 0.1, "rated_queries": 40}
    assert reset_adapter(tmp_path) is True and not path.exists()
    assert reset_adapter(tmp_path) is False


@pytest.mark.parametrize("content", [b"not a numpy file", b""])
def test_a_damaged_file_is_a_typed_error_naming_the_file(tmp_path, content) -> None:
    adapter_path(tmp_path).write_bytes(content)
    with pytest.raises(QueryAdapterError, match="query_adapter.npz is not a readable query adapter"):
        read_adapter(adapter_path(tmp_path))


def test_a_non_square_or_non_finite_matrix_is_refused(tmp_path) -> None:
    save_adapter(tmp_path, QueryAdapter(np.zeros((3, 4), np.float32)))
    with pytest.raises(QueryAdapterError, match="not a square finite one"):
        read_adapter(adapter_path(tmp_path))
    save_adapter(tmp_path, QueryAdapter(np.full((4, 4), np.nan, np.float32)))
    with pytest.raises(QueryAdapterError, match="not a square finite one"):
        read_adapter(adapter_path(tmp_path))


def test_the_engine_cache_follows_the_file_and_ignores_a_damaged_or_mismatched_one(tmp_path, caplog) -> None:
    cache = AdapterCache(tmp_path, dim=4)
    assert cache.current() is None and cache.error is None
    save_adapter(tmp_path, QueryAdapter(np.eye(4, dtype=np.float32), {"l2": 0.1}))
    first = cache.current()
    assert first is not None and first.info == {"l2": 0.1}
    assert cache.current() is first  # unchanged file: not read again
    save_adapter(tmp_path, QueryAdapter(np.zeros((4, 4), np.float32), {"l2": 0.3}))
    os.utime(adapter_path(tmp_path), ns=(1, 1))  # a new file even within one mtime tick
    assert cache.current().info == {"l2": 0.3}
    save_adapter(tmp_path, QueryAdapter(np.eye(6, dtype=np.float32)))
    with caplog.at_level("WARNING"):
        assert cache.current() is None
    assert "6-dimensional" in cache.error and "query adapter ignored" in caplog.text
    adapter_path(tmp_path).write_bytes(b"garbage")
    assert cache.current() is None and "not a readable query adapter" in cache.error
    adapter_path(tmp_path).unlink()
    assert cache.current() is None and cache.error is None


def test_labels_are_read_as_query_document_pairs(tmp_path) -> None:
    from knowledge_store.learning.adapter_training import read_labels

    path = tmp_path / "labels.jsonl"
    path.write_text('{"query": " how do I flush emitters? ", "document": "greenhouse.md"}\n\n'
                    '{"query": "swarms", "document": "bees/primer.md", "note": "extra fields are fine"}\n')
    assert read_labels(path) == [{"query": "how do I flush emitters?", "document": "greenhouse.md", "line": 1},
                                 {"query": "swarms", "document": "bees/primer.md", "line": 3}]


@pytest.mark.parametrize("content, message", [
    ('{"query": "a", "document": "x.md"}\n{not json\n', r"labels.jsonl:2: not JSON"),
    ('{"query": "a"}\n', r"labels.jsonl:1: each line needs non-empty string fields"),
    ('{"query": "  ", "document": "x.md"}\n', r"labels.jsonl:1: each line needs"),
    ('["a", "x.md"]\n', r"labels.jsonl:1: each line needs"),
    ("\n\n", r"holds no labels"),
])
def test_a_bad_labels_file_is_refused_naming_its_line(tmp_path, content, message) -> None:
    from knowledge_store.learning.adapter_training import read_labels

    path = tmp_path / "labels.jsonl"
    path.write_text(content)
    with pytest.raises(QueryAdapterError, match=message):
        read_labels(path)


def test_a_missing_labels_file_is_a_typed_error(tmp_path) -> None:
    from knowledge_store.learning.adapter_training import read_labels

    with pytest.raises(QueryAdapterError, match="cannot read labels"):
        read_labels(tmp_path / "nope.jsonl")
