"""Prometheus metrics for the API: request counts, latency histograms, errors, feedback, index version."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from knowledge_store.core.errors import GroundworkError
from knowledge_store.storage.store import store_connection

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """One registry per app instance, so tests and several apps in a process never collide."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, store_path: Path | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("groundwork_http_requests_total", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("groundwork_http_request_duration_seconds", "HTTP request latency", ["method", "route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.errors = Counter("groundwork_http_errors_total", "HTTP responses with status >= 500", ["route"],
                              registry=self.registry)
        self.query_latency = Histogram("groundwork_query_duration_seconds", "Retrieval latency inside the engine",
                                       buckets=LATENCY_BUCKETS, registry=self.registry)
        self.feedback = Counter("groundwork_feedback_total", "Feedback received", ["rating"], registry=self.registry)
        self.snapshot_version = Gauge("groundwork_index_snapshot_version", "Index snapshot being served",
                                      registry=self.registry)
        # the operations contract's names: latency per endpoint (route template), and pages ingested by every process
        self.endpoint_latency = Histogram("http_request_duration_seconds", "HTTP request latency by endpoint",
                                          ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        if store_path is not None:
            self.registry.register(PagesIngestedCollector(store_path))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method=method, route=route, status=str(status)).inc()
        self.latency.labels(method=method, route=route).observe(seconds)
        self.endpoint_latency.labels(endpoint=route).observe(seconds)
        if status >= 500:
            self.errors.labels(route=route).inc()

    def render(self) -> str:
        return generate_latest(self.registry).decode()


class PagesIngestedCollector:
    """``pages_ingested_total``: pages parsed by every sync run in the store - Dagster runs, the CLI and this
    server's jobs alike (``sync_runs.pages_parsed``), read at scrape time.  While a sync holds the store the
    last value read is reported (a counter never goes back)."""

    def __init__(self, store_path: Path) -> None:
        self.store_path = store_path
        self.last = 0

    def collect(self):
        if self.store_path.exists():
            try:
                with store_connection(self.store_path, read_only=True, timeout_s=0.5) as conn:
                    total = conn.execute("SELECT coalesce(sum(pages_parsed), 0) FROM sync_runs").fetchone()[0]
                self.last = max(self.last, int(total))
            except GroundworkError:
                pass
            except Exception:  # noqa: BLE001 - e.g. a store from before migration 4: report what we had
                pass
        family = CounterMetricFamily("pages_ingested", "Pages parsed into the store, by every ingestion process")
        family.add_metric([], self.last)
        yield family
