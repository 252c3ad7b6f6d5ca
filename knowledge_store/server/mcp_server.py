"""The MCP server: Groundwork's retrieval as two tools for IDE agents and assistants.

Built on the official ``mcp`` SDK (2.x: ``mcp.server.mcpserver.MCPServer``, the
successor of v1's ``FastMCP``).

Tools
-----
- ``search(query, k=5, filters=None, alpha=None, reranker=None, fusion=None,
  section_weight=None, lead_weight=None)`` - cited passages (unset ranking
  arguments: the corpus's effective defaults, self-tuned when tuned).  Returns a readable numbered list as text *and* structured content
  (``retrieval_request_id``, ``coverage``, ``results[]``, ``answer``) matching
  the tool's advertised ``outputSchema``.
- ``get_document(chunk_id, neighbours=1)`` - a cited chunk's full text with its
  neighbours in the same document version, in order.

Errors
------
- Bad arguments (``k`` out of range, bad ``alpha``, unknown ``reranker``, unknown
  filter keys, unknown argument names, wrong types) are JSON-RPC errors with code
  ``-32602`` (Invalid params); ``message`` names the field and ``data.field``
  carries it.  The SDK alone would turn schema-validation failures into
  ``isError`` tool results, so :class:`InvalidParamsMiddleware` validates
  ``tools/call`` arguments first, and engine-level checks
  (``QueryValidationError``) are raised as ``MCPError(INVALID_PARAMS)``.
- An unknown ``chunk_id``, a missing index, an unavailable reranker: an
  ``isError`` tool result whose text says what is wrong (the model can read it).
- An unknown tool name: the SDK's own behaviour, an ``isError`` result
  ``"Unknown tool: <name>"``; an unknown *method*: ``-32601``.
- Over HTTP: malformed JSON ``-32700``, a body that is not a JSON-RPC message
  ``-32600`` (the SDK's legacy path would answer ``-32602``; see
  :class:`_JSONRPCBodyCheck`).

Transports
----------
- stdio: :func:`run_stdio` (what ``groundwork mcp`` runs).
- Streamable HTTP (stateless, JSON responses) inside an existing FastAPI /
  Starlette app: :func:`mount_mcp`, or :func:`mcp_http_app` for the raw ASGI
  app and its lifespan.  The SDK's session manager must be running inside the
  parent app's lifespan; see :func:`mount_mcp`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from importlib.metadata import version
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import GroundworkError
from knowledge_store.retrieval.citations import Citation, citation_url
from knowledge_store.retrieval.engine import NO_RESULTS, QueryValidationError, RetrievalEngine
from knowledge_store.retrieval.filters import SearchFilters
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.reranker_registry import RERANKER_REGISTRY, RERANKERS, RerankerUnavailable

SERVER_NAME = "groundwork"

INSTRUCTIONS = """\
Groundwork searches a local, versioned knowledge base (manuals, docs, notes) and returns passages \
with their sources, so you can answer from them and cite them.

