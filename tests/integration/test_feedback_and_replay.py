"""Feedback -> gold set (knowledge_store.evaluation.feedback_gold) and query-log replay drift (knowledge_store.evaluation.log_replay),
on a real index of the sample corpus that the last test re-syncs after editing a document."""

from __future__ import annotations

import pytest

from knowledge_store.evaluation.feedback_gold import GoldSample, feedback_gold_set, helpful_by_config
from knowledge_store.evaluation.log_replay import ReplayReport, compare, replay
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.sample_corpus import FAQ
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.query_log import QueryLog
from tests.helpers import build_sample_index

pytestmark = pytest.mark.slow

CHILDREN = "How do I stop children from changing the temperature with a screen lock PIN?"
FIRMWARE = "How are firmware updates installed at night?"
CWIRE = "Does the Aurora need a C-wire?"


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("feedback_replay")
    return build_sample_index(root, embedder, query_torch_threads=2), root


@pytest.fixture(scope="module")
def world(sample_index, embedder):
    """Three logged searches (client "api") with feedback, plus one "eval" search."""
    settings, root = sample_index
    log = QueryLog(root / "logs.duckdb")
    engine = RetrievalEngine(settings, embedder=embedder, query_log=log)
    children = engine.search(CHILDREN, k=5, alpha=0.5, fusion="weighted", reranker="none", client="api")
    firmware = engine.search(FIRMWARE, k=5, alpha=0.5, fusion="weighted", reranker="none", client="api")
    cwire = engine.search(CWIRE, k=5, alpha=0.3, fusion="rrf", reranker="mmr", client="api")
    engine.search(CWIRE, k=5, client="eval")  # never replayed
    for response in (children, firmware, cwire):
        assert len(response.hits) == 5 and response.retrieval_request_id
    c, f = children.hits, firmware.hits
    # children: up on #1, down on #2 (then changed to up), down on #4, request-level up
    log.add_feedback(children.retrieval_request_id, "up", chunk_id=c[0].chunk_id)
    log.add_feedback(children.retrieval_request_id, "down", chunk_id=c[1].chunk_id)
    log.add_feedback(children.retrieval_request_id, "down", chunk_id=c[3].chunk_id)
    log.add_feedback(children.retrieval_request_id, "up")
    log.add_feedback(children.retrieval_request_id, "up", chunk_id=c[1].chunk_id)  # newest wins: up
    # firmware: up on #1 then down on #1 (newest wins: down) -> a negative-only sample
    log.add_feedback(firmware.retrieval_request_id, "up", chunk_id=f[0].chunk_id)
    log.add_feedback(firmware.retrieval_request_id, "down", chunk_id=f[0].chunk_id)
    # cwire: request-level down only -> a sample with no ids at all
    log.add_feedback(cwire.retrieval_request_id, "down")
    yield {"engine": engine, "log": log, "settings": settings, "root": root,
           "children": children, "firmware": firmware, "cwire": cwire}
    log.close()


def _by_query(samples: list[GoldSample]) -> dict[str, GoldSample]:
    return {s.query: s for s in samples}


def test_gold_set_has_reference_and_negative_ids_and_hashes(world):
    samples = feedback_gold_set(world["log"])
    assert len(samples) == 3  # one per request with feedback; the "eval" search has none
    gold = _by_query(samples)
    c = world["children"].hits
    children = gold[CHILDREN]
    assert children.retrieval_request_id == world["children"].retrieval_request_id
    assert children.reference_ids == [c[0].chunk_id, c[1].chunk_id]  # c[1]: down, then up -> up
    assert children.negative_ids == [c[3].chunk_id]
    assert children.reference_hashes == [c[0].content_hash, c[1].content_hash]
    assert children.negative_hashes == [c[3].content_hash]
    assert children.request_ratings == ["up"]
    assert children.params["alpha"] == 0.5 and children.params["fusion"] == "weighted"
    assert children.params["reranker"] == "none" and children.params["k"] == 5
    assert children.created_at is not None and children.has_references
    assert children.relevant() == {c[0].chunk_id, c[1].chunk_id}


def test_newest_rating_wins_and_negative_only_samples_are_kept(world):
    gold = _by_query(feedback_gold_set(world["log"]))
    f = world["firmware"].hits
    firmware = gold[FIRMWARE]
    assert firmware.reference_ids == [] and firmware.negative_ids == [f[0].chunk_id]
    assert firmware.negative_hashes == [f[0].content_hash]
    assert not firmware.has_references  # metrics must skip it
    cwire = gold[CWIRE]  # request-level feedback only: no ids, but still a sample
    assert cwire.reference_ids == cwire.negative_ids == [] and cwire.request_ratings == ["down"]
    assert cwire.params["fusion"] == "rrf" and cwire.params["reranker"] == "mmr"


def test_gold_set_since_filters_by_query_time(world):
    samples = feedback_gold_set(world["log"])
    newest = max(s.created_at for s in samples)
    assert [s.query for s in feedback_gold_set(world["log"], since=newest)] == [CWIRE]


