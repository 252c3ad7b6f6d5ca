"""Self-tuning without a model: the stored choice and its precedence over the built-in defaults, a damaged
tuned.json, the fusion vocabulary everywhere and `groundwork tune --reset` (the tuning itself on a real tiny
index: tests/integration/test_tuning.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.learning.tuning import keep_decision
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.ranking_defaults import (
    builtin_ranking,
    effective_question_alpha,
    effective_ranking,
    ranking_sources,
)
from knowledge_store.storage.tuned import RankingParams, TunedConfig, load_tuned, save_manual, save_tuned, tuned_path


def fake_tuned(params: RankingParams, ndcg_before: float = 0.5, ndcg_after: float = 0.6) -> TunedConfig:
    builtin = {"alpha": 0.5, "fusion": "weighted", "section_weight": 0.5, "lead_weight": 0.3}
    return TunedConfig(
        params=params, created_at="2026-01-01T00:00:00+00:00", snapshot_version=1,
        pseudo_queries={"heading": 20, "title": 5},
        before={"params": builtin, "ndcg@10": ndcg_before, "recall@5": 0.7},
        after={"params": params.to_dict(), "ndcg@10": ndcg_after, "recall@5": 0.8},
        table=[{**params.to_dict(), "ndcg@10": ndcg_after, "recall@5": 0.8, "ndcg@10_by_kind": {"heading": ndcg_after}}],
        seconds=1.5,
    )


class NoEmbedder:
    """RetrievalEngine.request() never embeds; this keeps the fast tests free of the model."""

    model_id = "none"
    dim = 384


def resolved(engine, query: str, **params):
    """The request ``engine`` would search with, before any index exists: its query's form read from the text
    alone, and the alpha that form gets."""
    return engine.resolve(engine.request(query, **params), None)


# ------------------------------------------------------------------ no model needed


def test_effective_ranking_precedence_setting_over_tuned_over_builtin(tmp_path):
    from knowledge_store.retrieval.engine import RetrievalEngine

    settings = Settings(data_dir=tmp_path)
    builtin = builtin_ranking(settings)
    assert effective_ranking(settings, settings.index_dir) == builtin  # nothing tuned yet
    assert set(ranking_sources(settings, settings.index_dir).values()) == {"default"}

    chosen = RankingParams(0.8, "rrf", 1.0, 0.0)
    save_tuned(settings.index_dir, fake_tuned(chosen))
    # tuned wins over the built-in defaults, in the engine too
    assert effective_ranking(settings, settings.index_dir) == chosen
    assert ranking_sources(settings, settings.index_dir) == {
        **dict.fromkeys(("alpha", "fusion", "section_weight", "lead_weight"), "tuned"), "question_alpha": "default"}
    assert resolved(RetrievalEngine(settings, embedder=NoEmbedder()), "anything").ranking == chosen

    # a setting given explicitly wins over the tuned value, field by field
    explicit = Settings(data_dir=tmp_path, default_alpha=0.6, lead_weight=0.3)
    assert effective_ranking(explicit, explicit.index_dir) == RankingParams(0.6, "rrf", 1.0, 0.3)
    assert ranking_sources(explicit, explicit.index_dir) == {"alpha": "setting", "fusion": "tuned",
                                                             "section_weight": "tuned", "lead_weight": "setting",
                                                             "question_alpha": "setting"}  # a pinned alpha: every query
    # and a value the query passes wins over everything
    request = RetrievalEngine(explicit, embedder=NoEmbedder()).request("anything", alpha=0.2, fusion="dbsf")
    assert request.ranking == RankingParams(0.2, "dbsf", 1.0, 0.3)

    # use_tuned_ranking=False ignores the file
    off = Settings(data_dir=tmp_path, use_tuned_ranking=False)
    assert effective_ranking(off, off.index_dir) == builtin_ranking(off) == builtin
    assert set(ranking_sources(off, off.index_dir).values()) <= {"default", "setting"}


@pytest.mark.parametrize("content", ["{not json", json.dumps({"params": {"alpha": 7}}), json.dumps([1, 2, 3]), ""])
def test_a_damaged_tuned_file_is_ignored_not_a_crash(tmp_path, content):
    from knowledge_store.retrieval.engine import RetrievalEngine

    settings = Settings(data_dir=tmp_path)
    tuned_path(settings.index_dir).parent.mkdir(parents=True)
    tuned_path(settings.index_dir).write_text(content)
    assert load_tuned(settings.index_dir) is None
    assert effective_ranking(settings, settings.index_dir) == builtin_ranking(settings)
    assert resolved(RetrievalEngine(settings, embedder=NoEmbedder()), "anything").ranking == builtin_ranking(settings)


def test_a_clear_gain_on_the_pseudo_queries_is_adopted():
    builtin = np.full(300, 0.5)
    best = builtin + 0.02 + np.random.default_rng(1).normal(0, 0.05, 300)
    decision = keep_decision(best, builtin)
    assert decision["adopted"] and decision["gain"] > decision["required"] >= 0.005
    assert decision["reason"].startswith("adopted: +0.0")


def test_a_gain_within_the_noise_of_the_draw_keeps_the_built_in():
    """Mean +0.025 (five times the fixed margin) but half the pseudo-queries win and half lose big."""
    builtin = np.full(40, 0.5)
    best = builtin + np.tile([0.5, -0.45], 20)
    decision = keep_decision(best, builtin)
    assert decision["gain"] == 0.025 and not decision["adopted"]
    assert decision["required"] > 0.1 and "kept the built-in" in decision["reason"]


def test_a_steady_gain_smaller_than_min_gain_keeps_the_built_in():
    builtin = np.full(300, 0.5)
    decision = keep_decision(builtin + 0.003, builtin, min_gain=0.005)
    assert decision["standard_error"] == 0.0 and decision["required"] == 0.005 and not decision["adopted"]


def test_the_built_in_as_best_is_not_a_change():
    scores = np.linspace(0, 1, 50)
    decision = keep_decision(scores, scores)
    assert not decision["adopted"] and "is the built-in" in decision["reason"]


def test_a_tuned_file_written_before_decisions_were_recorded_still_loads(tmp_path):
    params = RankingParams(0.6, "weighted", 1.0, 0.3)
    data = fake_tuned(params).to_dict()
    del data["decision"]
    tuned_path(tmp_path).write_text(json.dumps(data))
    loaded = load_tuned(tmp_path)
    assert loaded is not None and loaded.params == params and loaded.decision is None


def test_fusion_vocabulary_comes_from_fusion_modes():
    from typing import get_args

    from pydantic import ValidationError

    from knowledge_store.cli import build_parser
    from knowledge_store.server.mcp_server import vocabulary_parameters
    from knowledge_store.server.request_models import QueryBody
    from pipelines.evaluation import CONFIGURATIONS

    parser = build_parser()
    for mode in FUSION_MODES:
        assert parser.parse_args(["query", "x", "--fusion", mode]).fusion == mode
        assert parser.parse_args(["eval", "folder", "--fusion", mode]).fusion == mode
        assert QueryBody(query="x", fusion=mode).fusion == mode
    with pytest.raises(SystemExit):
        parser.parse_args(["query", "x", "--fusion", "bogus"])
    with pytest.raises(ValidationError):
        QueryBody(query="x", fusion="bogus")
    body = QueryBody(query="x", section_weight=0.25, lead_weight=1.0)
    assert (body.section_weight, body.lead_weight) == (0.25, 1.0)
    with pytest.raises(ValidationError):
        QueryBody(query="x", lead_weight=1.5)
    mcp_fusion = get_args(get_args(get_args(vocabulary_parameters()["fusion"])[0])[0])  # Annotated[Literal | None]
    assert set(mcp_fusion) == set(FUSION_MODES)
    assert {c.fusion for c in CONFIGURATIONS if c.alpha is None} == set(FUSION_MODES)


def test_cli_tune_reset_and_a_missing_index(tmp_path, capsys):
    from knowledge_store.cli import main

    data = tmp_path / "data"
    assert main(["tune", "--data-dir", str(data)]) == 2  # nothing published: one clear line, exit code 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no published index snapshot") and "\n" not in err

    settings = Settings(data_dir=data)
    save_tuned(settings.index_dir, fake_tuned(RankingParams(0.8, "rrf", 1.0, 0.0)))
    assert main(["tune", "--reset", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert "removed" in out and "built-in defaults" in out
    assert not tuned_path(settings.index_dir).exists()
    assert effective_ranking(settings, settings.index_dir) == builtin_ranking(settings)
    assert main(["tune", "--reset", "--data-dir", str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] is False


def test_questions_get_the_question_alpha_unless_a_query_or_a_pinned_alpha_says_otherwise(tmp_path):
    from knowledge_store.retrieval.engine import RetrievalEngine

    settings = Settings(data_dir=tmp_path)
    engine = RetrievalEngine(settings, embedder=NoEmbedder())
    question, other = "How do I sort a hash by value?", "sort hash by value"
    assert resolved(engine, question).alpha == settings.question_alpha == 0.8
    assert resolved(engine, question).query_form == "question" and resolved(engine, other).query_form == "other"
    assert resolved(engine, other).alpha == settings.default_alpha == 0.7
    assert resolved(engine, "why does my build fail").alpha == 0.8  # a wh-word opens a question without "?"
    assert resolved(engine, question, alpha=0.3).alpha == 0.3  # the query's own alpha wins

    # self-tuning chooses the alpha of everything else; questions keep theirs
    save_tuned(settings.index_dir, fake_tuned(RankingParams(0.5, "weighted", 1.0, 0.6)))
    assert (resolved(engine, question).alpha, resolved(engine, other).alpha) == (0.8, 0.5)

    # an alpha pinned by a setting or in the console is meant for every query
    pinned = RetrievalEngine(Settings(data_dir=tmp_path, default_alpha=0.6), embedder=NoEmbedder())
    assert (resolved(pinned, question).alpha, pinned.question_alpha()) == (0.6, None)
    save_manual(settings.index_dir, {"alpha": 0.45})
    assert (resolved(engine, question).alpha, ranking_sources(settings, settings.index_dir)["question_alpha"]) == (0.45, "console")
    # ... unless the question alpha is set explicitly too; and it can be switched off
    both = Settings(data_dir=tmp_path, default_alpha=0.6, question_alpha=0.9)
    assert effective_question_alpha(both, both.index_dir) == 0.9
    off = RetrievalEngine(Settings(data_dir=tmp_path, question_alpha=None), embedder=NoEmbedder())
    assert resolved(off, question).alpha == 0.45 and off.question_alpha() is None
