"""The HTTP API and the Knowledge Grounding Console (FastAPI).

    groundwork serve            # http://127.0.0.1:8080  (console at /, OpenAPI at /docs, MCP at /mcp)

Who writes what: the server is the only writer of the query log and feedback
(``logs.duckdb``); it reads index snapshots and switches to a newer one as soon
as a sync publishes it, without a restart.  Uploads land in
``<data_dir>/uploads`` and are ingested in this process by the same code path
the Dagster assets use (``run_sync``), one job at a time.
"""


import hashlib
import json
import logging
import mimetypes
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import FastAPI, File, Form, HTTPException, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.staticfiles import NotModifiedResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, create_model, field_validator

from knowledge_store.errors import (
    GroundworkError,
    IndexNotBuiltError,
    InvalidSourceError,
    SourceExistsError,
    SourceNotFoundError,
    StoreError,
)
from knowledge_store.ingest.source_actions import FailureNotFoundError
from knowledge_store.query_log import QueryLines, QueryLog, redact
from knowledge_store.retrieval.engine import QueryValidationError, RetrievalEngine
from knowledge_store.retrieval.filters import SearchFilters
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.rerankers import RERANKERS
from knowledge_store.server import api_models as out
from knowledge_store.server.api_models import COMMON_ERRORS, error_responses
from knowledge_store.server.metrics import Metrics
from knowledge_store.sources import NAME_PATTERN
from knowledge_store.server.origin_policy import OriginPolicy, OriginPolicyMiddleware, mcp_transport_security
from knowledge_store.settings import Settings

log = logging.getLogger(__name__)
STATIC_DIR = Path(__file__).parent / "static"
# what GET /api/knowledge/sources/{doc_id}/file can answer with (text formats are served as text/plain)
ORIGINAL_MEDIA_TYPES = ("application/pdf", "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
                        "text/html", "text/plain", "application/octet-stream")
# /widget.js: cached briefly and revalidated by ETag (a new release reaches pages within minutes); embeddable
# by pages that set Cross-Origin-Embedder-Policy; never sniffed as anything but JavaScript
WIDGET_HEADERS = {"Cache-Control": "public, max-age=600, must-revalidate", "Cross-Origin-Resource-Policy": "cross-origin",
                  "X-Content-Type-Options": "nosniff"}
UPLOAD_TYPES = {".pdf": "pdf", ".docx": "docx", ".html": "html", ".htm": "html", ".md": "markdown",
                ".markdown": "markdown", ".txt": "text", ".text": "text"}


# ------------------------------------------------------------------ request models

SOURCE_NAME_PATTERN = NAME_PATTERN.pattern


