"""The exact vector scan shared by several threads gives the single product's scores."""

from __future__ import annotations

import numpy as np
import pytest

from knowledge_store.retrieval.vector_scan import BLOCK_ROWS, PARALLEL_MIN_ROWS, cosine_scan


@pytest.mark.parametrize("rows", [10, PARALLEL_MIN_ROWS - 1, PARALLEL_MIN_ROWS, 3 * BLOCK_ROWS + 17])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_shared_scan_equals_one_matrix_vector_product(rows: int, threads: int) -> None:
    rng = np.random.default_rng(rows + threads)
    embeddings = rng.standard_normal((rows, 48), dtype=np.float32)
    query = rng.standard_normal(48).astype(np.float64)  # a float64 query is scanned as float32
    scores = cosine_scan(embeddings, query, threads)
    assert scores.dtype == np.float32 and scores.shape == (rows,)
    np.testing.assert_allclose(scores, embeddings @ query.astype(np.float32), rtol=1e-6, atol=1e-6)


def test_every_row_is_scored_once_whatever_the_block_count() -> None:
    # rows that are a multiple of the block size, and one row past it: no block dropped, none twice
    for rows in (2 * BLOCK_ROWS, 2 * BLOCK_ROWS + 1):
        embeddings = np.ones((rows, 4), dtype=np.float32) * np.arange(rows, dtype=np.float32)[:, None]
        scores = cosine_scan(embeddings, np.ones(4, dtype=np.float32), threads=4)
        np.testing.assert_array_equal(scores, 4 * np.arange(rows, dtype=np.float32))


def test_the_snapshot_manager_gives_each_snapshot_it_serves_the_configured_scan_threads(tmp_path) -> None:
    import threading
    from types import SimpleNamespace

    from knowledge_store.retrieval.snapshot_reader import SnapshotManager
    from knowledge_store.settings import Settings

    manager = SnapshotManager(tmp_path, scan_threads=Settings(vector_scan_threads=3).vector_scan_threads)
    served = manager._install(SimpleNamespace(scan_threads=1, ann_ready=threading.Event()), None)
    assert served.scan_threads == 3 and served.ann_ready.is_set()
    with pytest.raises(ValueError, match="vector_scan_threads"):
        Settings(vector_scan_threads=0)
