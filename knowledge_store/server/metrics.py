"""Prometheus metrics for the API: request counts, latency histograms, errors, feedback, index version."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """One registry per app instance, so tests and several apps in a process never collide."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
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

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method=method, route=route, status=str(status)).inc()
        self.latency.labels(method=method, route=route).observe(seconds)
        if status >= 500:
            self.errors.labels(route=route).inc()

    def render(self) -> str:
        return generate_latest(self.registry).decode()