def _json_integer(value: object) -> object:
    """An integer as JSON Schema means it: 3 or 3.0, never true or "3" (pydantic's lax mode takes both)."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be an integer")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]

# the fusion vocabulary is retrieval.fusion.FUSION_MODES; a Literal built from it gives OpenAPI its enum
FusionName = Literal[tuple(FUSION_MODES)]  # type: ignore[valid-type]


class QueryBody(BaseModel):
    """The query request; ``create_app`` derives the served model, whose schema also states the configured
    length limit and only the rerankers / answer modes the server can run (others get a 422 naming the setting)."""

    model_config = ConfigDict(extra="forbid")

    # minLength/pattern stated for clients; enforced by _not_blank with a message people understand
    query: str = Field(..., json_schema_extra={"minLength": 1, "pattern": r"\S"},
                       description="Free text: a question, a prompt fragment, a parameter name (not only whitespace).")
    k: JsonInt = Field(5, ge=1, le=100)
    alpha: float | None = Field(None, ge=0.0, le=1.0, strict=True, description="0 = pure BM25, 1 = pure vector; default: the "
                                "corpus's effective default (GET /api/knowledge/config).")
    fusion: FusionName | None = Field(None, description="How BM25 and vector scores are combined: " + "; ".join(
        f"{k}: {v}" for k, v in FUSION_MODES.items()) + ". Default: the corpus's effective default.")
    section_weight: float | None = Field(None, ge=0.0, le=1.0, strict=True, description="Share of a passage's BM25 evidence taken "
                                         "from its whole section (0 = the passage alone); default: effective default.")
    lead_weight: float | None = Field(None, ge=0.0, le=1.0, strict=True, description="Share of a passage's vector evidence taken "
                                      "from its section's first passage (0 = the passage alone); default: effective default.")
    reranker: Literal[RERANKERS] | None = None  # type: ignore[valid-type]
    filters: SearchFilters | None = None
    answer: Literal["extractive", "llm", "none"] = "extractive"
    min_relevance: float | None = Field(None, ge=0.0, le=1.0, strict=True)

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty or only whitespace")
        return value


class FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    retrieval_request_id: str = Field(..., min_length=1, max_length=64)
    chunk_id: str | None = Field(None, min_length=1, max_length=64)
    rating: Literal["up", "down"]
    note: str | None = None


def _text_field(description: str, **limits: Any):
    # minLength/pattern stated for clients; enforced by _not_blank with a message people understand
    return Field(..., json_schema_extra={"minLength": 1, "pattern": r"\S"}, description=description, **limits)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    return value


class AskBody(BaseModel):
    """``POST /api/ask`` (seed 002); ``create_app`` derives the served model (length limit, answer modes)."""

    model_config = ConfigDict(extra="forbid")

    query: str = _text_field("The question.")
    top_k: JsonInt = Field(10, ge=1, le=100, description="Passages retrieved and ranked by descending score.")
    max_sources: JsonInt = Field(3, ge=1, le=10, description="How many of the best of them the answer is made from "
                                                              "and returns as sources.")
    answer: Literal["extractive", "llm"] = "extractive"

    @field_validator("query")
    @classmethod
    def _query_not_blank(cls, value: str) -> str:
        return _not_blank(value)


class AskLocalBody(AskBody):
    """``POST /api/ask-local`` (seed 002): a question about text the reader selected in one document."""

    context: str = _text_field("The text the reader selected (searched together with the question).",
                               max_length=20000)
    source_file: str = _text_field("The document the selection is from: its path relative to its source (as in "
                                   "GET /api/kb/articles), an absolute path, a file name or a glob; the page URL "
                                   "for web sources. Retrieval is restricted to it.", max_length=2000)

    @field_validator("context", "source_file")
    @classmethod
    def _selection_not_blank(cls, value: str) -> str:
        return _not_blank(value)


def _iso_datetime(value: object) -> object:
    """Query-string datetimes must be ISO-8601 (the schema says date-time): ``0.5`` is not a moment."""
    if isinstance(value, str) and not re.match(r"^\d{4}-\d{2}-\d{2}", value):
        raise ValueError("must be an ISO-8601 date-time, e.g. 2026-01-31T12:00:00Z")
    return value


IsoDatetime = Annotated[datetime, BeforeValidator(_iso_datetime)]


# ------------------------------------------------------------------ ingestion jobs

class IngestJobs:
    """Ingestion work started through the API (uploads, source syncs, retries), in this process,
    one at a time (the store has one writer), pollable by id with live progress."""

    def __init__(self, settings: Settings, embedder, on_published=None) -> None:
        self.settings = settings
        self.embedder = embedder
        self.on_published = on_published  # e.g. the engine switching to the new snapshot before the job says done
        self.jobs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()

    def submit(self, files: list[str]) -> dict[str, Any]:
        """An upload: sync the uploads source only (never a crawl of the web sources)."""
        from knowledge_store.ingest.run import run_sync

        def work(progress) -> dict[str, Any]:
            report = run_sync(self.settings, self.embedder, trigger="api-upload", kinds=["upload"], progress=progress)
            return {"summary": report.summary, "snapshot_version": report.publish.snapshot_version,
                    "documents_indexed": report.publish.document_count, "chunks_indexed": report.publish.chunk_count}

        return self.submit_task("upload", work, files=files)

    def submit_task(self, kind: str, work, **fields: Any) -> dict[str, Any]:
        job_id = uuid.uuid4().hex
        job = {"job_id": job_id, "kind": kind, "status": "queued", **fields, "created_at": _now(), "started_at": None,
               "finished_at": None, "summary": None, "error": None, "snapshot_version": None, "progress": {},
               "runner": "in-process (the code path of the Dagster ingestion assets)"}
        with self._lock:
            self.jobs[job_id] = job
        threading.Thread(target=self._run, args=(job_id, work), daemon=True, name=f"ingest-{job_id[:8]}").start()
        return dict(job)

    def _progress(self, job_id: str):
        def report(name: str, progress: dict[str, Any]) -> None:
            # a web source's crawl figures at the top level (fetched, queued, ...); each stage's counts
            # (parse/chunk/embed: done, total, rate, ETA) under stages, the current one named by stage
            with self._lock:
                current = dict(self.jobs[job_id].get("progress") or {})
                if "unit" in progress:
                    current.update(stage=name, stages={**(current.get("stages") or {}), name: progress})
                else:
                    current.update({"source": name, **progress})
                current["updated_at"] = _now()
                self.jobs[job_id]["progress"] = current
        return report

    def _run(self, job_id: str, work) -> None:
        with self._run_lock:
            job = self.jobs[job_id]
            job.update(status="running", started_at=_now())
            try:
                outcome = work(self._progress(job_id))
                if self.on_published is not None:
                    self.on_published()
                with self._lock:
                    job.update(status="succeeded", **outcome)
            except Exception as error:  # noqa: BLE001 - reported through the job, never raised into the server
                job.update(status="failed", error=f"{type(error).__name__}: {error}")
            finally:
                job["finished_at"] = _now()

    def get(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            job = self.jobs.get(job_id)
            return json.loads(json.dumps(job, default=str)) if job else None


class WebOptions(BaseModel):
    """Crawl options of a web source (absent = the stored value, or the default for a new source; null is not a value)."""

    model_config = ConfigDict(extra="forbid")

    depth: JsonInt = Field(None, ge=0, le=5, description="Link hops followed from the base URL, 0-5 (default 2).")
    include: list[str] = Field(None, description="Only URLs matching one of these regexes (re.search on the full URL).")
    exclude: list[str] = Field(None, description="Skip URLs matching any of these regexes.")
    respect_robots: bool = Field(None, strict=True)
    requests_per_second: float = Field(None, ge=0.01, strict=True, description="Politeness limit per host (default 5).")
    max_pages: JsonInt = Field(None, ge=1, description="Page cap (default 500).")
    use_llms_txt: bool = Field(None, strict=True)
    use_sitemap: bool = Field(None, strict=True)
    llms_full_max_mb: float = Field(None, ge=0.01, strict=True)


class SourceBody(WebOptions):
    name: str = Field(..., pattern=SOURCE_NAME_PATTERN,
                      description="Unique name: letters, digits, '.', '_', '-' (also the Dagster partition key).")
    kind: Literal["web", "folder"] = "web"
    url: str | None = Field(None, description="Base URL of the site (kind web).")
    folder: str | None = Field(None, description="Folder on this machine (kind folder).")
    enabled: bool = Field(True, strict=True)
    sync: bool = Field(False, strict=True, description="Start a sync job right away (202 with its status URL).")


class SourceUpdateBody(WebOptions):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    name: str = Field(None, pattern=SOURCE_NAME_PATTERN)
    enabled: bool = Field(None, strict=True)


WEB_OPTION_FIELDS = tuple(WebOptions.model_fields)


def _refresh_quietly(engine: RetrievalEngine) -> None:
    try:
        engine.snapshots.refresh()
    except IndexNotBuiltError:
        pass


def _now() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


# ------------------------------------------------------------------ the app

def _field_error(error: dict) -> dict[str, str]:
    """One pydantic error as ``{field, message}``; malformed JSON names the body and the position."""
    if error.get("type") == "json_invalid":
        loc = error.get("loc", ())
        position = loc[-1] if loc and isinstance(loc[-1], int) else None
        detail = (error.get("ctx") or {}).get("error", "invalid JSON")
        where = f" at character {position}" if position is not None else ""
        return {"field": "body", "message": f"the body is not valid JSON{where}: {detail}"}
    return {"field": _field_of(error.get("loc", ())), "message": error.get("msg", "invalid")}


def _allowed_methods(request: Request) -> list[str]:
    """The methods every route of this path accepts (for the Allow header of a 405)."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match != Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return sorted(methods - {"HEAD"}) or ["GET"]


