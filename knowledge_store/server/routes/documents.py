"""Document routes: the document list, a document's relations (the document model), its original file (what
citations link to, ``#page=N`` included) and the knowledge-base articles.

Everything here reads the published snapshot, except the document list, which prefers the store
and falls back to the snapshot while a sync holds the store's lock.
"""

# no ``from __future__ import annotations``: FastAPI reads the parameter annotations as objects
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse

from knowledge_store.app.status import store_status
from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import GroundworkError, StoreError
from knowledge_store.ingest.parsers.detect import MEDIA_TYPES, media_type_of
from knowledge_store.retrieval.snapshot_reader import document_relations as relations_of
from knowledge_store.server import api_models as out
from knowledge_store.server.api_models import error_responses
from knowledge_store.server.errors import server_log
from knowledge_store.server.kb_articles import KB_UNAVAILABLE, list_articles
from knowledge_store.server.request_models import IsoDatetime
from knowledge_store.server.state import CallerOf, State
from knowledge_store.storage.query_log import redact

router = APIRouter(tags=["documents"])
FALLBACK_MEDIA_TYPE = "application/octet-stream"  # a file of no supported type is served as bytes, never rendered
# what GET /api/knowledge/sources/{doc_id}/file can answer with (text formats are served as text/plain)
ORIGINAL_MEDIA_TYPES = (*dict.fromkeys(MEDIA_TYPES.values()), FALLBACK_MEDIA_TYPE)


@router.get("/api/knowledge/documents", response_model=out.DocumentList)
def documents(state: State, include_history: bool = True, needs_review: bool = False) -> dict[str, Any]:
    """Documents with their versions and status (from the store; from the snapshot while a sync holds it).
    ``needs_review=true``: only those with low-confidence OCR regions (``low_confidence_regions`` counts them)."""
    try:
        status = store_status(state.settings.model_copy(update={"lock_timeout_s": 1.0}), include_history=include_history,
                              needs_review=needs_review)
        return {"source": "store", "documents": status["documents"], "counts": status["counts"],
                "index_snapshot": status["index_snapshot"]}
    except StoreError as error:
        snapshot = state.engine.snapshots.current()
        docs = [{k: v for k, v in d.items()} for d in snapshot.documents]
        if needs_review:  # the snapshot's documents carry no review marks: say so rather than list them all
            docs = []
        return {"source": "snapshot", "note": str(error), "documents": docs,
                "index_snapshot": {"snapshot_version": snapshot.info.snapshot_version}}


@router.get("/api/knowledge/documents/{doc_id}/relations", response_model=out.DocumentRelations,
            responses=error_responses(404))
def document_relations(doc_id: str, state: State) -> dict[str, Any]:
    """The relations of one document (the document model), from the published snapshot: the revisions (other files with
    the same asset id or title) it supersedes or that supersede it, and the documents it links to or is
    linked from (seeAlso), each with confidence and evidence; plus its rev_label and validity."""
    snapshots = state.engine.snapshots
    found = relations_of(snapshots.current(), doc_id)
    if found is None:
        raise HTTPException(status_code=404, detail=f"unknown doc_id '{doc_id}' (not in index snapshot "
                                                    f"{snapshots.current().info.snapshot_version})")
    return found


@router.get("/api/knowledge/sources/{doc_id}/file", response_class=FileResponse,
            responses={"200": {"description": "The original file, inline, with its own media type.",
                               "content": {media: {"schema": {"type": "string", "format": "binary"}}
                                           for media in ORIGINAL_MEDIA_TYPES}},
                       **error_responses(404, 410)})
