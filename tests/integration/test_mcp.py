"""The MCP server through the SDK's own clients: stdio (a real subprocess running
``run_stdio``) and Streamable HTTP (mounted on a FastAPI app served by uvicorn),
plus raw JSON-RPC bodies for the error codes.

The parts that need no model, store or server are in tests/unit/test_mcp.py.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.citations import Citation
from knowledge_store.retrieval.engine import NO_RESULTS, RetrievalEngine
from knowledge_store.server.mcp_server import build_mcp_server, mount_mcp
from knowledge_store.storage.query_log import QueryLog
from tests.helpers import free_port

pytestmark = pytest.mark.slow

RESET = "how do I reset the Aurora to factory settings"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
RESULT_KEYS = {"n", "chunk_id", "doc_id", "version", "title", "section", "pages", "url", "snippet", "score",
               "bm25_score", "vector_score", "relevance", "ocr", "ocr_confidence",
               # low-confidence OCR regions: the passage overlaps one, the document needs review
               "low_confidence_ocr", "needs_review",
               # the document model: the document's revision label, validity and relations
               "status", "rev_label", "valid_from", "valid_to", "superseded_by", "see_also", "entities",
               # the rest of the HTTP API's Citation: MCP results are that model, not a copy of part of it
               "section_path", "page_start", "page_end", "snippet_start", "snippet_end", "rerank_score", "last_updated",
               "doc_type", "source_path", "supersedes", "entity_boost"}


@pytest.fixture(scope="module")
def sample_index(shared_sample_index) -> Settings:
    """The session's sample index: the MCP tools only read it."""
    return shared_sample_index.model_copy(update={"query_torch_threads": 2})


@pytest.fixture(scope="module")
def engine(sample_index, embedder):
    engine = RetrievalEngine(sample_index, embedder=embedder, query_log=QueryLog(sample_index.logs_path))
    engine.warm_up()
    yield engine
    engine.query_log.close()


@pytest.fixture(scope="module")
def http_app(engine):
    """A FastAPI app with a lifespan of its own that *also* enters the MCP lifespan
    (as the Groundwork API does) while ``mount_mcp`` wraps the router's lifespan:
    both at once must be safe."""
    state = {"started": 0}
    mcp_lifespan = None

    @asynccontextmanager
    async def lifespan(app):
        state["started"] += 1
        async with mcp_lifespan(app):
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    mcp_lifespan = mount_mcp(app, engine)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True, name="uvicorn-mcp")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", state
    server.should_exit = True
    thread.join(timeout=15)


# ---------------------------------------------------------------------------- helpers

