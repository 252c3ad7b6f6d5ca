"""Retrieval quality of the real engine on a BEIR dataset: Recall@5, nDCG@10, MRR@10, P@5, latency.

Runs ``RetrievalEngine`` (the same code that serves) over the dataset's own
store (built by ``evals.beir.ingest_beir`` through the normal ingestion path).
Chunks are mapped back to BEIR documents and deduplicated (a document ranks
where its best chunk ranks).  Query embeddings are computed once per query and
cached, so sweeping many configurations costs one embedding per query.

    .venv/bin/python -m evals.retrieval_eval ../shared/datasets/scifact --split train --alphas 0 0.3 0.5 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evals.beir import BeirDataset, beir_ids_by_doc_id, beir_settings, ingest_beir, load_beir
from evals.metrics import aggregate, dedupe_ranking, score_query
from knowledge_store.embeddings import Embedder


class CachingEmbedder:
    """Wraps an Embedder; remembers each text's vector (queries repeat across configurations)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.torch_threads = inner.torch_threads
        self._cache: dict[str, np.ndarray] = {}

    def load(self):
        self.inner.load()
        return self

    def embed(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for text, vector in zip(missing, self.inner.embed(missing)):
                self._cache[text] = vector
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.dim), dtype=np.float32)


@dataclass(frozen=True)
class EvalConfig:
    alpha: float
    fusion: str = "weighted"
    reranker: str = "none"
    section_weight: float | None = None  # None = the engine's default for this corpus
    lead_weight: float | None = None

    @property
    def label(self) -> str:
        suffix = "" if self.reranker == "none" else f" + {self.reranker}"
        if self.section_weight is not None or self.lead_weight is not None:
            suffix = f" section={self.section_weight if self.section_weight is not None else 'default'}" \
                     f" lead={self.lead_weight if self.lead_weight is not None else 'default'}" + suffix
        if self.fusion != "weighted":
            return f"{self.fusion} (alpha {self.alpha:g})" + suffix
        name = {0.0: "BM25 only", 1.0: "vector only"}.get(self.alpha, f"hybrid alpha={self.alpha:g}")
        return name + suffix


@dataclass
class EvalResult:
    config: EvalConfig
    metrics: dict[str, float]
    latency_p50_ms: float
    latency_p95_ms: float
    queries: int
    per_query: list[dict] = field(default_factory=list)

    def row(self) -> dict[str, object]:
        return {
            "configuration": self.config.label, "alpha": self.config.alpha, "fusion": self.config.fusion,
            "reranker": self.config.reranker, "section_weight": self.config.section_weight,
            "lead_weight": self.config.lead_weight, "recall@5": self.metrics["recall@5"], "ndcg@10": self.metrics.get("ndcg@10"),
            "mrr@10": self.metrics.get("mrr@10"), "precision@5": self.metrics["precision@5"],
            "ragas_recall@5": self.metrics.get("ragas_recall@5"), "grounding": self.metrics.get("grounding"),
            "p50_ms": self.latency_p50_ms, "p95_ms": self.latency_p95_ms, "queries": self.queries,
        }


