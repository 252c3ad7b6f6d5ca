"""A newcomer's Evaluation page: the sample corpus's example questions evaluated on the index `make run` built
(``groundwork eval --sample``), read back through GET /api/evaluation/summary as the page reads it: a scorecard
row, an alpha sweep and each question's hits."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from knowledge_store.ingest.sample_corpus import EXAMPLE_QUESTIONS
from tests.helpers import build_sample_index

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sample(tmp_path_factory, embedder):
    return build_sample_index(tmp_path_factory.mktemp("sample_eval"), embedder)


def test_the_example_questions_fill_the_evaluation_page_in_seconds(sample, embedder, capsys, monkeypatch):
    from knowledge_store.cli import main
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app
    from knowledge_store.storage.query_log import QueryLog

    log = QueryLog(sample.logs_path)
    engine = RetrievalEngine(sample, embedder=embedder, query_log=log)
    # loaded here, not in the server's warm-up thread while the command below imports the same packages
    engine.warm_up()
    try:
        with TestClient(create_app(sample, engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
            before = client.get("/api/evaluation/summary").json()
            assert before["empty"] is True and "groundwork eval --sample" in before["hint"]

            monkeypatch.setenv("GROUNDWORK_QUERY_ENCODER", "torch")  # the model already loaded, no ONNX export
            started = time.perf_counter()
            assert main(["eval", "--sample", "--json", "--data-dir", str(sample.data_dir)]) == 0
            wall = time.perf_counter() - started
            report = json.loads(capsys.readouterr().out)
            print(f"groundwork eval --sample: {wall:.1f} s wall, {report['seconds']:.1f} s measured")
            assert wall < 60 and report["queries"] == len(EXAMPLE_QUESTIONS) == 4
            assert report["found_in_top5"] == 4  # every example question finds its answering document

            body = client.get("/api/evaluation/summary").json()
        assert body["empty"] is False
        rows = [r for r in body["scorecard"] if r["dataset"] == "sample corpus"]
        assert len(rows) == 1 and rows[0]["split"] == "example questions" and rows[0]["configuration"] == "served"
        assert rows[0]["queries"] == 4 and rows[0]["run_id"] == report["run_id"]
        assert rows[0]["metrics"]["recall@5"] == pytest.approx(report["metrics"]["recall@5"]) == 1.0
        assert 0.0 < rows[0]["metrics"]["ndcg@10"] <= 1.0

        sweep = next(s for s in body["alpha_sweeps"] if s["dataset"] == "sample corpus")
        assert sweep["run_id"] == report["run_id"] and [s["name"] for s in sweep["series"]] == ["Recall@5", "nDCG@10"]
        assert [p[0] for p in sweep["series"][0]["points"]] == [i / 10 for i in range(11)]
        assert all(0.0 <= p[1] <= 1.0 for s in sweep["series"] for p in s["points"])

        [run] = [q for q in body["questions"] if q["dataset"] == "sample corpus"]
        assert run["run_id"] == report["run_id"] and run["found"] == run["total"] == 4
        by_query = {q["query"]: q for q in run["questions"]}
        assert set(by_query) == {q.question for q in EXAMPLE_QUESTIONS}
        for example in EXAMPLE_QUESTIONS:
            shown = by_query[example.question]
            assert shown["expected"].startswith(example.file) and example.section[-1] in shown["expected"]
            assert 1 <= len(shown["hits"]) <= 5 and [h["rank"] for h in shown["hits"]] == list(range(1, len(shown["hits"]) + 1))
            first = shown["hits"][shown["found_rank"] - 1]
            assert first["relevant"] is True and first["document"] == example.file
            assert all(not h["relevant"] for h in shown["hits"][:shown["found_rank"] - 1])
            assert any(h["holds_answer"] for h in shown["hits"]), example.question  # the answering passage is shown
            assert set(shown["scores"]) >= {"recall@5", "ndcg@10"}
    finally:
        log.close()


def test_the_example_questions_refuse_an_index_of_another_corpus(tmp_path, embedder, capsys):
    from knowledge_store.cli import main
    from knowledge_store.config.settings import Settings
    from knowledge_store.ingest.run import run_sync

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "notes.md").write_text("# Notes\n\nThe kettle descaler is citric acid, one spoon per litre.\n")
    settings = Settings(data_dir=tmp_path / "data", sources=[docs])
    run_sync(settings, embedder)
    assert main(["eval", "--sample", "--data-dir", str(settings.data_dir)]) == 2
    error = capsys.readouterr().err
    assert "does not hold" in error and "aurora-installation-manual.pdf" in error and "groundwork eval <BEIR folder>" in error
    assert not (settings.data_dir / "eval" / "results.duckdb").exists()  # nothing recorded
    assert main(["eval"]) == 2
    assert "give a BEIR folder or --sample" in capsys.readouterr().err
