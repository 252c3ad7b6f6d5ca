"""The model's ONNX graphs: built once per machine in the per-user cache, and a quantised graph serves only where it
passed its fidelity check on the CPU that runs it (``models.artifacts``, ``OnnxEmbedder.decision``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from knowledge_store.config.embedding_models import QUANTIZATION_RECIPES
from knowledge_store.config.settings import Settings
from knowledge_store.models import artifacts as artifacts_module
from knowledge_store.models.artifacts import (
    FIDELITY_MIN,
    FIDELITY_MIN_MEAN,
    PROBE_TEXTS,
    ModelArtifacts,
    cpu_identity,
)
from knowledge_store.models.embeddings import (
    OnnxEmbedder,
    _Graph,
    document_embedder,
    document_model_id,
    graph_status,
    model_id_for,
    prepare_embedders,
)
from knowledge_store.models.serving import serving_model_id
from tests.helpers import this_cpu_check

pytestmark = pytest.mark.slow
INT8 = QUANTIZATION_RECIPES["int8"]


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory, model_path: Path) -> Path:
    """A model cache holding the suite model's fp32 and int8 graphs, built once for the module (no check yet)."""
    cache = tmp_path_factory.mktemp("model-cache")
    artifacts = ModelArtifacts(model_path, cache)
    artifacts.ensure(INT8)
    artifacts.fidelity_path(INT8).unlink(missing_ok=True)
    return cache


def _copy_cache(source: Path, target: Path) -> Path:
    """A private copy of ``source`` (hard links: the graphs are only ever replaced, never written in place)."""
    for path in source.rglob("*"):
        destination = target / path.relative_to(source)
        if path.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
        elif path.suffix != ".json" or path.name == "fingerprints.json":
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.hardlink_to(path)
    return target


def _break_graph(graph: Path) -> None:
    """Replace ``graph`` by the fp32 export with its word embeddings scrambled: a graph that loads and runs, and
    whose vectors are not the model's (as a saturating int8 kernel's are not)."""
    import onnx
    from onnx import numpy_helper

    fp32 = graph.with_name(graph.name.replace(INT8, "fp32"))
    model = onnx.load(str(fp32))
    largest = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    values = numpy_helper.to_array(largest).copy()
    np.random.default_rng(0).shuffle(values)
    largest.CopyFrom(numpy_helper.from_array(values, largest.name))
    graph.unlink()
    onnx.save(model, str(graph))


def test_the_quantised_graph_passes_its_fidelity_check_on_this_cpu(built_cache, tmp_path, model_path, embedder,
                                                                    int8_batches_faster):
    cache = _copy_cache(built_cache, tmp_path / "cache")
    int8 = OnnxEmbedder(model_path, cache, quantization="int8")
    decision = int8.decision
    assert decision.in_effect == "int8" and decision.fidelity.passed, decision.reason
    assert decision.fidelity.mean >= FIDELITY_MIN_MEAN and decision.fidelity.min >= FIDELITY_MIN
    assert decision.fidelity.cpu_key == cpu_identity().key and decision.fidelity.texts == len(PROBE_TEXTS)
    assert int8.model_id == f"{model_id_for(model_path)}+{INT8}"
    # the served vectors against the plain sentence-transformers model, one at a time and batched
    reference = embedder.embed(list(PROBE_TEXTS))
    cosines = np.concatenate([(int8.embed(list(PROBE_TEXTS)) * reference).sum(axis=1),
                              [float(int8.embed([t])[0] @ r) for t, r in zip(PROBE_TEXTS, reference)]])
    assert cosines.mean() >= FIDELITY_MIN_MEAN and cosines.min() >= FIDELITY_MIN, cosines


def test_a_graph_that_fails_its_fidelity_check_is_not_used_and_fp32_serves(built_cache, tmp_path, model_path, embedder):
    cache = _copy_cache(built_cache, tmp_path / "cache")
    artifacts = ModelArtifacts(model_path, cache)
    _break_graph(artifacts.graph_path(INT8))

    documents = OnnxEmbedder(model_path, cache, quantization="int8")
    decision = documents.decision
    assert decision.in_effect == "none" and not decision.fidelity.passed
    assert "FAILED" in decision.reason and "fp32 serves" in decision.reason
    assert decision.fidelity.mean < FIDELITY_MIN_MEAN
    # its vectors are fp32's, under fp32's id: never mixed with int8 vectors made where the graph is right
    assert documents.model_id == model_id_for(model_path) and documents.backend == "onnx"
    assert documents.onnx_path == artifacts.fp32_path
    vectors = documents.embed(["what does error E42 mean", "Pump"])
    assert np.allclose((vectors * embedder.embed(["what does error E42 mean", "Pump"])).sum(axis=1), 1.0, atol=1e-4)

    # the verdict is recorded for this CPU: the next process reads it instead of checking again
    recorded = json.loads(artifacts.fidelity_path(INT8).read_text())
    assert recorded[cpu_identity().key]["passed"] is False
    again = OnnxEmbedder(model_path, cache, quantization="int8", purpose="queries")
    again._check = lambda tag: pytest.fail("checked again although this CPU's verdict is recorded")
    assert again.decision.in_effect == "none"

    # status pages say why, without building anything
    settings = Settings(data_dir=tmp_path / "data", models_cache_dir=cache, document_quantization="int8",
                        query_quantization="int8")
    status = graph_status(settings)
    assert status["documents"]["in_effect"] == "none" and "FAILED" in status["documents"]["reason"]


