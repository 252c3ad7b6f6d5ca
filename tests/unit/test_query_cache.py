"""QueryEmbeddingCache: normalised keys, LRU, one model call per concurrent miss, errors shared, bulk untouched."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from knowledge_store.retrieval.query_cache import QueryEmbeddingCache, normalise_query


class FakeEmbedder:
    model_id, dim, torch_threads, loaded = "fake", 4, 1, True

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.delay_s = delay_s
        self.fail = fail
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            self.calls.append(list(texts))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("model weights are corrupt")
        return np.array([[len(t), t.count(" "), 1.0, 0.0] for t in texts], dtype=np.float32)


def test_normalised_text_is_the_key():
    assert normalise_query("  how do I\n reset\tthe  Aurora ") == "how do I reset the Aurora"
    inner = FakeEmbedder()
    cache = QueryEmbeddingCache(inner, size=8)
    first = cache.embed(["how do I reset"])
    again = cache.embed(["  how  do I\nreset "])
    assert np.array_equal(first, again) and len(inner.calls) == 1
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["hit_rate"]) == (1, 1, 0.5)


def test_least_recently_used_goes_first_and_size_zero_is_off():
    inner = FakeEmbedder()
    cache = QueryEmbeddingCache(inner, size=2)
    for text in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" arrives
        cache.embed([text])
    cache.embed(["a"])
    cache.embed(["b"])
    assert [c[0] for c in inner.calls] == ["a", "b", "c", "b"]
    off = QueryEmbeddingCache(inner, size=0)
    off.embed(["a"])
    off.embed(["a"])
    assert [c[0] for c in inner.calls][-2:] == ["a", "a"] and off.stats()["lookups"] == 0


def test_bulk_calls_pass_through_and_callers_get_copies():
    inner = FakeEmbedder()
    cache = QueryEmbeddingCache(inner, size=8)
    assert cache.embed(["one", "two"]).shape == (2, 4) and cache.stats()["lookups"] == 0
    vector = cache.embed(["one"])
    vector[0, 0] = -1.0  # a caller scribbling on its vector does not change the cache
    assert cache.embed(["one"])[0, 0] == 3.0
    assert cache.model_id == "fake" and cache.dim == 4 and cache.loaded and cache.inner is inner


def test_fifty_concurrent_calls_of_five_questions_cost_five_model_calls():
    inner = FakeEmbedder(delay_s=0.05)
    cache = QueryEmbeddingCache(inner, size=64)
    questions = [f"question number {i}" for i in range(5)] * 10
    with ThreadPoolExecutor(max_workers=50) as pool:
        vectors = list(pool.map(lambda q: cache.embed([q]), questions))
    assert len(inner.calls) == 5
    for question, vector in zip(questions, vectors):
        assert vector[0, 0] == len(question)
    stats = cache.stats()
    assert stats["misses"] == 5 and stats["hits"] + stats["coalesced"] == 45 and stats["hit_rate"] == 0.9


def test_an_error_reaches_every_waiter_and_is_not_cached():
    inner = FakeEmbedder(delay_s=0.05, fail=True)
    cache = QueryEmbeddingCache(inner, size=8)
    errors: list[str] = []

    def call() -> None:
        try:
            cache.embed(["same question"])
        except RuntimeError as error:
            errors.append(str(error))

    threads = [threading.Thread(target=call) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == ["model weights are corrupt"] * 10 and len(inner.calls) == 1
    inner.fail = False
    assert cache.embed(["same question"]).shape == (1, 4) and len(inner.calls) == 2