- `search(query, k=5, filters=None, alpha=None, reranker=None)`: hybrid keyword + semantic search. \
Returns numbered passages [n] with title, section, pages, a snippet, a link (`url`) and scores, \
plus `coverage` (high / medium / low / none: how well the best passages and their sentences answer) and a short \
extractive `answer`. Cite passages as [n] with their url. If it says "No relevant content found." \
(coverage "none"), the knowledge base does not cover the question: say so instead of guessing; words listed as \
"No document mentions" (`missing_terms`) appear in no document, so the passages cannot answer about them. \
`filters` restricts the search, e.g. {"paths": ["manuals/*.pdf"]}, {"sources": ["docs"]}, \
{"metadata": {"product": "aurora-hub"}}, {"entities": ["SOP-42"]} (passages mentioning an identifier or standard; \
each result lists the `entities` it mentions). `alpha` weights keywords (0) against meaning (1). \
`reranker` re-orders the passages: {rerankers}. \
`fusion`, `section_weight` and `lead_weight` fine-tune the ranking; usually leave them unset: the corpus's (self-tuned) defaults apply.
- `get_document(chunk_id, neighbours=1)`: the full text of a passage returned by `search` \
(by its `chunk_id`) with the passages around it in the same document version, for more context.
- `list_sources()`: what the knowledge base holds: each source (a folder, the uploads, a \
documentation website) with its kind, location and document and passage counts; use a name in \
`search(filters={"sources": [name]})`.\
"""
# the reranker choices worth explaining, from the registry (reranker_registry.RERANKER_REGISTRY)
INSTRUCTIONS = INSTRUCTIONS.replace("{rerankers}", "; ".join(
    f'"{spec.name}" ({spec.hint})' for spec in RERANKER_REGISTRY.values() if spec.hint))

# ---------------------------------------------------------------------------
# structured output


class SearchOutput(BaseModel):
    retrieval_request_id: str = Field(description="Id of this query in the query log (for feedback).")
    coverage: str = Field(description="high | medium | low | none: how well the best passage matches, capped by how "
                                      "well the sentences an extractive answer quotes from them answer the question.")
    results: list[Citation] = Field(description="The cited passages, best first: the same Citation model as the HTTP "
                                    "API's results (n is the marker [n] in the answer).")
    answer: str | None = Field(None, description="Short extractive answer with [n] markers, if any.")
    missing_terms: list[str] = Field(default_factory=list, description="Words of the query that no document contains: "
                                     "the passages cannot say anything about them.")


class DocumentChunk(BaseModel):
    chunk_id: str
    chunk_index: int
    section: str
    pages: list[int]
    url: str
    text: str
    is_cited: bool = Field(description="True for the chunk that was asked for.")


class DocumentOutput(BaseModel):
    chunk_id: str
    doc_id: str
    version: int
    title: str
    section: str
    pages: list[int]
    url: str
    status: str = Field(description="active, or superseded by a newer version of the document.")
    rev_label: str | None = Field(None, description="The document's revision label (Rev C, v2.1), if it has one.")
    valid_from: str | None = Field(None, description="ISO-8601 UTC: since when this version is the valid one.")
    valid_to: str | None = Field(None, description="ISO-8601 UTC: when it stopped being valid; null while it is.")
    superseded_by: str | None = Field(None, description="doc_id of the newer revision (another file) that replaced it.")
    supersedes: list[str] = Field(default_factory=list, description="doc_ids of older revisions it supersedes.")
    see_also: list[str] = Field(default_factory=list, description="doc_ids of documents it links to.")
    text: str = Field(description="Full text of the asked-for chunk.")
    chunks: list[DocumentChunk] = Field(description="The chunk and its neighbours, in document order.")


class SourceItem(BaseModel):
    name: str = Field(description="Use it in search filters: {\"sources\": [name]}.")
    kind: str = Field(description="folder | upload | web")
    location: str = Field(description="Folder path or the site's base URL.")
    documents: int = Field(description="Documents (pages, for a website) currently indexed.")
    chunks: int = Field(description="Passages currently indexed.")


class SourcesOutput(BaseModel):
    snapshot_version: int
    sources: list[SourceItem]


def source_summary(snapshot) -> SourcesOutput:
    """Per source: kind, location, active documents and chunks of the published snapshot."""
    docs_per: dict[str, set[str]] = {}
    chunks_per: dict[str, int] = {}
    names = [d["source_name"] for d in snapshot.documents]
    for index in snapshot.doc_index[snapshot.active]:
        name = names[int(index)]
        chunks_per[name] = chunks_per.get(name, 0) + 1
        docs_per.setdefault(name, set()).add(snapshot.documents[int(index)]["doc_id"])
    cursor = snapshot.conn.cursor()
    try:
        rows = cursor.execute("SELECT name, kind, location FROM sources ORDER BY name").fetchall()
    finally:
        cursor.close()
    items = [SourceItem(name=name, kind=kind, location=location, documents=len(docs_per.get(name, ())),
                        chunks=chunks_per.get(name, 0)) for name, kind, location in rows if name in chunks_per]
    return SourcesOutput(snapshot_version=snapshot.info.snapshot_version, sources=items)


# ---------------------------------------------------------------------------
# formatting


def _pages_label(pages: list[int]) -> str:
    if not pages:
        return ""
    if len(pages) == 1:
        return f" (p. {pages[0]})"
    return f" (pp. {pages[0]}\u2013{pages[-1]})"


def _short_section(title: str, section: str) -> str:
    """The section without a leading copy of the title ("Manual > Setup" -> "Setup")."""
    if title and section.startswith(title + " > "):
        return section[len(title) + 3:]
    return "" if section == title else section


def _heading(title: str, section: str, pages: list[int]) -> str:
    head = title or "(untitled)"
    section = _short_section(title, section)
    if section:
        head += f" \u2014 {section}"
    return head + _pages_label(pages)


def format_results(results: list[Citation], answer: str | None = None, coverage: str | None = None,
                   missing_terms: list[str] | None = None) -> str:
    """The readable numbered list agents see as text content."""
    missing = f"No document mentions: {', '.join(missing_terms)}" if missing_terms else ""
    if not results:
        return NO_RESULTS + (f"\n{missing}" if missing else "")
    blocks = []
    for c in results:
        lines = [f"[{c.n}] {_heading(c.title, c.section, c.pages)} score {c.score:.2f} (relevance {c.relevance:.2f})"]
        lines.append(c.snippet)
        if c.ocr:
            lines.append("(OCR'd text" + (f", word confidence {c.ocr_confidence:.2f})" if c.ocr_confidence is not None else ")"))
        if c.low_confidence_ocr:
            lines.append("(low-confidence OCR region: check this passage against the scan)")
        if c.entities:
            lines.append("mentions: " + ", ".join(f"{e.value} ({e.type})" for e in c.entities))
        if c.rev_label or c.valid_to:
            lines.append(validity_line(c.rev_label, c.valid_from, c.valid_to).lstrip("; "))
        if c.url:
            lines.append(c.url)
        lines.append(f"chunk_id: {c.chunk_id}")
        blocks.append("\n".join(lines))
    text = "\n\n".join(blocks)
    if answer and answer != NO_RESULTS:
        text += f"\n\nAnswer (extractive): {answer}"
    if coverage:
        text += f"\nCoverage: {coverage}"
    if missing:
        text += f"\n{missing}"
    return text


def validity_line(rev_label: str | None, valid_from: str | None, valid_to: str | None) -> str:
    """"; Rev C, valid since 2025-03-01" / "; valid 2024-01-02 to 2025-03-01 (superseded)": what an agent must
    know before quoting a passage; empty when there is nothing to say."""
    parts = [rev_label] if rev_label else []
    if valid_to:
        parts.append(f"valid {(valid_from or '?')[:10]} to {valid_to[:10]} (no longer current)")
    elif valid_from:
        parts.append(f"valid since {valid_from[:10]}")
    return "; " + ", ".join(parts) if parts else ""


def _pages(start: int | None, end: int | None) -> list[int]:
    if start is None:
        return []
    return list(range(start, (end or start) + 1))


# ---------------------------------------------------------------------------
# errors


def invalid_params(field: str, message: str, errors: list[dict[str, str]] | None = None) -> MCPError:
    """A JSON-RPC -32602 error naming ``field``."""
    data: dict[str, Any] = {"field": field}
    if errors:
        data["errors"] = errors
    return MCPError(code=INVALID_PARAMS, message=f"Invalid params: {message}", data=data)


def _validation_to_mcp(error: ValidationError) -> MCPError:
    errors = []
    for e in error.errors():
        field = ".".join(str(part) for part in e.get("loc", ())) or "arguments"
        errors.append({"field": field, "message": e.get("msg", "invalid")})
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or "invalid arguments"
    return invalid_params(errors[0]["field"] if errors else "arguments", summary, errors)


class InvalidParamsMiddleware:
    """Server middleware: validates ``tools/call`` arguments against the tool's
    input model *before* the SDK runs the tool, so a bad argument becomes a
    JSON-RPC ``-32602`` error instead of the SDK's ``isError`` tool result.
    Unknown argument names are rejected too (the SDK would silently drop them)."""

    def __init__(self, tools: Mapping[str, Tool]) -> None:
        self.tools = dict(tools)

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Any]) -> Any:
        if ctx.method == "tools/call" and isinstance(ctx.params, Mapping):
            tool = self.tools.get(ctx.params.get("name"))  # type: ignore[arg-type]
            arguments = ctx.params.get("arguments")
            if tool is not None and (arguments is None or isinstance(arguments, Mapping)):
                arguments = dict(arguments or {})
                known = set(tool.parameters.get("properties", {}))
                unknown = sorted(set(arguments) - known)
                if unknown:
                    raise invalid_params(
                        unknown[0], f"unknown argument {unknown[0]!r} (expected one of: {', '.join(sorted(known))})"
                    )
                try:
                    tool.fn_metadata.validate_arguments(arguments)
                except ValidationError as error:
                    raise _validation_to_mcp(error) from None
        return await call_next(ctx)


# ---------------------------------------------------------------------------
# the server


def vocabulary_parameters() -> dict[str, Any]:
    """The ``search`` tool's ``reranker`` and ``fusion`` parameter types, built from the registries now
    (``reranker_registry.RERANKER_REGISTRY``, ``fusion.FUSION_REGISTRY``), so a reranker or fusion mode
    registered there is in the tool schema by itself.  Every registered reranker is listed: one these
    settings cannot run is a readable tool error naming what it needs, not an unknown value."""
    return {
        "reranker": Annotated[
            RERANKERS.literal() | None,
            Field(description="Re-order the candidates: "
                  + ", ".join(spec.label for spec in RERANKER_REGISTRY.values()) + "."),
        ],
        "fusion": Annotated[
            FUSION_MODES.literal() | None,
            Field(description="How keyword and meaning scores are combined: " + ", ".join(FUSION_MODES)
                  + "; default: the corpus's (self-tuned) default."),
        ],
    }


def build_mcp_server(engine: RetrievalEngine) -> MCPServer:
    """An ``MCPServer`` named "groundwork" with the ``search``, ``get_document`` and ``list_sources`` tools.

    Does not change global logging (the SDK's constructor calls
    ``logging.basicConfig``; that is undone here when it took effect)."""

    def search(
        query: Annotated[str, Field(min_length=1, max_length=2000, description="What to look for, in plain words.")],
        k: Annotated[int, Field(ge=1, le=100, description="Number of passages to return.")] = 5,
        filters: Annotated[
            SearchFilters | None,
            Field(description="Restrict the search: sources, doc_ids, paths (globs), metadata, entities (SOP-42, ASSET-104, API 510: passages mentioning one), include_superseded."),
        ] = None,
        alpha: Annotated[
            float | None, Field(ge=0.0, le=1.0, description="0 = keywords only (BM25), 1 = meaning only (vectors); default: "
                                                            "the corpus's, higher for questions (question_alpha).")
        ] = None,
        reranker: str | None = None,  # typed from the registry below (vocabulary_parameters)
        fusion: str | None = None,  # typed from the registry below (vocabulary_parameters)
        section_weight: Annotated[
            float | None,
            Field(ge=0.0, le=1.0, description="0-1: how much a passage's whole section counts for keywords; default: the corpus's."),
        ] = None,
        lead_weight: Annotated[
            float | None,
            Field(ge=0.0, le=1.0, description="0-1: how much a section's opening passage counts for meaning; default: the corpus's."),
        ] = None,
    ) -> Annotated[CallToolResult, SearchOutput]:
        """Search the knowledge base; returns numbered passages with source (title, section, pages, url) and score."""
        try:
            response = engine.search(request=engine.request(
                query,
                k=k,
                alpha=alpha,
                fusion=fusion,
                section_weight=section_weight,
                lead_weight=lead_weight,
                reranker=reranker,
                filters=filters.model_dump(exclude_defaults=True) if filters is not None else None,
                client="mcp",
            ))
        except RerankerUnavailable as error:  # before its base class: well-formed, just not installed here -> isError result
            raise ToolError(str(error)) from None
        except QueryValidationError as error:
            raise invalid_params(error.field, str(error)) from None
        except GroundworkError as error:
            raise ToolError(f"{type(error).__name__}: {error}") from None
        answer = response.answer.text if response.answer is not None else None
        results = list(response.results)
        output = SearchOutput(
            retrieval_request_id=response.retrieval_request_id,
            coverage=response.coverage,
            results=results,
            answer=answer if results else None,
            missing_terms=response.missing_terms,
        )
        text = format_results(response.results, answer, response.coverage, response.missing_terms)
        return CallToolResult(
            content=[TextContent(type="text", text=text)],
            structured_content=output.model_dump(mode="json"),
        )

    def get_document(
        chunk_id: Annotated[str, Field(min_length=1, description="A chunk_id from a search result.")],
        neighbours: Annotated[
            int, Field(ge=0, le=10, description="How many chunks before and after to include.")
        ] = 1,
    ) -> Annotated[CallToolResult, DocumentOutput]:
        """The full text of a cited chunk and its neighbouring chunks (same document version, in order)."""
        try:
            snapshot = engine.snapshots.current()
        except GroundworkError as error:
            raise ToolError(f"{type(error).__name__}: {error}") from None
        row = snapshot.row_of.get(chunk_id)
        if row is None:
            raise ToolError(f"unknown chunk_id '{chunk_id}' (not in index snapshot {snapshot.info.snapshot_version})")
        hit = snapshot.hits_for_rows([row])[0]
        chunks = []
        for r in snapshot.neighbours(chunk_id, neighbours, neighbours):
            pages = _pages(r["page_start"], r["page_end"])
            url = r["url"] or ""
            if url and "#" not in url and r["page_start"] is not None:
                url = f"{url}#page={r['page_start']}"
            chunks.append(DocumentChunk(
                chunk_id=r["chunk_id"], chunk_index=int(r["chunk_index"]), section=r["section"] or "", pages=pages,
                url=url, text=r["text"], is_cited=r["chunk_id"] == chunk_id,
            ))
        output = DocumentOutput(
            chunk_id=hit.chunk_id, doc_id=hit.doc_id, version=hit.version, title=hit.title, section=hit.section,
            pages=hit.pages, url=citation_url(hit), status=hit.status, text=hit.text, chunks=chunks,
            rev_label=hit.rev_label, valid_from=hit.valid_from, valid_to=hit.valid_to, superseded_by=hit.superseded_by,
            supersedes=hit.supersedes, see_also=hit.see_also,
        )
        lines = [f"# {_heading(hit.title, hit.section, hit.pages)}", output.url,
                 f"doc_id: {hit.doc_id} (version {hit.version}, {hit.status})" + validity_line(hit.rev_label, hit.valid_from,
                                                                                              hit.valid_to), ""]
        for chunk in chunks:
            marker = ">>> cited chunk" if chunk.is_cited else "chunk"
            where = (_short_section(hit.title, chunk.section) + _pages_label(chunk.pages)).strip()
            lines.append(f"--- {marker} {chunk.chunk_index}{': ' + where if where else ''} [{chunk.chunk_id}]")
            lines.append(chunk.text)
            lines.append("")
        return CallToolResult(
            content=[TextContent(type="text", text="\n".join(lines).rstrip())],
            structured_content=output.model_dump(mode="json"),
        )

    def list_sources() -> Annotated[CallToolResult, SourcesOutput]:
        """The sources in the knowledge base (folders, uploads, websites) with document and passage counts."""
        try:
            output = source_summary(engine.snapshots.current())
        except GroundworkError as error:
            raise ToolError(f"{type(error).__name__}: {error}") from None
        lines = [f"{len(output.sources)} sources in index snapshot {output.snapshot_version}:"]
        lines += [f"- {item.name} ({item.kind}) {item.location}: {item.documents} documents, {item.chunks} passages"
                  for item in output.sources]
        return CallToolResult(
            content=[TextContent(type="text", text="\n".join(lines))],
            structured_content=output.model_dump(mode="json"),
        )

    # the tool schema is read from the annotations: these two come from the registries as they are now
    search.__annotations__.update(vocabulary_parameters())
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    tools = {
        "search": Tool.from_function(search, name="search", title="Search the knowledge base", annotations=read_only),
        "get_document": Tool.from_function(
            get_document, name="get_document", title="Read a cited passage in context", annotations=read_only
        ),
        "list_sources": Tool.from_function(
            list_sources, name="list_sources", title="List the knowledge base's sources", annotations=read_only
        ),
    }
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    server = MCPServer(
        name=SERVER_NAME,
        title="Groundwork",
        instructions=INSTRUCTIONS,
        version=_version(),
        tools=list(tools.values()),
        middleware=[InvalidParamsMiddleware(tools)],
        log_level="WARNING",
    )
    if not handlers:  # the SDK configured the root logger; leave that to the application
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.setLevel(level)
    return server


def _version() -> str:
    try:
        return version("groundwork")
    except Exception:  # noqa: BLE001 - the version is informational
        return "0.1.0"


# ---------------------------------------------------------------------------
# Streamable HTTP


_JSON = [(b"content-type", b"application/json")]


class _JSONRPCBodyCheck:
    """ASGI wrapper: answers a POST whose body is valid JSON but not a JSON-RPC
    message with ``-32600`` (Invalid Request).  mcp 2.3.0's legacy Streamable
    HTTP path answers ``-32602`` ("Validation error") for those; everything else
    (including malformed JSON, which the SDK answers with ``-32700``) passes
    through unchanged.  The body is buffered (bounded) and replayed."""

    def __init__(self, app: Callable[..., Any], max_body: int = 4 * 1024 * 1024) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        disconnected = False
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                break
            body = message.get("body", b"")
            chunks.append(body)
            size += len(body)
            more = message.get("more_body", False)
            if size > self.max_body:
                break  # let the SDK's limit answer 413 with what it can read
        body = b"".join(chunks)
        pending = more and not disconnected

        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": pending}
            return await receive()

        if not pending and not disconnected:
            reason = _invalid_request_reason(body)
            if reason is not None:
                error = {"jsonrpc": "2.0", "id": _request_id(body),
                         "error": {"code": INVALID_REQUEST, "message": f"Invalid Request: {reason}"}}
                payload = json.dumps(error).encode()
                await send({"type": "http.response.start", "status": 400,
                            "headers": [*_JSON, (b"content-length", str(len(payload)).encode())]})
                await send({"type": "http.response.body", "body": payload})
                return
        await self.app(scope, replay, send)


def _invalid_request_reason(body: bytes) -> str | None:
    """Why ``body`` is not a JSON-RPC 2.0 message, or None (also None for malformed JSON: the SDK's -32700)."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(message, list):
        return "batches are not supported; send one JSON-RPC message per request"
    if not isinstance(message, dict):
        return "the body must be a JSON-RPC message object"
    if message.get("jsonrpc") != "2.0":
        return "'jsonrpc' must be \"2.0\""
    if "method" in message:
        if not isinstance(message["method"], str) or not message["method"]:
            return "'method' must be a non-empty string"
        if "id" in message and not _valid_id(message["id"]):
            return "'id' must be a string or an integer"
        if "params" in message and not isinstance(message["params"], (dict, list)):
            return "'params' must be an object"
        return None
    if "result" in message or "error" in message:
        return None  # a response from the client: the SDK decides
    return "a request needs 'method'"


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _request_id(body: bytes) -> Any:
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(message, dict) and _valid_id(message.get("id")):
        return message["id"]
    return None


def default_transport_security(extra_hosts: list[str] | None = None) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding protection for a local server (Host must be localhost / 127.0.0.1 / [::1],
    any port), plus ``extra_hosts`` (e.g. ``["groundwork.internal:*"]``)."""
    local = ["127.0.0.1", "localhost", "[::1]"]
    hosts = [h for name in local for h in (name, f"{name}:*")] + list(extra_hosts or [])
    origins = [f"http://{name}:*" for name in local] + [f"http://{name}" for name in local]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


class MCPHTTPEndpoint:
    """The Streamable HTTP endpoint as an ASGI app, plus the lifespan that runs it.

    A fresh ``StreamableHTTPSessionManager`` is started on every lifespan entry
    (the SDK's manager can run only once), so the same app can be started,
    stopped and started again (tests, reloads).  Entering the lifespan while it
    is already running is a no-op, so wiring it twice is harmless.  A request
    that arrives while it is not running gets a JSON-RPC error (HTTP 503)
    saying so instead of the SDK's ``RuntimeError``."""

    def __init__(
        self,
        server: MCPServer,
        *,
        stateless: bool = True,
        json_response: bool = True,
        transport_security: TransportSecuritySettings | None = None,
    ) -> None:
        self.server = server
        self.stateless = stateless
        self.json_response = json_response
        self.transport_security = transport_security or default_transport_security()
        self.manager: StreamableHTTPSessionManager | None = None
        self._depth = 0
        self._app = _JSONRPCBodyCheck(self._dispatch)

    def _new_manager(self) -> StreamableHTTPSessionManager:
        # public API: streamable_http_app() builds the manager the SDK's own app would use;
        # we keep the manager and drop its Starlette wrapper (we are mounted on the parent app).
        self.server.streamable_http_app(
            json_response=self.json_response, stateless_http=self.stateless, transport_security=self.transport_security,
        )
        return self.server.session_manager

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        manager = self._new_manager()
        async with manager.run():
            self.manager = manager
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0
                self.manager = None

    async def _dispatch(self, scope: dict, receive: Callable, send: Callable) -> None:
        if self.stateless and scope.get("method") == "GET":
            # Stateless mode sends nothing unprompted, so there is no stream to open (the SDK would
            # hold the GET open forever); the spec allows 405 here and clients fall back to POST only.
            await send({"type": "http.response.start", "status": 405,
                        "headers": [(b"allow", b"POST, DELETE"), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        manager = self.manager
        if manager is None:
            payload = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
                "code": INTERNAL_ERROR,
                "message": "MCP endpoint is not running: the application's lifespan must enter the MCP lifespan "
                           "(see knowledge_store.server.mcp_server.mount_mcp)"}}).encode()
            await send({"type": "http.response.start", "status": 503, "headers": _JSON})
            await send({"type": "http.response.body", "body": payload})
            return
        await manager.handle_request(scope, receive, send)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        await self._app(scope, receive, send)


def mcp_http_app(
    engine: RetrievalEngine,
    *,
    transport_security: TransportSecuritySettings | None = None,
    stateless: bool = True,
    json_response: bool = True,
) -> tuple[MCPHTTPEndpoint, Callable[[Any], contextlib.AbstractAsyncContextManager[None]]]:
    """``(asgi_app, lifespan)`` for the Streamable HTTP transport.

    ``asgi_app`` serves the MCP endpoint at whatever path it is routed on;
    ``lifespan(app)`` is an async context manager that must be running while
    requests are served - enter it inside the parent application's lifespan::

        endpoint, mcp_lifespan = mcp_http_app(engine)
        app.add_route("/mcp", endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)

        @asynccontextmanager
        async def lifespan(app):
            async with mcp_lifespan(app):
                yield
    """
    endpoint = MCPHTTPEndpoint(
        build_mcp_server(engine), stateless=stateless, json_response=json_response,
        transport_security=transport_security,
    )
    return endpoint, endpoint.lifespan


def mount_mcp(
    app: Any,
    engine: RetrievalEngine,
    path: str = "/mcp",
    *,
    transport_security: TransportSecuritySettings | None = None,
    wire_lifespan: bool = True,
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """Serve MCP (Streamable HTTP, stateless, JSON responses) at ``path`` of an existing
    FastAPI / Starlette ``app``; returns the MCP lifespan ``lifespan(app)``.

    The route is added at exactly ``path`` (no ``Mount``, so ``POST /mcp`` is not
    redirected to ``/mcp/``).  The SDK's session manager must run inside the
    parent app's lifespan - a ``Mount``-ed sub-app's own lifespan is never run,
    the classic pitfall that leaves every request failing with "Task group is
    not initialized".  Two ways, both safe together (the lifespan is re-entrant):

    - ``wire_lifespan=True`` (default): ``app.router.lifespan_context`` is wrapped
      so the MCP lifespan encloses the app's existing lifespan.  Call this before
      the app starts.
    - or enter the returned lifespan in your own lifespan::

          @asynccontextmanager
          async def lifespan(app):
              async with mcp_lifespan(app):
                  ...  # your start-up
                  yield
                  ...  # your shut-down

    ``transport_security`` defaults to DNS-rebinding protection for a local
    server (Host localhost / 127.0.0.1 / [::1]); pass
    ``default_transport_security(["my-host:*"])`` for other host names, or
    ``TransportSecuritySettings(enable_dns_rebinding_protection=False)`` behind
    a trusted proxy.
    """
    endpoint, lifespan = mcp_http_app(engine, transport_security=transport_security)
    app.add_route(path, endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    if wire_lifespan:
        router = getattr(app, "router", app)
        previous = router.lifespan_context

        @contextlib.asynccontextmanager
        async def combined(parent: Any) -> AsyncIterator[Any]:
            async with lifespan(parent):
                async with previous(parent) as state:
                    yield state

        router.lifespan_context = combined
    return lifespan


# ---------------------------------------------------------------------------
# stdio


def run_stdio(settings: Settings | None = None) -> None:
    """Serve the tools over stdio (``groundwork mcp``): builds a ``RetrievalEngine``
    from ``settings`` (default: ``Settings()``, i.e. ``GROUNDWORK_*`` environment),
    loads the model and the index first, then serves until stdin closes.
    Logs go to stderr; stdout carries only the protocol."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    with contextlib.redirect_stdout(sys.stderr):  # stray prints (e.g. the ONNX export) must not corrupt the protocol stream
        engine = RetrievalEngine(settings or Settings())
        try:
            engine.warm_up()
        except GroundworkError as error:  # e.g. no index yet: serve anyway, tools report it
            print(f"groundwork mcp: {error}", file=sys.stderr)
    server = build_mcp_server(engine)
    try:
        server.run("stdio")
    finally:
        if engine._query_log is not None:  # only if a query opened it
            try:
                engine.query_log.close()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