def test_models_prepare_checks_both_graphs_and_runs_the_faster_passing_one_for_each(built_cache, tmp_path):
    """``groundwork models prepare`` (``make install``): both graphs checked on this CPU, documents' batches timed,
    and each purpose runs the graph its timing chose, as status pages say without building anything."""
    cache = _copy_cache(built_cache, tmp_path / "cache")
    settings = Settings(data_dir=tmp_path / "data", models_cache_dir=cache, document_quantization="int8",
                        query_quantization="int8")
    decisions = prepare_embedders(settings)
    record = decisions["documents"].fidelity
    assert record.passed and set(record.batch_ms) == set(record.query_ms) == {"fp32", "quantised"}, record
    chosen = {"documents": record.faster_for_documents(), "queries": record.faster_for_queries()}
    status = graph_status(settings)
    for purpose, faster in chosen.items():
        assert decisions[purpose].in_effect == ("int8" if faster == "quantised" else "none"), decisions[purpose]
        assert status[purpose]["in_effect"] == decisions[purpose].in_effect, status


def test_a_verdict_recorded_on_another_cpu_is_not_trusted_here(built_cache, tmp_path, model_path):
    cache = _copy_cache(built_cache, tmp_path / "cache")
    artifacts = ModelArtifacts(model_path, cache)
    _break_graph(artifacts.graph_path(INT8))
    elsewhere = {"cpu_key": "another-cpu", "cpu": "a CPU with VNNI", "flags": ["avx512_vnni"], "onnxruntime": "x",
                 "texts": 12, "mean": 0.995, "min": 0.99, "passed": True, "checked_at": "2026-01-01T00:00:00+00:00",
                 "seconds": 1.0}
    artifacts.fidelity_path(INT8).write_text(json.dumps({"another-cpu": elsewhere}))

    decision = OnnxEmbedder(model_path, cache, quantization="int8").decision
    assert decision.in_effect == "none" and decision.fidelity.cpu_key == cpu_identity().key
    recorded = json.loads(artifacts.fidelity_path(INT8).read_text())
    assert set(recorded) == {"another-cpu", cpu_identity().key}  # both verdicts kept, each for its own CPU


def test_graphs_are_built_once_per_machine_and_shared_by_every_data_dir(built_cache, tmp_path, model_path, monkeypatch,
                                                                        int8_batches_faster):
    cache = _copy_cache(built_cache, tmp_path / "cache")
    first = Settings(data_dir=tmp_path / "one", models_cache_dir=cache, document_quantization="int8")
    second = Settings(data_dir=tmp_path / "two", models_cache_dir=cache, document_quantization="int8")
    one = OnnxEmbedder(model_path, first.models_cache_dir, quantization="int8").load()
    assert one.loaded and one.quantization == "int8"

    def no_export(*args, **kwargs):
        raise AssertionError("exported again although the machine's cache holds the graph")

    monkeypatch.setattr(artifacts_module, "export_fp32", no_export)
    monkeypatch.setattr(artifacts_module, "quantise", no_export)
    two = OnnxEmbedder(model_path, second.models_cache_dir, quantization="int8").load()
    assert two.onnx_path == one.onnx_path and two.embed(["Pump"]).shape == (1, one.dim)
    for data_dir in (first.data_dir, second.data_dir):
        assert not list(Path(data_dir).rglob("*.onnx"))


def test_a_missing_graph_is_built_atomically_under_the_cache_lock(tmp_path, model_path, monkeypatch):
    cache = tmp_path / "cache"
    artifacts = ModelArtifacts(model_path, cache)
    states: list[str] = []

    def failing_export(model, target):
        Path(target).with_name(f".{Path(target).name}.tmp-left").write_text("half")
        raise artifacts_module.ModelArtifactError("export interrupted")

    monkeypatch.setattr(artifacts_module, "export_fp32", failing_export)
    with pytest.raises(artifacts_module.ModelArtifactError, match="export interrupted"):
        artifacts.ensure("", states.append)
    assert not artifacts.fp32_path.exists() and states == ["exporting"]
    monkeypatch.undo()
    assert artifacts.ensure("", states.append) == artifacts.fp32_path and artifacts.fp32_path.is_file()
    assert states[-1] == "idle" and "exporting" in states
    # the folder names what the graphs depend on: the weights' digest and ONNX Runtime's version
    import onnxruntime

    assert artifacts.folder.name == f"onnxruntime-{onnxruntime.__version__}"
    assert artifacts.folder.parent.parent == cache


