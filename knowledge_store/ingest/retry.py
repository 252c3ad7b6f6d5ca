"""Transient or permanent: which ingestion failures are worth another attempt, and the attempts themselves.

A failure is **transient** when the same input may succeed later without anyone changing it: an I/O error
reading the file, a store held by another writer, an OCR time-out on a machine busy with other work, a web
fetch that timed out or got 429/5xx.  It is **permanent** when the input itself is the problem: a corrupt,
unsupported, empty, oversize or too deeply nested file, a 404.  Transient failures are retried after the
waits of ``GROUNDWORK_INGEST_RETRY_DELAYS_S`` (one retry per wait: 10, 60 and 300 s);
permanent ones fail on the first attempt.  Either way the failure row keeps the attempts made, the class,
the last traceback (redacted) and the input (path or URL, size, sha256).
"""

from __future__ import annotations

import errno
import hashlib
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TypeVar

from knowledge_store.core.errors import IngestionError, StoreLockedError
from knowledge_store.storage.query_log import redact

T = TypeVar("T")

# OS errors another attempt can get past: the device or a network file system hiccuped, or a lock was held
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.EAGAIN, errno.EBUSY, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE,
                              errno.ENOLCK, errno.ECONNRESET, errno.ECONNABORTED, errno.EHOSTUNREACH,
                              errno.ENETUNREACH, errno.ENETDOWN})
TRACEBACK_MAX_CHARS = 8000  # the end of a longer one is kept: the frame that raised is last


class FailureClass(str, Enum):
    """The two classes of ingestion failure (stored in ``ingestion_failures.failure_class``)."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"


FAILURE_CLASSES = tuple(c.value for c in FailureClass)


def classify(error: BaseException) -> FailureClass:
    """Transient or permanent, from the error's type: ``IngestionError.transient``, a busy or locked store,
    an OS error whose number is in ``TRANSIENT_ERRNOS``, a network error; anything else is permanent (retrying
    a bug or a bad file only delays the failure row)."""
    if isinstance(error, IngestionError):
        return FailureClass.TRANSIENT if error.transient else FailureClass.PERMANENT
    if isinstance(error, StoreLockedError):
        return FailureClass.TRANSIENT
    if isinstance(error, (TimeoutError, ConnectionError)):
        return FailureClass.TRANSIENT
    if isinstance(error, OSError):
        return FailureClass.TRANSIENT if error.errno in TRANSIENT_ERRNOS else FailureClass.PERMANENT
    return FailureClass.PERMANENT


def redacted_traceback(error: BaseException) -> str:
    """The error's traceback (with its causes) as text, secrets redacted (tokens, passwords, Authorization
    headers, credentials in URLs), at most ``TRACEBACK_MAX_CHARS`` (the end kept)."""
    text = redact("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    if len(text) > TRACEBACK_MAX_CHARS:
        text = "…" + text[-(TRACEBACK_MAX_CHARS - 1):]
    return text


@dataclass(frozen=True)
class InputFacts:
    """What a failure row says about the input: its size and sha256 (None when it cannot be read)."""

    size_bytes: int | None
    sha256: str | None

    @classmethod
    def of_file(cls, path: Path | str) -> InputFacts:
        try:
            digest = hashlib.sha256()
            size = 0
            with open(path, "rb") as handle:
                while block := handle.read(1 << 20):
                    digest.update(block)
                    size += len(block)
            return cls(size, digest.hexdigest())
        except OSError:
            return cls(None, None)


def wait(seconds: float) -> None:
    """The real wait between attempts: a module function, so a test replaces it here and not ``time.sleep``
    for every thread of the process."""
    time.sleep(seconds)


@dataclass
class RetryPolicy:
    """Waits before each retry (``delays``: one retry per entry) and the sleep that waits them (tests inject one)."""

    delays: Sequence[float]
    sleep: Callable[[float], None] = field(default=lambda seconds: wait(seconds))

    @property
    def max_attempts(self) -> int:
        return 1 + len(self.delays)

    @classmethod
    def from_settings(cls, settings, sleep: Callable[[float], None] | None = None) -> RetryPolicy:
        return cls(list(settings.ingest_retry_delays_s), sleep) if sleep else cls(list(settings.ingest_retry_delays_s))


@dataclass
class Attempts:
    """The outcome of ``call_with_retries``: how many attempts, the waits between them, the errors seen."""

    count: int = 0
    waited_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # "Type: message" of each failed attempt


def call_with_retries(work: Callable[[], T], policy: RetryPolicy, attempts: Attempts | None = None,
                      on_retry: Callable[[int, float, BaseException], None] | None = None) -> T:
    """``work()``, retried after each of ``policy.delays`` while it raises a transient error; a permanent
    error, or a transient one after the last wait, is raised as is.  ``attempts`` (when given) is filled in;
    ``on_retry(attempt, delay, error)`` hears each retry before its wait."""
    attempts = attempts if attempts is not None else Attempts()
    while True:
        attempts.count += 1
        try:
            return work()
        except Exception as error:
            attempts.errors.append(redact(f"{type(error).__name__}: {error}")[:500])
            if classify(error) is FailureClass.PERMANENT or attempts.count > len(policy.delays):
                raise
            delay = float(policy.delays[attempts.count - 1])
            if on_retry is not None:
                on_retry(attempts.count, delay, error)
            policy.sleep(delay)
            attempts.waited_s += delay
