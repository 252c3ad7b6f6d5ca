"""One registry per vocabulary (issue 15 item 1): a fusion mode or reranker is named in one place.

A mode or reranker registered at test time (``monkeypatch.setitem`` on ``FUSION_REGISTRY`` /
``RERANKER_REGISTRY``, nothing else) is accepted by Settings, offered by the CLI, listed by
``GET /api/knowledge/config`` and the ranking settings, an enum value of the served OpenAPI schema
and of the MCP ``search`` tool, tried by the tuning grid, measured by the quality report, and runs
in a real search: the engine dispatches on the registry.  A scan of the sources proves no other
module spells a list of the names.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from knowledge_store.retrieval.answer import ANSWER_REGISTRY, available_answer_modes
from knowledge_store.retrieval.fusion import FUSION_MODES, FUSION_REGISTRY, FusionInputs, FusionMode, fuse_scores
from knowledge_store.retrieval.reranker_registry import (
    RERANKER_REGISTRY,
    RERANKERS,
    RerankerSpec,
    RerankerUnavailable,
)
from knowledge_store.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
GUIDES = {  # one short document each, so the index has several candidates to reorder
    "reset.md": "# Reset\n\nHold the reset button for ten seconds to restore the hub to factory settings.\n",
    "pairing.md": "# Pairing\n\nPress the pair button once; the light blinks blue while the hub looks for sensors.\n",
    "battery.md": "# Battery\n\nReplace the battery when the status light blinks red twice.\n",
}


def _bm25_only(inputs: FusionInputs) -> np.ndarray:
    """A fusion mode the code base does not have: raw BM25, whatever alpha says."""
    return inputs.bm25.astype(np.float64)


def _reverse(engine):
    """A reranker the code base does not have: the fused order reversed."""
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class ReverseReranker(BaseNodePostprocessor):
        @classmethod
        def class_name(cls) -> str:
            return "ReverseReranker"

        def _postprocess_nodes(self, nodes, query_bundle=None):
            return list(reversed(nodes))

    return ReverseReranker()


@pytest.fixture()
def registered(monkeypatch):
    """A fusion mode ``bm25max``, a reranker ``reverse`` and a reranker ``oracle`` that needs a setting
    these tests never have: added to the registries and nowhere else."""
    monkeypatch.setitem(FUSION_REGISTRY, "bm25max", FusionMode("bm25max", "raw BM25 only (test mode)", _bm25_only))
    monkeypatch.setitem(RERANKER_REGISTRY, "reverse", RerankerSpec("reverse", "the fused order reversed (test)",
                                                                   _reverse, hint="upside down"))
    monkeypatch.setitem(RERANKER_REGISTRY, "oracle", RerankerSpec(
        "oracle", "never available (test)", _reverse, needs="GROUNDWORK_ORACLE_PATH", available=lambda s: False))


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory, embedder) -> Settings:
    from knowledge_store.ingest.run import run_sync

    root = tmp_path_factory.mktemp("vocabularies")
    (root / "docs").mkdir()
    for name, text in GUIDES.items():
        (root / "docs" / name).write_text(text, encoding="utf-8")
    settings = Settings(data_dir=root / "data", sources=[root / "docs"], cross_encoder_path=None)
    run_sync(settings, embedder)
    return settings


def _enum(schema: dict, name: str, field: str) -> list[str]:
    prop = schema["components"]["schemas"][name]["properties"][field]
    return next(option["enum"] for option in prop.get("anyOf", [prop]) if "enum" in option)


# ------------------------------------------------------------------ registered once, accepted everywhere

def test_registered_names_are_accepted_by_settings_and_offered_by_the_cli(registered):
    from knowledge_store.cli import build_parser

    settings = Settings(default_fusion="bm25max", default_reranker="reverse")
    assert (settings.default_fusion, settings.default_reranker) == ("bm25max", "reverse")
    parser = build_parser()
    for command in (["query", "x"], ["eval", "folder"]):
        args = parser.parse_args([*command, "--fusion", "bm25max", "--reranker", "reverse"])
        assert (args.fusion, args.reranker) == ("bm25max", "reverse")
    with pytest.raises(Exception, match="must be one of weighted, dbsf, rrf, bm25max"):
        Settings(default_fusion="nope")
    with pytest.raises(Exception, match="must be one of none, mmr, feedback, cross-encoder, reverse, oracle"):
        Settings(default_reranker="nope")


def test_registered_fusion_mode_is_what_fuse_scores_runs_and_the_tuning_grid_tries(registered):
    from evals.quality_report import configurations
    from knowledge_store.tuning import check_manual_value, default_grid

    bm25 = np.array([0.0, 3.0, 1.0, 2.0])
    vector = np.array([0.9, 0.1, 0.8, 0.2])
    fused = fuse_scores(bm25, vector, None, alpha=0.9, pool=4, method="bm25max")
    assert fused.rows.tolist() == [1, 3, 2, 0] and fused.fused.tolist() == [3.0, 2.0, 1.0, 0.0]
    assert {p.fusion for p in default_grid()} == {"weighted", "dbsf", "rrf", "bm25max"}
    assert check_manual_value("fusion", "bm25max") == "bm25max"
    assert "bm25max" in {config.fusion for _, config in configurations(Settings())}


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


def test_without_registration_the_vocabularies_are_the_shipped_ones():
    assert list(FUSION_MODES) == ["weighted", "dbsf", "rrf"]
    assert list(RERANKERS) == ["none", "mmr", "feedback", "cross-encoder"]
    assert dict(FUSION_MODES) == {name: mode.description for name, mode in FUSION_REGISTRY.items()}


def test_answer_modes_offered_are_the_registered_ones_these_settings_can_run(tmp_path):
    plain = Settings(data_dir=tmp_path)
    with_llm = Settings(data_dir=tmp_path, llm_base_url="http://localhost:1/v1", llm_model="m")
    assert available_answer_modes(plain) == ("extractive", "none")
    assert available_answer_modes(with_llm) == ("extractive", "none", "llm")
    assert available_answer_modes(with_llm, writing_only=True) == ("extractive", "llm")
    assert list(ANSWER_REGISTRY) == ["extractive", "none", "llm"]


def test_embedding_backends_and_quantisations_are_checked_against_the_embeddings_vocabularies():
    from knowledge_store.embeddings import EMBEDDING_BACKENDS, QUANTIZATION_RECIPES

    assert Settings(document_encoder="torch", query_encoder="torch").query_encoder == "torch"
    for field, value, known in (("document_encoder", "tensorrt", EMBEDDING_BACKENDS),
                                ("query_encoder", "tensorrt", EMBEDDING_BACKENDS),
                                ("document_quantization", "int4", QUANTIZATION_RECIPES)):
        with pytest.raises(Exception, match=rf"{field}[\s\S]*must be one of {', '.join(known)} \(got '{value}'\)"):
            Settings(**{field: value})


# ------------------------------------------------------------------ no other module spells the lists

REGISTRIES = {ROOT / "knowledge_store" / "retrieval" / "fusion.py", ROOT / "knowledge_store" / "retrieval" / "reranker_registry.py"}
SCANNED = ("knowledge_store/**/*.py", "knowledge_store/**/*.js", "knowledge_store/**/*.html", "evals/**/*.py",
           "pipelines/**/*.py", "notebooks/*.ipynb")


def _name_tokens(text: str, names: list[str]) -> list[tuple[int, str]]:
    """Where ``text`` names a vocabulary value the way a list does: quoted ("mmr", 'mmr', \\"mmr\\"), as an
    object key (``{ mmr: ...``), an option value or a regex alternative (``mmr|feedback``)."""
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    pattern = re.compile(
        rf"""\\?["'](?P<quoted>{alternatives})\\?["']"""
        rf"""|[{{,]\s*(?P<key>{alternatives})\s*:"""
        rf"""|(?<![\w-])(?P<alt>{alternatives})\|(?=(?:{alternatives})(?![\w-]))""")
    return [(m.start(), m.group("quoted") or m.group("key") or m.group("alt")) for m in pattern.finditer(text)]


def _spelled_lists(text: str, names: list[str], window: int = 60) -> list[str]:
    """Excerpts where two different names of one vocabulary appear within ``window`` characters."""
    tokens = _name_tokens(text, names)
    found = []
    for (start, name), (end, other) in zip(tokens, tokens[1:]):
        if name != other and end - start <= window:
            found.append(text[max(0, start - 20):end + 20].replace("\n", " "))
    return found


def test_the_scan_finds_the_lists_this_change_removed():
    fusion, rerankers = list(FUSION_MODES), list(RERANKERS)
    assert _spelled_lists('choices=["none", "mmr", "feedback", "cross-encoder"]', rerankers)
    assert _spelled_lists('Field("none", pattern="^(none|mmr|feedback|cross-encoder)$")', rerankers)
    assert _spelled_lists('RerankerName = Literal["none", "mmr", "feedback", "cross-encoder"]', rerankers)
    assert _spelled_lists('var LABELS = { none: "none", mmr: "mmr (diversity)" };', rerankers)
    assert _spelled_lists('<option value="none">none</option>\n<option value="mmr">mmr</option>', rerankers)
    assert _spelled_lists('("dbsf", config(a, "dbsf", s, l)),\n        ("rrf", config(0.5, "rrf", s, l)),', fusion)
    assert _spelled_lists('    "rerankers = [\\"none\\", \\"mmr\\", \\"feedback\\"]\\n",', rerankers)
    assert not _spelled_lists('coverage "none" when nothing matched; the reranker mmr', rerankers)


@pytest.mark.parametrize("vocabulary", ["fusion", "reranker"])
def test_no_module_but_the_registry_spells_a_list_of_the_names(vocabulary):
    names = list(FUSION_MODES if vocabulary == "fusion" else RERANKERS)
    offenders = {}
    for pattern in SCANNED:
        for path in sorted(ROOT.glob(pattern)):
            if path in REGISTRIES or "__pycache__" in path.parts:
                continue
            found = _spelled_lists(path.read_text(encoding="utf-8"), names)
            if found:
                offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"{vocabulary} names listed outside their registry: {offenders}"
