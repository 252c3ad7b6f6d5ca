"""Document embedding with ONNX Runtime (issue 12): same vectors as torch in fp32, its own
model id when quantised, and cached vectors of another encoder are never reused.

Throughput is measured by bench/embed_throughput.py, never here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from knowledge_store.config.embedding_models import QUANTIZATION_RECIPES
from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError
from knowledge_store.models.embeddings import (
    Embedder,
    OnnxEmbedder,
    document_embedder,
    document_model_id,
    model_id_for,
    query_embedder,
)
from tests.helpers import MARKDOWN_FILLER

pytestmark = pytest.mark.slow

TEXTS = [
    "Aspirin reduces the risk of myocardial infarction in men over fifty.",
    "x",
    "Title › Methods\n\nWe measured serum cholesterol in 1,203 adults over ten years; "
    "LDL fell by 12% (95% CI 8-16) in the treated arm.",
    "Zebrafish heart regeneration depends on cardiomyocyte proliferation. " * 40,  # > 256 word-pieces: truncated
    "Ünïcödé, emoji 🚀 and CJK 漢字 still embed.",
    "Short one.",
    "A medium-length sentence about retrieval, chunking and embeddings that has a few more words in it.",
]


@pytest.fixture(autouse=True)
def _int8_documents(int8_batches_faster):
    """int8 document vectors where a test asks for them; which graph is faster on this CPU is set per test."""


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory) -> Path:
    """One export (and one int8 quantisation) for the whole module."""
    return tmp_path_factory.mktemp("models")


def _max_cos_gap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(1.0 - (a * b).sum(axis=1)).max())


def test_model_id_changes_with_quantisation_but_not_with_the_fp32_runtime(model_path, onnx_cache):
    base = model_id_for(model_path)
    assert document_model_id(model_path, "none") == base == Embedder(model_path).model_id
    assert OnnxEmbedder(model_path, onnx_cache).model_id == base  # fp32 ONNX: same vectors, same id
    int8 = document_model_id(model_path, "int8")
    assert int8 != base and int8.startswith(base + "+")
    assert OnnxEmbedder(model_path, onnx_cache, quantization="int8").model_id == int8
    with pytest.raises(ConfigError):
        document_model_id(model_path, "int4")


def test_settings_choose_the_document_embedder(model_path, tmp_path, onnx_cache):
    onnx = document_embedder(Settings(data_dir=tmp_path, torch_threads=2, models_cache_dir=onnx_cache))
    assert isinstance(onnx, OnnxEmbedder) and onnx.parallel == 2 and onnx.threads == 1
    assert onnx.cache_dir == onnx_cache and not onnx.loaded  # lazy: a no-change sync never loads it
    assert onnx.model_id == model_id_for(model_path)
    # graphs live in the per-user cache, not in the data dir
    assert Settings(data_dir=tmp_path).models_cache_dir != tmp_path / "models"
    int8 = document_embedder(Settings(data_dir=tmp_path, document_quantization="int8", models_cache_dir=onnx_cache))
    assert int8.model_id == document_model_id(model_path, "int8")
    torch = document_embedder(Settings(data_dir=tmp_path, document_encoder="torch", embed_batch_size=16))
    assert isinstance(torch, Embedder) and torch.batch_size == 16 and torch.model_id == onnx.model_id
    assert document_embedder(Settings(data_dir=tmp_path, torch_threads=2), workers=2).parallel == 1
    with pytest.raises(ConfigError):
        Settings(data_dir=tmp_path, document_encoder="torch", document_quantization="int8")


@pytest.mark.parametrize("batch_size,parallel", [(1, 2), (4, 1), (32, 2)])
def test_onnx_document_vectors_equal_the_torch_vectors_in_input_order(embedder, model_path, onnx_cache, batch_size, parallel):
    onnx = OnnxEmbedder(model_path, onnx_cache, threads=1, batch_size=batch_size, parallel=parallel)
    got, want = onnx.embed(TEXTS), embedder.embed(TEXTS)
    assert got.shape == want.shape == (len(TEXTS), 384) and got.dtype == np.float32
    assert _max_cos_gap(got, want) < 1e-5  # length sorting never reorders the output
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert onnx.embed([]).shape == (0, 384)


def test_int8_vectors_are_close_to_fp32_but_not_the_same(embedder, model_path, onnx_cache):
    int8 = OnnxEmbedder(model_path, onnx_cache, threads=1, batch_size=1, parallel=2, quantization="int8")
    got, want = int8.embed(TEXTS), embedder.embed(TEXTS)
    cosine = (got * want).sum(axis=1)
    assert cosine.min() > 0.97  # close: the ranking effect is measured in docs/EVALUATION.md
    assert _max_cos_gap(got, want) > 1e-4  # but not the fp32 vectors: hence their own model id
    assert int8.onnx_path != OnnxEmbedder(model_path, onnx_cache).onnx_path and int8.onnx_path.is_file()


def _time_graphs_as(onnx_cache: Path, model_path: Path, fp32_ms: float, quantised_ms: float,
                    batch_fp32_ms: float = 20.0, batch_quantised_ms: float = 10.0) -> None:
    """Record, for this CPU, that the int8 graph passed its check and embedded the probe queries one at a time, and
    the probe set in batches, in these times."""
    artifacts = OnnxEmbedder(model_path, onnx_cache, quantization="int8").artifacts
    OnnxEmbedder(model_path, onnx_cache, quantization="int8").decision  # checked (and recorded) once
    path = artifacts.fidelity_path(QUANTIZATION_RECIPES["int8"])
    records = json.loads(path.read_text())
    for record in records.values():
        assert set(record["batch_ms"]) == {"fp32", "quantised"}  # the document embedder's check timed batches
        record["query_ms"] = {"fp32": fp32_ms, "quantised": quantised_ms}
        record["batch_ms"] = {"fp32": batch_fp32_ms, "quantised": batch_quantised_ms}
    path.write_text(json.dumps(records))


def test_int8_queries_come_from_the_int8_graph_where_it_is_faster_and_need_the_onnx_encoder(
        embedder, model_path, onnx_cache, tmp_path):
    queries = ["how do I reset the thermostat", "what does error E42 mean"]
    _time_graphs_as(onnx_cache, model_path, fp32_ms=20.0, quantised_ms=10.0)
    int8 = query_embedder(model_path, "onnx", onnx_cache, threads=1, quantization="int8")
    fp32 = query_embedder(model_path, "onnx", onnx_cache, threads=1)
    assert isinstance(int8, OnnxEmbedder) and int8.backend == "onnx-int8" and fp32.backend == "onnx"
    got, want = int8.embed(queries), embedder.embed(queries)
    assert (got * want).sum(axis=1).min() > 0.97 and _max_cos_gap(got, want) > 1e-4
    assert _max_cos_gap(fp32.embed(queries), want) < 1e-5
    # where fp32 embeds queries faster (a CPU whose int8 kernels are slow), queries run fp32 and say why
    _time_graphs_as(onnx_cache, model_path, fp32_ms=10.0, quantised_ms=20.0)
    slow_int8 = query_embedder(model_path, "onnx", onnx_cache, threads=1, quantization="int8")
    assert slow_int8.backend == "onnx" and "fp32 embeds queries faster" in slow_int8.decision.reason
    assert _max_cos_gap(slow_int8.embed(queries), want) < 1e-5
    # documents keep the int8 graph either way: its speed on queries says nothing of batches
    assert OnnxEmbedder(model_path, onnx_cache, quantization="int8").backend == "onnx-int8"
    with pytest.raises(ConfigError, match="query_quantization"):
        query_embedder(model_path, "torch", onnx_cache, threads=1, quantization="int8")
    with pytest.raises(ConfigError, match="query_quantization"):
        Settings(data_dir=tmp_path, query_encoder="torch", query_quantization="int8")


def test_documents_run_the_graph_that_embedded_batches_faster_on_this_cpu(embedder, model_path, onnx_cache):
    texts = ["The heat pump defrosts every ninety minutes in cold weather.", "Error E42: open circuit on S1."]
    _time_graphs_as(onnx_cache, model_path, fp32_ms=20.0, quantised_ms=10.0, batch_fp32_ms=10.0, batch_quantised_ms=14.0)
    slow_int8 = OnnxEmbedder(model_path, onnx_cache, quantization="int8")
    # a CPU whose int8 kernels are slower than fp32 in batches (blockwise int8 without VNNI): fp32 embeds the
    # documents, under the fp32 model id, and the decision says why; queries keep the int8 graph they were faster on
    assert slow_int8.backend == "onnx" and slow_int8.model_id == model_id_for(model_path)
    assert "fp32 embeds documents faster on this CPU (10.0 vs 14.0 ms per text in a batch)" in slow_int8.decision.reason
    assert _max_cos_gap(slow_int8.embed(texts), embedder.embed(texts)) < 1e-5
    assert query_embedder(model_path, "onnx", onnx_cache, threads=1, quantization="int8").backend == "onnx-int8"
    _time_graphs_as(onnx_cache, model_path, fp32_ms=20.0, quantised_ms=10.0, batch_fp32_ms=14.0, batch_quantised_ms=10.0)
    fast_int8 = OnnxEmbedder(model_path, onnx_cache, quantization="int8")
    assert fast_int8.backend == "onnx-int8" and fast_int8.model_id == document_model_id(model_path, "int8")


def test_a_record_checked_before_batches_were_timed_is_checked_again_for_documents(model_path, onnx_cache):
    _time_graphs_as(onnx_cache, model_path, fp32_ms=20.0, quantised_ms=10.0)
    artifacts = OnnxEmbedder(model_path, onnx_cache, quantization="int8").artifacts
    path = artifacts.fidelity_path(QUANTIZATION_RECIPES["int8"])
    records = json.loads(path.read_text())
    for record in records.values():
        del record["batch_ms"]  # as a cache written before documents' batches were timed
    path.write_text(json.dumps(records))
    assert OnnxEmbedder(model_path, onnx_cache, quantization="int8").decision.fidelity.batch_ms  # timed now
    assert all(set(r["batch_ms"]) == {"fp32", "quantised"} for r in json.loads(path.read_text()).values())


def test_int8_query_vectors_never_embed_fp32_documents(model_path, onnx_cache, tmp_path):
    """The engine reuses its loaded query embedder for ingestion only when both are fp32."""
    from knowledge_store.retrieval.engine import RetrievalEngine

    engine = RetrievalEngine(Settings(data_dir=tmp_path, query_quantization="int8", models_cache_dir=onnx_cache))
    documents = engine.documents_embedder()
    assert documents.model_id == model_id_for(model_path) and documents.quantization == "none"
    assert engine.embedder is not documents


def test_an_fp32_graph_that_cannot_load_falls_back_to_torch_but_int8_fails_loudly(model_path, tmp_path, monkeypatch):
    def broken(self):
        raise RuntimeError("no onnx here")

    monkeypatch.setattr(OnnxEmbedder, "_load_onnx", broken)
    fp32 = OnnxEmbedder(model_path, tmp_path, torch_fallback=True).load()
    assert fp32.backend == "torch" and fp32.embed(["hello"]).shape == (1, 384)
    with pytest.raises(RuntimeError):
        OnnxEmbedder(model_path, tmp_path, quantization="int8", torch_fallback=True).load()


def _write_docs(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.md").write_text("# Pumps\n\nThe heat pump defrosts every ninety minutes in cold weather.\n"
                                 + MARKDOWN_FILLER)
    (folder / "b.md").write_text("# Boilers\n\nCondensing boilers need a drain for the acidic condensate.\n\n"
                                 "## Service\n\nA yearly service checks the flue and the gas pressure.\n" + MARKDOWN_FILLER)


def _rows_per_model(settings: Settings, table: str = "embeddings") -> dict[str, int]:
    from knowledge_store.storage.store import store_connection

    with store_connection(settings.store_path, read_only=True) as conn:
        return dict(conn.execute(f"SELECT model_id, count(*) FROM {table} GROUP BY 1").fetchall())


def _counting_syncs(monkeypatch, onnx_cache: Path, tmp_path: Path) -> list:
    """Every embedder ``run_sync`` builds from its settings, counted (``CountingEmbedder``), sharing the module's
    export; the docs written under ``tmp_path / "docs"``."""
    import knowledge_store.ingest.run as run_module
    from tests.helpers import CountingEmbedder

    monkeypatch.setenv("GROUNDWORK_MODELS_CACHE_DIR", str(onnx_cache))  # share the module's export
    made: list = []

    def counting(settings, workers=1, cache_dir=None, model_path=None):  # what run_sync builds from the settings, counted
        made.append(CountingEmbedder(document_embedder(settings, workers, cache_dir, model_path)))
        return made[-1]

    monkeypatch.setattr(run_module, "document_embedder", counting)
    _write_docs(tmp_path / "docs")
    return made


def test_changing_the_document_encoder_re_embeds_instead_of_reusing_cached_vectors(tmp_path, onnx_cache, monkeypatch):
    import knowledge_store.ingest.run as run_module
    from knowledge_store.storage.index import read_pointer

    made = _counting_syncs(monkeypatch, onnx_cache, tmp_path)
    fp32 = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"])
    int8 = fp32.model_copy(update={"document_quantization": "int8"})
    torch = fp32.model_copy(update={"document_encoder": "torch"})

    run_module.run_sync(fp32)
    fp32_id = document_model_id(fp32.model_path)
    chunks = _rows_per_model(fp32)[fp32_id]
    sentences = _rows_per_model(fp32, "sentence_embeddings")[fp32_id]  # each chunk text's sentences, embedded too
    assert chunks > 0 and isinstance(made[-1].inner, OnnxEmbedder)
    assert len(made[-1].texts) == chunks + sentences and sentences >= chunks
    assert _rows_per_model(fp32) == {fp32_id: chunks}

    run_module.run_sync(int8)  # another encoder: every text embedded again, under its own id
    assert len(made[-1].texts) == chunks + sentences
    int8_id = document_model_id(fp32.model_path, "int8")
    assert _rows_per_model(fp32) == {fp32_id: chunks, int8_id: chunks}
    assert _rows_per_model(fp32, "sentence_embeddings") == {fp32_id: sentences, int8_id: sentences}
    assert read_pointer(fp32.index_dir).model_id == int8_id  # the index serves the int8 vectors only

    run_module.run_sync(torch)  # torch fp32 = ONNX fp32 vectors: the cached ones are reused
    assert made[-1].texts == [] and isinstance(made[-1].inner, Embedder)
    assert read_pointer(fp32.index_dir).model_id == fp32_id
    assert _rows_per_model(fp32) == {fp32_id: chunks, int8_id: chunks}


def _vectors_by_hash(settings: Settings, model_id: str, table: str = "embeddings") -> dict:
    from knowledge_store.storage.store import store_connection

    order = ", ordinal" if table == "sentence_embeddings" else ""
    with store_connection(settings.store_path, read_only=True) as conn:
        rows = conn.execute(f"SELECT content_hash, embedding FROM {table} WHERE model_id = ? ORDER BY content_hash{order}",
                            [model_id]).fetchall()
    out: dict[str, list] = {}
    for content_hash, vector in rows:
        out.setdefault(content_hash, []).append(np.asarray(vector, dtype=np.float32))
    return {h: np.stack(v) for h, v in out.items()}


def test_in_context_sentence_vectors_come_from_the_chunks_own_pass_under_their_own_model_id(tmp_path, onnx_cache,
                                                                                             monkeypatch):
    import knowledge_store.ingest.run as run_module
    from knowledge_store.app.status import chunk_vector_status
    from knowledge_store.core.text import sentences_to_embed
    from knowledge_store.storage.index import read_pointer
    from knowledge_store.storage.store import store_connection

    made = _counting_syncs(monkeypatch, onnx_cache, tmp_path)
    separate = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"])
    in_context = separate.model_copy(update={"sentence_encoding": "in_context"})
    separate_id, context_id = document_model_id(separate.model_path), document_model_id(separate.model_path,
                                                                                          in_context_sentences=True)
    assert context_id == separate_id + "+ctxsent"

    run_module.run_sync(in_context)
    chunks = _rows_per_model(in_context)[context_id]
    with store_connection(in_context.store_path, read_only=True) as conn:
        texts = dict(conn.execute("SELECT content_hash, any_value(text) FROM chunks GROUP BY 1").fetchall())
    sentences = sum(len(sentences_to_embed(t)) for t in texts.values())
    assert len(made[-1].texts) == chunks  # one pass: no sentence is embedded on its own
    assert _rows_per_model(in_context, "sentence_embeddings") == {context_id: sentences}
    assert read_pointer(in_context.index_dir).model_id == context_id
    status = chunk_vector_status(in_context, in_context.index_dir)
    assert status["sentence_encoding"] == "in_context" and not status["sentence_re_embed_pending"]
    assert chunk_vector_status(separate, separate.index_dir)["sentence_re_embed_pending"]  # the setting changed

    run_module.run_sync(separate)  # its own id: every chunk and sentence embedded again, never mixed
    assert len(made[-1].texts) == chunks + sentences
    assert read_pointer(separate.index_dir).model_id == separate_id
    context_chunks, separate_chunks = (_vectors_by_hash(separate, i) for i in (context_id, separate_id))
    assert context_chunks.keys() == separate_chunks.keys()
    for h in context_chunks:  # the same forward pass makes the chunk vector either way
        assert np.allclose(context_chunks[h], separate_chunks[h], atol=1e-5)
    context_sentences, separate_sentences = (_vectors_by_hash(separate, i, "sentence_embeddings")
                                             for i in (context_id, separate_id))
    cosines = np.concatenate([(context_sentences[h] * separate_sentences[h]).sum(axis=1) for h in context_sentences])
    assert len(cosines) == sentences and cosines.mean() > 0.5  # the same sentences, read in their chunk's context
    assert (cosines < 0.999).mean() > 0.9  # ... not embedded alone

    run_module.run_sync(in_context)  # back: the cached vectors serve again, nothing embedded
    assert made[-1].texts == [] and read_pointer(in_context.index_dir).model_id == context_id


def test_a_sentence_beyond_the_models_window_is_embedded_on_its_own(model_path, onnx_cache):
    from knowledge_store.core.text import sentence_spans_to_embed, sentences_to_embed
    from knowledge_store.ingest.embed import MissingText, in_context_vectors, sentence_table

    context = OnnxEmbedder(model_path, onnx_cache, in_context_sentences=True)
    alone = OnnxEmbedder(model_path, onnx_cache)
    text = TEXTS[3]  # 40 sentences, more word-pieces than the window holds
    header = "Title › Regeneration"
    part = [MissingText("h", f"{header}\n\n{text}", text), MissingText("x", "x", "x")]
    vectors, pooled, covered = context.embed_in_context(
        [m.embed_text for m in part], [[(a + len(header) + 2, b + len(header) + 2) for a, b in sentence_spans_to_embed(text)],
                                       sentence_spans_to_embed("x")])
    assert np.allclose(vectors, alone.embed([m.embed_text for m in part]), atol=1e-5)
    cut = int(covered[:40].sum())
    assert 0 < cut < 40 and covered[:cut].all() and not covered[cut:40].any() and covered[40]
    chunks, table = in_context_vectors(context, part)
    rows = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    sentences = sentences_to_embed(text)
    assert table.num_rows == len(sentences) + 1 and table.column("ordinal").to_pylist()[:3] == [0, 1, 2]
    assert np.allclose(rows[cut:40], alone.embed(sentences[cut:]), atol=1e-5)  # cut off: embedded on its own
    assert np.allclose(rows[:cut], pooled[:cut], atol=1e-6) and not np.allclose(rows[0], alone.embed(sentences[:1])[0],
                                                                                  atol=1e-3)
    # sentences missing for texts that already have vectors come from the same kind of pass
    assert np.allclose(np.stack(sentence_table(context, part).column("embedding").to_numpy(zero_copy_only=False)), rows)
    with pytest.raises(ConfigError, match="sentence_encoding"):
        Settings(sentence_encoding="in_context", document_encoder="torch")