async def _exercise(session_or_client, *, check_instructions: str | None = None) -> dict:
    """list_tools + search + get_document + the tool-level errors, via any SDK session/client."""
    tools = {t.name: t for t in (await session_or_client.list_tools()).tools}
    assert set(tools) == {"search", "get_document", "list_sources"}
    search_schema = tools["search"].input_schema
    assert search_schema["required"] == ["query"]
    assert {"query", "k", "filters", "alpha", "reranker"} <= set(search_schema["properties"])
    assert search_schema["properties"]["k"]["maximum"] == 100
    assert tools["get_document"].input_schema["required"] == ["chunk_id"]
    assert tools["search"].output_schema is not None and "results" in tools["search"].output_schema["properties"]

    result = await session_or_client.call_tool("search", {"query": RESET, "k": 3})
    assert not result.is_error
    data = result.structured_content
    assert data["coverage"] in ("high", "medium") and data["retrieval_request_id"]
    assert 1 <= len(data["results"]) <= 3
    top = data["results"][0]
    assert set(top) == RESULT_KEYS == set(Citation.model_fields)
    assert top["n"] == 1 and top["url"].startswith("file://") and "#page=4" in top["url"]
    assert "factory" in top["snippet"].lower()
    text = result.content[0].text
    assert text.startswith("[1] ") and "(p. 4)" in text and top["url"] in text and data["answer"]

    doc = await session_or_client.call_tool("get_document", {"chunk_id": top["chunk_id"], "neighbours": 1})
    assert not doc.is_error
    body = doc.structured_content
    assert body["chunk_id"] == top["chunk_id"] and body["title"] == top["title"] and body["url"] == top["url"]
    indexes = [c["chunk_index"] for c in body["chunks"]]
    assert indexes == sorted(indexes) and 2 <= len(indexes) <= 3
    assert [c["chunk_id"] for c in body["chunks"] if c["is_cited"]] == [top["chunk_id"]]
    assert "factory" in body["text"].lower() and body["text"] in doc.content[0].text

    listed = await session_or_client.call_tool("list_sources", {})
    assert not listed.is_error
    by_name = {item["name"]: item for item in listed.structured_content["sources"]}
    assert by_name and all(item["documents"] >= 1 and item["chunks"] >= item["documents"] for item in by_name.values())
    assert all(name in listed.content[0].text and item["kind"] == "folder" for name, item in by_name.items())
    tops = []  # the names work as search filters: exactly one source holds the top passage
    for name in by_name:
        filtered = await session_or_client.call_tool("search", {"query": RESET, "k": 1, "filters": {"sources": [name]}})
        tops += [r["chunk_id"] for r in filtered.structured_content["results"]]
    assert tops.count(top["chunk_id"]) == 1

    missing = await session_or_client.call_tool("get_document", {"chunk_id": "no-such-chunk"})
    assert missing.is_error and "unknown chunk_id 'no-such-chunk'" in missing.content[0].text

    with pytest.raises(MCPError) as bad:
        await session_or_client.call_tool("search", {"query": RESET, "k": 0})
    assert bad.value.error.code == -32602 and "k" in bad.value.error.message
    return data


# ---------------------------------------------------------------------------- stdio

def test_stdio_server_via_sdk_client(sample_index):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", "from knowledge_store.server.mcp_server import run_stdio; run_stdio()"],
        env={
            "GROUNDWORK_DATA_DIR": str(sample_index.data_dir),
            "GROUNDWORK_EMBEDDING_MODEL": os.environ["GROUNDWORK_EMBEDDING_MODEL"],  # the suite's model (conftest)
            "GROUNDWORK_QUERY_TORCH_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        },
        cwd=str(sample_index.data_dir),  # no project .env
    )

    async def main() -> None:
        with anyio.fail_after(180):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                init = await session.initialize()
                assert init.server_info.name == "groundwork"
                assert "search" in init.instructions and "get_document" in init.instructions
                await _exercise(session)

    anyio.run(main)


# ---------------------------------------------------------------------------- streamable HTTP

def test_http_with_sdk_session_initialize_handshake(http_app, engine):
    base, state = http_app

    async def main() -> dict:
        with anyio.fail_after(120):
            async with streamable_http_client(f"{base}/mcp") as (read, write), ClientSession(read, write) as session:
                init = await session.initialize()
                assert init.server_info.name == "groundwork"
                return await _exercise(session)

    data = anyio.run(main)
    assert state["started"] == 1  # the app's own lifespan ran once, around the MCP one
    assert httpx.get(f"{base}/health").json() == {"ok": True}  # the rest of the app is untouched
    engine.query_log.flush()
    record = engine.query_log.get(data["retrieval_request_id"])
    assert record is not None and record.client == "mcp"