@pytest.mark.parametrize(("batch_ms", "passed", "in_effect"), [
    ({"fp32": 262.0, "quantised": 482.0}, True, "none"),  # blockwise int8 without VNNI: fp32 embeds documents faster
    ({"fp32": 482.0, "quantised": 262.0}, True, "int8"),
    ({"fp32": 482.0, "quantised": 262.0}, False, "none"),  # failed its fidelity check
    (None, True, "int8"),  # never checked on this CPU: the configured recipe until the first embedding checks it
])
def test_the_serving_model_id_is_the_id_of_what_the_document_embedder_makes_on_this_cpu(tmp_path, model_path, batch_ms,
                                                                                        passed, in_effect):
    settings = Settings(data_dir=tmp_path / "data", models_cache_dir=tmp_path / "cache", document_quantization="int8")
    artifacts = ModelArtifacts(model_path, settings.models_cache_dir)
    if batch_ms is not None:  # a checked graph: a file where the graph is, and this CPU's verdict on it
        artifacts.folder.mkdir(parents=True)
        artifacts.graph_path(INT8).write_bytes(b"graph")
        artifacts.record_fidelity(INT8, this_cpu_check(batch_ms, passed))
    expected = document_model_id(model_path, in_effect, settings.bare_vector_weight, settings.embedding_passage_prefix,
                                 settings.in_context_sentences)
    assert serving_model_id(settings) == expected
    if batch_ms is not None:  # the embedder that ingestion uses makes vectors under the same id
        assert document_embedder(settings).model_id == expected


def test_a_build_removes_what_killed_builds_left_and_nothing_else(tmp_path, model_path, monkeypatch):
    artifacts = ModelArtifacts(model_path, tmp_path / "cache")
    artifacts.folder.mkdir(parents=True)
    left = [".fp32.eager1.onnx.4242.tmp", ".int8.eager1.onnx.4242.tmp.smoothed",
            ".int8.eager1.onnx.4242.tmp.smoothed.calibration.data", ".int8.eager1.onnx.77.tmp.dynamic"]
    kept = ["notes.tmp", "int8.eager1.onnx", ".lock", ".fp32.onnx.tmp"]
    for name in left + kept:
        (artifacts.folder / name).write_bytes(b"x" * 1000)

    def export(model, target):
        Path(target).write_bytes(b"graph")

    monkeypatch.setattr(artifacts_module, "export_fp32", export)
    assert artifacts.ensure("") == artifacts.fp32_path
    present = {path.name for path in artifacts.folder.iterdir()}
    assert not present & set(left)
    assert set(kept) <= present and artifacts.fp32_path.name in present
    assert artifacts_module.remove_abandoned_builds(artifacts.folder) == 0  # nothing more to remove


def test_health_and_the_config_say_why_fp32_serves_where_the_quantised_graph_failed(built_cache, tmp_path, model_path,
                                                                                   embedder):
    import httpx

    from knowledge_store.retrieval.engine import RetrievalEngine
    from tests.helpers import build_sample_index, served_app

    cache = _copy_cache(built_cache, tmp_path / "cache")
    _break_graph(ModelArtifacts(model_path, cache).graph_path(INT8))
    sample = build_sample_index(tmp_path / "sample", embedder)
    settings = sample.model_copy(update={"models_cache_dir": cache, "query_quantization": "int8"})
    with served_app(settings, RetrievalEngine(settings)) as base:
        deadline = time.monotonic() + 300
        while (health := httpx.get(f"{base}/health", timeout=30).json())["services"]["model"] == "loading":
            assert time.monotonic() < deadline, health
            time.sleep(0.5)
        graph = health["model_graph"]
        assert graph["requested"] == "int8" and graph["in_effect"] == "none", graph
        assert "FAILED" in graph["reason"] and graph["fidelity"]["passed"] is False
        answer = httpx.post(f"{base}/api/knowledge/query", json={"query": "what does error E42 mean", "k": 3}, timeout=60)
        assert answer.status_code == 200 and answer.json()["results"]
        config = httpx.get(f"{base}/api/knowledge/config", timeout=30).json()
        assert "FAILED" in config["embedding_model"]["graphs"]["queries"]["reason"]