def evaluate(engine, dataset: BeirDataset, config: EvalConfig, doc_map: dict[str, str], chunks: int = 40,
             ks: tuple[int, ...] = (5, 10)) -> EvalResult:
    """Run every query of ``dataset`` through ``engine.search`` and score the document ranking."""
    from evals.grounding import grounding_score
    from evals.ragas_metrics import ragas_recall_batch
    from knowledge_store.progress import stage_progress
    from knowledge_store.retrieval.answer import extractive_answer

    per_query: list[dict] = []
    latencies: list[float] = []
    ragas_samples: list[tuple[list[str], list[str]]] = []
    counts = stage_progress("eval", "queries").start(len(dataset.queries))
    for query_id, text in dataset.queries.items():
        counts.advance()
        response = engine.search(text, k=min(100, max(chunks, 4 * max(ks))), alpha=config.alpha, fusion=config.fusion, reranker=config.reranker,
                                 section_weight=config.section_weight, lead_weight=config.lead_weight,
                                 min_relevance=0.0, answer="none", log=False, client="eval")
        latencies.append(response.latency_ms["total"] - response.latency_ms["embed"] + engine_embed_ms(engine))
        ranked = dedupe_ranking(doc_map.get(h.doc_id, h.doc_id) for h in response.hits)
        scores = score_query(ranked, dataset.qrels[query_id], ks=tuple(sorted(set(ks) | {5})))
        # grounding of the answer a user would get (extractive, from the top 5 passages)
        served = response.hits[:5]
        answer = extractive_answer(text, served)
        grounding = grounding_score(answer, {i + 1: h.text for i, h in enumerate(served)}).score
        ragas_samples.append((ranked[:5], list(dataset.qrels[query_id])))
        per_query.append({"query_id": query_id, **scores, "grounding": grounding})
    counts.finish()
    for row, value in zip(per_query, ragas_recall_batch(ragas_samples, k=5)):
        row["ragas_recall@5"] = value  # RAGAS IDBasedContextRecall over the top five retrieved ids
    metrics = aggregate(per_query)
    latencies.sort()
    return EvalResult(config, metrics, statistics.median(latencies), latencies[int(0.95 * (len(latencies) - 1))],
                      len(per_query), per_query)


_EMBED_MS: dict[int, float] = {}


def engine_embed_ms(engine) -> float:
    """Median query-embedding time of this engine's model (measured once, uncached),
    so reported latency includes a real embedding although vectors are cached."""
    key = id(engine)
    if key not in _EMBED_MS:
        inner = getattr(engine.embedder, "inner", engine.embedder)
        samples = []
        for i in range(15):
            started = time.perf_counter()
            inner.embed([f"calibration query number {i} about retrieval latency"])
            samples.append((time.perf_counter() - started) * 1000)
        _EMBED_MS[key] = statistics.median(samples[3:])
    return _EMBED_MS[key]


def open_engine(folder: Path, embedder: Embedder | None = None, ingest: bool = True, data_root: Path | None = None,
                **overrides):
    """The engine over ``folder``'s store (ingesting it first when asked) and the doc-id -> BEIR-id map.

    Stores live under ``data_root`` (default ``<GROUNDWORK_DATA_DIR>/eval``), one per corpus checksum.
    Queries are embedded by the same encoder the server uses (``query_embedder``).
    """
    from knowledge_store.embeddings import query_embedder
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.settings import Settings

    base_settings = Settings()
    data_root = data_root or base_settings.data_dir / "eval"
    if ingest:
        settings, _ = ingest_beir(folder, data_root=data_root, embedder=embedder)
    else:
        settings = beir_settings(load_beir(folder), data_root)
    settings = settings.model_copy(update=overrides)
    base = embedder or query_embedder(settings.model_path, settings.query_encoder, base_settings.data_dir / "models",
                                      settings.query_torch_threads)
    engine = RetrievalEngine(settings, embedder=CachingEmbedder(base), query_log=_NullLog())
    engine.warm_up()
    return engine, beir_ids_by_doc_id(settings)


class _NullLog:
    """Evaluation queries are not user traffic: they are not written to the query log."""

    def append(self, record) -> str:
        return ""

    def flush(self, timeout_s: float = 0) -> bool:
        return True

    def feedback_with_queries(self, limit: int = 10000) -> list:
        return []

    def close(self) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0])
    parser.add_argument("--rrf", action="store_true", help="also evaluate reciprocal-rank fusion at alpha 0.5")
    parser.add_argument("--rerankers", nargs="*", default=[], help="rerankers to add at --reranker-alpha")
    parser.add_argument("--reranker-alpha", type=float, default=0.5)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    dataset = load_beir(args.dataset, split=args.split)
    engine, doc_map = open_engine(args.dataset)
    configs = [EvalConfig(a) for a in args.alphas]
    if args.rrf:
        configs.append(EvalConfig(0.5, "rrf"))
    configs += [EvalConfig(args.reranker_alpha, "weighted", r) for r in args.rerankers]
    rows = []
    for config in configs:
        result = evaluate(engine, dataset, config, doc_map)
        rows.append(result.row())
        print(json.dumps(rows[-1]), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps({"dataset": str(args.dataset), "split": args.split, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
