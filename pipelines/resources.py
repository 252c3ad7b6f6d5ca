"""Dagster resources: the DuckDB store and the embedding model, injected into assets.

Both default to the environment-driven ``Settings`` (``GROUNDWORK_*``), so the
Dagster UI, ``groundwork ingest`` and the tests configure one thing the same way;
tests override ``data_dir``/``sources`` explicitly.
"""


from functools import lru_cache
from pathlib import Path

import dagster as dg

from knowledge_store.config.settings import Settings
from knowledge_store.models.embeddings import Embedder, OnnxEmbedder, TokenCounter, document_embedder, token_counter
from knowledge_store.models.serving import serving_model_path
from knowledge_store.retrieval.engine import RetrievalEngine


class KnowledgeStoreResource(dg.ConfigurableResource):
    """Where the store lives and what it ingests."""

    data_dir: str | None = None
    sources: str | None = None  # folders separated by ':'

    def settings(self) -> Settings:
        overrides: dict[str, object] = {}
        if self.data_dir:
            overrides["data_dir"] = self.data_dir
        if self.sources:
            overrides["sources"] = self.sources
        return Settings(**overrides)


@lru_cache(maxsize=4)
def _embedder(model_path: str, batch_size: int, torch_threads: int, dim: int, encoder: str = "torch",
              quantization: str = "none", onnx_batch_size: int = 8, cache_dir: str = "",
              bare_weight: float = 0.0, sentence_encoding: str = "separate") -> Embedder | OnnxEmbedder:
    """The document embedder for these settings (``document_encoder``, ``document_quantization``, ...)."""
    settings = Settings().model_copy(update={
        "model_path": model_path, "embed_batch_size": batch_size, "torch_threads": torch_threads, "embedding_dim": dim,
        "document_encoder": encoder, "document_quantization": quantization, "onnx_batch_size": onnx_batch_size,
        "bare_vector_weight": bare_weight, "sentence_encoding": sentence_encoding})
    return document_embedder(settings, cache_dir=Path(cache_dir) if cache_dir else None)


class EmbeddingModelResource(dg.ConfigurableResource):
    """The settings' embedding model (``GROUNDWORK_EMBEDDING_MODEL``) from a local folder (never downloaded); loaded once per process."""

    model_path: str | None = None
    batch_size: int | None = None
    torch_threads: int | None = None

    def _resolved(self) -> tuple[str, int, int, int]:
        base = Settings()
        return (
            self.model_path or str(base.model_path),
            self.batch_size or base.embed_batch_size,
            self.torch_threads or base.torch_threads,
            base.embedding_dim,
        )

    def embedder(self, workers: int = 1, quantization: str | None = None,
                 settings: Settings | None = None) -> Embedder | OnnxEmbedder:
        """The document embedder, with the cores (torch_threads) shared among ``workers`` processes embedding at once.

        ``quantization``: the corpus's ``query_quantization`` for texts embedded like queries (tuning), so they
        are embedded as the server embeds queries; default the document quantisation.  ``settings``:
        the corpus's, whose serving model (a fine-tuned one once adopted, ``models.serving``) is used unless
        this resource names a model."""
        path, batch, threads, dim = self._resolved()
        if settings is not None and not self.model_path:
            path = str(serving_model_path(settings))
        base = Settings()
        return _embedder(path, batch, max(1, threads // max(1, workers)), dim, base.document_encoder,
                         quantization or base.document_quantization, base.onnx_batch_size, str(base.models_cache_dir),
                         base.bare_vector_weight, base.sentence_encoding)

    def token_counter(self) -> TokenCounter:
        return token_counter(self._resolved()[0])


@lru_cache(maxsize=8)
def _engine(data_dir: str | None, overrides: tuple[tuple[str, object], ...]):
    settings = Settings(**({"data_dir": data_dir} if data_dir else {}), **dict(overrides))
    return RetrievalEngine(settings)


class RetrievalResource(dg.ConfigurableResource):
    """The query engine with its retrieval settings, so evaluation and tuning assets use exactly what serves.

    Unset fields fall back to ``Settings`` (``GROUNDWORK_DEFAULT_ALPHA`` etc.); a ranking field set here
    counts as set explicitly, so it wins over the corpus's self-tuned value (``knowledge_store.learning.tuning``).
    """

    data_dir: str | None = None
    default_k: int | None = None
    default_alpha: float | None = None
    default_fusion: str | None = None
    section_weight: float | None = None
    lead_weight: float | None = None
    use_tuned_ranking: bool | None = None
    default_reranker: str | None = None
    candidate_pool: int | None = None
    min_relevance: float | None = None

    def overrides(self) -> tuple[tuple[str, object], ...]:
        fields = ("default_k", "default_alpha", "default_fusion", "section_weight", "lead_weight", "use_tuned_ranking",
                  "default_reranker", "candidate_pool", "min_relevance")
        return tuple((name, getattr(self, name)) for name in fields if getattr(self, name) is not None)

    def settings(self) -> Settings:
        return Settings(**({"data_dir": self.data_dir} if self.data_dir else {}), **dict(self.overrides()))

    def engine(self):
        return _engine(self.data_dir, self.overrides())