def test_helpful_rate_per_config(world):
    rows = helpful_by_config(world["log"])
    by_config = {(r["alpha"], r["fusion"], r["reranker"]): r for r in rows}
    assert set(by_config) == {(0.5, "weighted", "none"), (0.3, "rrf", "mmr")}
    weighted = by_config[(0.5, "weighted", "none")]
    # children: c0 up, c1 up (newest), c3 down, request up -> 3 up 1 down; firmware: f0 down (newest)
    assert (weighted["up"], weighted["down"], weighted["rated"], weighted["requests"]) == (3, 2, 5, 2)
    assert weighted["helpful_rate"] == pytest.approx(3 / 5)
    rrf = by_config[(0.3, "rrf", "mmr")]
    assert (rrf["up"], rrf["down"], rrf["requests"]) == (0, 1, 1) and rrf["helpful_rate"] == 0.0
    assert rows[0] is weighted  # most rated first


def test_compare_matches_by_id_or_hash():
    logged = [{"chunk_id": "a", "content_hash": "h1"}, {"chunk_id": "b", "content_hash": "h2"},
              {"chunk_id": "c", "content_hash": "h3"}]
    current = [{"chunk_id": "a", "content_hash": "h1"}, {"chunk_id": "b2", "content_hash": "h2"},
               {"chunk_id": "d", "content_hash": "h4"}]
    overlap, added, removed, by_hash = compare(logged, current)
    assert overlap == pytest.approx(2 / 3) and added == ["d"] and removed == ["c"] and by_hash == 1
    assert compare([], []) == (1.0, [], [], 0)


def test_replay_on_the_unchanged_index_finds_no_drift(world):
    report = replay(world["log"], world["engine"])
    assert isinstance(report, ReplayReport)
    assert report.queries == 3  # the "eval" search is not replayed
    assert report.mean_overlap == 1.0 and report.changed_queries == 0
    assert {row.query for row in report.per_query} == {CHILDREN, FIRMWARE, CWIRE}
    rows = report.to_rows()
    assert len(rows) == 3 and all(r["overlap"] == 1.0 and not r["changed"] for r in rows)
    assert all(r["logged_snapshot"] == r["current_snapshot"] for r in rows)
    assert set(rows[0]) >= {"retrieval_request_id", "query", "overlap", "added", "removed",
                            "logged_snapshot", "current_snapshot"}
    assert world["log"].count() == 4  # replay does not log


def test_replay_detects_drift_after_a_document_changes(world, embedder):
    """Runs last: rewrites one FAQ answer and re-syncs the module's index."""
    faq = world["root"] / "docs" / FAQ
    text = faq.read_text(encoding="utf-8")
    start = text.index("### How do I stop children")
    end = text.index("### Can I switch")
    text = (text[:start] + "### How do I stop children from changing the temperature?\n\n"
            "The screen lock was removed in firmware 4.0. Ask Corvane support for a wall cover plate instead.\n\n"
            + text[end:])
    faq.write_text(text, encoding="utf-8")
    run_sync(world["settings"], embedder)
    engine = world["engine"]
    engine.snapshots.check_interval_s = 0

    report = replay(world["log"], engine)
    rows = {row.query: row for row in report.per_query}
    assert all(row.current_snapshot > row.logged_snapshot for row in rows.values())
    old_children = world["children"].hits[0]
    children = rows[CHILDREN]
    assert children.overlap < 1.0 and children.changed
    assert old_children.chunk_id in children.removed and len(children.added) >= 1
    # the C-wire answer lives in the same (re-versioned) FAQ document: new chunk id, same text
    old_cwire = world["cwire"].hits[0]
    assert old_cwire.doc_id == world["children"].hits[0].doc_id
    current_cwire = engine.search(CWIRE, k=5, alpha=0.3, fusion="rrf", reranker="mmr", log=False)
    assert old_cwire.chunk_id not in {h.chunk_id for h in current_cwire.hits}
    assert old_cwire.content_hash in {h.content_hash for h in current_cwire.hits}
    cwire = rows[CWIRE]
    assert cwire.overlap == 1.0 and not cwire.changed and cwire.kept_by_hash >= 1
    assert report.changed_queries >= 1 and report.mean_overlap < 1.0


def test_feedback_and_drift_assets_report_in_dagster(world):
    import dagster as dg

    from pipelines.evaluation import EvaluationResource, feedback_eval, query_log_drift
    from pipelines.resources import RetrievalResource

    settings, root = world["settings"], world["root"]
    world["log"].flush()
    resources = {
        "evaluation": EvaluationResource(logs_path=str(root / "logs.duckdb"), data_dir=str(settings.data_dir)),
        "retrieval": RetrievalResource(data_dir=str(settings.data_dir)),
    }
    result = dg.materialize([feedback_eval, query_log_drift], resources=resources)
    assert result.success
    fb = result.asset_materializations_for_node("feedback_eval")[0].metadata
    assert fb["samples"].value == 3 and fb["samples_with_references"].value == 1
    # RAGAS context recall@5 of the suite's configurations on the thumbs' references, one entry per configuration
    assert 0.0 <= fb["ragas_recall@5/hybrid"].value <= 1.0 and "hybrid" in fb["by_configuration"].value
    assert "helpful_rate" in fb["helpful_rate_by_configuration"].value
    drift = result.asset_materializations_for_node("query_log_drift")[0].metadata
    assert drift["queries_replayed"].value == 3 and 0.0 <= drift["mean_top5_overlap"].value <= 1.0
