"""The product as a new user gets it: no test pin.

The rest of the suite runs on MiniLM (tests/conftest.py) and cannot see the default a user gets.  This test
takes the defaults exactly as shipped - the registry's default model (all-mpnet-base-v2) with its quantisation
recipe, graphs from the machine's model cache that ``make install`` built, the default (sample) corpus - and walks
a new user's first minutes: a fresh data dir, the Dagster ingest job (``groundwork ingest``), the sample
evaluation ``make ingest`` runs, ``groundwork serve``, then every example question through ``/api/ask``: its
answering passage first, its key facts in the extractive answer, every citation's link resolving; ``/health``
healthy; the Evaluation page's figures agreeing with its per-question table; and the served vectors within cosine
0.99 (mean) / 0.98 (min) of the plain sentence-transformers model's on this CPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers import free_port, stop

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def shipped_environment(tmp_path: Path) -> dict[str, str]:
    """This process's environment without any GROUNDWORK_* setting (the suite's model pin included), with a fresh
    data dir and Dagster home as the Makefile makes them; the per-user model cache is the machine's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUNDWORK_") and k != "DAGSTER_HOME"}
    home = tmp_path / "data" / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(ROOT / "pipelines" / "dagster.yaml", home / "dagster.yaml")
    env.update(GROUNDWORK_DATA_DIR=str(tmp_path / "data"), DAGSTER_HOME=str(home), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", DAGSTER_DISABLE_TELEMETRY="1", RAGAS_DO_NOT_TRACK="true")
    return env


def groundwork(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "knowledge_store.cli", *args], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"groundwork {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_the_defaults_as_shipped_answer_a_new_user(tmp_path, monkeypatch):
    from knowledge_store.config.settings import Settings
    from knowledge_store.core.text import contains_words
    from knowledge_store.evaluation.sample_eval import in_answering_section
    from knowledge_store.ingest.sample_corpus import EXAMPLE_QUESTIONS

    env = shipped_environment(tmp_path)
    for name in [k for k in os.environ if k.startswith("GROUNDWORK_")]:  # this process too: the suite's pin goes
        monkeypatch.delenv(name)
    shipped = Settings(data_dir=tmp_path / "data")
    assert "GROUNDWORK_EMBEDDING_MODEL" not in env and shipped.embedding_model == "mpnet"

    groundwork(env, "ingest", "--json", timeout=1800)  # the Dagster ingest job, as `make ingest` runs it
    groundwork(env, "eval", "--sample", timeout=900)  # the Evaluation page's first scorecard, as `make ingest` runs it

    env["GROUNDWORK_SERVER_PORT"] = str(free_port())
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "knowledge_store.cli", "serve"], env=env, cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{env['GROUNDWORK_SERVER_PORT']}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                health = httpx.get(f"{base}/health", timeout=5)
                if health.status_code == 200 and health.json()["services"]["model"] == "up":
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        body = health.json()
        assert body["status"] == "healthy", body
        graph = body["model_graph"]
        assert graph["requested"] == shipped.query_quantization, graph
        if graph["requested"] != "none":  # the quantised graph checked on this CPU (and fp32 where it failed)
            assert graph["fidelity"] is not None and graph["fidelity"]["cpu_key"], graph

        misses = []
        for question in EXAMPLE_QUESTIONS:
            response = httpx.post(f"{base}/api/ask", json={"query": question.question}, timeout=120)
            assert response.status_code == 200, response.text
            ask = response.json()
            first = ask["sources"][0]
            if not in_answering_section(question, first["file"], [part.strip() for part in first["section"].split(">")]):
                misses.append(f"{question.question!r}: first source {first['file']} › {first['section']}")
            missing = [fact for fact in question.key_facts if not contains_words(ask["answer"], fact)]
            if missing:
                misses.append(f"{question.question!r}: answer {ask['answer']!r} lacks {missing}")
            for source in ask["sources"]:  # every citation's link opens the original
                link = httpx.get(source["url"].split("#", 1)[0], timeout=30)
                assert link.status_code == 200 and link.content, (source["url"], link.status_code)
        assert not misses, "\n".join(misses)

        # the Evaluation page: its caption, its per-question table and its scorecard row tell one story
        summary = httpx.get(f"{base}/api/evaluation/summary", timeout=30).json()
        row = next(r for r in summary["scorecard"] if r["dataset"] == "sample corpus")
        [run] = [q for q in summary["questions"] if q["dataset"] == "sample corpus" and q["run_id"] == row["run_id"]]
        assert run["total"] == row["queries"] == len(EXAMPLE_QUESTIONS)
        assert run["found"] == round(row["metrics"]["recall@5"] * run["total"])
        for question in run["questions"]:
            ticked = [hit["rank"] for hit in question["hits"] if hit["relevant"]]
            assert ticked == ([question["found_rank"]] if question["found_rank"] else []), question
        assert row["metrics"]["key_fact_recall"] == 1.0 and row["metrics"]["recall@5"] == 1.0, row["metrics"]
    finally:
        stop(proc)

    # the served vectors, documents and queries, against the plain model on this CPU (what the probe set checks)
    from sentence_transformers import SentenceTransformer

    from knowledge_store.models.artifacts import PROBE_TEXTS
    from knowledge_store.models.embeddings import document_embedder, settings_query_embedder

    texts = list(PROBE_TEXTS)
    reference = SentenceTransformer(str(shipped.model_path), device="cpu").encode(texts, normalize_embeddings=True)
    for embedder in (document_embedder(shipped), settings_query_embedder(shipped)):
        cosines = np.concatenate([(np.asarray(embedder.embed(texts)) * reference).sum(axis=1),
                                  [float(np.asarray(embedder.embed([t]))[0] @ r) for t, r in zip(texts, reference)]])
        assert cosines.mean() >= 0.99 and cosines.min() >= 0.98, (embedder.model_id, cosines.round(3).tolist())
