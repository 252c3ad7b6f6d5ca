"""``groundwork export --llamaindex PATH``: the published sample index opens in LlamaIndex's DuckDBVectorStore
and answers a query through ``VectorStoreIndex.from_vector_store`` with the project's embedder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.vector_stores.duckdb import DuckDBVectorStore

from knowledge_store.retrieval.llama_export import (
    ExportTargetExistsError,
    QueryEmbedding,
    export_llamaindex,
    open_store,
)
from knowledge_store.retrieval.snapshot_reader import SnapshotManager

pytestmark = pytest.mark.slow


def test_the_exported_store_answers_through_vector_store_index(shared_sample_index, embedder, tmp_path):
    settings = shared_sample_index
    target = tmp_path / "export" / "groundwork.duckdb"
    target.parent.mkdir()
    environment = {**os.environ, "GROUNDWORK_DATA_DIR": str(settings.data_dir),
                   "GROUNDWORK_SOURCES": ":".join(str(p) for p in settings.sources)}
    done = subprocess.run([sys.executable, "-m", "knowledge_store.cli", "export", "--llamaindex", str(target)],
                          env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    snapshot = SnapshotManager(settings.index_dir).current()
    assert f"wrote {snapshot.size} chunks" in done.stdout

    # DuckDBVectorStore.from_local(target) opens it where DuckDB can download its json extension; offline,
    # the same store class over a connection that skips that download (llama_export.OfflineConnection)
    store = open_store(target)
    assert isinstance(store, DuckDBVectorStore)
    index = VectorStoreIndex.from_vector_store(store, embed_model=QueryEmbedding(embedder))
    nodes = index.as_retriever(similarity_top_k=3).retrieve("How do I reset the Aurora to factory settings?")
    assert len(nodes) == 3
    top = nodes[0].node
    assert top.metadata["url"].endswith("aurora-installation-manual.pdf#page=4")
    assert "factory settings" in top.get_content().lower()
    assert top.node_id in snapshot.row_of and top.metadata["page_start"] == 4
    # the store's similarity is the snapshot's own cosine
    row = snapshot.row_of[top.node_id]
    query_vector = embedder.embed(["How do I reset the Aurora to factory settings?"])[0]
    assert nodes[0].score == pytest.approx(float(snapshot.embeddings[row] @ query_vector), abs=1e-4)

    with pytest.raises(ExportTargetExistsError) as refused:
        export_llamaindex(snapshot, target)
    assert refused.value.path == target
