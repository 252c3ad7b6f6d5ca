"""Approximate (HNSW) vector search (issue 12) on synthetic vectors: the same results as exact search, filters
never come up short, the side-file cache is only trusted when it matches its snapshot."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from knowledge_store.retrieval.ann import (
    AnnConfig,
    approximate_semantic_evidence,
    build_index,
    obtain,
    remove_orphans,
    side_paths,
)
from knowledge_store.retrieval.fusion import top_rows
from knowledge_store.retrieval.snapshot_reader import SectionIndex, SnapshotManager

DIM = 32


def clustered(n: int, seed: int = 0, centres: int = 40) -> np.ndarray:
    """Unit vectors around ``centres`` random directions (like chunks of related documents)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((centres, DIM)).astype(np.float32)
    rows = base[rng.integers(0, centres, n)] + 0.35 * rng.standard_normal((n, DIM)).astype(np.float32)
    return np.ascontiguousarray(rows / np.linalg.norm(rows, axis=1, keepdims=True), dtype=np.float32)


def fake_snapshot(embeddings: np.ndarray, config: AnnConfig, sections: SectionIndex | None = None):
    ann = build_index(embeddings, config)
    return SimpleNamespace(embeddings=embeddings, sections=sections, size=len(embeddings), ann=ann)


def exact_top(embeddings: np.ndarray, query: np.ndarray, mask: np.ndarray | None, k: int) -> list[int]:
    return top_rows(embeddings @ query, mask, k).tolist()


def approximate_top(snapshot, query: np.ndarray, mask: np.ndarray | None, k: int, pool: int, config: AnnConfig):
    partial = approximate_semantic_evidence(snapshot, snapshot.ann, query, mask, pool, config)
    partial.complete(pool, 0.0)
    return top_rows(partial.chunk, mask, k, candidates=partial.scored_rows).tolist(), partial


# ------------------------------------------------------------------ same results as exact

def test_ann_top_ten_equals_exact_top_ten_on_a_small_set():
    embeddings = clustered(3000)
    config = AnnConfig(min_chunks=1)  # the default beam (ef_search 512): the graph returns 512 of 3,000 rows
    snapshot = fake_snapshot(embeddings, config)
    queries = clustered(25, seed=1)
    for query in queries:
        got, partial = approximate_top(snapshot, query, None, 10, pool=100, config=config)
        assert partial.mode.startswith("ann") and partial.scored.sum() < len(embeddings)  # the graph was used, not a scan
        assert got == exact_top(embeddings, query, None, 10)
        # scored rows carry their exact cosine, every other row the sentinel
        rows = np.flatnonzero(partial.scored)
        assert np.allclose(partial.chunk[rows], embeddings[rows] @ query)


def test_section_lead_evidence_is_exact_for_every_scored_row():
    embeddings = clustered(2000)
    group = np.repeat(np.arange(400, dtype=np.int32), 5)  # sections of 5 consecutive rows
    sections = SimpleNamespace(group=group, lead_row=np.arange(0, 2000, 5, dtype=np.int64))
    config = AnnConfig(min_chunks=1)
    snapshot = fake_snapshot(embeddings, config, sections)
    query = clustered(1, seed=3)[0]
    partial = approximate_semantic_evidence(snapshot, snapshot.ann, query, None, 20, config)
    rows = np.flatnonzero(partial.scored)
    assert len(rows) % 5 == 0  # whole sections
    exact = embeddings @ query
    assert np.allclose(partial.lead[rows], exact[sections.lead_row[group[rows]]])


# ------------------------------------------------------------------ filters

def test_filter_far_from_the_query_still_returns_k_results():
    embeddings = clustered(4000, centres=8)
    config = AnnConfig(min_chunks=100, ef_search=32)
    snapshot = fake_snapshot(embeddings, config)
    query = embeddings[0]
    # allow only the 20% of rows least similar to the query: the graph's neighbours are all filtered out
    order = np.argsort(embeddings @ query)
    mask = np.zeros(len(embeddings), dtype=bool)
    mask[order[:800]] = True
    got, partial = approximate_top(snapshot, query, mask, 10, pool=50, config=config)
    assert partial.mode in ("ann-widened", "exact-fallback")  # the first candidates were all filtered out
    assert len(got) == 10 and got == exact_top(embeddings, query, mask, 10)


def test_small_filter_is_searched_exactly_and_partial_filter_through_the_graph():
    embeddings = clustered(4000)
    config = AnnConfig(min_chunks=1000, ef_search=64)
    snapshot = fake_snapshot(embeddings, config)
    rng = np.random.default_rng(5)
    small = rng.random(len(embeddings)) < 0.05  # ~200 rows < min_chunks: exact over them
    half = rng.random(len(embeddings)) < 0.5  # ~2000 rows: the graph, asked for ~2x the candidates
    for query in clustered(10, seed=2):
        got, partial = approximate_top(snapshot, query, small, 10, pool=50, config=config)
        assert partial.mode == "exact-masked" and got == exact_top(embeddings, query, small, 10)
        got, partial = approximate_top(snapshot, query, half, 10, pool=50, config=config)
        assert partial.mode in ("ann", "ann-widened", "exact-fallback")
        assert got == exact_top(embeddings, query, half, 10)


def test_filter_allowing_fewer_than_k_rows_returns_all_of_them():
    embeddings = clustered(3000)
    config = AnnConfig(min_chunks=1)
    snapshot = fake_snapshot(embeddings, config)
    mask = np.zeros(len(embeddings), dtype=bool)
    mask[[7, 700, 2999]] = True
    got, _ = approximate_top(snapshot, embeddings[5], mask, 10, pool=50, config=config)
    assert sorted(got) == [7, 700, 2999]


