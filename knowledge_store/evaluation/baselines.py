"""The plain pipelines a user would pick instead of the engine, scored in the same run.

Each is what ten lines of a popular library give on a BEIR dataset, with the same embedding model:

- ``plain dense``: sentence-transformers all-MiniLM-L6-v2, one vector per whole document
  (``title + " " + text``, truncated by the model at 256 word-pieces), exact cosine;
- ``plain bm25s``: bm25s (``method="lucene"``, k1 1.5, b 0.75) over whole documents, English stop
  words and the Snowball English stemmer (PyStemmer);
- ``plain hybrid``: min-max normalisation of those two over the union of their top 100, then
  ``alpha * dense + (1 - alpha) * bm25``.

Engine numbers are reported as ratios to these (docs/EVALUATION.md), so a change in the machine
or the dataset moves both sides of the comparison.

    .venv/bin/python -m knowledge_store.evaluation.baselines data/datasets/debian-docs --split test
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import Stemmer

from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import aggregate
from knowledge_store.evaluation.beir import BeirDataset, load_beir
from knowledge_store.evaluation.metrics import score_query

POOL = 100


@dataclass
class PlainScores:
    """Full score matrices (queries x documents) of the plain pipelines for one dataset split."""

    query_ids: list[str]
    doc_ids: list[str]
    dense: np.ndarray
    bm25: np.ndarray


def _doc_texts(ds: BeirDataset) -> tuple[list[str], list[str]]:
    ids = list(ds.corpus)
    return ids, [f"{ds.corpus[i].title} {ds.corpus[i].text}".strip() for i in ids]


def dense_document_vectors(ds: BeirDataset, model_path: Path, cache_dir: Path | None = None) -> np.ndarray:
    """One normalised vector per document (cached on disk by corpus checksum and model)."""
    ids, texts = _doc_texts(ds)
    key = hashlib.sha256(f"{ds.corpus_sha256}|{Path(model_path).resolve()}|title+text".encode()).hexdigest()[:16]
    cache = Path(cache_dir) / f"{ds.name}-{key}-dense.npy" if cache_dir else None
    if cache is not None and cache.is_file():
        vectors = np.load(cache)
        if vectors.shape[0] == len(ids):
            return vectors
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415 - sentence-transformers, ~6 s to import

    model = SentenceTransformer(str(model_path), device="cpu")
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, vectors)
    return vectors


def plain_scores(ds: BeirDataset, model_path: Path, cache_dir: Path | None = None) -> PlainScores:
    """Dense cosine and bm25s scores of every query against every document."""
    import bm25s  # noqa: PLC0415 - bm25s with SciPy, ~0.3 s to import
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415 - sentence-transformers, ~6 s to import

    doc_ids, texts = _doc_texts(ds)
    query_ids = list(ds.queries)
    doc_vectors = dense_document_vectors(ds, model_path, cache_dir)
    model = SentenceTransformer(str(model_path), device="cpu")
    query_vectors = model.encode([ds.queries[q] for q in query_ids], batch_size=64, normalize_embeddings=True,
                                 convert_to_numpy=True).astype(np.float32)
    dense = query_vectors @ doc_vectors.T

    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25(method="lucene")
    retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    bm25 = np.zeros((len(query_ids), len(doc_ids)), dtype=np.float32)
    tokenized = bm25s.tokenize([ds.queries[q] for q in query_ids], stopwords="en", stemmer=stemmer,
                               return_ids=False, show_progress=False)
    for row, tokens in enumerate(tokenized):
        if tokens:
            bm25[row] = retriever.get_scores(tokens)
    return PlainScores(query_ids, doc_ids, dense, bm25)


def _minmax(values: np.ndarray) -> np.ndarray:
    lo, hi = float(values.min()), float(values.max())
    return np.zeros_like(values) if hi - lo < 1e-12 else (values - lo) / (hi - lo)


def hybrid_row(dense: np.ndarray, bm25: np.ndarray, alpha: float, pool: int = POOL) -> tuple[np.ndarray, np.ndarray]:
    """(candidate columns, fused scores) of one query: min-max over the union of both top-``pool``."""
    candidates = np.union1d(np.argsort(-dense)[:pool], np.argsort(-bm25)[:pool])
    fused = alpha * _minmax(dense[candidates]) + (1 - alpha) * _minmax(bm25[candidates])
    return candidates, fused


def rankings(scores: PlainScores, method: str, alpha: float = 0.5, depth: int = 100) -> dict[str, list[str]]:
    """Ranked document ids per query for ``method`` in dense | bm25s | hybrid."""
    out: dict[str, list[str]] = {}
    for row, query_id in enumerate(scores.query_ids):
        if method == "dense":
            columns = np.argsort(-scores.dense[row], kind="stable")[:depth]
        elif method == "bm25s":
            columns = np.argsort(-scores.bm25[row], kind="stable")[:depth]
        elif method == "hybrid":
            candidates, fused = hybrid_row(scores.dense[row], scores.bm25[row], alpha)
            columns = candidates[np.argsort(-fused, kind="stable")][:depth]
        else:
            raise ValueError(f"method={method!r}: must be dense, bm25s or hybrid")
        out[query_id] = [scores.doc_ids[c] for c in columns]
    return out


def evaluate_plain(ds: BeirDataset, scores: PlainScores, method: str, alpha: float = 0.5) -> dict[str, float]:
    """Mean Recall@5, nDCG@10, MRR@10, P@5 of one plain pipeline."""
    ranked = rankings(scores, method, alpha)
    per_query = [score_query(ranked[q], ds.qrels[q], ks=(5, 10)) for q in scores.query_ids]
    return aggregate(per_query)


def plain_label(method: str, alpha: float | None = None) -> str:
    if method == "hybrid":
        return f"plain hybrid min-max alpha={alpha:g}"
    return {"dense": "plain dense (MiniLM, whole doc)", "bm25s": "plain bm25s (lucene, Snowball, stop words)"}[method]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--alphas", type=float, nargs="*", default=[0.5, 0.7])
    args = parser.parse_args(argv)
    settings = Settings()
    ds = load_beir(args.dataset, split=args.split)
    scores = plain_scores(ds, settings.model_path, settings.data_dir / "eval" / "baselines")
    for method, alpha in [("dense", None), ("bm25s", None), *(("hybrid", a) for a in args.alphas)]:
        metrics = evaluate_plain(ds, scores, method, alpha or 0.5)
        print(json.dumps({"configuration": plain_label(method, alpha), "recall@5": round(metrics["recall@5"], 4),
                          "ndcg@10": round(metrics["ndcg@10"], 4), "mrr@10": round(metrics["mrr@10"], 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
