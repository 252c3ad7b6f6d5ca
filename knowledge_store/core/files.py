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
from collections.abc import Callable, Iterator
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
def exclusive_lock(lock_path: Path, thread_lock: threading.Lock,
                   on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold ``thread_lock`` (this process's threads) and an ``flock`` on ``lock_path`` (other processes);
    ``on_wait`` is called once before blocking when another process holds the lock (so a caller can say why it
    waits)."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with thread_lock, open(lock_path, "a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


PRIVATE_UMASK = 0o077  # what the server creates is its user's alone: files 0600, folders 0700


def make_private(folder: Path) -> int:
    """Create ``folder`` (mode 0700) if needed and take every permission for group and others off it and off
    everything under it (symbolic links are not followed): the store, the query log, the snapshots and the logs
    quote the documents, internal ones included, and are for this user alone - like the admin token file.
    Returns how many entries were narrowed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    narrowed = 0
    for root, dirs, files in os.walk(folder):
        for name in [".", *dirs, *files]:
            path = os.path.join(root, name)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:  # removed meanwhile (a rotated log, a retired snapshot)
                continue
            if (mode & 0o077) and not os.path.islink(path):
                os.chmod(path, mode & ~0o077 & 0o7777)
                narrowed += 1
    return narrowed
