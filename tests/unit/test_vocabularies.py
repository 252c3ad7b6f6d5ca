"""One registry per vocabulary (issue 15 item 1): a fusion mode or reranker is named in one place.

A mode or reranker registered at test time (the ``registered`` fixture: ``monkeypatch.setitem`` on
``FUSION_REGISTRY`` / ``RERANKER_REGISTRY``, nothing else) is accepted by Settings, offered by the CLI, run by
``fuse_scores`` and tried by the tuning grid.  A scan of the sources proves no other module spells a list of
the names.  The engine, the API and MCP with registered names: tests/integration/test_vocabularies.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.answer import ANSWER_REGISTRY, available_answer_modes
from knowledge_store.retrieval.fusion import FUSION_MODES, FUSION_REGISTRY, fuse_scores
from knowledge_store.retrieval.reranker_registry import RERANKERS
from tests.helpers import REPO_ROOT as ROOT

# ------------------------------------------------------------------ registered once, accepted everywhere

def test_registered_names_are_accepted_by_settings_and_offered_by_the_cli(registered):
    from knowledge_store.cli import build_parser

    settings = Settings(default_fusion="bm25max", default_reranker="reverse")
    assert (settings.default_fusion, settings.default_reranker) == ("bm25max", "reverse")
    parser = build_parser()
    for command in (["query", "x"], ["eval", "folder"]):
        args = parser.parse_args([*command, "--fusion", "bm25max", "--reranker", "reverse"])
        assert (args.fusion, args.reranker) == ("bm25max", "reverse")
    with pytest.raises(Exception, match="must be one of weighted, dbsf, rrf, calibrated, bm25max"):
        Settings(default_fusion="nope")
    with pytest.raises(Exception, match="must be one of none, mmr, feedback, cross-encoder, reverse, oracle"):
        Settings(default_reranker="nope")


def test_registered_fusion_mode_is_what_fuse_scores_runs_and_the_tuning_grid_tries(registered):
    from evals.experiments.quality_report import configurations
    from knowledge_store.learning.tuning import default_grid
    from knowledge_store.storage.tuned import check_manual_value

    bm25 = np.array([0.0, 3.0, 1.0, 2.0])
    vector = np.array([0.9, 0.1, 0.8, 0.2])
    fused = fuse_scores(bm25, vector, None, alpha=0.9, pool=4, method="bm25max")
    assert fused.rows.tolist() == [1, 3, 2, 0] and fused.fused.tolist() == [3.0, 2.0, 1.0, 0.0]
    assert {p.fusion for p in default_grid()} == {"weighted", "dbsf", "rrf", "calibrated", "bm25max"}
    assert check_manual_value("fusion", "bm25max") == "bm25max"
    assert "bm25max" in {config.fusion for _, config in configurations(Settings())}


def test_without_registration_the_vocabularies_are_the_shipped_ones():
    assert list(FUSION_MODES) == ["weighted", "dbsf", "rrf", "calibrated"]
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
    from knowledge_store.config.embedding_models import EMBEDDING_BACKENDS, QUANTIZATION_RECIPES, SENTENCE_ENCODINGS

    assert Settings(document_encoder="torch", query_encoder="torch").query_encoder == "torch"
    for field, value, known in (("document_encoder", "tensorrt", EMBEDDING_BACKENDS),
                                ("query_encoder", "tensorrt", EMBEDDING_BACKENDS),
                                ("document_quantization", "int4", QUANTIZATION_RECIPES),
                                ("query_quantization", "int4", QUANTIZATION_RECIPES),
                                ("sentence_encoding", "late", SENTENCE_ENCODINGS)):
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
