"""Ingestion routes: upload a file (checked, stored in the uploads source, ingested by a job) and poll a job.

What an upload may be is ``parsers/detect.py``'s list of supported types: the extension picks the
type and the bytes must agree with it (the same check the parse stage makes), so a file refused
here would have failed ingestion anyway, and one accepted here is parsed as what it claimed.
"""

# no ``from __future__ import annotations``: FastAPI reads the parameter annotations as objects
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, File, Form, HTTPException, Request, UploadFile
from fastapi.responses import JSONResponse

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import IngestionError, QueryValidationError, StoreError
from knowledge_store.core.text import without_nul
from knowledge_store.ingest.parsers.detect import EXTENSION_TYPES, detect_type
from knowledge_store.server import api_models as out
from knowledge_store.server.api_models import error_responses
from knowledge_store.server.state import State
from knowledge_store.storage.store import store_connection

router = APIRouter(tags=["ingestion"])

READ_BYTES = 1024 * 1024  # an upload is streamed to disk in pieces of this size, hashed and size-checked as it goes
# multipart framing around the file: a Content-Length this much over the limit may still hold an acceptable file
MULTIPART_SLACK_BYTES = 1024 * 64
UPLOAD_PATH = "/api/knowledge/ingest"  # its body limit is the file limit, not GROUNDWORK_MAX_BODY_BYTES


@router.post(UPLOAD_PATH, status_code=202, response_model=out.UploadAccepted,
             responses=error_responses(409, 413))
async def ingest(request: Request, state: State, file: UploadFile = File(...), force: bool = Form(False)) -> JSONResponse:
    """Upload a PDF/DOCX/HTML/MD/TXT file; it is checked, stored in the uploads source and ingested."""
    settings = state.settings
    name = Path(without_nul_field("file", file.filename or "")).name
    suffix = Path(name).suffix.lower()
    if not name or suffix not in EXTENSION_TYPES:
        raise QueryValidationError("file", name or "(no name)", f"unsupported type; allowed: {', '.join(sorted(EXTENSION_TYPES))}")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > settings.max_file_bytes + MULTIPART_SLACK_BYTES:
        return _too_large(int(declared), settings)
    digest = hashlib.sha256()
    size = 0
    tmp = tempfile.NamedTemporaryFile(dir=settings.data_dir, prefix=".upload-", suffix=suffix, delete=False)
    try:
        while chunk := await file.read(READ_BYTES):
            size += len(chunk)
            if size > settings.max_file_bytes:
                tmp.close()
                os.unlink(tmp.name)
                return _too_large(size, settings)
            digest.update(chunk)
            tmp.write(chunk)
        tmp.close()
        if size == 0:
            raise QueryValidationError("file", name, "is empty")
        _check_content(Path(tmp.name), name, suffix)
        checksum = digest.hexdigest()
        duplicate = _find_duplicate(settings, checksum)
        if duplicate and not force:
            os.unlink(tmp.name)
            return JSONResponse(status_code=409, content={
                "error": "duplicate",
                "message": f"duplicate of {duplicate['title']}, ingested {duplicate['ingested']}",
                "duplicate_of": duplicate,
            })
        target = _free_name(settings.uploads_dir, name)
        shutil.move(tmp.name, target)
    except BaseException:
        if os.path.exists(tmp.name):
            os.unlink(tmp.name)
        raise
    job = state.jobs.submit([str(target)])
    base = str(request.base_url).rstrip("/")
    return JSONResponse(status_code=202, content={**job, "sha256": checksum, "size_bytes": size, "stored_as": target.name,
                                                  "status_url": f"{base}/api/knowledge/jobs/{job['job_id']}"})


@router.get("/api/knowledge/jobs/{job_id}", response_model=out.Job, responses=error_responses(404))
def job_status(job_id: str, state: State) -> dict[str, Any]:
    job = state.jobs.get(job_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"unknown job_id '{job_id}'")
    return job


def job_accepted(request: Request, job: dict[str, Any], **extra: Any) -> JSONResponse:
    """202 with the new job's record and the URL to poll (source syncs and retries answer this too)."""
    base = str(request.base_url).rstrip("/")
    return JSONResponse(status_code=202, content={**job, **extra,
                                                  "status_url": f"{base}/api/knowledge/jobs/{job['job_id']}"})


def without_nul_field(field: str, value: str) -> str:
    """``value``, or the 422 naming ``field`` when it holds a NUL character (no file name can)."""
    try:
        return without_nul(value)
    except ValueError as error:
        raise QueryValidationError(field, value, str(error)) from None


def _too_large(size: int, settings: Settings) -> JSONResponse:
    return JSONResponse(status_code=413, content={
        "error": "too_large", "message": f"file is {size / 1048576:.1f} MB, over the {settings.max_file_mb:g} MB limit"})


def _check_content(path: Path, name: str, suffix: str) -> None:
    """The bytes must be what the extension says (a 422 naming the file otherwise)."""
    try:
        detected = detect_type(path)
    except IngestionError as error:
        raise QueryValidationError("file", name, error.reason) from error
    if detected != EXTENSION_TYPES[suffix]:
        raise QueryValidationError("file", name, f"extension {suffix} does not match the content, which looks like {detected}")


def _find_duplicate(settings: Settings, checksum: str) -> dict[str, Any] | None:
    """The newest active or pending document with these bytes, or None (also when the store is busy:
    a duplicate then goes through, which costs a second copy, never a lost upload)."""
    if not settings.store_path.exists():
        return None
    try:
        with store_connection(settings.store_path, read_only=True, timeout_s=2.0) as conn:
            row = conn.execute(
                "SELECT doc_id, version, title, relative_path, coalesce(valid_from, created_at) FROM documents "
                "WHERE checksum = ? AND status IN ('active', 'pending') ORDER BY version DESC LIMIT 1", [checksum]
            ).fetchone()
    except StoreError:
        return None
    if row is None:
        return None
    return {"doc_id": row[0], "version": row[1], "title": row[2] or row[3], "path": row[3],
            "ingested": row[4].isoformat(timespec="seconds") + "Z"}


def _free_name(folder: Path, name: str) -> Path:
    """``name`` in ``folder``, or ``stem-1.ext``, ``stem-2.ext``, ... when taken."""
    target = folder / name
    stem, suffix = Path(name).stem, Path(name).suffix
    counter = 1
    while os.path.lexists(target):  # a dangling link is taken too: never write through it
        target = folder / f"{stem}-{counter}{suffix}"
        counter += 1
    return target
