"""The retry vocabulary and policy of ingestion (knowledge_store/ingest/retry.py), the redaction of what a
failure row keeps, the API job retry, and store migration 10 keeping every failure row."""

from __future__ import annotations

import errno
import time

import duckdb
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import (
    CorruptFileError,
    FileReadError,
    NestingTooDeepError,
    OcrTimeoutError,
    StoreBusyError,
    StoreLockedError,
    UnsupportedTypeError,
)
from knowledge_store.ingest.retry import (
    FAILURE_CLASSES,
    Attempts,
    FailureClass,
    RetryPolicy,
    call_with_retries,
    classify,
    redacted_traceback,
)
from knowledge_store.server.ingest_jobs import IngestJobs
from knowledge_store.storage.query_log import redact
from knowledge_store.storage.store import MIGRATIONS, migrate


@pytest.mark.parametrize("error, expected", [
    (FileReadError("a.pdf", "I/O error", errno=errno.EIO), "transient"),
    (OcrTimeoutError("a.pdf", 3, 9, 2, 301.0, 300.0), "transient"),
    (StoreLockedError("store.duckdb", "Could not set lock"), "transient"),
    (StoreBusyError("store.duckdb", 5.0), "transient"),
    (OSError(errno.EIO, "Input/output error"), "transient"),
    (TimeoutError("read timed out"), "transient"),
    (CorruptFileError("a.pdf", "broken xref"), "permanent"),
    (UnsupportedTypeError("a.exe", "not a document"), "permanent"),
    (NestingTooDeepError("a.html", 5000, 512), "permanent"),
    (OSError(errno.ENOENT, "No such file"), "permanent"),
    (ValueError("a bug"), "permanent"),
])
def test_errors_are_classified_transient_or_permanent(error, expected):
    assert classify(error).value == expected
    assert FAILURE_CLASSES == tuple(c.value for c in FailureClass) == ("transient", "permanent")


def test_retries_follow_the_delays_then_raise():
    waits: list[float] = []
    calls: list[int] = []

    def work():
        calls.append(1)
        raise FileReadError("a.txt", "I/O error", errno=errno.EIO)

    attempts = Attempts()
    with pytest.raises(FileReadError):
        call_with_retries(work, RetryPolicy([10, 60, 300], waits.append), attempts)
    assert waits == [10, 60, 300] and len(calls) == attempts.count == 4 and attempts.waited_s == 370


def test_permanent_error_is_not_retried_and_success_stops_retrying():
    waits: list[float] = []
    attempts = Attempts()
    with pytest.raises(CorruptFileError):
        call_with_retries(lambda: (_ for _ in ()).throw(CorruptFileError("a.pdf", "broken")),
                          RetryPolicy([1, 2], waits.append), attempts)
    assert attempts.count == 1 and waits == []

    outcomes = iter([StoreLockedError("s", "lock"), "done"])

    def work():
        value = next(outcomes)
        if isinstance(value, Exception):
            raise value
        return value

    attempts = Attempts()
    assert call_with_retries(work, RetryPolicy([7], waits.append), attempts) == "done"
    assert attempts.count == 2 and waits == [7]


def test_setting_default_and_validation():
    assert Settings().ingest_retry_delays_s == [10.0, 60.0, 300.0]
    assert RetryPolicy.from_settings(Settings()).max_attempts == 4
    assert Settings(ingest_retry_delays_s=[]).ingest_retry_delays_s == []
    with pytest.raises(ValueError, match="between 0 and 3600"):
        Settings(ingest_retry_delays_s=[-1])


def test_redaction_covers_url_credentials_and_authorization_headers():
    text = ("GET https://bob:hunter2@docs.example.com/a failed; headers {'Authorization': 'Token abcdef123456'} "
            "Proxy-Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ== password=s3cr3t")
    clean = redact(text)
    for secret in ("hunter2", "abcdef123456", "QWxhZGRpbjpvcGVuIHNlc2FtZQ", "s3cr3t"):
        assert secret not in clean
    assert "https://bob:[SECRET]@docs.example.com/a" in clean and "'Authorization': 'Token [SECRET]'" in clean
    assert redact(clean) == clean
    assert redact("the authorization step of OAuth") == "the authorization step of OAuth"


def test_traceback_is_redacted_and_bounded():
    def deep(n: int):
        if n == 0:
            raise RuntimeError("connect to ftp://ann:pa55word@host failed, api_key=abc")
        deep(n - 1)

    try:
        deep(400)
    except RuntimeError as error:
        trace = redacted_traceback(error)
    assert "pa55word" not in trace and "api_key=[SECRET]" in trace
    assert len(trace) <= 8000 and trace.rstrip().endswith("api_key=[SECRET]")


def test_api_job_is_retried_on_a_busy_store(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", ingest_retry_delays_s=[2, 3])
    jobs = IngestJobs(settings, embedder=lambda: None)
    waits: list[float] = []
    jobs.sleep = waits.append
    calls: list[int] = []

    def work(progress):
        calls.append(1)
        if len(calls) < 3:
            raise StoreLockedError(settings.store_path, "Could not set lock on file")
        return {"summary": "ok"}

    job = jobs.submit_task("sync", work)
    for _ in range(100):
        record = jobs.get(job["job_id"])
        if record["finished_at"]:
            break
        time.sleep(0.02)
    assert record["status"] == "succeeded" and record["attempts"] == 3 and waits == [2, 3]

    def corrupt(progress):
        raise CorruptFileError("a.pdf", "broken xref, token=abc123")

    job = jobs.submit_task("sync", corrupt)
    for _ in range(100):
        record = jobs.get(job["job_id"])
        if record["finished_at"]:
            break
        time.sleep(0.02)
    assert record["status"] == "failed" and record["attempts"] == 1 and record["failure_class"] == "permanent"
    assert "abc123" not in record["error"] and "abc123" not in record["traceback"] and waits == [2, 3]


def test_migration_keeps_existing_failure_rows(tmp_path):
    conn = duckdb.connect(str(tmp_path / "store.duckdb"))
    migrate(conn, [m for m in MIGRATIONS if m[0] <= 9])
    conn.execute("INSERT INTO ingestion_failures VALUES ('f1', 's', '/docs/a.pdf', 'd', 'abc', 'parse', 'corrupt', "
                 "'broken', now(), now(), NULL, 'run'), ('f2', 's', '/docs/b.pdf', NULL, NULL, 'scan', 'oversize', "
                 "'too big', now(), now(), now(), 'run')")
    assert migrate(conn) >= 10
    got = conn.execute("SELECT failure_id, reason, resolved_at IS NULL, attempts, failure_class, traceback, "
                       "input_size_bytes, input_sha256 FROM ingestion_failures ORDER BY failure_id").fetchall()
    assert got == [("f1", "broken", True, 1, None, None, None, None), ("f2", "too big", False, 1, None, None, None, None)]