def source_file(doc_id: str, state: State, caller: CallerOf):
    """The original file of a document, inline, so ``#page=N`` links open at the page.  Without the admin token
    (where one is required) only documents of public sources; any other is 404, as an unknown one."""
    snapshot = state.engine.snapshots.current()
    doc = next((d for d in snapshot.documents if d["doc_id"] == doc_id and d["status"] == "active"), None) or \
        next((d for d in snapshot.documents if d["doc_id"] == doc_id), None)
    if doc is None or (not caller.admin and doc.get("visibility") != "public"):
        raise HTTPException(status_code=404, detail=f"unknown doc_id '{doc_id}'")
    path = Path(doc["path"])
    if not path.is_file():
        raise HTTPException(status_code=410, detail=f"the file of '{doc['title']}' is no longer at its source")
    served = _inside_its_source(state.settings, snapshot, doc, path)
    if served is not None and not state.access.servable(served):
        # its folder now leads outside every source root (replaced by a link since it was indexed): never served
        raise HTTPException(status_code=410, detail=f"the file of '{doc['title']}' now lies outside every source "
                                                    "root; it is not served")
    if served is None:
        # e.g. replaced by a link to /etc/passwd after it was indexed: never serve what the source does not hold
        raise HTTPException(status_code=410, detail=f"the file of '{doc['title']}' now leads outside its source "
                                                    "folder (a symbolic link); it is not served")
    media = media_type_of(path) or FALLBACK_MEDIA_TYPE
    if media.startswith("text/"):
        media += "; charset=utf-8"
    # an ingested HTML page must not run scripts in this server's origin (it would pass the origin policy):
    # the sandbox CSP gives it an opaque origin with scripts off; nosniff stops content-type guessing
    return FileResponse(served, media_type=media, headers={
        "Content-Disposition": f'inline; filename="{path.name}"', "Content-Security-Policy": "sandbox",
        "X-Content-Type-Options": "nosniff"})


@router.get("/api/kb/articles", response_model=out.ArticlePage, response_model_exclude_unset=True,
            responses={"500": {"model": out.ErrorBody, "description": "The knowledge base is unavailable (no index "
                               "yet, or it cannot be read): {\"error\": \"Internal server error\", \"message\": "
                               "\"Knowledge base unavailable\"}."}})
def articles(request: Request, state: State,
             intent: str | None = Query(None, description="Only articles with this intent (metadata intent/tags) "
                                        "or with all its words in the title; not_hashing = Not hashing."),
             device: str | None = Query(None, description="Only articles for this device (metadata device/product)."),
             updated_since: IsoDatetime | None = Query(None, description="Only articles updated at or after this "
                                                       "moment (ISO-8601)."),
             limit: int = Query(100, ge=1, le=1000, description="Articles per page."),
             offset: int = Query(0, ge=0, description="Where the page starts (the previous page's next_offset).")):
    """Every active document as a knowledge-base article (the knowledge-base articles contract): full content once,
    ``metadata`` with ``intent``, ``device``, ``last_updated`` (always) and ``author``; filtered and paginated.
    Errors are 500 ``{"error": "Internal server error", "message": "Knowledge base unavailable"}``."""
    try:
        snapshot = state.engine.snapshots.current()
        return list_articles(state.settings, snapshot, str(request.base_url).rstrip("/"), intent=intent, device=device,
                             updated_since=updated_since, limit=limit, offset=offset)
    except GroundworkError as error:  # no index yet, store/snapshot unreadable: expected, no traceback
        server_log.warning("GET /api/kb/articles: knowledge base unavailable: %s", redact(str(error)))
        return JSONResponse(status_code=500, content=dict(KB_UNAVAILABLE))
    except Exception:  # noqa: BLE001 - the contract's one error body; the cause goes to the server log
        server_log.exception("GET /api/kb/articles failed")
        return JSONResponse(status_code=500, content=dict(KB_UNAVAILABLE))


def _inside_its_source(settings: Settings, snapshot: Any, doc: dict[str, Any], path: Path) -> Path | None:
    """The file to serve, links resolved (what is checked is what is sent), or None when it now lies
    outside where its source keeps files: the folder (unless GROUNDWORK_FOLLOW_EXTERNAL_SYMLINKS allows
    links out) or, for a web source, the fetched-pages store under the data folder."""
    resolved = path.resolve()
    cursor = snapshot.conn.cursor()
    try:
        row = cursor.execute("SELECT kind, location FROM sources WHERE source_id = ?", [doc["source_id"]]).fetchone()
    finally:
        cursor.close()
    if row is None:
        return resolved
    if row[0] == "web":
        root = (settings.data_dir / "web").resolve()
    elif settings.follow_external_symlinks:
        return resolved
    else:
        root = Path(row[1]).resolve()
    return resolved if resolved.is_relative_to(root) else None
