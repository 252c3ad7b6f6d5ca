"""Chunk vectors with or without the "title > section" header: measured on both dev sets.

The chunker embeds ``header + "\\n\\n" + text`` (knowledge_store/ingest/chunking.py).  This embeds every
chunk's text alone with the ingestion encoder (cached beside the store as ``bare_embeddings.npy``)
and ranks each split's queries by ``RankingPipeline`` (default ranking, feedback step included) with the
chunk vectors replaced by: the stored ones, the bare ones, and normalised blends of the two.

    .venv/bin/python -m evals.experiments.bare_embedding_experiment scifact scifact:train debian debian:train
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from evals.experiments.adapter_eval import ranked_rows
from evals.experiments.dev_store import open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.models.embeddings import document_embedder

BLENDS = (0.0, 0.3, 0.5, 0.7, 1.0)  # weight of the bare vector


def bare_vectors(snapshot, store_dir: Path, settings: Settings) -> np.ndarray:
    cache = store_dir / "bare_embeddings.npy"
    ids = store_dir / "bare_embeddings.ids"
    if cache.exists() and ids.exists() and ids.read_text().split("\n") == snapshot.chunk_ids:
        return np.load(cache)
    started = time.perf_counter()
    texts = [t or "" for t in snapshot.records.column("text").to_pylist()]
    embedder = document_embedder(settings)
    out = np.concatenate([embedder.embed(texts[i:i + 512]) for i in range(0, len(texts), 512)]).astype(np.float32)
    np.save(cache, out)
    ids.write_text("\n".join(snapshot.chunk_ids))
    print(f"  embedded {len(texts)} bare chunks in {time.perf_counter() - started:.0f} s", flush=True)
    return out


def run(name: str) -> dict[float, tuple[float, float]]:
    dev = open_dev_store(name)
    dataset, snapshot, params = dev.dataset, dev.snapshot, dev.params
    settings = Settings()
    bare = bare_vectors(snapshot, dev.store.index_dir.parent, settings)
    stored = snapshot.embeddings.copy()
    vectors = embed_queries(dataset, dev.embedder)
    out = {}
    for w in BLENDS:
        blend = (1 - w) * stored + w * bare
        snapshot.embeddings = (blend / np.linalg.norm(blend, axis=1, keepdims=True)).astype(np.float32)
        out[w] = dev.mean_scores((qid, dev.ranked_docs(ranked_rows(snapshot, text, vectors[qid], params, settings)))
                                 for qid, text in dataset.queries.items())
        print(f"  {name}: bare weight {w:g}: nDCG@10 {out[w][0]:.4f}  Recall@5 {out[w][1]:.4f}", flush=True)
    snapshot.embeddings = stored
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
