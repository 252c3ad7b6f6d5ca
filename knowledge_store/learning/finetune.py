"""Fine-tuning the embedding model on one corpus, label-free, and serving the result only when it helps.

One run (``finetune_corpus``; ``groundwork adapt --embedder``, the Dagster asset ``finetuned_embedder``,
``groundwork eval``):

1. **Pairs** from the served snapshot (``learning.pairs``): headings, titles, FAQ questions, first
   sentences, link texts and thumbs-up; a fifth of the query texts held out by hash, up to half in a
   corpus with few headings (enough held-out pseudo-queries that the decision can see a gain);
   optionally hard negatives mined with BM25 and the served model (``ContrastiveRecipe.hard_negatives``).
   Before training, the served model ranks the held-out pseudo-queries: when their spread says the
   decision could not see a gain of ``finetune_target_gain`` (``detectable_gain``), nothing is trained
   and the decision says why.
2. **Training** (``train_embedder``) with a ``learning.recipe.ContrastiveRecipe``: contrastive, in-batch
   negatives (each query's own target against the other targets of its batch of 32, scale 20; no two
   pairs of one section in a batch) with gradient caching (the batch's loss computed from embeddings
   made in mini-batches, so memory follows the mini-batch, not the batch), AdamW 2e-5 with 10 % warm-up
   and linear decay over one epoch, training texts cut at 128 word-pieces, seeded.  The mini-batch and
   gradient checkpointing are the fastest plan whose estimate of this process's peak (what it holds when
   training starts, measured, plus what training adds) fits ``finetune_memory_gb`` and whose addition fits
   what the machine has free (``plan_memory``); when none fits, the run declines before training.  The
   served query encoder is dropped before training: held-out scoring was its last use.  Training stops
   at the step that reaches ``finetune_budget_s``.  The model is saved
   under ``<data_dir>/models/finetuned/<base>-ft-<corpus>-<training hash>`` (written to a temporary
   folder, then renamed: a kill leaves no half model); a run with the same pairs reuses it.
3. **Re-embedding**: every served chunk text (and its sentences) gets a vector from the candidate in the
   store, under the candidate's own model id, by the ingestion code (``embed_missing``): batches, so a
   kill loses one batch and the next run resumes.  The served snapshot is not touched.
4. **Decision** (``decide``): the held-out pseudo-queries are ranked as the engine serves them
   (``tuning.score_grid`` with the effective ranking and its second passes, the targets stripped of the
   query's words) over the served snapshot with its model (scored before training) and over the same
   snapshot with the candidate's vectors and query encoder.  Adopted only when the paired nDCG@10 gain clears
   ``tuning.paired_gain`` (0.005 and two standard errors): the rule self-tuning and the query adapter
   decide by.  One held-out split, not k folds: a fold costs a fine-tuning.
5. **Adopted**: ``embedder.json`` names the model and a snapshot is published with its vectors
   (``publish_index``: text, ids and the BM25 index are rebuilt from the store as on every publish; only
   the vectors differ).  The pointer switch is atomic; servers follow the snapshot's model.
   **Declined**: the decision is recorded; the candidate's vectors leave the store, and its weights and its
   graphs in the model cache are removed (a candidate that was declined never serves; mpnet's take ~1 GB).

``rollback`` serves the base model again: its vectors are still in the store, so the republished
snapshot ranks exactly as before the adoption.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import logging
import os
import random
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import GroundworkError, IndexNotBuiltError
from knowledge_store.core.metrics import paired_gain
from knowledge_store.core.progress import stage_progress
from knowledge_store.ingest.embed import embed_missing
from knowledge_store.ingest.publish import active_fingerprint, publish_index
from knowledge_store.ingest.sync_runs import end_sync_run, start_sync_run
from knowledge_store.learning.pairs import HELD_OUT_SHARES, PairSet, TrainingPair, build_pairs, mine_hard_negatives
from knowledge_store.learning.recipe import (
    ContrastiveRecipe,
    fit_memory,
    release_checkpointing,
    smallest_plan,
    training_added_bytes,
    training_memory_bytes,
)
from knowledge_store.learning.tuning import feedback_rows, score_grid
from knowledge_store.models.artifacts import forget_model, forget_orphans
from knowledge_store.models.embeddings import (
    document_embedder,
    model_id_for,
    settings_query_embedder,
)
from knowledge_store.models.serving import (
    HISTORY_KEPT,
    EmbedderRecord,
    finetuned_dir,
    load_record,
    model_path_for,
    save_record,
    serving_model_id,
    serving_model_path,
)
from knowledge_store.retrieval.ranking_defaults import effective_question_alpha, effective_ranking
from knowledge_store.retrieval.sentences import sentence_index_from
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot, load_snapshot
from knowledge_store.storage.index import SnapshotInfo, build_snapshot, read_pointer, snapshot_file_name, write_pointer
from knowledge_store.storage.store import store_connection, transaction

logger = logging.getLogger(__name__)

RECIPE = ContrastiveRecipe()
TRAINING_RECORD = "training.json"
MIN_HELD_OUT = 20  # fewer held-out pseudo-queries cannot show a clear gain
MIN_GAIN, Z = 0.005, 2.0  # the decision rule (core.metrics.paired_gain): a gain over 0.005 and 2 standard errors
# the spread of a candidate's paired nDCG@10 differences relative to the base model's per-query spread, measured
# on fine-tuning runs (docs/EVALUATION.md): what detectable_gain expects before training
DIFF_SD_PER_BASE_SD = 0.5


def _proc_bytes(path: str, key: str) -> int | None:
    """The ``key:`` line of a Linux /proc status file (kB) in bytes; None where there is no such file or line."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory_bytes() -> int | None:
    """What the kernel says can be allocated without swapping (``MemAvailable``); None where it does not say."""
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def resident_bytes() -> int | None:
    """This process's resident memory now (``VmRSS``); None where the platform does not say."""
    return _proc_bytes("/proc/self/status", "VmRSS")


