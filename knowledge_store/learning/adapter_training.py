"""A query adapter learned from thumbs-up feedback: feedback that reaches queries nobody rated.

The ``feedback`` reranker moves passages that were rated for *similar* queries (cosine >= 0.8), so a
question asked in new words gets nothing from it.  This learns, per corpus, one linear map of the
query vector, ``q' = normalise(q + q @ W)``, from the rated (query, passage) pairs: it pulls a
query towards the kind of section its users up-voted and away from the near misses that outranked
it.  Documents are not touched (no re-embedding; the stored vectors stay the model's), so it costs
one 384 x 384 product per query and can be dropped at any time.

Training (``train_query_adapter``): every thumbs-up gives (query, the rated chunk's section).  Each
query's candidates are its 200 nearest chunks by the plain vector plus its target sections' chunks;
the loss is the softmax cross-entropy of the target chunks among the candidates (temperature 20),
plus ``l2 * |W|^2`` towards the identity.  The held-out check is a 4-fold cross-validation: the
rated queries fall into four folds by a hash of their text (the same folds on every run); for each
``l2`` of the grid and each fold an adapter is trained on the other three folds and that fold's
queries are ranked by ``RankingPipeline`` - the ranking the engine serves with, BM25 and all - with and
without it, so every rated query is held out once.  The adapter is adopted only when the best
``l2``'s paired gain over no adapter is clear (``core.metrics.paired_gain``: above ``min_gain`` nDCG@10
*and* two standard errors); it is then trained again on every rated query.  Why not one held-out
quarter and a fixed margin: on a documentation dev set that check adopted an adapter from a gain on
a handful of held-out queries that then ranked unseen questions worse (docs/EVALUATION.md).

Stored as ``<index_dir>/query_adapter.npz`` (atomically), beside ``tuned.json``; the engine reads it
per query (cached on the file's modification time), the console and ``/api/knowledge/config``
show its evidence, ``groundwork adapt --reset`` removes it.  docs/EVALUATION.md ("Feedback that
learns") has the measurements.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from knowledge_store.core.metrics import ndcg_at_k, paired_gain, recall_at_k
from knowledge_store.learning.tuning import corpus_inputs, feedback_queries, units_of
from knowledge_store.retrieval.evidence import gather_evidence
from knowledge_store.retrieval.query_adapter import QueryAdapter, QueryAdapterError, reset_adapter, save_adapter
from knowledge_store.retrieval.query_form import alpha_for
from knowledge_store.retrieval.ranking import TUNING_STEPS, RankingPipeline
from knowledge_store.retrieval.ranking_defaults import effective_question_alpha, effective_ranking
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot
from knowledge_store.storage.feedback_learning import record_decision
from knowledge_store.storage.tuned import RankingParams

L2_GRID = (0.03, 0.1, 0.3)
FOLDS = 4  # cross-validation folds of the held-out check


@dataclass(frozen=True)
class RatedQuery:
    """One rated query: its text, plain vector, and the section numbers its users up-voted."""

    query: str
    vector: np.ndarray
    targets: frozenset[int]


def rated_queries(snapshot: LoadedSnapshot, feedback: Iterable[dict],
                  embed: Callable[[list[str]], np.ndarray]) -> list[RatedQuery]:
    """Thumbs-up rows whose chunk is still in ``snapshot``, grouped by query text."""

    gold = feedback_queries(snapshot, feedback)
    if not gold:
        return []
    vectors = embed([q.query for q in gold])
    return [RatedQuery(q.query, np.asarray(v, dtype=np.float32), q.targets) for q, v in zip(gold, vectors)]


def read_labels(path: Path) -> list[dict]:
    """A labelled set for ``groundwork adapt --labels``: JSON lines ``{"query": ..., "document": ...}``, the document
    named by its relative path, full path or doc id as ``groundwork`` lists them.  QueryAdapterError names the
    file and line of the first bad one (nothing is half-read)."""
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise QueryAdapterError(f"cannot read labels {path}: {error}") from error
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise QueryAdapterError(f"{path}:{number}: not JSON ({error.msg})") from error
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) and row[k].strip()
                                                for k in ("query", "document")):
            raise QueryAdapterError(f"{path}:{number}: each line needs non-empty string fields "
                                    f"\"query\" and \"document\", got {line[:120]!r}")
        rows.append({"query": row["query"].strip(), "document": row["document"].strip(), "line": number})
    if not rows:
        raise QueryAdapterError(f"{path} holds no labels")
    return rows


def labels_as_feedback(snapshot: LoadedSnapshot, labels: list[dict],
                       embed: Callable[[list[str]], np.ndarray]) -> tuple[list[dict], list[dict]]:
    """(thumbs-up rows, labels naming no document in the index): each label becomes an up-vote on its
    document's chunk nearest to the query (a document is many sections; the label says which one only
    through the query).  Only served versions count (a superseded version's rows are inactive); a relative
    path two sources share names the first - give the full path to pick the other."""
    served = set(np.unique(snapshot.doc_index[snapshot.active]).tolist())
    names: dict[str, int] = {}
    for index, doc in enumerate(snapshot.documents):
        if index not in served:
            continue
        for key in ("relative_path", "path", "doc_id"):
            if doc.get(key):
                names.setdefault(str(doc[key]), index)
    rows_of: dict[int, np.ndarray] = {}
    known = [label for label in labels if label["document"] in names]
    missing = [label for label in labels if label["document"] not in names]
    vectors = embed([label["query"] for label in known]) if known else []
    out = []
    for label, vector in zip(known, vectors):
        doc = names[label["document"]]
        rows = rows_of.setdefault(doc, np.flatnonzero((snapshot.doc_index == doc) & snapshot.active))  # served: never empty
        best = int(rows[np.argmax(snapshot.embeddings[rows] @ vector)])
        out.append({"query": label["query"], "chunk_id": snapshot.chunk_ids[best], "rating": "up", "source": "labels"})
    return out, missing


def fold_of(query: str, folds: int = FOLDS) -> int:
    """The cross-validation fold of a rated query, by a hash of its text: the same fold on every run."""
    return int(hashlib.sha1(query.encode("utf-8")).hexdigest()[:8], 16) % folds


def assign_folds(rated: list[RatedQuery], folds: int = FOLDS) -> np.ndarray:
    """Each rated query's fold (``fold_of``); when the hash leaves a fold empty (a handful of queries), the
    queries are dealt round-robin in hash order instead, so every fold has a query to hold out."""
    hashed = np.array([fold_of(r.query, folds) for r in rated], dtype=np.int64)
    if len(rated) >= folds and len(np.unique(hashed)) < folds:
        order = sorted(range(len(rated)), key=lambda i: hashlib.sha1(rated[i].query.encode("utf-8")).hexdigest())
        hashed[order] = np.arange(len(rated)) % folds
    return hashed


def _candidates(snapshot: LoadedSnapshot, rated: list[RatedQuery], nearest: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, is_target) per query, padded with -1: the nearest chunks plus every chunk of the targets."""
    group = snapshot.sections.group
    members: dict[int, np.ndarray] = {}
    lists, flags = [], []
    for r in rated:
        scores = snapshot.embeddings @ r.vector
        k = min(nearest, len(scores))
        near = np.argpartition(-scores, k - 1)[:k]
        target_rows = np.concatenate([members.setdefault(g, np.flatnonzero(group == g)) for g in r.targets])
        rows = np.concatenate([target_rows, near[~np.isin(near, target_rows)]])
        lists.append(rows)
        flags.append(np.arange(len(rows)) < len(target_rows))
    width = max(len(rows) for rows in lists)
    out = np.full((len(lists), width), -1, dtype=np.int64)
    is_target = np.zeros((len(lists), width), dtype=bool)
    for i, (rows, flag) in enumerate(zip(lists, flags)):
        out[i, :len(rows)] = rows
        is_target[i, :len(rows)] = flag
    return out, is_target


def fit_adapter(snapshot: LoadedSnapshot, rated: list[RatedQuery], l2: float, steps: int = 300,
                nearest: int = 200, temperature: float = 20.0, lr: float = 3e-3, batch: int = 256,
                seed: int = 13) -> np.ndarray:
    """The matrix ``W`` minimising the target chunks' softmax loss among each query's candidates."""
    rows, is_target = _candidates(snapshot, rated, nearest)
    vectors = snapshot.embeddings[np.maximum(rows, 0)]
    return fit_matrix(np.stack([r.vector for r in rated]), vectors, rows >= 0, is_target, l2, steps=steps,
                      temperature=temperature, lr=lr, batch=batch, seed=seed)


def fit_matrix(queries: np.ndarray, candidates: np.ndarray, valid: np.ndarray, is_target: np.ndarray, l2: float,
               steps: int = 300, temperature: float = 20.0, lr: float = 3e-3, batch: int = 256,
               seed: int = 13) -> np.ndarray:
    """Adam on ``mean(logsumexp(all candidates) - logsumexp(targets)) + l2 * |W|^2``.

    ``queries`` (n, d); ``candidates`` (n, width, d) each query's candidate vectors, ``valid`` and
    ``is_target`` (n, width) which of them are real and which are the query's targets."""
    import torch  # noqa: PLC0415 - torch, ~1.5 s to import

    generator = torch.Generator().manual_seed(seed)
    queries_t = torch.tensor(np.asarray(queries, dtype=np.float32))
    candidates_t = torch.tensor(np.asarray(candidates, dtype=np.float32))
    valid_t = torch.tensor(valid)
    target_t = torch.tensor(is_target & valid)
    dim = queries_t.shape[1]
    matrix = torch.zeros((dim, dim), requires_grad=True)
    optimiser = torch.optim.Adam([matrix], lr=lr)
    n = len(queries_t)
    for _ in range(steps):
        pick = torch.randperm(n, generator=generator)[:batch] if n > batch else torch.arange(n)
        q = queries_t[pick]
        moved = q + q @ matrix
        moved = moved / moved.norm(dim=1, keepdim=True)
        logits = temperature * torch.einsum("bd,bkd->bk", moved, candidates_t[pick])
        logits = logits.masked_fill(~valid_t[pick], float("-inf"))
        positive = logits.masked_fill(~target_t[pick], float("-inf"))
        loss = (torch.logsumexp(logits, 1) - torch.logsumexp(positive, 1)).mean() + l2 * (matrix ** 2).sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return matrix.detach().numpy().astype(np.float32)


def per_query_quality(snapshot: LoadedSnapshot, rated: list[RatedQuery], params: RankingParams,
                      matrix: np.ndarray | None, settings, question_alpha: float | None = None) -> np.ndarray:
    """(queries, 2) nDCG@10 and Recall@5 of each query's rated sections when ``rated`` are ranked as the engine
    ranks under ``settings`` (candidate pool, RRF constant, sentence evidence, the feedback step; questions at
    ``question_alpha``), with the adapter ``matrix`` applied to their vectors (None: as asked)."""

    adapter = None if matrix is None else QueryAdapter(matrix)
    pipeline = RankingPipeline.served(settings, only=TUNING_STEPS)
    out = np.zeros((len(rated), 2), dtype=np.float64)
    for i, r in enumerate(rated):
        vector = r.vector if adapter is None else adapter.apply(r.vector)
        ranking = replace(params, alpha=alpha_for(r.query, params.alpha, question_alpha, snapshot))
        fused = pipeline.rank(pipeline.context(r.query, gather_evidence(snapshot, r.query, vector), ranking, snapshot,
                                               vector, snapshot.active))
        ranked = units_of(snapshot, fused.rows, "section")
        out[i] = ndcg_at_k(ranked, r.targets, 10), recall_at_k(ranked, r.targets, 5)
    return out


def mean_quality(per_query: np.ndarray) -> dict[str, float]:
    return {"ndcg@10": round(float(per_query[:, 0].mean()), 4), "recall@5": round(float(per_query[:, 1].mean()), 4)}


def cross_validated_quality(snapshot: LoadedSnapshot, rated: list[RatedQuery], folds: np.ndarray, l2: float,
                            params: RankingParams, settings, question_alpha: float | None,
                            steps: int) -> tuple[np.ndarray, float]:
    """Per-query quality of every rated query ranked with an adapter trained on the *other* folds, and the
    mean norm of those adapters."""
    out = np.zeros((len(rated), 2), dtype=np.float64)
    norms = []
    for fold in np.unique(folds):
        held = np.flatnonzero(folds == fold)
        train = [rated[i] for i in np.flatnonzero(folds != fold)]
        matrix = fit_adapter(snapshot, train, l2, steps=steps)
        norms.append(float(np.linalg.norm(matrix)))
        out[held] = per_query_quality(snapshot, [rated[i] for i in held], params, matrix, settings, question_alpha)
    return out, float(np.mean(norms))


@dataclass
class AdapterTraining:
    """What ``train_query_adapter`` measured and chose; ``adapter`` is None when none was adopted."""

    adapter: QueryAdapter | None
    rated_queries: int
    held_out_queries: int
    without: dict[str, float]
    table: list[dict[str, Any]]
    reason: str
    seconds: float
    labels_used: int = 0
    labels_unmatched: list[dict] = field(default_factory=list)  # {"line", "document"} naming no indexed document
    decision: dict[str, Any] = field(default_factory=dict)  # core.metrics.paired_gain of the best l2 against no adapter

    def to_dict(self) -> dict[str, Any]:
        return {"adopted": self.adapter is not None, "rated_queries": self.rated_queries,
                "labels_used": self.labels_used, "labels_unmatched": self.labels_unmatched,
                "held_out_queries": self.held_out_queries, "without_adapter": self.without, "table": self.table,
                "decision": self.decision,
                "reason": self.reason, "seconds": self.seconds,
                **({"l2": self.adapter.info["l2"]} if self.adapter is not None else {})}


def train_query_adapter(snapshot: LoadedSnapshot, settings, feedback: Iterable[dict],
                        embed: Callable[[list[str]], np.ndarray], params: RankingParams,
                        l2_grid: Iterable[float] = L2_GRID, min_queries: int | None = None,
                        min_gain: float = 0.005, z: float = 2.0, steps: int = 300,
                        question_alpha: float | None = None, folds: int = FOLDS) -> AdapterTraining:
    """Train, check by ``folds``-fold cross-validation on the rated queries and (if the gain is clear: above
    ``min_gain`` and ``z`` standard errors, paired per query) return the adapter; never saves."""

    started = time.perf_counter()
    if snapshot.sections is None:
        raise QueryAdapterError("this snapshot has no sections table: re-sync the corpus before training an adapter")
    min_queries = settings.adapter_min_queries if min_queries is None else min_queries
    rated = rated_queries(snapshot, feedback, embed)
    if len(rated) < max(min_queries, folds):
        raise QueryAdapterError(
            f"only {len(rated)} queries have a thumbs-up on a passage still in the index (need {max(min_queries, folds)}): "
            "an adapter learned from fewer would follow noise; collect more feedback first")
    fold = assign_folds(rated, folds)
    without = per_query_quality(snapshot, rated, params, None, settings, question_alpha)
    table, per_l2 = [], {}
    for l2 in l2_grid:
        per_l2[l2], norm = cross_validated_quality(snapshot, rated, fold, l2, params, settings, question_alpha, steps)
        table.append({"l2": l2, "norm": round(norm, 3), **mean_quality(per_l2[l2])})
    best = max(table, key=lambda row: (row["ndcg@10"], row["recall@5"]))
    decision = paired_gain(per_l2[best["l2"]][:, 0], without[:, 0], min_gain, z)
    decision.pop("changed")
    summary = (f"on {len(rated)} rated queries, each held out once ({folds}-fold), the best adapter (l2 {best['l2']:g}) "
               f"reached nDCG@10 {best['ndcg@10']:.4f} against {mean_quality(without)['ndcg@10']:.4f} without one "
               f"(paired gain {decision['gain']:+.4f}, standard error {decision['standard_error']:.4f}; "
               f"needs above {decision['required']:.4f})")
    if not decision["adopted"]:
        return AdapterTraining(None, len(rated), len(rated), mean_quality(without), table, f"not adopted: {summary}",
                               round(time.perf_counter() - started, 2), decision=decision)
    matrix = fit_adapter(snapshot, rated, best["l2"], steps=steps)
    info = {"trained_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "snapshot_version": snapshot.info.snapshot_version, "model": Path(str(settings.model_path)).name,
            "model_id": snapshot.info.model_id.split("+", 1)[0],
            "l2": best["l2"], "rated_queries": len(rated), "held_out_queries": len(rated), "folds": folds,
            "held_out_without": mean_quality(without), "held_out_with": {k: best[k] for k in ("ndcg@10", "recall@5")},
            "decision": decision, "table": table}
    seconds = round(time.perf_counter() - started, 2)
    info["seconds"] = seconds
    return AdapterTraining(QueryAdapter(matrix, info), len(rated), len(rated), mean_quality(without), table,
                           f"adopted: {summary}", seconds, decision=decision)


# --------------------------------------------------------------------------- the whole job


def retrain_threshold(settings) -> int:
    """New thumbs-up after which the sensor ``feedback_grew`` retrains: ``adapter_retrain_votes``, never fewer
    than ``adapter_min_queries`` (fewer could not train one)."""
    return max(settings.adapter_retrain_votes, settings.adapter_min_queries)


def thumbs_up(rows: Iterable[dict]) -> int:
    """How many of the feedback ``rows`` are thumbs-up (what the sensor ``feedback_grew`` counts)."""
    return sum(1 for row in rows if str(row.get("rating")).lower() in ("up", "1", "+1", "true"))


def decision_record(training: AdapterTraining, up_votes: int, trigger: str, snapshot_version: int) -> dict[str, Any]:
    """What ``storage.feedback_learning`` keeps of a training run: adopted or declined, why, and the evidence."""
    best = max(training.table, key=lambda row: (row["ndcg@10"], row["recall@5"])) if training.table else None
    return {"decision": "adopted" if training.adapter is not None else "declined", "reason": training.reason,
            "gain": training.decision.get("gain"), "standard_error": training.decision.get("standard_error"),
            "required": training.decision.get("required"), "rated_queries": training.rated_queries,
            "ndcg@10_without": training.without.get("ndcg@10"), "ndcg@10_with": best["ndcg@10"] if best else None,
            "up_votes": up_votes, "trigger": trigger, "snapshot_version": snapshot_version,
            "seconds": training.seconds}


def adapt_corpus(settings, embedder=None, feedback: Iterable[dict] | None = None, save: bool = True,
                 labels: list[dict] | None = None, trigger: str = "cli") -> AdapterTraining:
    """Train the adapter of the corpus served from ``settings.index_dir`` on its feedback (plus ``labels``, see
    ``read_labels``) and, when ``save``, store it if adopted - or remove a stored one the new measurement did
    not adopt (what is served is what the latest evidence chose).  Labels naming no indexed document are an
    error when none match, and are counted in the result otherwise.

    When ``save``, the decision is recorded in ``feedback_learning.json`` (``storage.feedback_learning``) with
    the thumbs-up count it was made at and ``trigger`` (who asked): adopted, declined by the held-out rule, or
    declined because too few queries are rated yet (then the ``QueryAdapterError`` is raised after recording)."""
    with corpus_inputs(settings, embedder, feedback) as (snapshot, embedder, feedback):
        up_votes = thumbs_up(feedback)
        version = int(snapshot.info.snapshot_version)
        missing: list[dict] = []
        if labels:
            labelled, missing = labels_as_feedback(snapshot, labels, embedder.embed)
            if not labelled:
                example = ", ".join(repr(m["document"]) for m in missing[:3])
                raise QueryAdapterError(f"none of the {len(labels)} labels names a document in this index (e.g. {example}); "
                                        "name documents by the relative path `groundwork` lists")
            feedback += labelled
        try:
            training = train_query_adapter(snapshot, settings, feedback, embedder.embed,
                                           effective_ranking(settings, settings.index_dir),
                                           question_alpha=effective_question_alpha(settings, settings.index_dir))
        except QueryAdapterError as error:
            if save:
                record_decision(settings.index_dir, {
                    "decision": "declined", "reason": f"not trained: {error}", "rated_queries": None,
                    "up_votes": up_votes, "trigger": trigger, "snapshot_version": version})
            raise
        training.labels_used = len(labels or []) - len(missing)
        training.labels_unmatched = [{"line": m["line"], "document": m["document"]} for m in missing]
    if save:
        if training.adapter is not None:
            save_adapter(settings.index_dir, training.adapter)
        elif reset_adapter(settings.index_dir):
            training.reason += "; the previously stored adapter was removed"
        record_decision(settings.index_dir, decision_record(training, up_votes, trigger, version))
    return training
