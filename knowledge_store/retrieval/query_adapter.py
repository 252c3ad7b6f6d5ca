"""The query adapter at query time: ``q' = normalise(q + q @ W)``, its file and the engine's cache of it.

The adapter is learned from thumbs-up feedback by ``learning/adapter_training.py`` (``groundwork adapt``,
the ``query_adapter`` asset) and stored as ``<index_dir>/query_adapter.npz`` (atomically), beside
``tuned.json``; the engine reads it per query (cached on the file's modification time) and applies it only to
vectors of the model it was trained on (``QueryAdapter.fits``).  ``groundwork adapt --reset`` removes it.
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from knowledge_store.core.errors import GroundworkError

ADAPTER_FILE = "query_adapter.npz"


class QueryAdapterError(GroundworkError):
    """A query adapter cannot be trained or read (too little feedback, a damaged file ...); says why."""


@dataclass(frozen=True)
class QueryAdapter:
    """``q' = normalise(q + q @ matrix)``; ``info`` is the evidence it was adopted on."""

    matrix: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[0])

    def summary(self, in_use: bool) -> dict[str, Any]:
        """What ``/api/knowledge/config``, the console and ``groundwork status`` show of it: the held-out evidence."""
        keys = ("trained_at", "snapshot_version", "rated_queries", "held_out_queries", "folds", "held_out_without",
                "held_out_with", "decision", "l2", "seconds")
        return {**{k: self.info.get(k) for k in keys}, "in_use": in_use}

    def fits(self, model_id: str) -> bool:
        """Whether it was trained on vectors of ``model_id`` (a snapshot's; suffixes ignored).  An adapter
        trained before adapters recorded their model is taken for the vectors it was trained on, of the
        configured base model, which ``width`` can only partly check."""
        trained = self.info.get("model_id")
        return trained is None or trained == (model_id or "").split("+", 1)[0]

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        """The adapted, L2-normalised query vector(s); a vector of another width is refused."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.shape[-1] != self.dim:
            raise QueryAdapterError(f"query vector has {vectors.shape[-1]} dimensions, the adapter {self.dim}: "
                                    "it was trained for another embedding model; run `groundwork adapt` again")
        moved = vectors + vectors @ self.matrix
        return (moved / np.linalg.norm(moved, axis=-1, keepdims=True)).astype(np.float32)


# --------------------------------------------------------------------------- stored adapter


def adapter_path(index_dir: Path) -> Path:
    return Path(index_dir) / ADAPTER_FILE


def save_adapter(index_dir: Path, adapter: QueryAdapter) -> Path:
    """Write ``adapter`` atomically (a reader sees the old file or the new one, never half of one)."""
    path = adapter_path(index_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, matrix=adapter.matrix, info=np.array(json.dumps(adapter.info)))
    tmp = path.with_suffix(f".tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)
    return path


def read_adapter(path: Path) -> QueryAdapter:
    """The adapter stored at ``path``; QueryAdapterError (naming the file) when it is damaged."""
    try:
        with np.load(path, allow_pickle=False) as data:
            matrix = np.asarray(data["matrix"], dtype=np.float32)
            info = json.loads(str(data["info"]))
    except Exception as error:  # noqa: BLE001 - any damage reads as one typed error
        raise QueryAdapterError(f"{path} is not a readable query adapter ({error}); "
                                "`groundwork adapt --reset` removes it") from error
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or not np.isfinite(matrix).all():
        raise QueryAdapterError(f"{path} holds a {matrix.shape} matrix, not a square finite one; "
                                "`groundwork adapt --reset` removes it")
    return QueryAdapter(matrix, info)


def reset_adapter(index_dir: Path) -> bool:
    path = adapter_path(index_dir)
    if path.exists():
        path.unlink()
        return True
    return False


class AdapterCache:
    """The corpus's adapter for the engine: read again only when the file changes; a damaged or
    mismatched file is reported once in the log and ignored (queries go on without an adapter)."""

    def __init__(self, index_dir: Path, dim: int) -> None:
        self.path = adapter_path(index_dir)
        self.dim = dim
        self._key: tuple[int, int] | None = None
        self._adapter: QueryAdapter | None = None
        self.error: str | None = None
        self._lock = threading.Lock()

    def current(self) -> QueryAdapter | None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._key, self._adapter, self.error = None, None, None
            return None
        key = (stat.st_mtime_ns, stat.st_size)
        if key == self._key:
            return self._adapter
        with self._lock:
            if key != self._key:
                adapter, error = None, None
                try:
                    adapter = read_adapter(self.path)
                    if adapter.dim != self.dim:
                        error = (f"{self.path}: adapter for {adapter.dim}-dimensional vectors, the model makes "
                                 f"{self.dim}; ignored - run `groundwork adapt` again")
                        adapter = None
                except QueryAdapterError as exc:
                    error = str(exc)
                if error:
                    logging.getLogger(__name__).warning("query adapter ignored: %s", error)
                self._adapter, self.error, self._key = adapter, error, key
        return self._adapter


