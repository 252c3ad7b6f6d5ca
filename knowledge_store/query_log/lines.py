"""One JSON line per answered query (seed 004's shape), on stdout and/or a rotated file."""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from knowledge_store.query_log.records import _dumps
from knowledge_store.query_log.redaction import redact

log = logging.getLogger(__name__)


class _DailyAndSizeRotatingHandler(logging.handlers.TimedRotatingFileHandler):
    """Rotates at midnight (UTC) and whenever the file passes ``max_bytes``; keeps ``backupCount`` files.
    A rotated file is renamed with its timestamp (``query.log.2026-11-23_17-05-00``)."""

    def __init__(self, filename: Path, max_bytes: int, backup_count: int) -> None:
        super().__init__(filename, when="midnight", utc=True, backupCount=backup_count, encoding="utf-8", delay=True)
        self.max_bytes = max_bytes
        self.suffix = "%Y-%m-%d_%H-%M-%S"
        self.extMatch = re.compile(r"^\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(\.\d+)?$", re.ASCII)

    def shouldRollover(self, record: logging.LogRecord) -> int:  # noqa: N802 - logging's API
        if self.stream is not None and self.max_bytes > 0:
            self.stream.seek(0, 2)
            if self.stream.tell() + len(self.format(record)) + 1 > self.max_bytes:
                return 1
        return super().shouldRollover(record)

    def rotation_filename(self, default_name: str) -> str:
        # the size trigger can fire twice in one second: never overwrite a rotated file
        name, n = default_name, 1
        while os.path.exists(name):
            name, n = f"{default_name}.{n}", n + 1
        return name


class QueryLines:
    """One JSON line per query in seed 004's shape - ``{timestamp, query, num_results, latency_ms, reranker,
    top_score, results: [{chunk_id, source, score, text_preview}], error, answer, ...}`` - on stdout (container
    logs) and/or in ``<folder>/query.log``, rotated daily and at ``max_mb``, ``keep_days`` kept.  Rows arrive
    already redacted (``_normalise``); writing never raises into a query."""

    def __init__(self, folder: Path | None, stdout: bool = False, max_mb: float = 100.0, keep_days: int = 7) -> None:
        self.logger = logging.getLogger(f"groundwork.query_lines.{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        self.path = None
        if folder is not None:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.path = Path(folder) / "query.log"
            handler = _DailyAndSizeRotatingHandler(self.path, int(max_mb * 1024 * 1024), keep_days)
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.logger.addHandler(handler)
        if stdout:
            handler = logging.StreamHandler(sys.stdout)
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.logger.addHandler(handler)

    @staticmethod
    def line(row: Mapping[str, Any]) -> dict[str, Any]:
        results = row["results_post"]
        results = json.loads(results) if isinstance(results, str) else results
        latency = row["latency_ms"]
        latency = json.loads(latency) if isinstance(latency, str) else latency
        params = row["params"]
        params = json.loads(params) if isinstance(params, str) else params
        top = [{"chunk_id": r.get("chunk_id"), "source": r.get("url") or r.get("source_path") or r.get("doc_id"),
                "score": r.get("score"), "text_preview": redact(str(r.get("text") or r.get("snippet") or ""))[:200]}
               for r in results]
        return {
            "timestamp": row["created_at"].isoformat(timespec="seconds") + "Z", "query": row["query"],
            "num_results": len(top), "latency_ms": (latency or {}).get("total"),
            "reranker": (params or {}).get("reranker"), "top_score": top[0]["score"] if top else None,
            "results": top, "error": row.get("error"), "answer": row.get("answer"),
            "retrieval_request_id": row["retrieval_request_id"], "client": row["client"],
            "reranker_status": row.get("reranker_status"), "coverage": row.get("coverage"),
            "snapshot_version": row.get("snapshot_version"),
        }

    def write(self, row: Mapping[str, Any]) -> None:
        try:
            self.logger.info(_dumps(self.line(row)))
        except Exception:  # noqa: BLE001 - a log line must never break a query
            log.warning("query log: could not write a query line", exc_info=True)

    def close(self) -> None:
        for handler in list(self.logger.handlers):
            handler.close()
            self.logger.removeHandler(handler)
