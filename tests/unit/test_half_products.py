"""Float16 rows times a float32 vector through ONNX Runtime: the products NumPy's conversion gives, without its cost."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from knowledge_store.retrieval.half_products import half_products


def test_products_equal_numpy_float32_products_of_the_same_float16_rows():
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(1000, 768)).astype(np.float16)
    vector = rng.normal(size=768).astype(np.float32)
    expected = rows.astype(np.float32) @ vector
    got = half_products(rows, vector)
    assert got.dtype == np.float32 and got.shape == (1000,)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)  # float32 sums in another order
    # a non-contiguous selection (a gather's view) is scored as its own rows
    np.testing.assert_allclose(half_products(rows[::3], vector), expected[::3], rtol=1e-5, atol=1e-4)


def test_no_rows_give_no_products_and_mismatched_shapes_name_both():
    assert half_products(np.zeros((0, 4), dtype=np.float16), np.ones(4, dtype=np.float32)).shape == (0,)
    with pytest.raises(ValueError, match=r"rows \(2, 4\) and vector \(3,\)"):
        half_products(np.zeros((2, 4), dtype=np.float16), np.ones(3, dtype=np.float32))


def test_threads_scoring_at_once_each_get_their_own_products():
    rng = np.random.default_rng(4)
    blocks = [rng.normal(size=(200 + 50 * i, 64)).astype(np.float16) for i in range(8)]
    vectors = [rng.normal(size=64).astype(np.float32) for _ in range(8)]
    results: dict[int, np.ndarray] = {}

    def score(i: int) -> None:
        for _ in range(20):
            results[i] = half_products(blocks[i], vectors[i])

    threads = [threading.Thread(target=score, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        np.testing.assert_allclose(results[i], blocks[i].astype(np.float32) @ vectors[i], rtol=1e-5, atol=1e-4)
