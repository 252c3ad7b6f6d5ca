"""The development sets' published stores, opened for the experiments that rank with ``RankingPipeline``.

``evals.experiments.prf_experiment``, ``adapter_eval``, ``pseudo_adapter_experiment``, ``bare_embedding_experiment``,
``bm25_params_experiment``, ``query_form_experiment``, ``doc_aggregation_experiment``, ``fusion_normalisation_experiment``
and ``rm3_experiment`` all measure on the same two stores (built by ``knowledge_store.evaluation.beir`` under
``data/eval``): SciFact (tuned on train, reported on test) and the Debian docs set built by
``make devset``, and the Perl docs set built by it too (``evals.experiments.perl_docs``).  A set is named ``scifact``,
``debian`` or ``perl``, optionally with ``:split``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evals.experiments.ranking_sweep import doc_beir_ids
from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import dedupe_ranking, ndcg_at_k, recall_at_k
from knowledge_store.evaluation.beir import BeirDataset, beir_settings, load_beir
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot, load_snapshot
from knowledge_store.storage.tuned import RankingParams

ROOT = Path(__file__).resolve().parents[2]
# name -> (BEIR folder, the split reported when none is named)
DATASETS = {"scifact": (ROOT.parent / "shared" / "datasets" / "scifact", "test"),
            "debian": (ROOT / "data" / "datasets" / "debian-docs", "all"),
            "perl": (ROOT / "data" / "datasets" / "perl-docs", "all")}


@dataclass
class DevStore:
    name: str
    folder: Path
    dataset: BeirDataset  # the queries and qrels of the split opened
    store: Settings  # the store's own settings (index_dir, model)
    snapshot: LoadedSnapshot
    embedder: object  # the query embedder, loaded
    beir: list[str]  # BEIR ``_id`` per document index of the snapshot
    params: RankingParams  # the built-in default ranking

    def split(self, split: str) -> BeirDataset:
        """Another split of the same set (same corpus, same store)."""
        return load_beir(self.folder, split=split)

    def ranked_docs(self, rows: np.ndarray) -> list[str]:
        """BEIR ids of the documents of the ranked chunk ``rows``, each where its best chunk ranks."""
        return dedupe_ranking(self.beir[d] for d in self.snapshot.doc_index[rows].tolist())

    def mean_scores(self, rankings: Iterable[tuple[str, list[str]]]) -> tuple[float, float]:
        """Mean nDCG@10 and Recall@5 (4 decimals) of ``(query id, ranked BEIR ids)`` on the opened split's qrels."""
        qrels = self.dataset.qrels
        scores = [(ndcg_at_k(ranked, qrels[qid], 10), recall_at_k(ranked, qrels[qid], 5)) for qid, ranked in rankings]
        return tuple(np.round(np.mean(scores, axis=0), 4).tolist())


def open_dev_store(spec: str) -> DevStore:
    """``scifact``, ``debian``, ``scifact:train`` ...: the set's split, its store's snapshot and a loaded query embedder."""
    from knowledge_store.models.embeddings import settings_query_embedder
    from knowledge_store.retrieval.ranking_defaults import builtin_ranking

    name, _, split = spec.partition(":")
    folder, default_split = DATASETS[name]
    dataset = load_beir(folder, split=split or default_split)
    settings = Settings()
    store = beir_settings(dataset, settings.data_dir / "eval")
    snapshot = load_snapshot(store.index_dir)
    embedder = settings_query_embedder(store, threads=2)  # as the server embeds queries (its quantised graph)
    return DevStore(spec, folder, dataset, store, snapshot, embedder, doc_beir_ids(snapshot), builtin_ranking(settings))
