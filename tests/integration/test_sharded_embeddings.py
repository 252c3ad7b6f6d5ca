"""The embeddings asset in shards (several Dagster steps/workers at once): same result as one.

Shards split the missing texts by content hash; each step embeds its own and writes
short batches through the store's single-writer lock.  Whatever the shard count, the
store ends with exactly the vectors a single-process run makes - none missing, none
twice - and the published index is the same.

The parts that need no model, store or server are in tests/unit/test_sharded_embeddings.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from knowledge_store.ingest.sample_corpus import write_sample_corpus
from knowledge_store.storage.index import open_snapshot
from knowledge_store.storage.store import store_connection
from pipelines.ingestion import INGESTION_ASSETS, INGESTION_CHECKS
from pipelines.resources import EmbeddingModelResource, KnowledgeStoreResource
from tests.helpers import REPO_ROOT


def _ingest(root: Path, docs: Path, workers: int, monkeypatch) -> tuple[dg.ExecuteInProcessResult, Path]:
    monkeypatch.setenv("GROUNDWORK_EMBED_WORKERS", str(workers))
    data = root / f"data-{workers}"
    result = dg.materialize(
        [*INGESTION_ASSETS, *INGESTION_CHECKS],
        resources={"store": KnowledgeStoreResource(data_dir=str(data), sources=str(docs)),
                   "model": EmbeddingModelResource(torch_threads=2)},
    )
    assert result.success
    return result, data


def _vectors(data: Path) -> list[tuple[str, str]]:
    with store_connection(data / "store.duckdb", read_only=True) as conn:
        return conn.execute("SELECT content_hash, model_id FROM embeddings ORDER BY ALL").fetchall()


@pytest.mark.slow
def test_sharded_embedding_stores_exactly_the_vectors_of_a_single_run(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    write_sample_corpus(docs)
    single, single_data = _ingest(tmp_path, docs, 1, monkeypatch)
    sharded, sharded_data = _ingest(tmp_path, docs, 3, monkeypatch)

    one, three = _vectors(single_data), _vectors(sharded_data)
    assert one == three and len(set(three)) == len(three)  # same rows, no duplicates
    with store_connection(sharded_data / "store.duckdb", read_only=True) as conn:
        wanted = conn.execute("SELECT count(DISTINCT content_hash) FROM chunks").fetchone()[0]
    assert len(three) == wanted

    meta = {k: getattr(v, "value", v) for k, v in sharded.asset_materializations_for_node("embeddings")[-1].metadata.items()}
    assert meta["shards"] == 3 and meta["embeddings_computed"] == wanted
    steps = {e.step_key for e in sharded.all_events if e.step_key and e.step_key.startswith("embeddings.embed_shard")}
    assert len(steps) == 3  # one step per shard: what a multiprocess/K8s/Celery executor runs at once

    snapshots = []
    for data in (single_data, sharded_data):
        conn, _ = open_snapshot(data / "index")
        try:
            snapshots.append(conn.execute("SELECT chunk_id FROM chunks ORDER BY chunk_id").fetchall())
        finally:
            conn.close()
    assert snapshots[0] == snapshots[1]

    # a re-sync with nothing new embeds nothing in any shard
    again, _ = _ingest(tmp_path, docs, 3, monkeypatch)
    meta = {k: getattr(v, "value", v) for k, v in again.asset_materializations_for_node("embeddings")[-1].metadata.items()}
    assert meta["embeddings_computed"] == 0 and _vectors(sharded_data) == three


@pytest.mark.slow
def test_the_multiprocess_executor_runs_the_shards_in_parallel_processes(tmp_path):
    """The real thing: `dagster job execute` with the multiprocess executor, 2 shards, 2 processes."""
    docs = tmp_path / "docs"
    write_sample_corpus(docs)
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "GROUNDWORK_DATA_DIR": str(tmp_path / "data"),
           "GROUNDWORK_SOURCES": str(docs), "GROUNDWORK_EMBED_WORKERS": "2", "HF_HUB_OFFLINE": "1"}
    config = tmp_path / "run.yaml"
    config.write_text("execution:\n  config:\n    multiprocess:\n      max_concurrent: 2\n")
    run = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "job", "execute", "-m", "pipelines", "-j", "ingest",
         "-c", str(config)],
        env=env, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    # dagster's log lines: "<time> - dagster - DEBUG - ingest - <run id> - <pid> - <step key> - STEP_START - ..."
    starts = [line.split(" - ") for line in output.splitlines() if " - STEP_START - " in line]
    pids = {fields[5] for fields in starts if len(fields) > 7 and fields[6].startswith("embeddings.embed_shard")}
    assert len(pids) == 2, output[-3000:]  # two shard steps, two worker processes
    with store_connection(tmp_path / "data" / "store.duckdb", read_only=True) as conn:
        vectors = conn.execute("SELECT count(*), count(DISTINCT content_hash) FROM embeddings").fetchone()
        wanted = conn.execute("SELECT count(DISTINCT content_hash) FROM chunks").fetchone()[0]
    assert vectors == (wanted, wanted)


def _sentences(data: Path) -> list[tuple[str, str, int]]:
    with store_connection(data / "store.duckdb", read_only=True) as conn:
        return conn.execute("SELECT content_hash, model_id, ordinal FROM sentence_embeddings ORDER BY ALL").fetchall()


@pytest.mark.slow
@pytest.mark.parametrize("sentence_encoding", ["separate", "in_context"])
def test_handoff_shards_never_write_the_store_and_give_the_same_vectors(tmp_path, monkeypatch, sentence_encoding):
    monkeypatch.setenv("GROUNDWORK_SENTENCE_ENCODING", sentence_encoding)
    docs = tmp_path / "docs"
    write_sample_corpus(docs)
    _, single_data = _ingest(tmp_path, docs, 1, monkeypatch)
    handoff = tmp_path / "handoff"
    monkeypatch.setenv("GROUNDWORK_EMBED_HANDOFF_DIR", str(handoff))
    _, handoff_data = _ingest(tmp_path, docs, 2, monkeypatch)
    assert _vectors(handoff_data) == _vectors(single_data)
    sentences = _sentences(handoff_data)
    assert sentences == _sentences(single_data) and len(sentences) > len(_vectors(single_data))
    assert {model_id.endswith("+ctxsent") for _, model_id, _ in sentences} == {sentence_encoding == "in_context"}
    assert not list(handoff.rglob("*.parquet"))  # imported, then removed


def test_parts_left_by_a_killed_run_are_imported_once(tmp_path):
    """Whole parts survive a kill; importing them is idempotent and removes them."""
    import numpy as np

    from knowledge_store.config.settings import Settings
    from knowledge_store.ingest.embed import MissingText
    from knowledge_store.ingest.embed_handoff import embed_shard_to_parts, import_parts

    settings = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"], write_batch_chunks=2)
    with store_connection(settings.store_path):  # an empty, migrated store
        pass
    texts = {f"{i:064x}": f"text {i}" for i in range(5)}

    class FakeEmbedder:
        model_id, dim = "fake-model", 384

        def embed(self, batch):
            return np.ones((len(batch), 384), dtype=np.float32) / np.sqrt(384)

    import knowledge_store.ingest.embed_handoff as handoff_module

    original = handoff_module.missing_embeddings
    handoff_module.missing_embeddings = lambda s, m, shard, shards: ([MissingText(h, t, t) for h, t in texts.items()], 0)
    try:
        result = embed_shard_to_parts(settings, FakeEmbedder(), 0, 1, tmp_path / "handoff")
    finally:
        handoff_module.missing_embeddings = original
    parts = list((tmp_path / "handoff").rglob("*.parquet"))
    assert result.computed == 5 and len(parts) == 3 and not list((tmp_path / "handoff").rglob("*.tmp"))
    assert import_parts(settings, tmp_path / "handoff", "fake-model") == 5
    assert import_parts(settings, tmp_path / "handoff", "fake-model") == 0  # nothing left
    with store_connection(settings.store_path, read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM embeddings WHERE model_id = 'fake-model'").fetchone()[0] == 5
