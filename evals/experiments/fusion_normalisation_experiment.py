"""Score normalisation before fusion and the candidate pool size: measured on both dev sets.

``weighted`` fusion min-max normalises each method's scores over the fused pool (the union of
both methods' top ``candidate_pool`` rows).  Two untested alternatives of the issue's list:

- *theoretical min-max* (Bruch et al., "An Analysis of Fusion Functions for Hybrid Retrieval",
  2023): the lower bound is the score's theoretical minimum, not the pool's — BM25 / max(BM25)
  and (cosine − m) / (max(cosine) − m) with m = 0 (``tmm0``, negative cosines clipped) or
  m = −1 (``tmm1``); swept over alpha because the scale change moves the best alpha;
- the pool size itself (``candidate_pool`` 30 … 400; 100 shipped), which sets the pool minimum.

The variants are registered as fusion modes for this run only (``FUSION_REGISTRY``), so the
default path (``RankingPipeline``, feedback step included) ranks with them unchanged.

    .venv/bin/python -m evals.experiments.fusion_normalisation_experiment debian:train scifact:train debian:test scifact
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np

from evals.experiments.adapter_eval import ranked_rows
from evals.experiments.dev_store import open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.retrieval import fusion

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
POOLS = (30, 50, 100, 200, 400)


def max_scaled(values: np.ndarray) -> np.ndarray:
    """``values / max``: the theoretical minimum (0) maps to 0, the pool's best to 1."""
    hi = float(values.max()) if len(values) else 0.0
    return values / hi if hi > 1e-12 else np.zeros(len(values))


def _tmm0(x: fusion.FusionInputs) -> np.ndarray:
    return x.alpha * max_scaled(np.clip(x.vector, 0.0, None)) + (1.0 - x.alpha) * max_scaled(x.bm25)


def _tmm1(x: fusion.FusionInputs) -> np.ndarray:
    return x.alpha * max_scaled(x.vector + 1.0) + (1.0 - x.alpha) * max_scaled(x.bm25)


def register_variants() -> None:
    for name, fn in (("tmm0", _tmm0), ("tmm1", _tmm1)):
        fusion.FUSION_REGISTRY[name] = fusion.FusionMode(name, f"theoretical min-max ({name}), experiment only", fn)


def run(spec: str) -> dict[str, tuple[float, float]]:
    register_variants()
    dev = open_dev_store(spec)
    snapshot, dataset = dev.snapshot, dev.dataset
    vectors = embed_queries(dataset, dev.embedder)
    base = Settings()
    points = [(f"weighted {dev.params.alpha:g}, pool {pool}", dev.params, base.model_copy(update={"candidate_pool": pool}))
              for pool in POOLS]
    points += [(f"{mode} {alpha:g}", replace(dev.params, fusion=mode, alpha=alpha), base)
               for mode in ("tmm0", "tmm1") for alpha in ALPHAS]
    out = {}
    for label, params, settings in points:
        out[label] = dev.mean_scores((qid, dev.ranked_docs(ranked_rows(snapshot, text, vectors[qid], params, settings)))
                                     for qid, text in dataset.queries.items())
        print(f"  {spec}: {label}: nDCG@10 {out[label][0]:.4f}  Recall@5 {out[label][1]:.4f}", flush=True)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
