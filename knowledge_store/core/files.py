"""Small files that several processes read and write: an atomic JSON replace and an exclusive file lock.

``tuned.json``, ``feedback_learning.json`` and ``embedder.json`` are each read on every query or request
and rewritten by a background run, so a reader must see the old or the new file, never half of one, and
two writers must take turns (threads of one process and other processes alike).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, indent: int = 2) -> Path:
    """Write ``data`` as JSON to a temporary file beside ``path``, fsync it, then rename it over ``path``.
    A failed write removes its temporary and raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=indent)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextmanager
def exclusive_lock(lock_path: Path, thread_lock: threading.Lock) -> Iterator[None]:
    """Hold ``thread_lock`` (this process's threads) and an ``flock`` on ``lock_path`` (other processes)."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with thread_lock, open(lock_path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
