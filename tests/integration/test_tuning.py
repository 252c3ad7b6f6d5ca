"""Self-tuning plumbing: pseudo-queries and query-text stripping on a real tiny index, the stored
choice and its precedence, ``groundwork tune``, the Dagster asset and ``/api/knowledge/config``.

The tiny corpus: 8 Markdown documents, each a title, an introduction and three sections (one an
FAQ-style "How do I ...?" question), with distinct vocabulary and sections long enough not to be
merged by the chunker: 8 titles + 8 questions + 16 headings = 32 pseudo-queries (tuning needs 20).

The parts that need no model, store or server are in tests/unit/test_tuning.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.query_adapter import QueryAdapter, adapter_path
from knowledge_store.retrieval.ranking_defaults import builtin_ranking, effective_ranking
from knowledge_store.storage.tuned import load_tuned, tuned_path

DOCS = {
    "greenhouse.md": ("Greenhouse Irrigation Handbook", [
        ("Drip Line Layout", "Run the drip tubing along each bench and keep emitters thirty centimetres apart so every tray "
         "receives water. Anchor the tubing with wire pins so it does not creep when the plastic warms up during the afternoon."),
        ("How do I flush clogged emitters?", "Open the end caps, raise the pressure for two minutes and soak blocked nozzles "
         "in diluted vinegar overnight. Rinse them in clean water before refitting, and check that each one drips evenly again."),
        ("Seasonal Watering Schedule", "Water tomatoes every morning in summer, every second day in spring, and twice weekly "
         "through winter months. Seedlings dry out faster than mature plants, so inspect the trays by hand at noon."),
    ]),
    "beekeeping.md": ("Backyard Beekeeping Primer", [
        ("Hive Inspection Routine", "Open the brood box on warm calm afternoons, lift frames gently and look for eggs, larvae "
         "and capped cells. Use a little smoke at the entrance first and keep every frame over the open box while you look at it."),
        ("How do I prevent swarming colonies?", "Give the queen more room early, split strong colonies in late spring and "
         "remove queen cells weekly. A crowded brood nest in May is the clearest warning sign that the workers are preparing to leave."),
        ("Honey Harvest Timing", "Take honey supers off once eighty percent of the comb is capped and the nectar flow has "
         "ended. Uncapped nectar ferments in the jar, so test a frame by shaking it gently over the open hive."),
    ]),
    "bicycle.md": ("Bicycle Maintenance Guide", [
        ("Chain Lubrication Steps", "Wipe the chain with a rag, apply one drop of oil per roller and spin the pedals "
         "backwards for a minute. Wipe off the excess afterwards because surplus oil collects grit that wears the cassette quickly."),
        ("How do I adjust rim brakes?", "Loosen the pad bolt, centre the pad on the braking surface, and tighten the cable "
         "until the lever feels firm. Toe the front of each pad inwards by a millimetre so the stop is quiet and does not squeal."),
        ("Tyre Pressure Table", "Road tyres need about seven bar, gravel tyres three, and mountain tyres under two for loose "
         "trails. Heavier riders add a little, and wet days call for slightly less to keep the contact patch wide."),
    ]),
    "sourdough.md": ("Sourdough Baking Notes", [
        ("Starter Feeding Ratio", "Mix one part starter with equal weights of flour and water and keep the jar at room "
         "temperature. A lively culture doubles within six hours and smells pleasantly sour rather than sharp like acetone."),
        ("How do I shape a tight boule?", "Pre-shape the dough into a round, rest twenty minutes, then drag it across the "
         "bench to build surface tension. Dust the basket with rice flour so the loaf releases cleanly after the cold overnight proof."),
        ("Oven Spring Problems", "Bake inside a preheated cast iron pot with the lid on for the first twenty minutes to trap "
         "steam. Flat loaves usually mean an overproofed dough or a score that was too shallow to open."),
    ]),
    "aquarium.md": ("Freshwater Aquarium Care", [
        ("Nitrogen Cycle Basics", "Beneficial bacteria turn ammonia from fish waste into nitrite and then into far less "
         "harmful nitrate. A new tank needs about four weeks before those colonies are strong enough to handle a full stock."),
        ("How do I acclimate new fish?", "Float the sealed bag for fifteen minutes, add tank water gradually, then net the "
         "fish into the tank. Keep the lights off for the rest of the day so the newcomers can settle without stress."),
        ("Filter Sponge Cleaning", "Squeeze the sponge in a bucket of old tank water; tap water would kill the useful "
         "bacteria colonies. Clean only half of the media at a time so the biological balance is never lost completely."),
    ]),
    "telescope.md": ("Amateur Telescope Setup", [
        # the heading's words appear nowhere else in the corpus (the strip test relies on it)
        ("Collimating Newtonian Mirrors", "Use a laser tool to centre the secondary, then tilt the primary until the dot "
         "returns to the centre ring. Repeat the check after transport because bumpy roads shift the optics out of line."),
        ("How do I polar align the mount?", "Level the tripod, point the axis at the celestial pole and refine the position "
         "with the adjustment knobs. Accurate alignment lets the motor track objects for long exposures without drifting stars."),
        ("Eyepiece Magnification Formula", "Divide the focal length of the instrument by the focal length of the eyepiece "
         "to get the power. Useful power rarely exceeds twice the aperture in millimetres, whatever the box promises."),
    ]),
    "pottery.md": ("Studio Pottery Techniques", [
        ("Wedging Clay Properly", "Knead the clay in a spiral motion about fifty times to remove air pockets and align the "
         "particles. Trapped air expands in the kiln and can crack or even burst a finished piece."),
        ("How do I centre clay on the wheel?", "Wet your hands, brace your elbows on your thighs and push the lump down and "
         "inwards while spinning fast. Cone it up and down two or three times until it runs true without wobbling under your palms."),
        ("Glaze Firing Temperatures", "Stoneware glazes mature around cone six, while earthenware glazes melt at much lower "
         "kiln temperatures. Always fire a test tile first because thickness and clay body change the final colour."),
    ]),
    "kayak.md": ("Sea Kayak Safety Manual", [
        ("Wet Exit Practice", "Lean forward, pull the spray skirt loop, push the boat away with both hands and surface "
         "beside it. Practise in warm shallow water with a partner standing by until the movement becomes automatic."),
        ("How do I read marine forecasts?", "Check wind speed, swell period and tide times, and stay ashore when gusts "
         "exceed fifteen knots. Offshore winds are the most dangerous because they push a tired paddler away from land."),
        ("Paddle Float Rescue", "Attach the float to one blade, lay the shaft across the rear deck and climb back in using it "
         "as an outrigger. Pump the cockpit dry before paddling on, since a swamped boat is unstable in chop."),
    ]),
}
TITLES = {title for title, _ in DOCS.values()}
HEADINGS = {heading for _, sections in DOCS.values() for heading, _ in sections}
UNIQUE_HEADING = "Collimating Newtonian Mirrors"


def write_tiny_corpus(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (title, sections) in DOCS.items():
        lines = [f"# {title}", "", f"This page belongs to the {title.lower()} series of short reference notes, "
                 "written for beginners who want one page per topic and nothing more.", ""]
        for heading, text in sections:
            lines += [f"## {heading}", "", text, ""]
        (folder / name).write_text("\n".join(lines))


# ------------------------------------------------------------------ on a real tiny index


@pytest.fixture(scope="module")
def tiny_embedder(model_path):
    from knowledge_store.models.embeddings import Embedder

    return Embedder(model_path, batch_size=32, torch_threads=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_embedder):
    """The tiny corpus ingested through the normal sync path (real model, real index)."""
    from knowledge_store.ingest.run import run_sync

    root = tmp_path_factory.mktemp("tuning")
    write_tiny_corpus(root / "docs")
    settings = Settings(data_dir=root / "data", sources=[root / "docs"], torch_threads=1)
    run_sync(settings, tiny_embedder)
    return settings


@pytest.fixture()
def snapshot(tiny):
    from knowledge_store.retrieval.snapshot_reader import load_snapshot

    snap = load_snapshot(tiny.index_dir)
    yield snap
    snap.close()


def untuned(settings: Settings) -> Settings:
    tuned_path(settings.index_dir).unlink(missing_ok=True)
    return settings


@pytest.mark.slow
def test_pseudo_queries_have_question_heading_and_title_kinds_with_real_targets(snapshot):
    from knowledge_store.learning.tuning import build_pseudo_queries

    queries = build_pseudo_queries(snapshot)
    kinds = {q.kind for q in queries}
    assert kinds == {"question", "heading", "title"}
    assert len(queries) == len(TITLES) + len(HEADINGS) == 32
    section_paths = snapshot.records.column("section_path").to_pylist()
    for q in queries:
        assert q.targets and q.strip == q.query
        if q.kind == "title":
            assert q.unit == "document" and q.strip_field == "title" and q.query in TITLES
            assert {snapshot.documents[d]["title"] for d in q.targets} == {q.query}
        else:
            assert q.unit == "section" and q.strip_field == "section" and q.query in HEADINGS
            assert q.query.endswith("?") == (q.kind == "question")
            for group in q.targets:  # the target section exists and is the one under that heading
                rows = np.flatnonzero(snapshot.sections.group == group)
                assert len(rows) and all(section_paths[r][-1] == q.query for r in rows)


@pytest.mark.slow
def test_the_query_text_is_removed_from_its_target(snapshot, tiny_embedder):
    from knowledge_store.learning.tuning import TermCounter, build_pseudo_queries, strip_query_from_targets
    from knowledge_store.retrieval.evidence import gather_evidence

    pq = next(q for q in build_pseudo_queries(snapshot) if q.query == UNIQUE_HEADING)
    vector = tiny_embedder.embed([pq.query])[0]
    evidence = gather_evidence(snapshot, pq.query, vector)
    stripped = strip_query_from_targets(snapshot, pq, evidence, tiny_embedder.embed, TermCounter(snapshot), vector)
    target = np.flatnonzero(np.isin(snapshot.sections.group, list(pq.targets)))
    others = np.setdiff1d(np.arange(snapshot.size), target)
    assert len(target) >= 1
    # the heading's words occur only in that heading: without it the target's BM25 and cosine drop
    assert np.all(evidence.bm25_chunk[target] > 0)
    assert np.all(stripped.bm25_chunk[target] < evidence.bm25_chunk[target])
    assert np.all(stripped.bm25_section[target] < evidence.bm25_section[target])
    assert np.all(stripped.vector_chunk[target] < evidence.vector_chunk[target])
    # every other row keeps its real scores: the competition is the real one
    assert np.array_equal(stripped.bm25_chunk[others], evidence.bm25_chunk[others])
    assert np.array_equal(stripped.vector_chunk[others], evidence.vector_chunk[others])
    # the served second passes (sentence evidence, the feedback step) score the pool from chunk vectors: they get
    # the stripped ones for the targets, and the snapshot's own vectors stay as stored
    from knowledge_store.retrieval.evidence import chunk_vectors, pool_vector_evidence

    stored = snapshot.embeddings[target].copy()
    assert sorted(stripped.replaced) == target.tolist()
    assert np.allclose(chunk_vectors(snapshot, target, stripped.replaced) @ vector, stripped.vector_chunk[target], atol=1e-5)
    rescored = pool_vector_evidence(snapshot, target, vector, 0.0, 0.0, stripped.replaced)
    assert np.allclose(rescored, stripped.vector_chunk[target], atol=1e-5)
    assert np.all(pool_vector_evidence(snapshot, target, vector, 0.0) > rescored)  # stored header: the leak it closes
    assert np.array_equal(snapshot.embeddings[target], stored)


@pytest.mark.slow
def test_tune_corpus_saves_a_choice_on_the_grid_not_worse_than_builtin(tiny, tiny_embedder):
    from knowledge_store.learning.tuning import default_grid, tune_corpus

    settings = untuned(tiny)
    tuned = tune_corpus(settings, embedder=tiny_embedder, feedback=[], save=True)
    assert tuned_path(settings.index_dir).is_file()
    stored = load_tuned(settings.index_dir)
    assert stored is not None and stored.to_dict() == tuned.to_dict()
    grid = default_grid()
    assert stored.params in grid
    assert stored.after["ndcg@10"] >= stored.before["ndcg@10"]
    # the pseudo-queries are scored for real (section numbers against section numbers): on this corpus of
    # distinct subjects most find their target; 0.0 here was a bug that kept every corpus on the built-in
    assert stored.before["ndcg@10"] > 0.5 and stored.before["recall@5"] > 0.5
    assert stored.before["params"] == builtin_ranking(settings).to_dict()
    assert stored.pseudo_queries == {"question": 8, "heading": 16, "title": 8}
    assert len(stored.table) == len(grid)  # the built-in default is on the grid
    # the best grid point is adopted only when its gain is clear of the draw's noise (keep_decision)
    decision = stored.decision
    assert decision is not None  # the stored scores are rounded to 4 places
    assert abs(decision["gain"] - (stored.table[0]["ndcg@10"] - stored.before["ndcg@10"])) <= 2e-4
    if decision["adopted"]:
        assert stored.after["ndcg@10"] == stored.table[0]["ndcg@10"] and "adopted" in decision["reason"]
    else:
        assert stored.after == stored.before and "kept the built-in" in decision["reason"]
    assert effective_ranking(settings, settings.index_dir) == stored.params


@pytest.mark.slow
def test_cli_tune_dry_run_does_not_write_and_json_and_too_few_queries(tiny, capsys, monkeypatch):
    from knowledge_store.cli import main

    monkeypatch.setenv("GROUNDWORK_TORCH_THREADS", "1")
    settings = untuned(tiny)
    data = str(settings.data_dir)
    assert main(["tune", "--dry-run", "--data-dir", data]) == 0
    out = capsys.readouterr().out
    assert not tuned_path(settings.index_dir).exists()
    for text in ("pseudo-queries: 32 (question 8, heading 16, title 8)", "built-in", "chosen", "nDCG@10", "Recall@5",
                 "top 5 of", "dry run: nothing saved"):
        assert text in out, text

    assert main(["tune", "--json", "--data-dir", data]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"params", "created_at", "snapshot_version", "pseudo_queries", "before", "after", "table", "seconds"} <= set(report)
    assert load_tuned(settings.index_dir).params.to_dict() == report["params"]

    untuned(settings)
    assert main(["tune", "--limit", "5", "--data-dir", data]) == 2  # TuningError: one line, exit code 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: only") and "pseudo-queries" in err and "\n" not in err
    assert not tuned_path(settings.index_dir).exists()


@pytest.mark.slow
def test_dagster_asset_materialises_with_metadata_and_check(tiny):
    import dagster as dg

    from pipelines.resources import EmbeddingModelResource, RetrievalResource
    from pipelines.tuning import TUNING_ASSETS, TUNING_CHECKS

    settings = untuned(tiny)
    resources = {"retrieval": RetrievalResource(data_dir=str(settings.data_dir)),
                 "model": EmbeddingModelResource(torch_threads=1)}
    result = dg.materialize([*TUNING_ASSETS, *TUNING_CHECKS], resources=resources, raise_on_error=False)
    assert result.success
    metadata = result.asset_materializations_for_node("corpus_tuning")[0].metadata
    for key in ("pseudo_queries", "pseudo_queries_question", "pseudo_queries_heading", "pseudo_queries_title",
                "chosen", "alpha", "fusion", "section_weight", "lead_weight", "ndcg_at_10_before", "ndcg_at_10_after",
                "ndcg_at_10_delta", "recall_at_5_before", "recall_at_5_after", "recall_at_5_delta", "duration_s",
                "before_after", "top_configurations", "plot", "plot_path", "tuned_path", "decision",
                "best_gain_ndcg_at_10", "best_gain_standard_error", "gain_required"):
        assert key in metadata, key
    assert metadata["decision"].value == load_tuned(settings.index_dir).decision["reason"]
    assert metadata["pseudo_queries_question"].value == 8 and metadata["pseudo_queries_heading"].value == 16
    assert isinstance(metadata["ndcg_at_10_after"].value, float)
    assert metadata["ndcg_at_10_after"].value >= metadata["ndcg_at_10_before"].value
    assert "built-in" in metadata["before_after"].value and "chosen" in metadata["before_after"].value
    assert metadata["top_configurations"].value.count("\n| ") == 15  # header row aside: the best 15
    assert "data:image/png;base64," in metadata["plot"].value
    assert Path(metadata["plot_path"].value).stat().st_size > 1000
    assert load_tuned(settings.index_dir).params.alpha == metadata["alpha"].value
    checks = result.get_asset_check_evaluations()
    assert sorted((c.check_name, c.passed) for c in checks) == [("adapter_helps_held_out_queries", True),
                                                                 ("tuning_not_worse_than_builtin", True)]
    # no feedback yet: the adapter asset materialises with the reason and stores nothing
    adapter = result.asset_materializations_for_node("query_adapter")[0].metadata
    assert adapter["adopted"].value is False
    assert "queries have a thumbs-up" in adapter["reason"].value
    assert not adapter_path(settings.index_dir).exists()

    # a corpus that cannot be tuned: the run fails with the reason and no tuned.json is made up
    untuned(settings)
    failed = dg.materialize([*TUNING_ASSETS, *TUNING_CHECKS], resources=resources, raise_on_error=False,
                            run_config={"ops": {"corpus_tuning": {"config": {"limit": 5}}}})
    assert not failed.success
    failure = next(e for e in failed.all_events if e.is_step_failure)
    assert "pseudo-queries could be built" in str(failure.event_specific_data.error.message)
    assert not tuned_path(settings.index_dir).exists()


@pytest.mark.slow
def test_config_endpoint_reports_tuned_and_effective_defaults(tiny, tiny_embedder, tmp_path):
    from fastapi.testclient import TestClient

    from knowledge_store.learning.tuning import tune_corpus
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app
    from knowledge_store.storage.query_log import QueryLog

    settings = untuned(tiny)
    log = QueryLog(tmp_path / "logs.duckdb")
    engine = RetrievalEngine(settings, embedder=tiny_embedder, query_log=log)
    try:
        with TestClient(create_app(settings, engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
            before = client.get("/api/knowledge/config").json()
            assert before["tuned"] is None
            assert before["fusion_modes"] == FUSION_MODES
            assert set(before["ranking_sources"].values()) == {"default"}
            builtin = builtin_ranking(settings)
            assert (before["default_alpha"], before["default_fusion"], before["section_weight"], before["lead_weight"]) == (
                builtin.alpha, builtin.fusion, builtin.section_weight, builtin.lead_weight)

            tuned = tune_corpus(settings, embedder=tiny_embedder, feedback=[])
            after = client.get("/api/knowledge/config").json()  # no restart: the file is read when it changes
            assert set(after["tuned"]) >= {"created_at", "snapshot_version", "pseudo_queries", "before", "after", "seconds"}
            assert "table" not in after["tuned"]
            assert after["tuned"]["after"] == tuned.after and after["tuned"]["pseudo_queries"] == tuned.pseudo_queries
            assert after["tuned"]["decision"] == tuned.decision and after["tuned"]["decision"]["reason"]
            assert after["ranking_sources"] == {**dict.fromkeys(("alpha", "fusion", "section_weight", "lead_weight"), "tuned"),
                                                "question_alpha": "default"}
            assert (after["default_alpha"], after["default_fusion"], after["section_weight"], after["lead_weight"]) == (
                tuned.params.alpha, tuned.params.fusion, tuned.params.section_weight, tuned.params.lead_weight)
            assert after["question_alpha"] == settings.question_alpha

            # a search that does not say uses the tuned ranking (a question: at the question alpha); one that does
            # gets what it asked for
            response = client.post("/api/knowledge/query", json={"query": "How do I adjust rim brakes?", "k": 3})
            assert response.status_code == 200, response.text
            params = response.json()["params"]
            assert (params["alpha"], params["query_form"], params["fusion"], params["section_weight"], params["lead_weight"]) == (
                settings.question_alpha, "question", tuned.params.fusion, tuned.params.section_weight, tuned.params.lead_weight)
            assert response.json()["results"][0]["title"] == "Bicycle Maintenance Guide"
            params = client.post("/api/knowledge/query", json={"query": "rim brake adjustment", "k": 3}).json()["params"]
            assert (params["alpha"], params["query_form"]) == (tuned.params.alpha, "other")
            response = client.post("/api/knowledge/query", json={
                "query": "How do I adjust rim brakes?", "k": 3, "fusion": "dbsf", "section_weight": 0.2, "lead_weight": 0.0})
            assert response.status_code == 200, response.text
            params = response.json()["params"]
            assert (params["fusion"], params["section_weight"], params["lead_weight"]) == ("dbsf", 0.2, 0.0)
            bad = client.post("/api/knowledge/query", json={"query": "brakes", "fusion": "bogus"})
            assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "fusion"
    finally:
        log.close()
        untuned(settings)


# ------------------------------------------------------------------ the query adapter learned from feedback


def heading_feedback() -> list[dict]:
    """A thumbs-up for every section, asked as its heading in other words: 24 rated queries."""
    rows = []
    for name, (title, sections) in DOCS.items():
        for i, (heading, _) in enumerate(sections):
            rows.append({"query": f"{title}: {heading.lower().rstrip('?')}", "heading": heading, "rating": "up"})
    return rows


def with_chunks(snapshot, rows: list[dict]) -> list[dict]:
    """Each row's chunk: the first chunk whose text holds its heading."""
    texts = snapshot.records.column("text").to_pylist()
    out = []
    for row in rows:
        chunk = next(i for i, text in enumerate(texts) if row["heading"] in text)
        out.append({**row, "chunk_id": snapshot.chunk_ids[chunk]})
    return out