def peak_rss_mb() -> float | None:
    """This process's peak resident memory so far (MB); None where the platform does not say."""
    try:
        import resource  # noqa: PLC0415 - not on Windows

        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KB on Linux
    except (ImportError, OSError):
        return None


class FinetuneError(GroundworkError):
    """Fine-tuning cannot run here (no snapshot, a model that cannot be loaded ...); says why."""


@dataclass
class TrainingRun:
    """What ``train_embedder`` did."""

    model_path: str
    model_id: str
    training_hash: str
    pairs: int
    steps: int
    planned_steps: int
    seconds: float
    stopped_by: str  # "epoch" (all pairs once), "budget" (finetune_budget_s reached) or "reused" (found on disk)
    loss_first: float | None = None
    loss_last: float | None = None
    trained_pairs: int = 0  # pairs the steps went through (each once)
    recipe: dict[str, Any] = field(default_factory=dict)  # ContrastiveRecipe.to_dict(), memory plan included

    @property
    def pairs_per_s(self) -> float:
        return round(self.trained_pairs / self.seconds, 2) if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "pairs_per_s": self.pairs_per_s}


@dataclass
class Decision:
    """One fine-tuning run's outcome: what ``groundwork adapt --embedder --json`` prints and embedder.json keeps."""

    decision: str  # "adopted" | "declined"
    reason: str
    gain: float | None = None
    standard_error: float | None = None
    required: float | None = None
    held_out: int = 0
    held_out_feedback: int = 0
    before: dict[str, float] = field(default_factory=dict)  # served model on the held-out queries
    after: dict[str, float] = field(default_factory=dict)  # the candidate on them
    detectable_gain: float | None = None  # the smallest gain the held-out set can show, estimated before training
    base_sd: float | None = None  # the served model's per-query nDCG@10 spread on the held-out queries
    diff_sd: float | None = None  # the paired differences' spread (detectable_gain's ratio is fitted to these)
    held_out_share: float | None = None
    pairs: int = 0
    pair_kinds: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    seconds_by_stage: dict[str, float] = field(default_factory=dict)
    base_model_id: str = ""
    served_model_id: str = ""  # what served when the run started
    candidate_model_id: str | None = None
    model_path: str | None = None  # the candidate's folder
    training: dict[str, Any] | None = None
    training_hash: str | None = None
    snapshot_version: int | None = None  # the snapshot published when adopted (else the one decided on)
    created_at: str = ""
    finished_at: str = ""
    peak_rss_mb: float | None = None  # the process's peak resident memory when the run finished (training included)
    # the memory plan against what happened: the process's resident memory when training was planned, the plan's
    # estimate of the peak, and the process's peak so far when training, the re-embedding and the decision ended
    # (MB; the peak never falls, so the first stage whose figure rises past another's is the one that raised it)
    memory: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- training