def _field_of(loc: tuple | list) -> str:
    """``("body", "filters", "paths")`` -> ``filters.paths``; the first element is where it came from."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "form", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def create_app(settings: Settings | None = None, engine: RetrievalEngine | None = None, mount_mcp: bool = True) -> FastAPI:
    settings = settings or Settings()
    settings.uploads_dir.mkdir(parents=True, exist_ok=True)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    query_log = engine.query_log if engine is not None else QueryLog(settings.logs_path)
    engine = engine or RetrievalEngine(settings, query_log=query_log)
    metrics = Metrics(settings.store_path)
    if query_log.lines is None:  # one JSON line per query on stdout and in the rotated logs/query.log (seed 004)
        query_log.lines = QueryLines(settings.data_dir / "logs" if settings.query_log_file else None,
                                     stdout=settings.query_log_stdout, max_mb=settings.query_log_max_mb,
                                     keep_days=settings.query_log_keep_days)
    jobs = IngestJobs(settings, engine.embedder, on_published=lambda: _refresh_quietly(engine))
    search_limiter = anyio.CapacityLimiter(settings.search_workers)
    started_at = time.time()
    mcp_lifespan = None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        threading.Thread(target=_warm, args=(engine,), daemon=True, name="warm-up").start()
        if mcp_lifespan is not None:
            async with mcp_lifespan(app):
                yield
        else:
            yield
        query_log.flush(timeout_s=5.0)

    app = FastAPI(
        title="Groundwork",
        version="0.1.0",
        description="Grounded retrieval with citations: query, feedback, ingestion, documents, articles. "
                    "Every error has the body {error, message} (422 adds errors: [{field, message}]).",
        lifespan=lifespan,
        responses=COMMON_ERRORS,
    )

    # the configured limits are part of the contract: the schema states them
    rerankers = tuple(engine.available_rerankers())
    answer_modes = ("extractive", "none") + (("llm",) if settings.llm_base_url and settings.llm_model else ())

    served_query_body = create_model(
        "QueryBody", __base__=QueryBody,
        query=(str, Field(..., max_length=settings.max_query_chars, json_schema_extra={"minLength": 1, "pattern": r"\S"},
                          description="Free text: a question, a prompt fragment, a parameter name (not only whitespace).")),
        reranker=(Annotated[Literal[RERANKERS], WithJsonSchema({"type": "string", "enum": list(rerankers)})] | None,  # type: ignore[valid-type]
                  Field(None, description="Reorders the fused candidates; the rerankers this server can run "
                                          "(cross-encoder needs GROUNDWORK_CROSS_ENCODER_PATH). Default: default_reranker.")),
        answer=(Annotated[Literal["extractive", "llm", "none"], WithJsonSchema({"type": "string", "enum": list(answer_modes)})],
                Field("extractive", description="extractive (sentences of the passages, cited), none, or llm when an "
                                                "OpenAI-compatible endpoint is configured.")),
    )
    ask_modes = ("extractive",) + (("llm",) if "llm" in answer_modes else ())
    ask_overrides = dict(
        query=(str, Field(..., max_length=settings.max_query_chars, json_schema_extra={"minLength": 1, "pattern": r"\S"},
                          description="The question.")),
        answer=(Annotated[Literal["extractive", "llm"], WithJsonSchema({"type": "string", "enum": list(ask_modes)})],
                Field("extractive", description="extractive (sentences of the sources, cited [n]) or llm when an "
                                                "OpenAI-compatible endpoint is configured.")),
    )
    served_ask_body = create_model("AskBody", __base__=AskBody, **ask_overrides)
    served_ask_local_body = create_model("AskLocalBody", __base__=AskLocalBody, **ask_overrides)
    served_feedback_body = create_model(
        "FeedbackBody", __base__=FeedbackBody, note=(str | None, Field(None, max_length=settings.max_note_chars)))
    app.state.settings = settings
    app.state.engine = engine
    policy = OriginPolicy.from_settings(settings)
    app.state.origin_policy = policy
    app.state.query_log = query_log
    app.state.jobs = jobs
    app.state.metrics = metrics

    # -------------------------------------------------------------- middleware & errors
    @app.middleware("http")
    async def observe(request: Request, call_next):
        began = time.perf_counter()
        route = request.url.path
        try:
            response = await call_next(request)
        except Exception:
            metrics.observe(request.method, _route_template(request), 500, time.perf_counter() - began)
            raise
        metrics.observe(request.method, _route_template(request) or route, response.status_code, time.perf_counter() - began)
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = [_field_error(e) for e in exc.errors()]
        message = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return JSONResponse(status_code=422, content={"error": "validation_error", "message": message, "errors": errors})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # one error shape everywhere: {error, message} (detail kept for FastAPI-style clients)
        kind = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 410: "gone"}.get(exc.status_code, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # every method of this path, not only those of the first route that matched it
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return JSONResponse(status_code=exc.status_code, content={"error": kind, "message": str(exc.detail), "detail": exc.detail},
                            headers=headers or None)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception):
        # the {error, message} promise holds for bugs too; the traceback goes to the server log, never the client
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(status_code=500, content={"error": "internal_error", "message": (
            f"unexpected {type(exc).__name__} while handling {request.method} {request.url.path}; "
            "the server log has the details")})

    def field_error(request: Request, exc: QueryValidationError | InvalidSourceError):
        return JSONResponse(status_code=422, content={"error": "validation_error", "message": str(exc),
                                                      "errors": [{"field": exc.field, "message": str(exc)}]})

    app.add_exception_handler(QueryValidationError, field_error)
    app.add_exception_handler(InvalidSourceError, field_error)

    def plain_error(status: int, code: str):
        def handler(request: Request, exc: Exception):
            return JSONResponse(status_code=status, content={"error": code, "message": str(exc)})
        return handler

    for error_type, status, code in (
        (IndexNotBuiltError, 503, "index_not_built"),
        (SourceNotFoundError, 404, "source_not_found"),
        (FailureNotFoundError, 404, "failure_not_found"),
        (SourceExistsError, 409, "source_conflict"),
    ):
        app.add_exception_handler(error_type, plain_error(status, code))

    @app.exception_handler(GroundworkError)
    async def groundwork_error(request: Request, exc: GroundworkError):
        return JSONResponse(status_code=503, content={"error": type(exc).__name__, "message": redact(str(exc))})

    # -------------------------------------------------------------- query & feedback
    @app.post("/api/knowledge/query", tags=["knowledge"], response_model=out.QueryResponse)
    async def query(body: served_query_body, request: Request) -> dict[str, Any]:  # type: ignore[valid-type]
        """Hybrid retrieval with citations; the response's ``retrieval_request_id`` is what feedback refers to."""
        # a few search workers, not one thread per request: on 2 cores 40 threads fighting over the
        # GIL and torch is slower; waiting requests still share model calls (BatchingEmbedder)
        response = await anyio.to_thread.run_sync(
            lambda: engine.search(
                body.query, k=body.k, alpha=body.alpha, fusion=body.fusion, section_weight=body.section_weight,
                lead_weight=body.lead_weight, reranker=body.reranker, filters=body.filters,
                min_relevance=body.min_relevance, answer=body.answer, client="api",
            ),
            limiter=search_limiter,
        )
        out = response.to_dict()
        base = str(request.base_url).rstrip("/")
        for item in out["results"]:
            fragment = item["url"].split("#", 1)[1] if "#" in item["url"] else ""
            item["source_url"] = f"{base}/api/knowledge/sources/{item['doc_id']}/file" + (f"#{fragment}" if fragment else "")
        metrics.query_latency.observe(response.latency_ms["total"] / 1000.0)
        return out

    async def _ask(body: AskBody, request: Request, **local: Any) -> dict[str, Any]:
        from knowledge_store.server.ask import ask

        if body.answer not in ask_modes:
            raise QueryValidationError("answer", body.answer, "no LLM configured (set GROUNDWORK_LLM_BASE_URL and "
                                                              "GROUNDWORK_LLM_MODEL)")
        base = str(request.base_url).rstrip("/")
        result = await anyio.to_thread.run_sync(
            lambda: ask(engine, base, body.query, top_k=body.top_k, max_sources=min(body.max_sources, body.top_k),
                        answer=body.answer, **local),
            limiter=search_limiter,
        )
        metrics.query_latency.observe(result["latency_ms"] / 1000.0)
        return result

    @app.post("/api/ask", tags=["knowledge"], response_model=out.AskResponse)
    async def ask_book(body: served_ask_body, request: Request) -> dict[str, Any]:  # type: ignore[valid-type]
        """Seed 002's ``/ask``: ``{query}`` -> ``{answer, sources: [{file, section, url, pages}]}``; the answer is
        made from the best ``max_sources`` (3) of the ``top_k`` (10) ranked passages and cites them as ``[n]``."""
        return await _ask(body, request, client="api-ask")

    @app.post("/api/ask-local", tags=["knowledge"], response_model=out.AskResponse)
    async def ask_local(body: served_ask_local_body, request: Request) -> dict[str, Any]:  # type: ignore[valid-type]
        """Seed 002's ``/ask-local``: a question about selected text; retrieval only in ``source_file`` (422 when it
        matches no indexed document), searching for the question and the selected ``context``."""
        return await _ask(body, request, context=body.context, source_file=body.source_file, client="api-ask-local")

    @app.post("/api/knowledge/feedback", status_code=201, tags=["knowledge"], response_model=out.FeedbackStored,
              responses=error_responses(404))
    def feedback(body: served_feedback_body) -> dict[str, Any]:  # type: ignore[valid-type]
        """Thumbs up/down (and an optional note) on a logged request or one of its passages."""
        if body.note is not None and len(body.note) > settings.max_note_chars:
            raise QueryValidationError("note", f"{len(body.note)} characters", f"must be at most {settings.max_note_chars} characters")
        record = query_log.get(body.retrieval_request_id)
        if record is None:
            raise HTTPException(status_code=404, detail=f"unknown retrieval_request_id '{body.retrieval_request_id}'")
        if body.chunk_id is not None:
            shown = {r.get("chunk_id") for r in record.results_post} | {r.get("chunk_id") for r in record.results_pre}
            if body.chunk_id not in shown:
                raise QueryValidationError("chunk_id", body.chunk_id, f"was not among the results of request {body.retrieval_request_id}")
        stored = query_log.add_feedback(body.retrieval_request_id, body.rating, chunk_id=body.chunk_id, note=body.note)
        metrics.feedback.labels(rating=body.rating).inc()
        engine.forget_feedback_cache()
        return stored

    @app.get("/api/knowledge/feedback", tags=["knowledge"], response_model=out.FeedbackList)
    def list_feedback(since: IsoDatetime | None = Query(None, description="ISO-8601; only feedback created after this"),
                      limit: int = Query(100, ge=1, le=10000)) -> dict[str, Any]:
        if since is not None and since.tzinfo is not None:
            since = since.astimezone(timezone.utc).replace(tzinfo=None)
        rows = query_log.list_feedback(since=since, limit=limit)
        return {"feedback": rows, "count": len(rows)}

    # -------------------------------------------------------------- ingestion
    @app.post("/api/knowledge/ingest", status_code=202, tags=["ingestion"], response_model=out.UploadAccepted,
              responses=error_responses(409, 413))
    async def ingest(file: UploadFile = File(...), force: bool = Form(False), request: Request = None) -> JSONResponse:
        """Upload a PDF/DOCX/HTML/MD/TXT file; it is checked, stored in the uploads source and ingested."""
        name = Path(file.filename or "").name
        suffix = Path(name).suffix.lower()
        if not name or suffix not in UPLOAD_TYPES:
            raise QueryValidationError("file", name or "(no name)", f"unsupported type; allowed: {', '.join(sorted(UPLOAD_TYPES))}")
        declared = request.headers.get("content-length") if request else None
        if declared and declared.isdigit() and int(declared) > settings.max_file_bytes + 1024 * 64:
            return _too_large(int(declared), settings)
        digest = hashlib.sha256()
        size = 0
        tmp = tempfile.NamedTemporaryFile(dir=settings.data_dir, prefix=".upload-", suffix=suffix, delete=False)
        try:
            while chunk := await file.read(1024 * 1024):
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
        job = jobs.submit([str(target)])
        base = str(request.base_url).rstrip("/") if request else ""
        return JSONResponse(status_code=202, content={**job, "sha256": checksum, "size_bytes": size, "stored_as": target.name,
                                                      "status_url": f"{base}/api/knowledge/jobs/{job['job_id']}"})

    @app.get("/api/knowledge/jobs/{job_id}", tags=["ingestion"], response_model=out.Job, responses=error_responses(404))
    def job_status(job_id: str) -> dict[str, Any]:
        job = jobs.get(job_id)
        if job is None:
            raise HTTPException(status_code=404, detail=f"unknown job_id '{job_id}'")
        return job

    # -------------------------------------------------------------- source registry
    def _job_response(request: Request, job: dict[str, Any], **extra: Any) -> JSONResponse:
        base = str(request.base_url).rstrip("/")
        return JSONResponse(status_code=202, content={**job, **extra,
                                                      "status_url": f"{base}/api/knowledge/jobs/{job['job_id']}"})

    def _sync_job(name: str, refresh: bool = False) -> dict[str, Any]:
        from knowledge_store.ingest.run import run_sync

        def work(progress) -> dict[str, Any]:
            report = run_sync(settings, jobs.embedder, trigger="api", names=[name], progress=progress, refresh=refresh)
            raw = report.raw
            return {"summary": report.summary, "snapshot_version": report.publish.snapshot_version,
                    "added": raw.added, "updated": raw.updated, "removed": raw.removed, "unchanged": raw.unchanged,
                    "excluded": raw.excluded, "failed": raw.failed + report.parse.failed,
                    "crawl": {k: v for k, v in raw.crawls.get(name, {}).items() if k != "excluded_preview"} or None,
                    "documents_indexed": report.publish.document_count, "chunks_indexed": report.publish.chunk_count}

        return jobs.submit_task("sync", work, source=name)

    def _writer():
        from knowledge_store.store import store_connection

        return store_connection(settings.store_path, timeout_s=min(settings.lock_timeout_s, 10.0))

    @app.get("/api/sources", tags=["sources"], response_model=out.SourceList)
    def sources_list(include_deleted: bool = False) -> dict[str, Any]:
        """Every source with its counts and last sync."""
        from knowledge_store.sources import list_sources, register_configured_sources, source_statistics

        with _writer() as conn:
            configured = {s.source_id for s in register_configured_sources(conn, settings)}
            # configured=false: a folder the settings no longer name (indexed, not synced; DELETE removes it)
            rows = [{**s.as_dict(), "statistics": source_statistics(conn, s.source_id),
                     "configured": s.origin != "settings" or s.source_id in configured}
                    for s in list_sources(conn, include_deleted=include_deleted)]
        return {"sources": rows}

    @app.post("/api/sources", status_code=201, tags=["sources"], response_model=out.SourceCreated,
              responses={**error_responses(409), "202": {"model": out.JobAccepted,
                                                         "description": "Registered, and its first sync started (sync: true)."}})
    def sources_add(body: SourceBody, request: Request):
        """Register a web site or a folder; ``sync: true`` starts its first sync (202 + job)."""
        from knowledge_store.sources import add_source

        options = {k: getattr(body, k) for k in WEB_OPTION_FIELDS if getattr(body, k) is not None}
        if body.kind == "web" and not body.url:
            raise InvalidSourceError("url", None, "a web source needs a base URL")
        if body.kind == "folder":
            if not body.folder:
                raise InvalidSourceError("folder", None, "a folder source needs a folder")
            if options:
                raise InvalidSourceError(next(iter(options)), next(iter(options.values())),
                                         "crawl options apply to web sources only")
        with _writer() as conn:
            source = add_source(conn, body.name, body.kind, body.url if body.kind == "web" else body.folder,
                                options, enabled=body.enabled)
        if body.sync and source.enabled:
            return _job_response(request, _sync_job(source.name), source=source.as_dict())
        return JSONResponse(status_code=201, content={"source": source.as_dict()})

    @app.get("/api/sources/{name}", tags=["sources"], response_model=out.Open, responses=error_responses(404))
    def sources_show(name: str) -> dict[str, Any]:
        """One source: options, document/page/chunk counts, last sync summary, open failures."""
        from knowledge_store.ingest.source_actions import describe_source

        return json.loads(json.dumps(describe_source(settings, name), default=str))

    @app.patch("/api/sources/{name}", tags=["sources"], response_model=out.SourceUpdated, responses=error_responses(404, 409))
    def sources_update(name: str, body: SourceUpdateBody) -> dict[str, Any]:
        """Change options; ``resync_needed`` says when the index no longer matches the rules."""
        from knowledge_store.sources import update_source

        changes = body.model_dump(exclude_none=True)
        if not changes:
            raise InvalidSourceError("body", {}, "nothing to update")
        with _writer() as conn:
            source, changed, resync = update_source(conn, name, changes)
        return {"source": source.as_dict(), "changed": changed, "resync_needed": source.resync_needed,
                "message": (f"re-sync needed: POST /api/sources/{source.name}/sync to apply the new rules"
                            if resync else "no re-sync needed")}

    @app.delete("/api/sources/{name}", tags=["sources"], response_model=out.SourceDeleted, responses=error_responses(404))
    def sources_delete(name: str) -> dict[str, Any]:
        """Soft-delete: the source's chunks leave the index before this returns; purged after retention."""
        from knowledge_store.ingest.source_actions import delete_source_now

        result = delete_source_now(settings, name)
        engine.snapshots.refresh()  # serve the snapshot without the source from the next query on
        return result

    @app.post("/api/sources/{name}/sync", status_code=202, tags=["sources"], response_model=out.JobAccepted,
              responses=error_responses(404))
    def sources_sync(name: str, request: Request, refresh: bool = False):
        """Re-sync one source now (scan or crawl, parse, chunk, embed, publish); poll the job for progress.
        ``refresh=true`` downloads every page of a web source again (ignores lastmod and validators)."""
        from knowledge_store.sources import get_source

        with _writer() as conn:
            source = get_source(conn, name)
        if not source.enabled:
            raise InvalidSourceError("enabled", False, f"source {name!r} is disabled; PATCH enabled=true first")
        return _job_response(request, _sync_job(source.name, refresh), refresh=refresh)

    @app.get("/api/failures", tags=["sources"], response_model=out.FailureList)
    def failures_list() -> dict[str, Any]:
        """Open ingestion failures (files and URLs), newest first."""
        from knowledge_store.ingest.failures import open_failures
        from knowledge_store.store import store_connection

        with store_connection(settings.store_path, read_only=True, timeout_s=5.0) as conn:
            return json.loads(json.dumps({"failures": open_failures(conn)}, default=str))

    @app.post("/api/failures/{failure_id}/retry", status_code=202, tags=["sources"], response_model=out.JobAccepted,
              responses=error_responses(404))
    def failures_retry(failure_id: str, request: Request):
        """Run one failed item again (fetch the URL, parse the version, or re-scan its source)."""
        from knowledge_store.ingest.source_actions import open_failure, retry_failure
        from knowledge_store.store import store_connection

        with store_connection(settings.store_path, read_only=True, timeout_s=5.0) as conn:
            failure = open_failure(conn, failure_id)

        def work(progress) -> dict[str, Any]:
            outcome = retry_failure(settings, failure_id, jobs.embedder, progress=progress)
            return {"summary": outcome["summary"], "snapshot_version": outcome["snapshot_version"],
                    "resolved": outcome["resolved"], "still_failing": outcome["still_failing"]}

        return _job_response(request, jobs.submit_task("retry", work, failure_id=failure_id, path=failure["path"]))

    # -------------------------------------------------------------- documents & sources
    @app.get("/api/knowledge/documents", tags=["documents"], response_model=out.DocumentList)
    def documents(include_history: bool = True) -> dict[str, Any]:
        """Documents with their versions and status (from the store; from the snapshot while a sync holds it)."""
        from knowledge_store.status import store_status

        try:
            status = store_status(settings.model_copy(update={"lock_timeout_s": 1.0}), include_history=include_history)
            return {"source": "store", "documents": status["documents"], "counts": status["counts"],
                    "index_snapshot": status["index_snapshot"]}
        except StoreError as error:
            snapshot = engine.snapshots.current()
            docs = [{k: v for k, v in d.items()} for d in snapshot.documents]
            return {"source": "snapshot", "note": str(error), "documents": docs,
                    "index_snapshot": {"snapshot_version": snapshot.info.snapshot_version}}

    @app.get("/api/knowledge/documents/{doc_id}/relations", tags=["documents"], response_model=out.DocumentRelations,
             responses=error_responses(404))
    def document_relations(doc_id: str) -> dict[str, Any]:
        """Seed 003's relations of one document, from the published snapshot: the revisions (other files with
        the same asset id or title) it supersedes or that supersede it, and the documents it links to or is
        linked from (seeAlso), each with confidence and evidence; plus its rev_label and validity."""
        from knowledge_store.retrieval.snapshot_reader import document_relations as relations_of

        found = relations_of(engine.snapshots.current(), doc_id)
        if found is None:
            raise HTTPException(status_code=404, detail=f"unknown doc_id '{doc_id}' (not in index snapshot "
                                                        f"{engine.snapshots.current().info.snapshot_version})")
        return found

    @app.get("/api/knowledge/sources/{doc_id}/file", tags=["documents"], response_class=FileResponse,
             responses={"200": {"description": "The original file, inline, with its own media type.",
                                "content": {media: {"schema": {"type": "string", "format": "binary"}}
                                            for media in ORIGINAL_MEDIA_TYPES}},
                        **error_responses(404, 410)})
    def source_file(doc_id: str):
        """The original file of a document, inline, so ``#page=N`` links open at the page."""
        snapshot = engine.snapshots.current()
        doc = next((d for d in snapshot.documents if d["doc_id"] == doc_id and d["status"] == "active"), None) or \
            next((d for d in snapshot.documents if d["doc_id"] == doc_id), None)
        if doc is None:
            raise HTTPException(status_code=404, detail=f"unknown doc_id '{doc_id}'")
        path = Path(doc["path"])
        if not path.is_file():
            raise HTTPException(status_code=410, detail=f"the file of '{doc['title']}' is no longer at its source")
        served = _inside_its_source(snapshot, doc, path)
        if served is None:
            # e.g. replaced by a link to /etc/passwd after it was indexed: never serve what the source does not hold
            raise HTTPException(status_code=410, detail=f"the file of '{doc['title']}' now leads outside its source "
                                                        "folder (a symbolic link); it is not served")
        media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix.lower() in (".md", ".markdown", ".txt", ".text"):
            media = "text/plain"
        if media not in ORIGINAL_MEDIA_TYPES:
            media = "application/octet-stream"
        if media.startswith("text/"):
            media += "; charset=utf-8"
        # an ingested HTML page must not run scripts in this server's origin (it would pass the origin policy):
        # the sandbox CSP gives it an opaque origin with scripts off; nosniff stops content-type guessing
        return FileResponse(served, media_type=media, headers={
            "Content-Disposition": f'inline; filename="{path.name}"', "Content-Security-Policy": "sandbox",
            "X-Content-Type-Options": "nosniff"})

    @app.get("/api/kb/articles", tags=["documents"], response_model=out.ArticlePage, response_model_exclude_unset=True,
             responses={"500": {"model": out.ErrorBody, "description": "The knowledge base is unavailable (no index "
                                "yet, or it cannot be read): {\"error\": \"Internal server error\", \"message\": "
                                "\"Knowledge base unavailable\"}."}})
    def articles(request: Request,
                 intent: str | None = Query(None, description="Only articles with this intent (metadata intent/tags) "
                                            "or with all its words in the title; not_hashing = Not hashing."),
                 device: str | None = Query(None, description="Only articles for this device (metadata device/product)."),
                 updated_since: IsoDatetime | None = Query(None, description="Only articles updated at or after this "
                                                           "moment (ISO-8601)."),
                 limit: int = Query(100, ge=1, le=1000, description="Articles per page."),
                 offset: int = Query(0, ge=0, description="Where the page starts (the previous page's next_offset).")):
        """Every active document as a knowledge-base article (seed 001, contract 1): full content once,
        ``metadata`` with ``intent``, ``device``, ``last_updated`` (always) and ``author``; filtered and paginated.
        Errors are 500 ``{"error": "Internal server error", "message": "Knowledge base unavailable"}``."""
        from knowledge_store.server.kb_articles import KB_UNAVAILABLE, list_articles

        try:
            snapshot = engine.snapshots.current()
            return list_articles(settings, snapshot, str(request.base_url).rstrip("/"), intent=intent, device=device,
                                 updated_since=updated_since, limit=limit, offset=offset)
        except GroundworkError as error:  # no index yet, store/snapshot unreadable: expected, no traceback
            log.warning("GET /api/kb/articles: knowledge base unavailable: %s", redact(str(error)))
            return JSONResponse(status_code=500, content=dict(KB_UNAVAILABLE))
        except Exception:  # noqa: BLE001 - the contract's one error body; the cause goes to the server log
            log.exception("GET /api/kb/articles failed")
            return JSONResponse(status_code=500, content=dict(KB_UNAVAILABLE))

    @app.get("/api/knowledge/config", tags=["knowledge"], response_model=out.ConfigResponse)
    def config() -> dict[str, Any]:
        """Defaults and limits clients need (the console reads them); no secrets.

        The ranking defaults are the *effective* ones: a setting set explicitly wins, then a value set in the
        console (PUT /api/knowledge/ranking), then the corpus's self-tuned choice (``groundwork tune``), then the
        built-in default; ``ranking_sources`` / ``reranker_source`` say which applied to each value and ``tuned``
        summarises the tuning run (null when the corpus is not tuned)."""
        from knowledge_store.tuning import load_tuned, ranking_sources, reranker_source

        index_dir = engine.snapshots.index_dir
        ranking = engine.ranking_defaults()
        tuned = load_tuned(index_dir)
        return {
            "default_k": settings.default_k, "max_k": 100, "default_alpha": ranking.alpha,
            "default_fusion": ranking.fusion, "section_weight": ranking.section_weight,
            "lead_weight": ranking.lead_weight, "fusion_modes": dict(FUSION_MODES),
            "ranking_sources": ranking_sources(engine.settings, index_dir),
            "tuned": None if tuned is None else {
                "created_at": tuned.created_at, "snapshot_version": tuned.snapshot_version,
                "pseudo_queries": tuned.pseudo_queries, "before": tuned.before, "after": tuned.after,
                "seconds": tuned.seconds, "in_use": engine.settings.use_tuned_ranking,
            },
            "default_reranker": engine.default_reranker(), "reranker_source": reranker_source(engine.settings, index_dir),
            "rerankers": list(rerankers), "answer_modes": list(answer_modes),
            "min_relevance": settings.min_relevance, "max_query_chars": settings.max_query_chars,
            "max_note_chars": settings.max_note_chars, "max_upload_mb": settings.max_file_mb,
            "upload_types": sorted(UPLOAD_TYPES), "llm_answers": bool(settings.llm_base_url and settings.llm_model),
        }

    # the console's Settings and Evaluation pages: corpus ranking defaults (tuned.json), evaluation results
    from knowledge_store.server.admin_api import add_admin_routes

    add_admin_routes(app, settings, engine, rerankers)

    # -------------------------------------------------------------- operations
    @app.get("/health", tags=["operations"], response_model=out.Health,
             responses={"503": {"model": out.Health, "description": "Degraded: no index yet (reason says why)."}})
    def health() -> JSONResponse:
        body: dict[str, Any] = {"status": "ok", "uptime_s": round(time.time() - started_at, 1),
                                "store": settings.store_path.exists(), "model_loaded": engine.embedder.loaded}
        if callable(getattr(engine.embedder, "stats", None)):
            body["query_cache"] = engine.embedder.stats()  # query-embedding cache: hits, misses, hit_rate
        try:
            snapshot = engine.snapshots.current()
            body["index"] = {"snapshot_version": snapshot.info.snapshot_version, "chunks": int(snapshot.active.sum()),
                             "documents": snapshot.info.document_count, "published": snapshot.info.created_at}
        except GroundworkError as error:
            body.update(status="degraded", index=None, reason=str(error))
        return JSONResponse(status_code=200 if body["status"] == "ok" else 503, content=body)

    @app.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
    def prometheus_metrics() -> PlainTextResponse:
        try:
            metrics.snapshot_version.set(engine.snapshots.current().info.snapshot_version)
        except GroundworkError:
            pass
        return PlainTextResponse(metrics.render(), media_type=metrics.content_type)

    def _inside_its_source(snapshot, doc: dict[str, Any], path: Path) -> Path | None:
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

    def openapi_schema() -> dict[str, Any]:
        # errors are JSON on every route, also where the success body is not (/metrics, /file)
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    for code, response in operation.get("responses", {}).items():
                        if code[0] in "45":
                            response["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi_schema

    if mount_mcp:
        try:
            from knowledge_store.server.mcp_server import mount_mcp as _mount

            mcp_lifespan = _mount(app, engine, transport_security=mcp_transport_security(policy))
        except ImportError:  # the MCP module is optional for the HTTP API
            mcp_lifespan = None

    # outermost last: the Host/Origin policy refuses before CORS, routing or body parsing run
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_credentials=False,
                           allow_methods=["GET", "POST", "PATCH", "DELETE"], allow_headers=["content-type"],
                           expose_headers=["retry-after"], max_age=600)
    app.add_middleware(OriginPolicyMiddleware, policy=policy)

    if STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

        @app.get("/", include_in_schema=False)
        def console() -> FileResponse:
            return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

        @app.get("/widget.js", include_in_schema=False)
        def chat_widget(request: Request) -> Response:
            """The embeddable docs-site chat widget (docs/WIDGET.md): one ``<script src=".../widget.js">`` on any
            page.  Loaded cross-origin by a classic script tag (no ``Origin`` header, so the origin policy serves
            it to any page; its API calls are what ``GROUNDWORK_CORS_ORIGINS`` governs).  Revalidation by ETag
            answers 304, so every page view of a docs site costs a header exchange, not the script."""
            path = STATIC_DIR / "widget.js"
            response = FileResponse(path, media_type="text/javascript; charset=utf-8", headers=WIDGET_HEADERS,
                                    stat_result=path.stat())
            wanted = {tag.strip().removeprefix("W/") for tag in request.headers.get("if-none-match", "").split(",")}
            if response.headers["etag"] in wanted or "*" in wanted:
                return NotModifiedResponse(response.headers)
            return response
    else:
        @app.get("/", include_in_schema=False)
        def root() -> RedirectResponse:
            return RedirectResponse("/docs")

    return app


