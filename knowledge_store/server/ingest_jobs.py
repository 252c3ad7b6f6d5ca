"""Ingestion work started through the HTTP API: uploads, source syncs and failure retries.

Why in the server process and one at a time: the store has one writer, and ``groundwork serve``
alone (no Dagster daemon) must be able to ingest an upload.  Each job runs ``run_sync`` (or
``retry_failure``), the code path of the Dagster ingestion assets, in a daemon thread; jobs queue
on one run lock, and their record (``Job`` below, what ``GET /api/knowledge/jobs/{job_id}``
answers) carries live progress per stage.  Records live in memory: a restart forgets them.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.retry import Attempts, RetryPolicy, call_with_retries, classify, redacted_traceback
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.source_actions import retry_failure
from knowledge_store.storage.query_log import redact

JobStatus = Literal["queued", "running", "succeeded", "failed"]
# what the job record says ran it (the Dagster assets' code path, not a Dagster run)
RUNNER = "in-process (the ingestion sequence the Dagster assets run, knowledge_store.ingest.run)"

ProgressReport = Callable[[str, dict[str, Any]], None]
JobWork = Callable[[ProgressReport], dict[str, Any]]


class Job(BaseModel):
    """An ingestion job (upload, source sync, retry) with live progress."""

    # the work's outcome adds fields per kind (counts of a sync, resolved of a retry): additions, never replacements
    model_config = ConfigDict(extra="allow")

    job_id: str
    kind: str
    status: JobStatus
    created_at: str
    started_at: str | None
    finished_at: str | None
    summary: Any = None
    error: str | None
    snapshot_version: int | None
    progress: dict[str, Any]
    skipped: list[dict[str, str]] | None = Field(None, description="Sync and upload jobs: documents parsed but left "
                                                  "out on purpose, each {path, kind, reason} with its row on "
                                                  "/api/failures (kind too_short: a Markdown file under "
                                                  "GROUNDWORK_MIN_MARKDOWN_WORDS words).")


def utc_now() -> str:
    """Job timestamps: UTC, to the second, ``Z``-suffixed (what the console shows and compares)."""
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


class IngestJobs:
    """Ingestion work started through the API (uploads, source syncs, retries), in this process,
    one at a time (the store has one writer), pollable by id with live progress."""

    def __init__(self, settings: Settings, embedder: Callable[[], Any],
                 on_published: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self._embedder = embedder  # the document embedder of the moment: the serving model can change
        self.on_published = on_published  # e.g. the engine switching to the new snapshot before the job says done
        self.jobs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self.sleep: Callable[[float], None] | None = None  # the wait between a job's attempts (None: time.sleep)

    @property
    def embedder(self) -> Any:
        return self._embedder()

    def submit(self, files: list[str]) -> dict[str, Any]:
        """An upload: sync the uploads source only (never a crawl of the web sources)."""
        def work(progress: ProgressReport) -> dict[str, Any]:
            report = run_sync(self.settings, self.embedder, trigger="api-upload", kinds=["upload"], progress=progress)
            return {"summary": report.summary, "snapshot_version": report.publish.snapshot_version,
                    "documents_indexed": report.publish.document_count, "chunks_indexed": report.publish.chunk_count,
                    "checks": [check.to_dict() for check in report.checks], "skipped": report.parse.skipped}

        return self.submit_task("upload", work, files=files)

    def submit_sync(self, name: str, refresh: bool = False) -> dict[str, Any]:
        """Re-sync one registered source (scan or crawl, parse, chunk, embed, publish); ``refresh`` downloads
        every page of a web source again.  The outcome carries the sync's counters and its crawl figures."""
        def work(progress: ProgressReport) -> dict[str, Any]:
            report = run_sync(self.settings, self.embedder, trigger="api", names=[name], progress=progress,
                              refresh=refresh)
            raw = report.raw
            return {"summary": report.summary, "snapshot_version": report.publish.snapshot_version,
                    "added": raw.added, "updated": raw.updated, "removed": raw.removed, "unchanged": raw.unchanged,
                    "excluded": raw.excluded, "failed": raw.failed + report.parse.failed,
                    "crawl": {k: v for k, v in raw.crawls.get(name, {}).items() if k != "excluded_preview"} or None,
                    "documents_indexed": report.publish.document_count, "chunks_indexed": report.publish.chunk_count,
                    "checks": [check.to_dict() for check in report.checks],
                    # parsed but left out on purpose, each with its warning row: [{path, kind, reason}]
                    "skipped": report.parse.skipped}

        return self.submit_task("sync", work, source=name)

    def submit_retry(self, failure_id: str, path: str) -> dict[str, Any]:
        """Run one failed item again (fetch the URL, parse the version, or re-scan its source)."""
        def work(progress: ProgressReport) -> dict[str, Any]:
            outcome = retry_failure(self.settings, failure_id, self.embedder, progress=progress)
            return {"summary": outcome["summary"], "snapshot_version": outcome["snapshot_version"],
                    "resolved": outcome["resolved"], "still_failing": outcome["still_failing"]}

        return self.submit_task("retry", work, failure_id=failure_id, path=path)

    def submit_task(self, kind: str, work: JobWork, **fields: Any) -> dict[str, Any]:
        """Queue ``work`` as a job of ``kind`` (``fields`` describe it in the record); returns the new record."""
        job_id = uuid.uuid4().hex
        job = {"job_id": job_id, "kind": kind, "status": "queued", **fields, "created_at": utc_now(), "started_at": None,
               "finished_at": None, "summary": None, "error": None, "snapshot_version": None, "progress": {},
               "runner": RUNNER}
        with self._lock:
            self.jobs[job_id] = job
        threading.Thread(target=self._run, args=(job_id, work), daemon=True, name=f"ingest-{job_id[:8]}").start()
        return dict(job)

    def _progress(self, job_id: str) -> ProgressReport:
        def report(name: str, progress: dict[str, Any]) -> None:
            # a web source's crawl figures at the top level (fetched, queued, ...); each stage's counts
            # (parse/chunk/embed: done, total, rate, ETA) under stages, the current one named by stage
            with self._lock:
                current = dict(self.jobs[job_id].get("progress") or {})
                if "unit" in progress:
                    current.update(stage=name, stages={**(current.get("stages") or {}), name: progress})
                else:
                    current.update({"source": name, **progress})
                current["updated_at"] = utc_now()
                self.jobs[job_id]["progress"] = current
        return report

    def _run(self, job_id: str, work: JobWork) -> None:
        """Run the job; a transient failure (a store held by another writer, an I/O error) runs it again after
        each wait of ``GROUNDWORK_INGEST_RETRY_DELAYS_S`` (the record says ``attempts`` and, while it waits,
        ``retry``); a permanent one, or the last, fails it with its class and redacted traceback."""
        with self._run_lock:
            job = self.jobs[job_id]
            job.update(status="running", started_at=utc_now(), attempts=0)
            attempts = Attempts()
            policy = RetryPolicy.from_settings(self.settings, sleep=self.sleep)

            def on_retry(attempt: int, delay: float, error: BaseException) -> None:
                with self._lock:
                    job.update(attempts=attempt, retry={"attempt": attempt + 1, "of": policy.max_attempts,
                                                        "in_s": delay, "after": redact(f"{type(error).__name__}: {error}")})

            try:
                outcome = call_with_retries(lambda: work(self._progress(job_id)), policy, attempts, on_retry)
                if self.on_published is not None:
                    self.on_published()
                with self._lock:
                    job.update(status="succeeded", attempts=attempts.count, **outcome)
            except Exception as error:  # noqa: BLE001 - reported through the job, never raised into the server
                job.update(status="failed", error=redact(f"{type(error).__name__}: {error}"), attempts=attempts.count,
                           failure_class=classify(error).value, traceback=redacted_traceback(error))
            finally:
                job.pop("retry", None)
                job["finished_at"] = utc_now()

    def get(self, job_id: str) -> dict[str, Any] | None:
        """A JSON-safe copy of the job's record, or None for an unknown id."""
        with self._lock:
            job = self.jobs.get(job_id)
            return json.loads(json.dumps(job, default=str)) if job else None
