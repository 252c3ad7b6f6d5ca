"""The sample corpus's example questions as an evaluation: a scorecard, an alpha sweep and each question's hits
on the default index, in seconds, so the Evaluation page is not empty after ``make run``.

``EXAMPLE_QUESTIONS`` (``ingest.sample_corpus``) each have one answering document (and in it one section and a
verbatim answer snippet).  ``evaluate_example_questions`` runs them through the served index as it is (no
re-ingest) with ``retrieval_eval.evaluate`` - the same evaluator as a BEIR set, the document as the judged
unit - once with the corpus's served defaults (the scorecard row, configuration ``served``, with every
question's first hits) and once per alpha of ``SWEEP_ALPHAS`` (the sweep), and records it all in one run of
the results store.  Four questions measure little; the point is a page that shows from the first minute what
an evaluation looks like and where each question's answer ranked.  The SciFact evaluation (``groundwork eval
<folder>``, the Dagster ``evaluate`` job) is the measurement.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import GroundworkError
from knowledge_store.evaluation.beir import BeirDataset
from knowledge_store.evaluation.results_store import (
    EvalRun,
    QuestionHits,
    SweepPoint,
    record_eval_results,
    results_path,
)
from knowledge_store.evaluation.retrieval_eval import CachingEmbedder, EvalConfig, EvalResult, NullQueryLog, evaluate
from knowledge_store.ingest.sample_corpus import EXAMPLE_QUESTIONS, SampleQuestion
from knowledge_store.models.embeddings import settings_query_embedder
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.store import utcnow

SAMPLE_DATASET = "sample corpus"
SAMPLE_SPLIT = "example questions"
SERVED = "served"  # the configuration name of the run with the corpus's served defaults
SWEEP_ALPHAS = tuple(round(i / 10, 1) for i in range(11))
HITS_KEPT = 5


class SampleEvaluationError(GroundworkError):
    """The example questions cannot be evaluated on this index (it does not hold the sample corpus)."""


@dataclass
class SampleEvaluation:
    """What ``evaluate_example_questions`` measured and recorded."""

    run_id: str
    served: EvalResult
    sweep: list[SweepPoint]
    questions: list[QuestionHits]
    seconds: float
    results_path: Path

    @property
    def found(self) -> int:
        return sum(1 for q in self.questions if q.found_rank is not None)


def question_id(question: str) -> str:
    """A question's id: a hash of its text (the same on every run)."""
    return hashlib.sha256(question.encode("utf-8")).hexdigest()[:12]


def _dataset(folder: Path, questions: Sequence[SampleQuestion]) -> BeirDataset:
    """The questions as a labelled set judged by document: each question's answering file."""
    return BeirDataset(name=SAMPLE_DATASET, folder=folder, split=SAMPLE_SPLIT, corpus={},
                       queries={question_id(q.question): q.question for q in questions},
                       qrels={question_id(q.question): {q.file: 1} for q in questions}, corpus_sha256="")


def _file_of_documents(engine: RetrievalEngine, questions: Sequence[SampleQuestion]) -> dict[str, str]:
    """doc id -> file name of every served document; SampleEvaluationError naming the answering files the
    index does not hold (another corpus is served)."""
    snapshot = engine.snapshots.current()
    files = {doc["doc_id"]: Path(str(doc.get("relative_path") or doc.get("path") or "")).name
             for doc in snapshot.documents}
    missing = sorted({q.file for q in questions} - set(files.values()))
    if missing:
        raise SampleEvaluationError(
            f"the index at {engine.settings.index_dir} does not hold {', '.join(missing)}: the example questions are "
            "about the sample corpus (the default source); evaluate your own corpus with `groundwork eval <BEIR folder>`")
    return files


def evaluate_example_questions(settings: Settings, embedder=None,
                               questions: Sequence[SampleQuestion] = EXAMPLE_QUESTIONS,
                               alphas: Sequence[float] = SWEEP_ALPHAS, record: bool = True) -> SampleEvaluation:
    """Evaluate ``questions`` on the index served from ``settings.index_dir`` and (``record``) append the run to
    ``<data_dir>/eval/results.duckdb``: the served configuration's metrics, each question's hits, the sweep."""
    started = time.perf_counter()
    base = embedder or settings_query_embedder(settings)
    engine = RetrievalEngine(settings, embedder=CachingEmbedder(base), query_log=NullQueryLog())
    files = _file_of_documents(engine, questions)  # IndexNotBuiltError when nothing is published yet
    dataset = _dataset(settings.sample_corpus_dir, questions)
    defaults = engine.ranking_defaults()
    reranker = engine.default_reranker()
    served = evaluate(engine, dataset, EvalConfig(name=SERVED, fusion=defaults.fusion, reranker=reranker), files,
                      keep_hits=HITS_KEPT)
    sweep = []
    for alpha in alphas:
        result = evaluate(engine, dataset, EvalConfig(alpha=alpha, fusion=defaults.fusion, reranker=reranker), files)
        sweep.append(SweepPoint(alpha=float(alpha), fusion=defaults.fusion, reranker=reranker,
                                metrics={name: result.metrics[name] for name in ("recall@5", "ndcg@10")}))
    by_id = {question_id(q.question): q for q in questions}
    rows = []
    for row in served.per_query:
        question = by_id[row["query_id"]]
        hits = row["hits"]
        answer = " ".join(question.answer.split())
        for hit in hits:
            hit["relevant"] = hit["document"] == question.file
            hit["holds_answer"] = answer in " ".join(str(hit.pop("text")).split())
        found = next((hit["rank"] for hit in hits if hit["relevant"]), None)
        rows.append(QuestionHits(
            query_id=row["query_id"], query=question.question, expected=f"{question.file} \u203a "
            + " \u203a ".join(question.section), found_rank=found,
            scores={k: float(v) for k, v in row.items() if k not in ("query_id", "hits") and v is not None},
            hits=hits))
    run_id = f"sample-{uuid.uuid4().hex[:12]}"
    path = results_path(settings.data_dir)
    if record:  # alpha None in the record: each question got the served per-query default
        record_eval_results(path, [EvalRun.from_result(served, run_id=run_id, dataset=SAMPLE_DATASET,
                                                       split=SAMPLE_SPLIT, created_at=utcnow())],
                            questions=rows, sweep=sweep)
    return SampleEvaluation(run_id=run_id, served=served, sweep=sweep, questions=rows,
                            seconds=round(time.perf_counter() - started, 2), results_path=path)