def release_freed_memory() -> None:
    """Hand the memory Python and torch have freed back to the system.  glibc keeps freed heap pages mapped, so
    without this the candidate's graph builds after training add to what training left behind: a collection,
    then ``malloc_trim`` where the C library has one (a no-op elsewhere)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def plan_memory(settings: Settings, base_path: Path, base_id: str, recipe: ContrastiveRecipe, decision: Decision,
                moment: str) -> tuple[ContrastiveRecipe | None, str]:
    """(the fastest memory plan for training now, "") or (None, why training is declined).  The estimate is of this
    process's peak: what it holds now (the snapshot, the served query encoder, the pairs: more for a larger corpus)
    plus what training adds, which must also fit what the machine has free.  ``decision.memory`` keeps the figures
    (MB) under ``moment``'s names."""
    free, resident = available_memory_bytes(), resident_bytes()
    budget = settings.finetune_memory_gb * 2**30
    planned = fit_memory(base_path, recipe, budget, resident, free)
    decision.memory.update({"budget_mb": round(budget / 2**20),
                            f"resident_mb_{moment}": round(resident / 2**20) if resident is not None else None,
                            f"free_mb_{moment}": round(free / 2**20) if free is not None else None})
    if planned is not None:
        decision.memory["estimate_mb"] = round(training_memory_bytes(base_path, planned, resident) / 2**20)
        return planned, ""
    smallest = smallest_plan(base_path, recipe)
    need, adds = training_memory_bytes(base_path, smallest, resident), training_added_bytes(base_path, smallest)
    short = (f"the machine has {free / 2**30:.1f} GB free" if free is not None and adds > free
             else f"GROUNDWORK_FINETUNE_MEMORY_GB is {settings.finetune_memory_gb:g}")
    return None, (f"declined: training {base_id} would take this process to about {need / 2**30:.1f} GB (it holds "
                  f"{(need - adds) / 2**30:.1f} GB; training adds {adds / 2**30:.1f} GB with mini-batches of "
                  f"{smallest.mini_batch_size}{', gradient checkpointing' if smallest.gradient_checkpointing else ''})"
                  f" and {short}; free memory, raise GROUNDWORK_FINETUNE_MEMORY_GB, choose a smaller model "
                  "(GROUNDWORK_EMBEDDING_MODEL=minilm) or set GROUNDWORK_FINETUNE_EMBEDDER=false")


def training_hash(base_model_id: str, pairs: PairSet, corpus: str, recipe: ContrastiveRecipe = RECIPE) -> str:
    """What makes a fine-tuned model what it is: its base, its pairs, the recipe (not its memory plan) and the
    corpus it is for."""
    identity = json.dumps(recipe.identity(), sort_keys=True)
    return hashlib.sha256(f"{base_model_id}|{corpus}|{identity}|{pairs.digest()}".encode()).hexdigest()


def batches(pairs: list[TrainingPair], size: int, seed: int) -> list[list[TrainingPair]]:
    """Seeded batches in which no section appears twice: a second pair of one section would be scored as
    a wrong answer for the first (in-batch negatives), and so would a hard negative mined from a section whose
    pair is in the batch.  Batches of fewer than two pairs teach nothing."""
    order = list(pairs)
    random.Random(seed).shuffle(order)
    pending = deque(order)
    out: list[list[TrainingPair]] = []
    while pending:
        batch: list[TrainingPair] = []
        groups: set[int] = set()  # the batch's targets' sections
        negative_groups: set[int] = set()  # its hard negatives' sections
        skipped: list[TrainingPair] = []
        while pending and len(batch) < size:
            pair = pending.popleft()
            if pair.group in groups or pair.group in negative_groups or groups.intersection(pair.negative_groups):
                skipped.append(pair)
                continue
            batch.append(pair)
            groups.add(pair.group)
            negative_groups.update(pair.negative_groups)
        if len(batch) < 2:
            break
        pending.extendleft(reversed(skipped))
        out.append(batch)
    return out


