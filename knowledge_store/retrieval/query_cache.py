"""Recent query embeddings, shared by every caller of one engine (HTTP API, MCP, ``retrieve_knowledge``).

Support bots and consoles ask the same questions again and again; embedding a
query is the one step of a search that needs the model (10-30 ms of CPU here).
``QueryEmbeddingCache`` wraps the engine's embedder:

* one-text calls (queries) are looked up by the *normalised* query text
  (surrounding whitespace stripped, runs of whitespace made one space: the
  tokenizer sees the same word-pieces either way), least recently used out
  first, ``size`` entries (``GROUNDWORK_QUERY_CACHE_SIZE``; 0 = off);
* concurrent misses on the same text share one model call (the first caller
  embeds, the others wait for its vector or its error): fifty clients asking
  the same new question cost one embedding, not fifty;
* bulk calls (ingestion, evaluation) go straight to the wrapped embedder;
* callers get a copy, so nothing they do to a vector changes the cache.

``stats()`` counts lookups: ``hits`` (in the cache), ``coalesced`` (waited for
another caller's model call) and ``misses`` (embedded by the model);
``hit_rate`` is the share served without a model call of its own,
``(hits + coalesced) / lookups``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

import numpy as np


def normalise_query(text: str) -> str:
    """The cache key: whitespace-insensitive, otherwise the text as given."""
    return " ".join(text.split())


class QueryEmbeddingCache:
    """Thread-safe LRU of query vectors in front of an embedder (see the module docstring)."""

    def __init__(self, inner: Any, size: int = 2048) -> None:
        self.inner = inner  # the uncached embedder (evaluations time it directly)
        self.size = max(0, int(size))
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.coalesced = 0

    # ---------------------------------------------------------------- the embedder interface
    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def torch_threads(self) -> int:
        return getattr(self.inner, "torch_threads", 1)

    @property
    def loaded(self) -> bool:
        return bool(getattr(self.inner, "loaded", True))

    def load(self) -> "QueryEmbeddingCache":
        if hasattr(self.inner, "load"):
            self.inner.load()
        return self

    def __getattr__(self, name: str) -> Any:  # anything else the wrapped embedder offers
        if name == "inner":  # not set yet (during unpickling); never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    def embed(self, texts: list[str]) -> np.ndarray:
        if len(texts) != 1 or not self.size or not isinstance(texts[0], str):
            return self.inner.embed(texts)
        key = normalise_query(texts[0])
        with self._lock:
            vector = self._vectors.get(key)
            if vector is not None:
                self._vectors.move_to_end(key)
                self.hits += 1
                return vector[None, :].copy()
            pending = self._inflight.get(key)
            leader = pending is None
            if leader:
                pending = self._inflight[key] = Future()
                self.misses += 1
            else:
                self.coalesced += 1
        if not leader:
            return pending.result()[None, :].copy()  # the leader's vector, or its error raised here
        try:
            vector = np.asarray(self.inner.embed(texts))[0]
        except BaseException as error:
            with self._lock:
                self._inflight.pop(key, None)
            pending.set_exception(error)
            raise
        with self._lock:
            self._vectors[key] = vector
            self._vectors.move_to_end(key)
            while len(self._vectors) > self.size:
                self._vectors.popitem(last=False)
            self._inflight.pop(key, None)
        pending.set_result(vector)
        return vector[None, :].copy()

    # ---------------------------------------------------------------- observability
    def stats(self) -> dict[str, Any]:
        with self._lock:
            lookups = self.hits + self.misses + self.coalesced
            return {"hits": self.hits, "coalesced": self.coalesced, "misses": self.misses, "lookups": lookups,
                    "hit_rate": round((self.hits + self.coalesced) / lookups, 4) if lookups else None,
                    "entries": len(self._vectors), "size": self.size}

    def clear(self) -> None:
        """Forget every vector and the counters (e.g. after the query encoder changed)."""
        with self._lock:
            self._vectors.clear()
            self.hits = self.misses = self.coalesced = 0
