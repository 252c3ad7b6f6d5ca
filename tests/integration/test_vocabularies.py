"""One registry per vocabulary (issue 15 item 1): a fusion mode or reranker is named in one place.

A mode or reranker registered at test time (``monkeypatch.setitem`` on ``FUSION_REGISTRY`` /
``RERANKER_REGISTRY``, nothing else) is accepted by Settings, offered by the CLI, listed by
``GET /api/knowledge/config`` and the ranking settings, an enum value of the served OpenAPI schema
and of the MCP ``search`` tool, tried by the tuning grid, measured by the quality report, and runs
in a real search: the engine dispatches on the registry.  A scan of the sources proves no other
module spells a list of the names.

The parts that need no model, store or server are in tests/unit/test_vocabularies.py.
"""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.reranker_registry import RerankerUnavailable
from tests.helpers import MARKDOWN_FILLER

GUIDES = {  # one short document each, so the index has several candidates to reorder
    "reset.md": "# Reset\n\nHold the reset button for ten seconds to restore the hub to factory settings.\n",
    "pairing.md": "# Pairing\n\nPress the pair button once; the light blinks blue while the hub looks for sensors.\n",
    "battery.md": "# Battery\n\nReplace the battery when the status light blinks red twice.\n",
}


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory, embedder) -> Settings:
    from knowledge_store.ingest.run import run_sync

    root = tmp_path_factory.mktemp("vocabularies")
    (root / "docs").mkdir()
    for name, text in GUIDES.items():
        (root / "docs" / name).write_text(text + MARKDOWN_FILLER, encoding="utf-8")
    settings = Settings(data_dir=root / "data", sources=[root / "docs"], cross_encoder_path=None)
    run_sync(settings, embedder)
    return settings


def _enum(schema: dict, name: str, field: str) -> list[str]:
    prop = schema["components"]["schemas"][name]["properties"][field]
    return next(option["enum"] for option in prop.get("anyOf", [prop]) if "enum" in option)


def test_registered_names_run_in_a_search_through_the_engine(registered, tiny_index, embedder):
    from knowledge_store.retrieval.engine import RetrievalEngine

    engine = RetrievalEngine(tiny_index, embedder=embedder)
    fused = engine.search("reset button battery light", k=3, answer="none", log=False, min_relevance=0.0)
    reversed_ = engine.search("reset button battery light", k=3, reranker="reverse", answer="none", log=False,
                              min_relevance=0.0)
    assert reversed_.reranker_status == "ok" and reversed_.params["reranker"] == "reverse"
    candidates = engine.candidates(engine.request("reset button battery light", reranker="reverse", min_relevance=0.0),
                                   20).hits
    assert [h.chunk_id for h in reversed_.hits] == [h.chunk_id for h in reversed(candidates)][:3]
    assert [h.chunk_id for h in fused.hits] != [h.chunk_id for h in reversed_.hits]
    bm25 = engine.search("reset button battery light", k=3, fusion="bm25max", answer="none", log=False, min_relevance=0.0)
    assert bm25.params["fusion"] == "bm25max"
    assert [h.score for h in bm25.hits] == sorted((h.bm25_score or 0.0 for h in bm25.hits), reverse=True)
    assert "oracle" not in engine.available_rerankers() and "reverse" in engine.available_rerankers()
    with pytest.raises(RerankerUnavailable, match="the oracle reranker needs GROUNDWORK_ORACLE_PATH"):
        engine.search("reset", reranker="oracle", log=False)


def test_registered_names_are_in_the_config_the_ranking_settings_and_the_openapi_enums(registered, tiny_index, embedder):
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app

    app = create_app(tiny_index, RetrievalEngine(tiny_index, embedder=embedder), mount_mcp=False)
    with TestClient(app, base_url="http://localhost") as client:
        config = client.get("/api/knowledge/config").json()
        assert "bm25max" in config["fusion_modes"] and config["fusion_modes"]["bm25max"] == "raw BM25 only (test mode)"
        assert "reverse" in config["rerankers"] and "oracle" not in config["rerankers"]  # only what this server runs
        assert config["reranker_labels"]["reverse"] == "reverse (upside down)"
        ranking = client.get("/api/knowledge/ranking").json()
        assert "bm25max" in ranking["fusion_modes"] and ranking["reranker_labels"]["reverse"] == "reverse (upside down)"
        schema = client.get("/openapi.json").json()
        assert "bm25max" in _enum(schema, "QueryBody", "fusion") and "bm25max" in _enum(schema, "RankingUpdate", "fusion")
        assert "reverse" in _enum(schema, "QueryBody", "reranker") and "reverse" in _enum(schema, "RankingUpdate", "reranker")
        assert "oracle" not in _enum(schema, "QueryBody", "reranker")
        ok = client.post("/api/knowledge/query", json={"query": "reset button", "fusion": "bm25max", "reranker": "reverse",
                                                       "answer": "none", "min_relevance": 0})
        assert ok.status_code == 200 and ok.json()["params"]["reranker"] == "reverse", ok.text
        unavailable = client.post("/api/knowledge/query", json={"query": "reset", "reranker": "oracle"})
        assert unavailable.status_code == 422 and "GROUNDWORK_ORACLE_PATH" in unavailable.json()["message"]
        put = client.put("/api/knowledge/ranking", json={"fusion": "bm25max", "reranker": "reverse"})
        assert put.status_code == 200 and put.json()["fusion"]["effective"] == "bm25max", put.text


def test_registered_names_are_in_the_mcp_search_tool_schema(registered, tiny_index, embedder):
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.mcp_server import build_mcp_server

    server = build_mcp_server(RetrievalEngine(tiny_index, embedder=embedder))
    [search] = [tool for tool in asyncio.run(server.list_tools()) if tool.name == "search"]
    properties = search.input_schema["properties"]

    def enum(field: str) -> list[str]:
        return next(option["enum"] for option in properties[field]["anyOf"] if "enum" in option)

    assert enum("fusion")[-1] == "bm25max"
    assert enum("reranker")[-2:] == ["reverse", "oracle"]  # every registered one; "oracle" is a tool error here
    assert "reverse (upside down)" in properties["reranker"]["description"]