# ------------------------------------------------------------------ side-file cache

@pytest.fixture()
def snapshot_file(tmp_path: Path) -> Path:
    path = tmp_path / "snapshot-000001.duckdb"
    path.write_bytes(b"immutable snapshot stand-in")
    return path


def info(version: int = 1):
    return SimpleNamespace(snapshot_version=version, fingerprint=f"fp{version}")


def test_side_file_is_written_then_reused(snapshot_file: Path):
    embeddings = clustered(1500)
    config = AnnConfig(min_chunks=1)
    first = obtain(snapshot_file, info(), embeddings, config)
    index_path, meta_path = side_paths(snapshot_file, config)
    assert first.origin == "built" and index_path.exists() and meta_path.exists()
    assert not [p for p in snapshot_file.parent.iterdir() if ".tmp-" in p.name]  # temporaries renamed away
    second = obtain(snapshot_file, info(), embeddings, config)
    assert second.origin == "cache"
    query = embeddings[3]
    assert second.search(query, 10).tolist() == first.search(query, 10).tolist()


@pytest.mark.parametrize("damage", ["flip index bytes", "truncate index", "garbage metadata", "other vectors",
                                    "snapshot changed", "other snapshot version", "metadata missing"])
def test_stale_or_corrupt_side_file_is_rebuilt(snapshot_file: Path, damage: str):
    embeddings = clustered(1500)
    config = AnnConfig(min_chunks=1)
    obtain(snapshot_file, info(), embeddings, config)
    index_path, meta_path = side_paths(snapshot_file, config)
    version = 1
    if damage == "flip index bytes":
        data = bytearray(index_path.read_bytes())
        data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
        index_path.write_bytes(bytes(data))
    elif damage == "truncate index":
        index_path.write_bytes(index_path.read_bytes()[:4096])
    elif damage == "garbage metadata":
        meta_path.write_text("{not json")
    elif damage == "other vectors":
        embeddings = clustered(1500, seed=9)
    elif damage == "snapshot changed":
        snapshot_file.write_bytes(b"a different file under the same name")
    elif damage == "other snapshot version":
        version = 2
    elif damage == "metadata missing":
        meta_path.unlink()
    rebuilt = obtain(snapshot_file, info(version), embeddings, config)
    assert rebuilt.origin == "built"
    # the rebuilt graph replaced the damaged side file and is trusted next time
    assert obtain(snapshot_file, info(version), embeddings, config).origin == "cache"
    assert json.loads(meta_path.read_text())["rows"] == len(embeddings)


def test_side_files_of_retired_snapshots_are_removed(snapshot_file: Path):
    embeddings = clustered(500)
    config = AnnConfig(min_chunks=1)
    obtain(snapshot_file, info(), embeddings, config)
    index_path, meta_path = side_paths(snapshot_file, config)
    snapshot_file.unlink()
    removed = remove_orphans(snapshot_file.parent)
    assert sorted(removed) == sorted([index_path.name, meta_path.name])
    assert not index_path.exists() and not meta_path.exists()


def test_cache_that_cannot_be_written_still_gives_an_index(snapshot_file: Path, monkeypatch):
    import knowledge_store.retrieval.ann as ann_module

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ann_module.os, "replace", full_disk)
    ann = obtain(snapshot_file, info(), clustered(500), AnnConfig(min_chunks=1))
    assert ann.origin == "built"
    assert not list(snapshot_file.parent.glob("*.ann-*")) and not list(snapshot_file.parent.glob(".*.ann-*"))


# ------------------------------------------------------------------ serving while building

def test_snapshot_is_served_exactly_until_its_index_is_ready(snapshot_file: Path, monkeypatch):
    embeddings = clustered(1000)
    gate = threading.Event()
    snapshot = SimpleNamespace(size=len(embeddings), path=snapshot_file, info=info(), embeddings=embeddings, ann=None,
                               ann_ready=threading.Event(), ann_cancel=threading.Event(), ann_error=None)
    manager = SnapshotManager(snapshot_file.parent, ann=AnnConfig(min_chunks=1, cache=False))

    import knowledge_store.retrieval.ann as ann_module

    real_obtain = ann_module.obtain

    def slow_obtain(*args, **kwargs):
        gate.wait(10)
        return real_obtain(*args, **kwargs)

    monkeypatch.setattr(ann_module, "obtain", slow_obtain)
    manager._start_ann(snapshot)
    assert snapshot.ann is None and not snapshot.ann_ready.is_set()  # queries meanwhile: exact search
    gate.set()
    assert manager.wait_for_ann(snapshot, 30) is not None and snapshot.ann.origin == "built"


def test_small_snapshot_gets_no_index(snapshot_file: Path):
    snapshot = SimpleNamespace(size=10, ann=None, ann_ready=threading.Event())
    SnapshotManager(snapshot_file.parent, ann=AnnConfig(min_chunks=200_000))._start_ann(snapshot)
    assert snapshot.ann_ready.is_set() and snapshot.ann is None


def test_ranks_without_corpus_length_arrays_match_the_full_array_ranks():
    from knowledge_store.retrieval.fusion import ranks_in

    rng = np.random.default_rng(4)
    for _ in range(50):
        top = rng.choice(10_000, size=int(rng.integers(0, 60)), replace=False)
        rows = np.unique(np.concatenate([top[: len(top) // 2], rng.integers(0, 10_000, 40)]))
        full = np.zeros(10_000, dtype=np.int64)
        full[top] = np.arange(1, len(top) + 1)
        assert ranks_in(rows, top).tolist() == full[rows].tolist()
