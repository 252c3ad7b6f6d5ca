"""The sample corpus's example questions as an evaluation: a scorecard, an alpha sweep and each question's hits
on the default index, in seconds, so the Evaluation page is not empty after ``make run``.

``EXAMPLE_QUESTIONS`` (``ingest.sample_corpus``) each have one answering section (a file and a heading path) and
key facts a correct answer must hold.  ``evaluate_example_questions`` runs them through the served index as it is
(no re-ingest) with ``retrieval_eval.evaluate`` - the same evaluator as a BEIR set - judging each passage by
whether it lies in the question's answering section (``judged_as``: every passage of that section is one judged
unit, every other section its own), once with the corpus's served defaults (the scorecard row, configuration
``served``, with every question's first ``HITS_KEPT`` judged units) and once per alpha of ``SWEEP_ALPHAS`` (the
sweep), and records it all in one run of the results store.  One definition serves the page: a question is found
when its answering section is among the first ``HITS_KEPT`` units, which is exactly its recall@5; a hit is marked
relevant when it is in the answering section; the answer metrics (answer support, key-fact recall) score the
answer a user would get from the first five passages.  The SciFact evaluation (``groundwork eval <folder>``, the
Dagster ``evaluate`` job) is the measurement; these questions show what an evaluation looks like.
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
from knowledge_store.core.text import contains_words
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
HITS_KEPT = 5  # judged units kept per question: found among them = recall@5 of 1
ANSWERING_SECTION = "answering section"  # the judged id of every passage in a question's answering section


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
        """Questions whose answering section is among the first ``HITS_KEPT`` units (= recall@5 x questions)."""
        return sum(1 for q in self.questions if q.found_rank is not None)


def question_id(question: str) -> str:
    """A question's id: a hash of its text (the same on every run)."""
    return hashlib.sha256(question.encode("utf-8")).hexdigest()[:12]


def _dataset(folder: Path, questions: Sequence[SampleQuestion]) -> BeirDataset:
    """The questions as a labelled set judged by answering section, with their key facts."""
    return BeirDataset(name=SAMPLE_DATASET, folder=folder, split=SAMPLE_SPLIT, corpus={},
                       queries={question_id(q.question): q.question for q in questions},
                       qrels={question_id(q.question): {ANSWERING_SECTION: 1} for q in questions}, corpus_sha256="",
                       key_facts={question_id(q.question): tuple(q.key_facts) for q in questions})


def in_answering_section(question: SampleQuestion, file: str, section_path: Sequence[str]) -> bool:
    """Whether a passage of ``file`` under ``section_path`` lies in ``question``'s answering section (the section
    or one of its subsections)."""
    return file == question.file and tuple(section_path[:len(question.section)]) == tuple(question.section)


def _judged_as(questions: Sequence[SampleQuestion], files: dict[str, str]):
    """``retrieval_eval.evaluate``'s ``judged_as``: ``ANSWERING_SECTION`` for a passage in the question's answering
    section, else its file and section path."""
    by_id = {question_id(q.question): q for q in questions}

    def judged_as(query_id: str, hit) -> str:
        file = files.get(hit.doc_id, hit.doc_id)
        if in_answering_section(by_id[query_id], file, hit.section_path):
            return ANSWERING_SECTION
        return " \u203a ".join((file, *hit.section_path))

    return judged_as


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
    judged_as = _judged_as(questions, files)
    defaults = engine.ranking_defaults()
    reranker = engine.default_reranker()
    served = evaluate(engine, dataset, EvalConfig(name=SERVED, fusion=defaults.fusion, reranker=reranker), files,
                      keep_hits=HITS_KEPT, judged_as=judged_as)
    sweep = []
    for alpha in alphas:
        result = evaluate(engine, dataset, EvalConfig(alpha=alpha, fusion=defaults.fusion, reranker=reranker), files,
                          judged_as=judged_as)
        sweep.append(SweepPoint(alpha=float(alpha), fusion=defaults.fusion, reranker=reranker,
                                metrics={name: result.metrics[name] for name in ("recall@5", "ndcg@10")}))
    by_id = {question_id(q.question): q for q in questions}
    rows = []
    for row in served.per_query:
        question = by_id[row["query_id"]]
        hits = row["hits"]
        for hit in hits:  # "relevant" is the judgement the metrics used (retrieval_eval._first_units)
            text = str(hit.pop("text"))
            hit["holds_answer"] = all(contains_words(text, fact) for fact in question.key_facts)
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



def evaluate_example_configs(settings: Settings, configs: Sequence[EvalConfig], embedder=None,
                             questions: Sequence[SampleQuestion] = EXAMPLE_QUESTIONS) -> list[EvalResult]:
    """The example questions on the served index once per configuration of ``configs`` (an evaluation suite's),
    judged as ``evaluate_example_questions`` judges them; nothing recorded (the caller files the runs)."""
    base = embedder or settings_query_embedder(settings)
    engine = RetrievalEngine(settings, embedder=CachingEmbedder(base), query_log=NullQueryLog())
    files = _file_of_documents(engine, questions)  # IndexNotBuiltError when nothing is published yet
    dataset = _dataset(settings.sample_corpus_dir, questions)
    judged_as = _judged_as(questions, files)
    return [evaluate(engine, dataset, config, files, judged_as=judged_as) for config in configs]