@pytest.mark.slow
def test_adapter_training_measures_held_out_queries_and_the_engine_serves_the_stored_adapter(
        tiny, tiny_embedder, snapshot, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from knowledge_store.learning.adapter_training import train_query_adapter
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.retrieval.query_adapter import reset_adapter, save_adapter
    from knowledge_store.server.app import create_app
    from knowledge_store.storage.query_log import QueryLog

    settings = untuned(tiny)
    reset_adapter(settings.index_dir)
    feedback = with_chunks(snapshot, heading_feedback())
    params = builtin_ranking(settings)
    # as shipped: a corpus this easy leaves no clear gain, so nothing is adopted, and the reason says why
    declined = train_query_adapter(snapshot, settings, feedback, tiny_embedder.embed, params, steps=60)
    assert declined.adapter is None and declined.reason.startswith("not adopted: on 24 rated queries")
    assert declined.decision["gain"] <= declined.decision["required"]
    # every query already finds its section (gain exactly 0): to follow the adopted path, the decision says yes
    import knowledge_store.learning.adapter_training as adapter_training

    decide = adapter_training.paired_gain
    monkeypatch.setattr(adapter_training, "paired_gain", lambda *args, **kw: {**decide(*args, **kw), "adopted": True})
    training = train_query_adapter(snapshot, settings, feedback, tiny_embedder.embed, params, steps=60)
    assert training.rated_queries == 24 and training.held_out_queries == 24  # every rated query held out once
    assert [row["l2"] for row in training.table] == [0.03, 0.1, 0.3]
    assert 0.0 < training.without["ndcg@10"] <= 1.0  # measured for real, the target sections are found
    adapter = training.adapter
    assert adapter is not None and adapter.dim == 384 and training.reason.startswith("adopted")
    assert adapter.info["rated_queries"] == 24 and adapter.info["held_out_without"] == training.without
    assert adapter.info["folds"] == 4 and adapter.info["decision"] == training.decision
    # too little feedback: a typed error with the counts, nothing trained
    with pytest.raises(Exception, match="only 3 queries have a thumbs-up"):
        train_query_adapter(snapshot, settings, feedback[:3], tiny_embedder.embed, params)

    log = QueryLog(tmp_path / "logs.duckdb")
    engine = RetrievalEngine(settings, embedder=tiny_embedder, query_log=log)
    query = "keeping a sourdough culture alive"
    try:
        plain = engine.search(query, k=5, log=False, answer="none")
        # a strong, deliberately wrong map shows the stored adapter is applied: the ranking changes ...
        rng = np.random.default_rng(3)
        save_adapter(settings.index_dir, QueryAdapter(rng.normal(size=(384, 384)).astype(np.float32) * 3, adapter.info))
        moved = engine.search(query, k=5, log=False, answer="none")
        assert [h.chunk_id for h in moved.hits] != [h.chunk_id for h in plain.hits]
        assert moved.params["query_adapter"] is True and plain.params["query_adapter"] is False
        # ... while each hit's vector score stays the model's own cosine (relevance is calibrated on it)
        raw = tiny_embedder.embed([query])[0]
        for hit in moved.hits:
            assert hit.vector_score == pytest.approx(float(snapshot.embeddings[snapshot.row_of[hit.chunk_id]] @ raw), abs=1e-4)
        with TestClient(create_app(settings, engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
            shown = client.get("/api/knowledge/config").json()["query_adapter"]
            assert shown["in_use"] is True and shown["rated_queries"] == 24
            assert shown["held_out_without"] == training.without
        engine.settings = settings.model_copy(update={"use_query_adapter": False})  # switched off: plain ranking
        assert [h.chunk_id for h in engine.search(query, k=5, log=False, answer="none").hits] == \
            [h.chunk_id for h in plain.hits]
    finally:
        reset_adapter(settings.index_dir)
        log.close()


@pytest.mark.slow
def test_the_adapter_asset_reports_its_cross_validated_decision_in_metadata(tiny, snapshot, monkeypatch):
    import dagster as dg

    import knowledge_store.learning.tuning as tuning
    from pipelines.resources import EmbeddingModelResource, RetrievalResource
    from pipelines.tuning import query_adapter

    settings = untuned(tiny)
    stored = adapter_path(settings.index_dir)
    stored.unlink(missing_ok=True)
    monkeypatch.setattr(tuning, "feedback_rows", lambda _settings: with_chunks(snapshot, heading_feedback()))
    resources = {"retrieval": RetrievalResource(data_dir=str(settings.data_dir)),
                 "model": EmbeddingModelResource(torch_threads=1)}
    result = dg.materialize([query_adapter], resources=resources)
    metadata = result.asset_materializations_for_node("query_adapter")[0].metadata
    # every section is already found first on this corpus: no clear gain, nothing stored, the numbers say why
    assert metadata["adopted"].value is False
    assert metadata["reason"].value.startswith("not adopted: on 24 rated queries, each held out once (4-fold)")
    assert metadata["rated_queries"].value == 24 and metadata["held_out_queries"].value == 24
    assert metadata["paired_gain"].value <= metadata["gain_required"].value
    assert metadata["gain_required"].value >= 0.005 and metadata["gain_standard_error"].value >= 0.0
    assert metadata["held_out_table"].value.count("| trained |") == 3
    assert not stored.exists()


@pytest.mark.slow
def test_cli_adapt_refuses_too_little_feedback_and_reset_removes_the_adapter(tiny, capsys, monkeypatch):
    from knowledge_store.cli import main
    from knowledge_store.retrieval.query_adapter import save_adapter

    monkeypatch.setenv("GROUNDWORK_TORCH_THREADS", "1")
    data = str(tiny.data_dir)
    assert main(["adapt", "--data-dir", data]) == 2  # no feedback in this store's log
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: only 0 queries have a thumbs-up") and "\n" not in err
    save_adapter(tiny.index_dir, QueryAdapter(np.zeros((384, 384), np.float32)))
    assert main(["adapt", "--reset", "--json", "--data-dir", data]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] is True
    assert not adapter_path(tiny.index_dir).exists()
    assert main(["adapt", "--reset", "--data-dir", data]) == 0
    assert "nothing to remove" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_adapt_learns_from_a_labelled_set_and_reports_labels_naming_no_document(tiny, snapshot, capsys, tmp_path,
                                                                                     monkeypatch):
    from knowledge_store.cli import main

    monkeypatch.setenv("GROUNDWORK_TORCH_THREADS", "1")
    data = str(tiny.data_dir)
    relative = {doc["title"]: doc["relative_path"] for doc in snapshot.documents}
    labels = [{"query": row["query"], "document": relative[row["query"].split(":")[0]]} for row in heading_feedback()]
    labels.append({"query": "how do I tune a piano?", "document": "piano.md"})
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(json.dumps(label) for label in labels))
    assert main(["adapt", "--labels", str(path), "--dry-run", "--json", "--data-dir", data]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rated_queries"] == 24 and report["labels_used"] == 24
    assert report["labels_unmatched"] == [{"line": 25, "document": "piano.md"}]
    assert len(report["table"]) == 3 and report["held_out_queries"] > 0
    assert not adapter_path(tiny.index_dir).exists()  # dry run

    path.write_text(json.dumps({"query": "tune a piano", "document": "piano.md"}))
    assert main(["adapt", "--labels", str(path), "--data-dir", data]) == 2
    assert "none of the 1 labels names a document in this index" in capsys.readouterr().err
    assert main(["adapt", "--labels", str(path), "--reset", "--data-dir", data]) == 2
    assert "use one of them" in capsys.readouterr().err


def test_feedback_sensor_requests_a_tune_run_every_n_new_thumbs_up(tmp_path):
    import dagster as dg

    from knowledge_store.storage.query_log import QueryLog
    from knowledge_store.storage.query_log.records import QueryLogRecord
    from pipelines.definitions import tune_job
    from pipelines.resources import RetrievalResource
    from pipelines.tuning import build_feedback_sensor

    data = tmp_path / "data"
    data.mkdir()
    sensor = build_feedback_sensor(tune_job)
    resources = {"retrieval": RetrievalResource(data_dir=str(data))}
    monkey = pytest.MonkeyPatch()
    monkey.setenv("GROUNDWORK_ADAPTER_RETRAIN_VOTES", "30")  # (at least adapter_min_queries, 20, is needed anyway)

    def vote(log: QueryLog, n: int, rating: str = "up") -> None:
        for i in range(n):
            rid = log.append(QueryLogRecord(query=f"question {i}", client="cli", params={}, results_pre=[],
                                            results_post=[], latency_ms={}, reranker_status="ok",
                                            coverage="answered", snapshot_version=1))
            log.add_feedback(rid, rating)

    try:
        with dg.instance_for_test() as instance:
            def tick(cursor=None):
                context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
                return sensor(context), context.cursor

            result, cursor = tick()
            assert isinstance(result, dg.SkipReason) and "no query log" in result.skip_message
            log = QueryLog(data / "logs.duckdb")
            vote(log, 29)
            vote(log, 10, "down")  # thumbs-down do not count towards a retrain
            log.close()
            result, cursor = tick(cursor)
            assert isinstance(result, dg.SkipReason) and "29 new thumbs-up" in result.skip_message
            log = QueryLog(data / "logs.duckdb")
            vote(log, 1)
            log.close()
            result, cursor = tick(cursor)
            assert isinstance(result, dg.RunRequest) and result.run_key == "feedback-30" and cursor == "30"
            assert result.tags["groundwork/trigger"] == "feedback"
            result, cursor = tick(cursor)  # nothing new since the request
            assert isinstance(result, dg.SkipReason) and "0 new thumbs-up" in result.skip_message
    finally:
        monkey.undo()


@pytest.mark.slow
def test_status_shows_the_ranking_and_the_query_adapter(tiny, capsys):
    from knowledge_store.cli import main
    from knowledge_store.retrieval.query_adapter import reset_adapter, save_adapter

    data = str(untuned(tiny).data_dir)
    reset_adapter(tiny.index_dir)
    assert main(["status", "--data-dir", data]) == 0
    out = capsys.readouterr().out
    assert "ranking: weighted" in out and "not self-tuned" in out and "query adapter: none" in out
    info = {"trained_at": "2026-11-25T00:50:00+00:00", "rated_queries": 31, "held_out_queries": 8, "l2": 0.1,
            "held_out_without": {"ndcg@10": 0.5, "recall@5": 0.6}, "held_out_with": {"ndcg@10": 0.625, "recall@5": 0.7}}
    save_adapter(tiny.index_dir, QueryAdapter(np.zeros((384, 384), np.float32), info))
    try:
        assert main(["status", "--json", "--data-dir", data]) == 0
        ranking = json.loads(capsys.readouterr().out)["ranking"]
        assert ranking["query_adapter"]["rated_queries"] == 31 and ranking["query_adapter"]["in_use"] is True
        assert main(["status", "--data-dir", data]) == 0
        assert ("query adapter: trained 2026-11-25T00:50:00+00:00 on 31 rated queries; held-out nDCG@10 0.500 -> 0.625"
                in capsys.readouterr().out)
        save_adapter(tiny.index_dir, QueryAdapter(np.zeros((384, 384), np.float32), {
            **info, "held_out_queries": 31, "folds": 4,
            "decision": {"gain": 0.125, "standard_error": 0.04, "required": 0.08, "adopted": True}}))
        assert main(["status", "--data-dir", data]) == 0
        assert ("held-out nDCG@10 0.500 -> 0.625 (paired gain +0.125 ± 0.040, 4-fold)" in capsys.readouterr().out)
        adapter_path(tiny.index_dir).write_bytes(b"damaged")
        assert main(["status", "--data-dir", data]) == 0
        assert "query adapter: not in use - " in capsys.readouterr().out
    finally:
        reset_adapter(tiny.index_dir)
