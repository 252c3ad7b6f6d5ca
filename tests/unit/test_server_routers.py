"""The server's layout (issue 15 item 3) without an app: the body-model guard, original files' media types
from the parsers, ingestion jobs one at a time (the routers of a real app: tests/integration/test_server_routers.py)."""

from __future__ import annotations

import threading

import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.parsers import detect
from knowledge_store.server.ingest_jobs import IngestJobs
from knowledge_store.server.routes import knowledge
from knowledge_store.server.routes.documents import ORIGINAL_MEDIA_TYPES
from knowledge_store.server.state import with_body_model


def test_with_body_model_refuses_an_endpoint_without_that_parameter():
    def health() -> dict:
        return {}

    with pytest.raises(TypeError, match="has no parameter 'body'"):
        with_body_model(health, knowledge.QueryBody)


def test_original_files_are_served_with_the_parsers_media_types():
    assert ORIGINAL_MEDIA_TYPES[-1] == "application/octet-stream"
    assert set(ORIGINAL_MEDIA_TYPES[:-1]) == set(detect.MEDIA_TYPES.values())
    assert set(detect.MEDIA_TYPES) == set(detect.EXTENSION_TYPES.values())
    assert detect.media_type_of("Manual.PDF") == "application/pdf"
    assert detect.media_type_of("notes.markdown") == "text/plain"
    assert detect.media_type_of("page.htm") == "text/html"
    assert detect.media_type_of("data.xml") is None


def test_ingest_jobs_run_one_at_a_time_and_report_failures_in_their_record(tmp_path):
    published: list[str] = []
    jobs = IngestJobs(Settings(data_dir=tmp_path), embedder=lambda: None, on_published=lambda: published.append("refresh"))
    release = threading.Event()
    running: list[str] = []

    def slow(progress):
        running.append("slow")
        progress("parse", {"unit": "documents", "done": 1, "total": 2})
        release.wait(10)
        return {"summary": "ok", "snapshot_version": 3}

    def broken(progress):
        running.append("broken")
        raise ValueError("the folder vanished")

    first = jobs.submit_task("sync", slow, source="docs")
    second = jobs.submit_task("retry", broken, failure_id="f1")
    assert first["kind"] == "sync" and first["source"] == "docs" and second["failure_id"] == "f1"
    _wait_for(lambda: jobs.get(first["job_id"])["status"] == "running")
    assert jobs.get(second["job_id"])["status"] == "queued" and running == ["slow"]  # one writer at a time
    assert jobs.get(first["job_id"])["progress"]["stages"]["parse"]["done"] == 1
    release.set()
    _wait_for(lambda: jobs.get(second["job_id"])["finished_at"] is not None)
    done, failed = jobs.get(first["job_id"]), jobs.get(second["job_id"])
    assert (done["status"], done["summary"], done["snapshot_version"]) == ("succeeded", "ok", 3)
    assert (failed["status"], failed["error"]) == ("failed", "ValueError: the folder vanished")
    assert published == ["refresh"]  # only a job that published switches the engine to the new snapshot
    assert jobs.get("no-such-job") is None


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)