def _warm(engine: RetrievalEngine) -> None:
    try:
        engine.warm_up()
    except Exception:  # noqa: BLE001 - /health reports what is missing
        pass


def _route_template(request: Request) -> str:
    route = request.scope.get("route")
    return getattr(route, "path", None) or request.url.path


def _too_large(size: int, settings: Settings) -> JSONResponse:
    return JSONResponse(status_code=413, content={
        "error": "too_large", "message": f"file is {size / 1048576:.1f} MB, over the {settings.max_file_mb:g} MB limit"})


def _check_content(path: Path, name: str, suffix: str) -> None:
    from knowledge_store.errors import IngestionError
    from knowledge_store.parsers.detect import detect_type

    try:
        detected = detect_type(path)
    except IngestionError as error:
        raise QueryValidationError("file", name, error.reason) from error
    if detected != UPLOAD_TYPES[suffix]:
        raise QueryValidationError("file", name, f"extension {suffix} does not match the content, which looks like {detected}")


def _find_duplicate(settings: Settings, checksum: str) -> dict[str, Any] | None:
    from knowledge_store.store import store_connection

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
    target = folder / name
    stem, suffix = Path(name).stem, Path(name).suffix
    counter = 1
    while os.path.lexists(target):  # a dangling link is taken too: never write through it
        target = folder / f"{stem}-{counter}{suffix}"
        counter += 1
    return target


def serve(settings: Settings | None = None) -> None:
    """Run the API with uvicorn on the configured host/port (loopback unless allowed)."""
    import ipaddress

    import uvicorn

    settings = settings or Settings()
    host = settings.server_host
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost
        loopback = False
    if not loopback and not settings.allow_remote:
        raise GroundworkError(
            f"refusing to bind to {host}: set GROUNDWORK_ALLOW_REMOTE=true to serve beyond this machine"
        )
    uvicorn.run(create_app(settings), host=host, port=settings.server_port, log_level="info", access_log=False)