@pytest.mark.parametrize("setting, blockwise, smoothed", [
    ("int8-mixed", ("/intermediate/", "/output/dense"), ()),
    ("int8-smooth", ("/output/dense",), ("/intermediate/",)),
])
def test_the_query_recipes_quantise_attention_dynamically_and_the_rest_as_their_tag_says(
        tmp_path, model_path, embedder, setting, blockwise, smoothed):
    import onnx

    tag = QUANTIZATION_RECIPES[setting]
    artifacts = ModelArtifacts(model_path, tmp_path / "cache")
    graph = onnx.load(str(artifacts.ensure(tag)), load_external_data=False).graph
    # one self-contained file: the intermediate graphs and their side files of weights are gone
    assert not any(init.data_location == onnx.TensorProto.EXTERNAL for init in graph.initializer)
    leftovers = [p.name for p in artifacts.graph_path(tag).parent.iterdir() if p.name.endswith(".data") or ".tmp" in p.name]
    assert not leftovers, leftovers
    by_kind: dict[str, list[str]] = {}
    for node in graph.node:
        by_kind.setdefault(node.op_type, []).append(node.name)
    in_blocks = by_kind.get("MatMulNBits", [])
    assert in_blocks and all(any(part in n and "/attention/" not in n for part in blockwise) for n in in_blocks), in_blocks
    layers = sum(1 for n in in_blocks if blockwise[0] in n)  # one feed-forward output per layer
    assert layers == len(in_blocks) // len(blockwise)
    assert by_kind.get("MatMulInteger") or by_kind.get("DynamicQuantizeMatMul")  # the attention projections
    smooth = [n for n in by_kind.get("Mul", []) if n.endswith("/smooth")]
    assert len(smooth) == layers * len(smoothed) and all(any(p in n for p in smoothed) for n in smooth), smooth
    weight_names = {init.name for init in graph.initializer}
    weighted_fp32 = [n.name for n in graph.node if n.op_type == "MatMul" and any(i in weight_names for i in n.input)]
    assert not weighted_fp32, weighted_fp32  # no weight MatMul is left in fp32

    queries = OnnxEmbedder(model_path, artifacts.cache_dir, quantization=setting, purpose="queries")
    decision = queries.decision
    assert decision.fidelity.passed and decision.recipe == tag, decision.reason
    # the graph's own vectors, a question at a time as a server embeds them, against sentence-transformers'
    texts = list(PROBE_TEXTS)
    graph_vectors = _Graph(artifacts.graph_path(tag), queries._make_tokenizer(), 1).vectors(texts, 1)
    cosines = (graph_vectors * embedder.embed(texts)).sum(axis=1)
    assert cosines.mean() >= FIDELITY_MIN_MEAN and cosines.min() >= FIDELITY_MIN, cosines

def test_smoothing_moves_input_ranges_into_the_weights_without_changing_the_fp32_vectors(tmp_path, model_path):
    import onnx
    from tokenizers import Tokenizer

    recipe = artifacts_module.RECIPES[QUANTIZATION_RECIPES["int8-smooth"]]
    fp32 = ModelArtifacts(model_path, tmp_path / "cache").ensure("")
    smoothed = tmp_path / "smoothed.onnx"
    artifacts_module.smooth_activations(onnx, fp32, smoothed, recipe, model_path / "tokenizer.json")
    graph = onnx.load(str(smoothed), load_external_data=False).graph
    smooth = [n.name for n in graph.node if n.op_type == "Mul" and n.name.endswith("/smooth")]
    assert smooth and all("/intermediate/" in n for n in smooth)
    tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.no_padding()
    texts = list(PROBE_TEXTS)
    before = _Graph(fp32, tokenizer, 1).vectors(texts, 1)
    after = _Graph(smoothed, tokenizer, 1).vectors(texts, 1)
    np.testing.assert_allclose(after, before, atol=2e-5)  # the same function, up to float32 rounding


def test_a_smoothing_recipe_without_a_tokenizer_or_a_matching_node_is_refused(tmp_path, model_path):
    from dataclasses import replace

    recipe = artifacts_module.RECIPES[QUANTIZATION_RECIPES["int8-smooth"]]
    fp32 = ModelArtifacts(model_path, tmp_path / "cache").ensure("")
    target = tmp_path / "out.onnx"
    with pytest.raises(artifacts_module.ModelArtifactError, match="needs the model's tokenizer.json"):
        artifacts_module.quantise(fp32, target, recipe)
    elsewhere = replace(recipe, smooth_nodes=r"/no_such_layer/MatMul$")
    with pytest.raises(artifacts_module.ModelArtifactError, match="no_such_layer"):
        artifacts_module.quantise(fp32, target, elsewhere, model_path / "tokenizer.json")
    assert not target.exists() and not list(tmp_path.glob(".out.onnx.*"))  # nothing half-written is left
