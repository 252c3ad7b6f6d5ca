"""The console's stored ranking: tuned.json's hand-set block against `groundwork tune`'s choice and the
settings (no server, no model; the HTTP side is in tests/integration/test_console_admin_api.py)."""

from __future__ import annotations

import json

import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.ranking_defaults import (
    effective_ranking,
    effective_reranker,
    ranking_sources,
    reranker_source,
)
from knowledge_store.storage.tuned import (
    RankingParams,
    TunedConfig,
    load_manual,
    load_tuned,
    save_manual,
    save_tuned,
    tuned_path,
)


def tuned_run(params: RankingParams) -> TunedConfig:
    """A stored tuning run (what `groundwork tune` writes) choosing ``params``."""
    return TunedConfig(
        params=params, created_at="2026-01-01T00:00:00+00:00", snapshot_version=1, pseudo_queries={"heading": 20},
        before={"params": {"alpha": 0.7, "fusion": "weighted", "section_weight": 1.0, "lead_weight": 0.6},
                "ndcg@10": 0.5, "recall@5": 0.6},
        after={"params": params.to_dict(), "ndcg@10": 0.6, "recall@5": 0.7},
        table=[{**params.to_dict(), "ndcg@10": 0.6, "recall@5": 0.7}], seconds=1.0,
    )


# ------------------------------------------------------------------ the stored ranking (no server, no model)

def test_console_values_win_over_the_tuned_choice_and_settings_win_over_both(tmp_path):
    settings = Settings(data_dir=tmp_path)
    save_tuned(settings.index_dir, tuned_run(RankingParams(0.8, "rrf", 0.0, 0.3)))
    stored = save_manual(settings.index_dir, {"alpha": 0.4, "reranker": "mmr"})
    assert stored.values == {"alpha": 0.4, "reranker": "mmr"}

    assert effective_ranking(settings, settings.index_dir) == RankingParams(0.4, "rrf", 0.0, 0.3)
    assert ranking_sources(settings, settings.index_dir) == {"alpha": "console", "fusion": "tuned",
                                                             "section_weight": "tuned", "lead_weight": "tuned",
                                                             "question_alpha": "console"}  # questions follow it
    assert (effective_reranker(settings, settings.index_dir), reranker_source(settings, settings.index_dir)) == ("mmr", "console")
    assert load_tuned(settings.index_dir).params.alpha == 0.8  # the tuning evidence is untouched

    pinned = Settings(data_dir=tmp_path, default_alpha=0.55, default_reranker="none")
    assert effective_ranking(pinned, pinned.index_dir).alpha == 0.55
    assert ranking_sources(pinned, pinned.index_dir)["alpha"] == "setting"
    assert effective_reranker(pinned, pinned.index_dir) == "none"

    ignored = Settings(data_dir=tmp_path, use_tuned_ranking=False)
    assert effective_reranker(ignored, ignored.index_dir) == ignored.default_reranker
    assert set(ranking_sources(ignored, ignored.index_dir).values()) == {"default"}

    # null forgets a value; forgetting the last one leaves the tuning run alone
    save_manual(settings.index_dir, {"alpha": None})
    assert effective_ranking(settings, settings.index_dir).alpha == 0.8
    save_manual(settings.index_dir, {"reranker": None})
    assert load_manual(settings.index_dir) is None and load_tuned(settings.index_dir) is not None
    assert "manual" not in json.loads(tuned_path(settings.index_dir).read_text())


def test_a_new_tuning_run_replaces_hand_set_alpha_but_keeps_the_hand_set_reranker(tmp_path):
    settings = Settings(data_dir=tmp_path)
    save_manual(settings.index_dir, {"alpha": 0.2, "fusion": "dbsf", "reranker": "feedback"})
    assert load_tuned(settings.index_dir) is None  # set by hand only: no tuning evidence is made up
    save_tuned(settings.index_dir, tuned_run(RankingParams(0.6, "rrf", 1.0, 0.0)))
    assert effective_ranking(settings, settings.index_dir) == RankingParams(0.6, "rrf", 1.0, 0.0)
    assert load_manual(settings.index_dir).values == {"reranker": "feedback"}
    assert effective_reranker(settings, settings.index_dir) == "feedback"


@pytest.mark.parametrize("manual", [{"alpha": 3}, {"fusion": "bogus"}, {"reranker": "magic"}, "not an object"])
def test_a_damaged_hand_set_block_is_ignored_and_the_tuning_still_applies(tmp_path, manual):
    settings = Settings(data_dir=tmp_path)
    save_tuned(settings.index_dir, tuned_run(RankingParams(0.6, "rrf", 1.0, 0.0)))
    path = tuned_path(settings.index_dir)
    path.write_text(json.dumps({**json.loads(path.read_text()), "manual": manual}))
    assert load_manual(settings.index_dir) is None
    assert effective_ranking(settings, settings.index_dir) == RankingParams(0.6, "rrf", 1.0, 0.0)
