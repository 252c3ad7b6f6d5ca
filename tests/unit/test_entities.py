"""Entities without a store: extraction and canonical values, configurable patterns
and the ranking boost as arithmetic (rows, snapshot, API and MCP: tests/integration/test_entities.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.core.entities import DEFAULT_VOCABULARY, build_vocabulary, entity_id_for
from knowledge_store.core.errors import ConfigError, EntityPatternError
from knowledge_store.retrieval.evidence import EntityBoost, apply_entity_boost
from knowledge_store.retrieval.fusion import Fused


def values(text: str) -> list[tuple[str, str]]:
    return [(m.type, m.canonical_value) for m in DEFAULT_VOCABULARY.extract(text)]


# ------------------------------------------------------------------ extraction and canonical values

def test_default_patterns_find_each_type_with_exact_spans():
    text = "Inspect ASSET-104 and pump EQP-P101 under SOP-42 as API 510 and ISO 9001 require."
    mentions = DEFAULT_VOCABULARY.extract(text)
    assert [(m.type, m.canonical_value) for m in mentions] == [
        ("asset", "ASSET-104"), ("equipment", "EQP-P101"), ("procedure", "SOP-42"),
        ("standard", "API 510"), ("standard", "ISO 9001")]
    for m in mentions:
        assert text[m.span_start:m.span_end] == m.surface == m.canonical_value
        assert m.confidence == 1.0


@pytest.mark.parametrize("written, canonical", [
    ("api 510", ("standard", "API 510")), ("API-510", ("standard", "API 510")), ("API510", ("standard", "API 510")),
    ("iso9001", ("standard", "ISO 9001")), ("ISO 9001:2015", ("standard", "ISO 9001")),
    ("IEC 61511", ("standard", "IEC 61511")), ("sop 42", ("procedure", "SOP-42")), ("sop_42", ("procedure", "SOP-42")),
    ("asset_104", ("asset", "ASSET-104")), ("Asset104", ("asset", "ASSET-104")), ("eqp-p101", ("equipment", "EQP-P101")),
])
def test_spellings_meet_one_canonical_value(written, canonical):
    assert values(f"see {written} here") == [canonical]


@pytest.mark.parametrize("text", [
    "the API 2 endpoint", "ISO 9 paper", "we replaced the asset 12 times", "ASSET-104-A is a sub-part",
    "EQPMENT list", "a SOPHISTICATED 42 step plan",
])
def test_near_misses_are_not_entities(text):
    assert values(text) == []


def test_entity_id_is_a_hash_of_type_and_canonical_value():
    [a] = DEFAULT_VOCABULARY.extract("api-510")
    [b] = DEFAULT_VOCABULARY.extract("API 510")
    assert a.entity_id == b.entity_id == entity_id_for("standard", "API 510") != entity_id_for("asset", "API 510")
    assert len(a.entity_id) == 32


def test_filter_values_are_read_with_the_same_patterns():
    assert DEFAULT_VOCABULARY.filter_keys("api-510") == ["api 510"]
    assert DEFAULT_VOCABULARY.filter_keys(" Pressure  Relief ") == ["pressure relief"]  # no pattern: compared as given


# ------------------------------------------------------------------ configuration

def test_entity_patterns_setting_replaces_removes_and_adds_types(monkeypatch, tmp_path):
    monkeypatch.setenv("GROUNDWORK_ENTITY_PATTERNS", json.dumps({
        "asset": r"\bTAG-(\d+)\b",
        "standard": None,
        "term": {"pattern": r"relief valves?", "canonical": "relief valve", "case": "lower"},
    }))
    vocabulary = Settings(data_dir=tmp_path).entity_vocabulary
    assert vocabulary.types == ["asset", "equipment", "procedure", "term"]
    found = [(m.type, m.canonical_value) for m in vocabulary.extract("TAG-9 has two Relief Valves; API 510; ASSET-1")]
    assert found == [("asset", "TAG-9"), ("term", "relief valve")]
    assert vocabulary.signature != DEFAULT_VOCABULARY.signature


@pytest.mark.parametrize("entry, reason", [
    (r"ASSET-(\d+", "not a valid regular expression"),
    (r"\d*", "matches the empty string"),
    ({"pattern": r"TAG-(\d+)", "canonical": r"TAG-\2"}, "canonical template"),
    ({"pattern": r"TAG-\d+", "case": "title"}, "case must be one of"),
])
def test_a_bad_entity_pattern_is_refused_naming_the_type_and_pattern(entry, reason, tmp_path):
    with pytest.raises(EntityPatternError) as caught:
        Settings(data_dir=tmp_path, entity_patterns={"tag": entry})
    error = caught.value
    assert isinstance(error, ConfigError) and error.entity_type == "tag"
    pattern = entry if isinstance(entry, str) else entry["pattern"]
    assert error.pattern == pattern and repr(pattern) in str(error) and reason in str(error)


def test_a_bad_entity_type_name_is_refused():
    with pytest.raises(EntityPatternError, match="type names"):
        build_vocabulary({"Bad Type": r"X-\d+"})


# ------------------------------------------------------------------ the boost, as arithmetic

def _fused(rows, scores) -> Fused:
    n = len(rows)
    return Fused(rows=np.array(rows, dtype=np.int64), fused=np.array(scores, dtype=np.float64), bm25=np.zeros(n),
                 vector=np.zeros(n), bm25_rank=np.zeros(n, dtype=np.int64), vector_rank=np.zeros(n, dtype=np.int64))


def test_the_boost_lifts_mentioning_candidates_by_a_share_of_the_spread():
    fused = _fused([10, 11, 12, 13], [1.0, 0.8, 0.5, 0.2])
    boosted = apply_entity_boost(fused, EntityBoost((np.array([3, 12]), np.array([12, 13])), weight=0.75))
    # row 12 names both entities (+0.75 * 0.8), row 13 one of two (+0.375 * 0.8)
    assert boosted.rows.tolist() == [12, 10, 11, 13]
    assert boosted.boost.tolist() == pytest.approx([0.6, 0.0, 0.0, 0.3])
    assert boosted.fused.tolist() == pytest.approx([1.1, 1.0, 0.8, 0.5])


def test_candidates_without_a_mention_keep_their_order_and_scores():
    fused = _fused([4, 5, 6], [0.9, 0.5, 0.1])
    boosted = apply_entity_boost(fused, EntityBoost((np.array([99]),), weight=0.75))
    assert boosted.rows.tolist() == [4, 5, 6] and boosted.fused.tolist() == [0.9, 0.5, 0.1]
    assert not boosted.boost.any()