def test_http_with_sdk_client_auto_negotiation(http_app):
    """``mcp.Client`` in its default 'auto' mode speaks the 2026-07-28 per-request protocol."""
    base, _ = http_app

    async def main() -> None:
        with anyio.fail_after(120):
            async with Client(f"{base}/mcp") as client:
                assert client.protocol_version == "2026-07-28"
                result = await client.call_tool("search", {"query": RESET, "k": 2, "filters": {"paths": ["*.pdf"]}})
                assert result.structured_content["results"]
                assert all(r["url"].split("#")[0].endswith(".pdf") for r in result.structured_content["results"])
                with pytest.raises(MCPError) as bad:
                    await client.call_tool("search", {"query": RESET, "reranker": "bogus"})
                assert bad.value.error.code == -32602 and bad.value.error.data["field"] == "reranker"
                unknown = await client.call_tool("no_such_tool", {})  # the SDK's choice: a tool error, not -32601
                assert unknown.is_error and "Unknown tool: no_such_tool" in unknown.content[0].text

    anyio.run(main)


def _call(name: str, arguments: dict, id_: int = 7) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (b'{"jsonrpc": "2.0", "id": 1, "method": ', -32700, None),
        (b'{"id": 1, "method": "tools/list"}', -32600, None),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]', -32600, None),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": "x"}', -32600, None),
        (b'{"jsonrpc": "2.0", "id": 1}', -32600, None),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/frobnicate"}', -32601, None),
        (_call("search", {"query": RESET, "k": 101}), -32602, "k"),
        (_call("search", {"query": RESET, "alpha": 1.5}), -32602, "alpha"),
        (_call("search", {"query": RESET, "reranker": "magic"}), -32602, "reranker"),
        (_call("search", {"query": RESET, "filters": {"folders": ["x"]}}), -32602, "filters.folders"),
        (_call("search", {"query": RESET, "top_k": 3}), -32602, "top_k"),
        (_call("search", {"k": 3}), -32602, "query"),
        (_call("get_document", {"chunk_id": "x", "neighbours": -1}), -32602, "neighbours"),
    ],
)
def test_http_raw_jsonrpc_error_codes(http_app, body, code, field):
    base, _ = http_app
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = httpx.post(f"{base}/mcp", headers=HEADERS, timeout=60, **kwargs)
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code, error
    if code in (-32700, -32600):
        assert response.status_code == 400
    if field is not None:
        assert error["data"]["field"] == field and field in error["message"]


def test_http_raw_success_host_check_and_get(http_app):
    base, _ = http_app
    ok = httpx.post(f"{base}/mcp", headers=HEADERS, json=_call("search", {"query": RESET, "k": 1}), timeout=60)
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("application/json")  # JSON, not SSE
    assert ok.json()["result"]["structuredContent"]["results"][0]["n"] == 1
    rebinding = httpx.post(f"{base}/mcp", headers={**HEADERS, "Host": "attacker.example"},
                           json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert rebinding.status_code == 421  # the SDK's DNS-rebinding protection
    assert httpx.get(f"{base}/mcp", headers=HEADERS).status_code == 405  # stateless: no server-initiated stream


def test_mcp_endpoint_without_lifespan_says_so(engine):
    """The classic pitfall: the session manager is not running -> a clear JSON-RPC error, not a crash."""
    app = FastAPI()
    mount_mcp(app, engine, wire_lifespan=False)

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # does not run the lifespan
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
            return await client.post("/mcp", headers=HEADERS, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})

    response = anyio.run(main)
    assert response.status_code == 503 and "lifespan" in response.json()["error"]["message"]


# ---------------------------------------------------------------------------- in-process

def test_no_relevant_content_in_process(engine):
    async def main():
        async with Client(build_mcp_server(engine)) as client:
            return await client.call_tool("search", {"query": "quantum chromodynamics of emperor penguins"})

    result = anyio.run(main)
    assert not result.is_error
    # the agent reads that nothing is relevant, and which of its words no document contains
    assert result.content[0].text == NO_RESULTS + "\nNo document mentions: quantum, chromodynamics, emperor, penguins"
    assert NO_RESULTS == "No relevant content found."
    assert result.structured_content["results"] == [] and result.structured_content["coverage"] == "none"
    assert result.structured_content["answer"] is None
    assert result.structured_content["missing_terms"] == ["quantum", "chromodynamics", "emperor", "penguins"]

