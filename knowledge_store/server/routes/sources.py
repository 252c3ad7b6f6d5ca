"""Source routes: the registry of web sites and folders (list, add, show, update, delete, sync) and the
open ingestion failures (list, retry).  Syncs and retries run as ingestion jobs (``ingest_jobs.py``)
and answer 202 with the URL to poll.
"""

# no ``from __future__ import annotations``: FastAPI reads the parameter annotations as objects
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import InvalidSourceError
from knowledge_store.ingest.failures import open_failures
from knowledge_store.ingest.source_actions import delete_source_now, describe_source, open_failure, update_source_now
from knowledge_store.ingest.sources import (
    add_source,
    check_renderer,
    get_source,
    list_sources,
    register_configured_sources,
    source_statistics,
)
from knowledge_store.server import api_models as out
from knowledge_store.server.api_models import error_responses
from knowledge_store.server.request_models import WEB_OPTION_FIELDS, SourceBody, SourceUpdateBody
from knowledge_store.server.routes.ingestion import job_accepted
from knowledge_store.server.state import State
from knowledge_store.storage.store import store_connection

router = APIRouter(tags=["sources"])


def _writer(settings: Settings):
    """A store connection for registry reads and writes, waiting at most 10 s for a running sync's lock."""
    return store_connection(settings.store_path, timeout_s=min(settings.lock_timeout_s, 10.0))


@router.get("/api/sources", response_model=out.SourceList)
def sources_list(state: State, include_deleted: bool = False) -> dict[str, Any]:
    """Every source with its counts and last sync."""
    with _writer(state.settings) as conn:
        configured = {s.source_id for s in register_configured_sources(conn, state.settings)}
        # configured=false: a folder the settings no longer name (indexed, not synced; DELETE removes it)
        rows = [{**s.as_dict(), "statistics": source_statistics(conn, s.source_id),
                 "configured": s.origin != "settings" or s.source_id in configured}
                for s in list_sources(conn, include_deleted=include_deleted)]
    return {"sources": rows}


@router.post("/api/sources", status_code=201, response_model=out.SourceCreated,
             responses={**error_responses(409), "202": {"model": out.JobAccepted,
                                                        "description": "Registered, and its first sync started (sync: true)."}})
def sources_add(body: SourceBody, request: Request, state: State):
    """Register a web site or a folder (inside a source root: ``GROUNDWORK_SOURCE_ROOTS``, else 422 naming
    ``folder``); ``visibility`` internal unless said public; ``sync: true`` starts its first sync (202 + job)."""
    options = {k: getattr(body, k) for k in WEB_OPTION_FIELDS if getattr(body, k) is not None}
    if body.kind == "web" and not body.url:
        raise InvalidSourceError("url", None, "a web source needs a base URL")
    if body.kind == "folder":
        if not body.folder:
            raise InvalidSourceError("folder", None, "a folder source needs a folder")
        if options:
            raise InvalidSourceError(next(iter(options)), next(iter(options.values())),
                                     "crawl options apply to web sources only")
        state.access.check_source_folder(body.folder)
    check_renderer(state.settings, options)
    with _writer(state.settings) as conn:
        source = add_source(conn, body.name, body.kind, body.url if body.kind == "web" else body.folder,
                            options, enabled=body.enabled, visibility=body.visibility)
    if body.sync and source.enabled:
        return job_accepted(request, state.jobs.submit_sync(source.name), source=source.as_dict())
    return JSONResponse(status_code=201, content={"source": source.as_dict()})


@router.get("/api/sources/{name}", response_model=out.Open, responses=error_responses(404))
def sources_show(name: str, state: State) -> dict[str, Any]:
    """One source: options, document/page/chunk counts, last sync summary, open failures."""
    return json.loads(json.dumps(describe_source(state.settings, name), default=str))


@router.patch("/api/sources/{name}", response_model=out.SourceUpdated, responses=error_responses(404, 409))
def sources_update(name: str, body: SourceUpdateBody, state: State) -> dict[str, Any]:
    """Change options; ``resync_needed`` says when the index no longer matches the rules.  A new ``visibility``
    applies before this returns (a snapshot is published: ``snapshot_version``)."""
    changes = body.model_dump(exclude_none=True)
    if not changes:
        raise InvalidSourceError("body", {}, "nothing to update")
    source, changed, resync, published = update_source_now(state.settings, name, changes)
    if published is not None:
        state.engine.snapshots.refresh()  # the new visibility serves from the next query on
    return {"source": source.as_dict(), "changed": changed, "resync_needed": source.resync_needed,
            "snapshot_version": published,
            "message": (f"re-sync needed: POST /api/sources/{source.name}/sync to apply the new rules"
                        if resync else "no re-sync needed")}


@router.delete("/api/sources/{name}", response_model=out.SourceDeleted, responses=error_responses(404))
def sources_delete(name: str, state: State) -> dict[str, Any]:
    """Soft-delete: the source's chunks leave the index before this returns; purged after retention."""
    result = delete_source_now(state.settings, name)
    state.engine.snapshots.refresh()  # serve the snapshot without the source from the next query on
    return result


@router.post("/api/sources/{name}/sync", status_code=202, response_model=out.JobAccepted, responses=error_responses(404))
def sources_sync(name: str, request: Request, state: State, refresh: bool = False):
    """Re-sync one source now (scan or crawl, parse, chunk, embed, publish); poll the job for progress.
    ``refresh=true`` downloads every page of a web source again (ignores lastmod and validators)."""
    with _writer(state.settings) as conn:
        source = get_source(conn, name)
    if not source.enabled:
        raise InvalidSourceError("enabled", False, f"source {name!r} is disabled; PATCH enabled=true first")
    return job_accepted(request, state.jobs.submit_sync(source.name, refresh), refresh=refresh)


@router.get("/api/failures", response_model=out.FailureList)
def failures_list(state: State) -> dict[str, Any]:
    """Open ingestion failures (files and URLs), newest first.  Each row: ``failure_id, source_id, path`` (the file
    or URL), ``stage, kind, reason, first_seen_at, last_seen_at``, ``attempts`` (made before giving up: transient
    failures are retried after each wait of ``GROUNDWORK_INGEST_RETRY_DELAYS_S``), ``failure_class``
    (transient | permanent), ``traceback`` (the last attempt's, secrets redacted), ``input_size_bytes`` and
    ``input_sha256`` (null when unknown, e.g. for a URL that was never fetched)."""
    with store_connection(state.settings.store_path, read_only=True, timeout_s=5.0) as conn:
        return json.loads(json.dumps({"failures": open_failures(conn)}, default=str))


@router.post("/api/failures/{failure_id}/retry", status_code=202, response_model=out.JobAccepted,
             responses=error_responses(404))
def failures_retry(failure_id: str, request: Request, state: State):
    """Run one failed item again (fetch the URL, parse the version, or re-scan its source)."""
    with store_connection(state.settings.store_path, read_only=True, timeout_s=5.0) as conn:
        failure = open_failure(conn, failure_id)
    return job_accepted(request, state.jobs.submit_retry(failure_id, failure["path"]))