def train_embedder(base_path: Path, pairs: list[TrainingPair], out_dir: Path, budget_s: float, threads: int,
                   recipe: ContrastiveRecipe = RECIPE, log: Callable[[str], None] | None = None) -> TrainingRun:
    """Fine-tune ``base_path`` on ``pairs`` into ``out_dir`` with ``recipe`` (see the module docstring); ``log``
    hears loss and pairs/s every few steps.  A folder already at ``out_dir`` is the same training (its name holds
    the hash): it is reused."""
    out_dir = Path(out_dir)
    if (out_dir / TRAINING_RECORD).is_file():
        recorded = json.loads((out_dir / TRAINING_RECORD).read_text())
        recorded.pop("pairs_per_s", None)
        return replace(TrainingRun(**recorded), stopped_by="reused")
    # only a fine-tuning run needs torch and sentence-transformers
    import torch  # noqa: PLC0415 - torch, ~1.5 s to import
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415 - sentence-transformers, ~6 s to import

    started = time.monotonic()
    torch.manual_seed(recipe.seed)
    torch.set_num_threads(max(1, threads))
    model = SentenceTransformer(str(base_path), device="cpu", local_files_only=True)
    serving_length = model.max_seq_length
    model.max_seq_length = min(recipe.max_tokens, serving_length)
    plan = batches(pairs, recipe.batch_size, recipe.seed) * recipe.epochs
    if not plan:
        raise FinetuneError(f"{len(pairs)} training pairs make no batch of two")
    loss_of = recipe.build_loss(model)
    warmup = max(1, int(recipe.warmup * len(plan)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min((step + 1) / warmup, max(
        0.0, (len(plan) - step) / max(1, len(plan) - warmup))))
    model.train()
    losses: list[float] = []
    trained = 0
    training_started = time.monotonic()  # the budget is training time: loading the model is not part of it
    counts = stage_progress("fine-tune", "pairs").start(sum(len(b) for b in plan))
    stopped_by = "epoch"
    say = log or logger.info
    for step, batch in enumerate(plan):
        if time.monotonic() - training_started >= budget_s:
            stopped_by = "budget"
            break
        columns = [[p.query for p in batch], [p.target for p in batch]]
        if recipe.hard_negatives and all(p.negatives for p in batch):
            columns += [[p.negatives[i] for p in batch] for i in range(recipe.hard_negatives)]
        loss = loss_of([model.preprocess(texts) for texts in columns], None)
        loss.backward()  # the cached loss embeds the batch again, mini-batch by mini-batch, with gradients
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        trained += len(batch)
        counts.advance(len(batch))
        if step % 10 == 0 or step == len(plan) - 1:
            elapsed = time.monotonic() - started
            say(f"fine-tune step {step + 1}/{len(plan)}: loss {np.mean(losses[-10:]):.4f}, "
                f"{trained / max(elapsed, 1e-9):.1f} pairs/s, {elapsed:.0f} s")
    counts.finish()
    del optimizer, schedule, loss_of  # AdamW's moments: the re-embedding that follows needs the memory
    if recipe.gradient_checkpointing:
        release_checkpointing(model[0].auto_model)
    model.eval()
    model.max_seq_length = serving_length
    seconds = time.monotonic() - started
    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(str(tmp))
    run = TrainingRun(model_path=str(out_dir), model_id="", training_hash=out_dir.name.rsplit("-", 1)[-1],
                      pairs=len(pairs), steps=len(losses), planned_steps=len(plan), seconds=round(seconds, 2),
                      stopped_by=stopped_by, loss_first=round(losses[0], 4) if losses else None,
                      loss_last=round(float(np.mean(losses[-10:])), 4) if losses else None, trained_pairs=trained,
                      recipe=recipe.to_dict())
    (tmp / TRAINING_RECORD).write_text(json.dumps(run.to_dict(), indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    run.model_id = model_id_for(out_dir)
    (out_dir / TRAINING_RECORD).write_text(json.dumps(run.to_dict(), indent=2))
    return run


# --------------------------------------------------------------------------- the candidate's vectors


def store_vectors(settings: Settings, snapshot: LoadedSnapshot, model_id: str) -> tuple[np.ndarray, Any]:
    """``snapshot``'s rows' chunk vectors for ``model_id`` from the store, row-aligned, and their sentence
    index (None when sentence vectors are off).  FinetuneError when a row has no vector for it."""
    hashes = snapshot.records.column("content_hash").to_pylist()
    wanted = pa.table({"content_hash": sorted(set(hashes))})
    with store_connection(settings.store_path, read_only=True, timeout_s=settings.lock_timeout_s) as conn:
        conn.register("wanted", wanted)
        rows = conn.execute("SELECT e.content_hash, e.embedding FROM embeddings e SEMI JOIN wanted w "
                            "ON w.content_hash = e.content_hash WHERE e.model_id = ?", [model_id]).arrow()
        sentences = None
        if snapshot.sentence_index is not None:
            sentences = conn.execute(
                "SELECT s.content_hash, s.embedding FROM sentence_embeddings s SEMI JOIN wanted w "
                "ON w.content_hash = s.content_hash WHERE s.model_id = ? ORDER BY s.content_hash, s.ordinal",
                [model_id]).arrow()
        conn.unregister("wanted")
    dim = snapshot.embeddings.shape[1]
    found = dict(zip(rows.column(0).to_pylist(),
                     rows.column(1).combine_chunks().values.to_numpy(zero_copy_only=False).reshape(-1, dim)))
    missing = [h for h in set(hashes) if h not in found]
    if missing:
        raise FinetuneError(f"{len(missing)} chunk texts have no vector for {model_id} (first: {missing[0]})")
    vectors = np.stack([found[h] for h in hashes]).astype(np.float32) if hashes else np.zeros((0, dim), np.float32)
    index = None
    if sentences is not None and sentences.num_rows:
        flat = sentences.column(1).combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
        index = sentence_index_from(hashes, sentences.column(0).to_pylist(), flat.astype(np.float16))
    return vectors, index


def with_vectors(snapshot: LoadedSnapshot, vectors: np.ndarray, sentence_index: Any, model_id: str) -> LoadedSnapshot:
    """``snapshot`` as if it had been published with another model's vectors (same rows, text and BM25)."""
    return replace(snapshot, embeddings=vectors, sentence_index=sentence_index,
                   info=replace(snapshot.info, model_id=model_id), phrase_text_cache={}, normalised_text_cache={},
                   query_entity_cache={})


def drop_vectors(settings: Settings, model_id: str) -> None:
    """Remove a declined candidate's vectors from the store (chunks and sentences)."""
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn, transaction(conn):
        conn.execute("DELETE FROM embeddings WHERE model_id = ?", [model_id])
        conn.execute("DELETE FROM sentence_embeddings WHERE model_id = ?", [model_id])


# --------------------------------------------------------------------------- deciding


def held_out_scores(settings: Settings, snapshot: LoadedSnapshot, queries: list,
                    embed: Callable[[list[str]], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-query nDCG@10 and Recall@5 of ``queries`` (held-out pseudo-queries) ranked over ``snapshot`` as the
    engine serves them (its effective ranking and second passes, the targets stripped of the query's words)."""
    params = effective_ranking(settings, settings.index_dir)
    question_alpha = effective_question_alpha(settings, settings.index_dir)
    ndcg, recall = score_grid(snapshot, queries, embed, [params], pool=settings.candidate_pool, rrf_k=settings.rrf_k,
                              question_alpha=question_alpha, served_by=settings)
    return ndcg[0], recall[0]


def figures(scores: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    ndcg, recall = scores
    return {"ndcg@10": round(float(ndcg.mean()), 4), "recall@5": round(float(recall.mean()), 4)}


def detectable_gain(base_ndcg: np.ndarray, min_gain: float = MIN_GAIN, z: float = Z) -> tuple[float, float]:
    """(the smallest paired nDCG@10 gain the decision can adopt on these held-out queries, the standard error it
    expects), estimated before training from the served model's per-query nDCG@10: a paired difference spreads
    about ``DIFF_SD_PER_BASE_SD`` times as widely as the base scores do."""
    n = len(base_ndcg)
    if n < 2:
        return float("inf"), float("inf")
    se = DIFF_SD_PER_BASE_SD * float(np.std(base_ndcg, ddof=1)) / np.sqrt(n)
    return max(min_gain, z * se), se


def decide(base: tuple[np.ndarray, np.ndarray], candidate: tuple[np.ndarray, np.ndarray],
           ) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """The paired decision on the held-out pseudo-queries' scores with the served model (``base``) and the
    candidate (``held_out_scores``): (paired_gain's decision, before, after) with nDCG@10 and Recall@5 means."""
    verdict = paired_gain(candidate[0], base[0], MIN_GAIN, Z)
    verdict["diff_sd"] = round(float(np.std(candidate[0] - base[0], ddof=1)), 4) if len(base[0]) > 1 else 0.0
    return verdict, figures(base), figures(candidate)


# --------------------------------------------------------------------------- one run


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def corpus_key(settings: Settings) -> str:
    """Which corpus a fine-tuned model is for: its data folder."""
    return hashlib.sha256(str(Path(settings.data_dir).resolve()).encode()).hexdigest()[:8]


def _record(settings: Settings, decision: Decision, adopted_path: str | None = None,
            adopted_id: str | None = None, replace_last: bool = False) -> EmbedderRecord:
    """Save ``decision`` in embedder.json (and, when adopted, the model it names); the previous decision goes to
    the history (``replace_last``: this run's decision, recorded before, is completed instead)."""
    record = load_record(settings.index_dir) or EmbedderRecord(base_model_id=decision.base_model_id)
    if record.base_model_id != decision.base_model_id:  # another base model now: the old record does not apply
        record = EmbedderRecord(base_model_id=decision.base_model_id)
    if record.decision and not replace_last:
        record.history = [record.decision, *record.history][:HISTORY_KEPT]
    record.decision = decision.to_dict()
    if decision.decision == "adopted":
        if record.model_id != adopted_id:  # adopted now, not when the run that trained it began (created_at)
            record.adopted_at = _now()
        record.model_path, record.model_id = adopted_path, adopted_id
    save_record(settings.index_dir, record)
    return record


def _close(settings: Settings, run_id: str, status: str, reason: str) -> None:
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        end_sync_run(conn, run_id, status, reason[:500])


def finetune_corpus(settings: Settings, feedback: Iterable[dict] | None = None, budget_s: float | None = None,
                    force: bool = False, log: Callable[[str], None] | None = None,
                    recipe: ContrastiveRecipe = RECIPE) -> Decision:
    """Fine-tune the base model on the corpus served from ``settings.index_dir``, decide, and adopt or decline
    (see the module docstring).  ``force``: train and decide again even when these pairs were decided before."""
    started = time.perf_counter()
    stages: dict[str, float] = {}
    say = log or logger.info
    base_path = Path(settings.model_path)
    base_id = model_id_for(base_path)
    snapshot = load_snapshot(settings.index_dir)
    try:
        served_id = snapshot.info.model_id
        # the held-out queries are embedded with the model of the snapshot they are ranked over
        served_path = Path(snapshot.info.model_path or model_path_for(settings, served_id) or serving_model_path(settings))
        decision = Decision(decision="declined", reason="", base_model_id=base_id, served_model_id=served_id,
                            created_at=_now(), snapshot_version=snapshot.info.snapshot_version)
        rated = list(feedback_rows(settings) if feedback is None else feedback)
        pairs = build_pairs(snapshot, rated, max_pairs=settings.finetune_max_pairs)
        # a larger held-out share must not leave too few pairs to train on: back down a step at a time
        while len(pairs.train) < settings.finetune_min_pairs and pairs.held_out_share > HELD_OUT_SHARES[0]:
            smaller = max(share for share in HELD_OUT_SHARES if share < pairs.held_out_share)
            pairs = build_pairs(snapshot, rated, max_pairs=settings.finetune_max_pairs, held_out_share=smaller)
        stages["pairs"] = round(time.perf_counter() - started, 2)
        decision.pairs, decision.pair_kinds = len(pairs.train), pairs.counts
        decision.held_out, decision.held_out_feedback = len(pairs.held_out), pairs.held_out_feedback
        decision.held_out_share = pairs.held_out_share
        say(f"fine-tune: {len(pairs.train)} training pairs {pairs.counts} from {pairs.candidates} candidates; "
            f"{len(pairs.held_out)} held-out pseudo-queries ({pairs.held_out_feedback} from thumbs-up)")
        if len(pairs.train) < settings.finetune_min_pairs or len(pairs.held_out) < MIN_HELD_OUT:
            decision.reason = (f"declined: {len(pairs.train)} training pairs and {len(pairs.held_out)} held-out "
                               f"pseudo-queries; fine-tuning needs {settings.finetune_min_pairs} and {MIN_HELD_OUT} "
                               "(a corpus with more headings, titles and sections, or thumbs-up, gives more)")
            return _finish(settings, decision, started, stages)
        served_queries = settings_query_embedder(settings, served_path, threads=settings.torch_threads)
        if recipe.hard_negatives:
            mined = mine_hard_negatives(snapshot, pairs.train, served_queries.embed([p.query for p in pairs.train]),
                                        recipe.hard_negatives)
            pairs = replace(pairs, train=mined)
            decision.pair_kinds = {**pairs.counts, "with_hard_negatives": sum(bool(p.negatives) for p in mined)}
            stages["hard_negatives"] = round(time.perf_counter() - started - sum(stages.values()), 2)
            say(f"fine-tune: hard negatives for {decision.pair_kinds['with_hard_negatives']} of {len(mined)} pairs")
        digest = training_hash(base_id, pairs, corpus_key(settings), recipe)
        decision.training_hash = digest[:12]
        last = (load_record(settings.index_dir) or EmbedderRecord(base_model_id=base_id)).decision
        if not force and last and last.get("training_hash") == decision.training_hash and \
                last.get("base_model_id") == base_id:
            say(f"fine-tune: these pairs were decided before ({last['decision']}, {last['created_at']}); nothing to do")
            return Decision(**{k: v for k, v in last.items() if k in Decision.__dataclass_fields__})
        # a training run the machine cannot hold would be killed midway: declined before it starts, and not
        # remembered as decided (no training hash), so the next run trains the same pairs.  Planned here with what
        # the process holds now, and again right before training with what it holds then
        planned, decline = plan_memory(settings, base_path, base_id, recipe, decision, "at_plan")
        if planned is None:
            decision.training_hash, decision.reason = None, decline
            say(f"fine-tune: {decision.reason}")
            return _finish(settings, decision, started, stages)
        # the served model's scores on the held-out queries, before training: whether the rule could see the gain
        # fine-tuning is for, and the "before" of the decision
        base_scores = held_out_scores(settings, snapshot, pairs.held_out, served_queries.embed)
        stages["held_out"] = round(time.perf_counter() - started - sum(stages.values()), 2)
        decision.detectable_gain, expected_se = detectable_gain(base_scores[0])
        decision.base_sd = round(float(np.std(base_scores[0], ddof=1)), 4)
        target = settings.finetune_target_gain
        if decision.detectable_gain > target:
            decision.before = figures(base_scores)
            decision.reason = (f"declined before training: {len(pairs.held_out)} held-out pseudo-queries can show a "
                               f"gain of {decision.detectable_gain:.4f} nDCG@10 at the least (2 expected standard "
                               f"errors of {expected_se:.4f}), more than the {target:.4f} fine-tuning is for "
                               "(GROUNDWORK_FINETUNE_TARGET_GAIN); a corpus with more headings and titles gives more")
            say(f"fine-tune: {decision.reason}")
            return _finish(settings, decision, started, stages)
        # the served query encoder is done (the candidate's decision uses these scores): its session and the arena
        # its batches grew (~0.7 GB for mpnet) would otherwise sit beside training
        del served_queries
        release_freed_memory()
        planned, decline = plan_memory(settings, base_path, base_id, recipe, decision, "before_training")
        if planned is None:
            decision.training_hash, decision.reason = None, decline
            decision.before = figures(base_scores)
            say(f"fine-tune: {decision.reason}")
            return _finish(settings, decision, started, stages)
        say(f"fine-tune: batches of {planned.batch_size} in mini-batches of {planned.mini_batch_size}"
            f"{' with gradient checkpointing' if planned.gradient_checkpointing else ''}: this process at about "
            f"{decision.memory['estimate_mb'] / 1024:.1f} GB while training")
        name = f"{base_id.split(':')[0]}-ft-{corpus_key(settings)}-{decision.training_hash}"
        out_dir = finetuned_dir(settings) / name
        budget = settings.finetune_budget_s if budget_s is None else budget_s
        training = train_embedder(base_path, pairs.train, out_dir, budget, settings.torch_threads, planned, log=say)
        decision.memory["peak_mb_after_training"] = peak_rss_mb()
        release_freed_memory()  # training's activations and optimiser state, before the candidate's graphs
        stages["train"] = round(time.perf_counter() - started - sum(stages.values()), 2)
        decision.training, decision.model_path = training.to_dict(), str(out_dir)
        say(f"fine-tune: {training.steps}/{training.planned_steps} steps in {training.seconds:.0f} s "
            f"({training.stopped_by}); re-embedding the corpus")

        # the candidate's vectors, in the store beside the served ones (the served snapshot is not touched)
        with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
            run_id = start_sync_run(conn, None, "finetune")
        candidate_docs = document_embedder(settings, model_path=out_dir)
        try:
            # the id of the vectors the embedder makes on this CPU: its graphs are checked here first, and where the
            # quantised one fails or is the slower, fp32 embeds under the fp32 id
            candidate_id = candidate_docs.model_id
            decision.candidate_model_id = candidate_id
            say(f"fine-tune: re-embedding with {candidate_id}")
            embed_missing(settings, candidate_docs, run_id)
            decision.memory["peak_mb_after_reembedding"] = peak_rss_mb()
        except BaseException as error:
            _close(settings, run_id, "interrupted" if isinstance(error, KeyboardInterrupt) else "failed",
                   f"{type(error).__name__}: {error}")
            raise
        stages["embed"] = round(time.perf_counter() - started - sum(stages.values()), 2)
        release_freed_memory()  # the document graph's build and the re-embedding, before the query graph's
        vectors, sentences = store_vectors(settings, snapshot, candidate_id)
        candidate = with_vectors(snapshot, vectors, sentences, candidate_id)
        candidate_queries = settings_query_embedder(settings, out_dir, threads=settings.torch_threads)
        verdict, before, after = decide(base_scores, held_out_scores(settings, candidate, pairs.held_out,
                                                                     candidate_queries.embed))
        decision.memory["peak_mb_after_decision"] = peak_rss_mb()
        decision.diff_sd = verdict.get("diff_sd")
        stages["decide"] = round(time.perf_counter() - started - sum(stages.values()), 2)
        decision.gain, decision.standard_error, decision.required = (verdict["gain"], verdict["standard_error"],
                                                                     verdict["required"])
        decision.before, decision.after = before, after
        n = len(pairs.held_out)
        if verdict["adopted"]:
            decision.decision = "adopted"
            decision.reason = (f"adopted: +{verdict['gain']:.4f} nDCG@10 on {n} held-out pseudo-queries, above "
                               f"{verdict['required']:.4f} (0.005 and 2 standard errors)")
        else:
            decision.reason = (f"declined: {verdict['gain']:+.4f} nDCG@10 on {n} held-out pseudo-queries, not above "
                               f"{verdict['required']:.4f} (0.005 and 2 standard errors); {served_id} keeps serving")
    finally:
        snapshot.close()
    if decision.decision != "adopted":
        _close(settings, run_id, "succeeded", decision.reason)
        if candidate_id != served_id:  # a candidate that will never serve: its vectors, weights and graphs go
            drop_vectors(settings, candidate_id)
            freed = forget_model(out_dir, settings.models_cache_dir)
            shutil.rmtree(out_dir, ignore_errors=True)
            say(f"fine-tune: removed the declined candidate {out_dir.name} and its graphs ({freed / 2**20:.0f} MB)")
        return _finish(settings, decision, started, stages)
    # the record names the model before the snapshot switches: a kill in between leaves the old snapshot serving
    # (queries follow the snapshot) and the next publish completes the switch
    _record(settings, decision, str(out_dir), model_id_for(out_dir))
    embed_missing(settings, candidate_docs, run_id)  # texts a concurrent sync added meanwhile (usually none)
    published = publish_index(settings, candidate_id, run_id, model_path=out_dir)
    decision.snapshot_version = published.snapshot_version
    stages["publish"] = round(time.perf_counter() - started - sum(stages.values()), 2)
    return _finish(settings, decision, started, stages, replace_last=True)


def _finish(settings: Settings, decision: Decision, started: float, stages: dict[str, float],
            replace_last: bool = False) -> Decision:
    decision.seconds = round(time.perf_counter() - started, 2)
    decision.seconds_by_stage = stages
    try:  # fine-tuned models' graphs whose model folder is gone (a deleted data dir) can never load again
        forget_orphans(settings.models_cache_dir)
    except OSError as error:
        logger.warning("could not prune the model cache %s: %s", settings.models_cache_dir, error)
    decision.peak_rss_mb = peak_rss_mb()
    decision.finished_at = _now()
    adopted = decision.decision == "adopted" and decision.model_path
    _record(settings, decision, decision.model_path if adopted else None,
            model_id_for(Path(decision.model_path)) if adopted else None, replace_last=replace_last)
    return decision


def corpus_change(settings: Settings) -> tuple[float, int, str]:
    """(share of the served chunk texts new since the last fine-tuning decision, served chunk texts, why): what the
    Dagster sensor compares with ``finetune_change_share``.  New = its vector of the serving model was made after
    the decision finished.  Never decided: everything is new."""
    record = load_record(settings.index_dir)
    decision = record.decision if record else None
    finished = (decision or {}).get("finished_at")
    model_id = serving_model_id(settings)
    since = datetime.fromisoformat(finished).astimezone(timezone.utc).replace(tzinfo=None) if finished else None
    with store_connection(settings.store_path, read_only=True, timeout_s=min(settings.lock_timeout_s, 5.0)) as conn:
        new, total = conn.execute(
            "SELECT count(*) FILTER (WHERE ? IS NULL OR e.created_at > ?), count(*) FROM (SELECT DISTINCT c.content_hash "
            "FROM chunks c JOIN documents d ON d.doc_id = c.doc_id AND d.version = c.version AND d.status = 'active') a "
            "JOIN embeddings e ON e.content_hash = a.content_hash AND e.model_id = ?", [since, since, model_id]).fetchone()
    share = new / total if total else 0.0
    why = ("never fine-tuned" if since is None else f"{new} of {total} served chunk texts are new since the last "
           f"fine-tuning decision ({decision.get('decision')}, {finished})")
    return share, int(total), why


def base_index(settings: Settings) -> Path:
    """A snapshot of the corpus with the base model's vectors in ``<data_dir>/index-base`` (never served): what
    evaluation compares an adopted model with."""
    return index_copy(settings, Path(settings.model_path), Path(settings.data_dir) / "index-base")


def index_copy(settings: Settings, model_path: Path, base_dir: Path) -> Path:
    """A snapshot of the served chunks with ``model_path``'s vectors in ``base_dir`` (never served, a folder of its
    own): texts without a vector of that model are embedded first; an existing copy of the same chunks is
    reused."""
    embedder = document_embedder(settings, model_path=model_path)
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        run_id = start_sync_run(conn, None, "model-copy")
    embed_missing(settings, embedder, run_id)
    _close(settings, run_id, "succeeded", f"vectors of {embedder.model_id} for evaluation")
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        fingerprint, chunks, documents = active_fingerprint(conn, embedder.model_id)
        try:
            current = read_pointer(base_dir)
        except IndexNotBuiltError:
            current = None
        if current is None or current.fingerprint != fingerprint or not current.path(base_dir).exists():
            version = (current.snapshot_version if current else 0) + 1
            info = SnapshotInfo(snapshot_version=version, file=snapshot_file_name(version), created_at=_now(),
                                chunk_count=chunks, document_count=documents, fingerprint=fingerprint,
                                model_id=embedder.model_id, model_path=str(model_path))
            build_snapshot(conn, base_dir, info, settings.entity_vocabulary, sentences=settings.sentence_vectors)
            write_pointer(base_dir, info)
            if current is not None:
                current.path(base_dir).unlink(missing_ok=True)
    return base_dir


def rollback(settings: Settings) -> dict[str, Any]:
    """Serve the base model again: forget the adopted model and publish a snapshot with the base model's vectors
    (still in the store; texts added since the adoption are embedded first)."""
    record = load_record(settings.index_dir)
    base_id = model_id_for(settings.model_path)
    previous = record.model_id if record else None
    if record is not None:
        record.model_path = record.model_id = record.adopted_at = None
        entry = {"decision": "rolled_back", "created_at": _now(), "reason": f"rolled back from {previous}"
                 if previous else "nothing was adopted", "base_model_id": base_id}
        if record.decision:
            record.history = [record.decision, *record.history][:HISTORY_KEPT]
        record.decision = entry
        save_record(settings.index_dir, record)
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        run_id = start_sync_run(conn, None, "finetune-rollback")
    embedder = document_embedder(settings, model_path=settings.model_path)
    embed_missing(settings, embedder, run_id)
    published = publish_index(settings, embedder.model_id, run_id, model_path=Path(settings.model_path))
    return {"rolled_back_from": previous, "model_id": embedder.model_id, "snapshot_version": published.snapshot_version,
            "chunks": published.chunk_count}
