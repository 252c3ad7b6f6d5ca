"""RAGAS on the logs: the feedback log as references, the query log as served answers.

**Feedback** (``feedback_evaluation``): each rated query of the query log (``feedback_gold.feedback_gold_set``)
is a reference - up-rated passages relevant, down-rated ones not.  Today's engine answers it once per suite
configuration (alpha, fusion, reranker), and its first five passages are scored with RAGAS's non-LLM metrics:
``ragas_recall@5`` (``IDBasedContextRecall``: the up-rated passages among the five, compared by content hash,
so a re-sync that keeps a passage's text keeps its label), ``ragas_context_recall@5`` (``NonLLMContextRecall``
on the passages' text) and ``ragas_context_precision@5`` (``NonLLMContextPrecisionWithReference``), plus
``downrated_in_top5`` (how many down-rated passages still come back, per query).  A configuration naming another
embedding model than the served index is not scored (its reason is kept): the log's passages are this index's.

**Query log** (``query_log_evaluation``): a sample of logged queries with the answer and the passages that were
served (the logged content hashes, read back from today's snapshot; a query whose passages no longer exist is
skipped, counted).  With a judge (``RagasJudge.from_settings``: GROUNDWORK_EVAL_JUDGE_URL / _MODEL, or the
answering endpoint) RAGAS ``faithfulness`` and ``answer_relevancy`` are computed per answer method, the judge
model recorded.  Always, and without a judge, two metrics that fail on a wrong answer: ``answer_support``
(the answer cites passages and only passages the logs' thumbs or the labels mark relevant) and
``key_fact_recall`` (the answer holds every key fact of the labelled question: the sample corpus's example
questions carry them).  Queries with no label are not scored by those two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knowledge_store.config.settings import Settings
from knowledge_store.core.text import normalised_words
from knowledge_store.evaluation.feedback_gold import GoldSample, feedback_gold_set
from knowledge_store.evaluation.metrics import METRICS, MetricUnavailable, QueryOutcome
from knowledge_store.evaluation.ragas_metrics import JudgeItem, RagasJudge, ragas_version
from knowledge_store.evaluation.retrieval_eval import NullQueryLog
from knowledge_store.evaluation.sample_eval import in_answering_section
from knowledge_store.ingest.sample_corpus import EXAMPLE_QUESTIONS, SampleQuestion
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot
from knowledge_store.storage.query_log import QueryLog

__all__ = ["FeedbackReport", "QueryLogReport", "feedback_evaluation", "query_log_evaluation"]

TOP_K = 5
FEEDBACK_RAGAS = ("ragas_recall@5", "ragas_context_recall@5", "ragas_context_precision@5")
QUERY_LOG_SAMPLE = 200  # newest answered queries a query-log evaluation reads


@dataclass
class FeedbackReport:
    samples: int  # rated queries with at least one up-rated passage
    negative_only: int  # rated queries with down-rated passages only (no reference: not scored)
    by_configuration: dict[str, dict[str, float]]
    not_scored: dict[str, str] = field(default_factory=dict)  # configuration -> why it was not scored
    per_query: list[dict[str, Any]] = field(default_factory=list)
    ragas_version: str = field(default_factory=ragas_version)


@dataclass
class QueryLogReport:
    queries: int  # answered queries scored
    skipped: int  # answered queries whose served passages are gone from today's index
    by_method: dict[str, dict[str, float]]
    unavailable: dict[str, dict[str, dict[str, str]]]  # method -> metric -> {"status", "reason"}
    judge_model: str | None
    per_query: list[dict[str, Any]] = field(default_factory=list)
    ragas_version: str = field(default_factory=ragas_version)


class _Passages:
    """Today's snapshot read by content hash and chunk id: a logged passage's text, file and section path."""

    def __init__(self, snapshot: LoadedSnapshot) -> None:
        self.snapshot = snapshot
        self.by_hash: dict[str, int] = {}
        for row, digest in enumerate(snapshot.records.column("content_hash").to_pylist()):
            if digest and digest not in self.by_hash:
                self.by_hash[digest] = row

    def row(self, chunk_id: str | None, digest: str | None) -> int | None:
        if digest and digest in self.by_hash:
            return self.by_hash[digest]
        return self.snapshot.row_of.get(chunk_id) if chunk_id else None

    def text(self, row: int) -> str:
        return str(self.snapshot.records.column("text")[row].as_py())

    def place(self, row: int) -> tuple[str, tuple[str, ...]]:
        hit = self.snapshot.hits_for_rows([row])[0]
        doc = self.snapshot.documents[int(self.snapshot.doc_index[row])]
        return Path(str(doc.get("relative_path") or doc.get("path") or "")).name, tuple(hit.section_path)


def _mean(values: Sequence[float | None]) -> float | None:
    scored = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return math.fsum(scored) / len(scored) if scored else None


def _open_log(settings: Settings, log_path: Path | None) -> QueryLog:
    return QueryLog(Path(log_path) if log_path else settings.logs_path)


def _passage_id(chunk_id: str, sample: GoldSample) -> str:
    return sample.hash_of.get(chunk_id) or chunk_id


def feedback_evaluation(settings: Settings, configurations: Sequence[Any], engine: RetrievalEngine | None = None,
                        log_path: Path | None = None) -> FeedbackReport:
    """Score today's engine on the feedback log's references under each of ``configurations`` (objects with
    ``name``, ``alpha``, ``fusion``, ``reranker`` and ``model``: ``suites.SuiteConfig``)."""
    log = _open_log(settings, log_path)
    try:
        samples = feedback_gold_set(log)
    finally:
        log.close()
    scored = [s for s in samples if s.has_references]
    engine = engine or RetrievalEngine(settings, query_log=NullQueryLog())
    report = FeedbackReport(samples=len(scored), negative_only=len(samples) - len(scored), by_configuration={})
    if not scored:
        return report
    snapshot = engine.snapshots.current()
    passages = _Passages(snapshot)
    served_model = snapshot.info.model_id
    for config in configurations:
        if getattr(config, "model", None) and not served_model.startswith(config.model):
            report.not_scored[config.name] = (f"the served index embeds with {served_model}, not {config.model}: the "
                                              "logged passages are this index's")
            continue
        outcomes, downrated = [], []
        for sample in scored:
            response = engine.search(sample.query, k=TOP_K, min_relevance=0.0, answer="none", log=False,
                                     client="eval", alpha=config.alpha, fusion=config.fusion,
                                     reranker=config.reranker)
            top = response.hits[:TOP_K]
            ranked = [h.content_hash or h.chunk_id for h in top]
            relevant = {_passage_id(c, sample): 1.0 for c in sample.reference_ids}
            references = {}
            for chunk_id in sample.reference_ids:
                row = passages.row(chunk_id, sample.hash_of.get(chunk_id))
                if row is not None:
                    references[_passage_id(chunk_id, sample)] = passages.text(row)
            negatives = {_passage_id(c, sample) for c in sample.negative_ids}
            downrated.append(float(sum(1 for i in ranked if i in negatives)))
            outcomes.append(QueryOutcome(query_id=sample.retrieval_request_id, ranked=ranked, relevant=relevant,
                                         passages={n + 1: h.text for n, h in enumerate(top)}, question=sample.query,
                                         references=references))
        figures: dict[str, float] = {}
        per_metric: dict[str, list[float]] = {}
        for name in FEEDBACK_RAGAS:
            values = METRICS[name].score(outcomes)
            per_metric[name] = values
            figures[name] = float(_mean(values) or 0.0)
        figures["downrated_in_top5"] = float(_mean(downrated) or 0.0)
        report.by_configuration[config.name] = figures
        for index, outcome in enumerate(outcomes):
            report.per_query.append({"configuration": config.name, "retrieval_request_id": outcome.query_id,
                                     "query": outcome.question, "downrated_in_top5": downrated[index],
                                     **{name: per_metric[name][index] for name in FEEDBACK_RAGAS}})
    return report


def _example(query: str, questions: Sequence[SampleQuestion]) -> SampleQuestion | None:
    wanted = normalised_words(query)
    return next((q for q in questions if normalised_words(q.question) == wanted), None)


def query_log_evaluation(settings: Settings, judge: RagasJudge | None = None, *, use_settings_judge: bool = True,
                         limit: int = QUERY_LOG_SAMPLE, log_path: Path | None = None,
                         questions: Sequence[SampleQuestion] = EXAMPLE_QUESTIONS,
                         snapshot: LoadedSnapshot | None = None,
                         judged: Sequence[str] = ("faithfulness", "answer_relevancy")) -> QueryLogReport:
    """Score the newest ``limit`` answered queries of the query log (see the module docstring).  ``judge``:
    the RAGAS judge; None with ``use_settings_judge`` = ``RagasJudge.from_settings(settings)``; ``judged``: the
    judged metrics to ask it for (each is two or more requests per answer)."""
    if judge is None and use_settings_judge:
        judge = RagasJudge.from_settings(settings)
    log = _open_log(settings, log_path)
    try:
        rows = [r for r in log.list(limit=limit) if r.answer and not r.error and r.client != "eval"]
        feedback = feedback_gold_set(log)
    finally:
        log.close()
    labels = {s.retrieval_request_id: s for s in feedback}
    if not rows:  # nothing answered yet: nothing to score, and no index needed to say so
        return QueryLogReport(queries=0, skipped=0, by_method={}, unavailable={},
                              judge_model=judge.model if judge else None)
    if snapshot is None:
        snapshot = RetrievalEngine(settings, query_log=NullQueryLog()).snapshots.current()
    passages = _Passages(snapshot)
    by_method: dict[str, list[tuple[QueryOutcome, bool]]] = {}
    skipped = 0
    for record in reversed(rows):  # oldest first
        served: dict[int, str] = {}
        ids: dict[int, str] = {}
        relevant: dict[str, float] = {}
        example = _example(record.query, questions)
        missing = False
        for n, result in enumerate(record.results_post, start=1):
            row = passages.row(result.get("chunk_id"), result.get("content_hash"))
            if row is None:
                missing = True
                break
            served[n] = passages.text(row)
            ids[n] = result.get("content_hash") or result.get("chunk_id")
            if example is not None and in_answering_section(example, *passages.place(row)):
                relevant[ids[n]] = 1.0
        if missing or not served:
            skipped += 1
            continue
        sample = labels.get(record.retrieval_request_id)
        if sample is not None:
            for chunk_id in sample.reference_ids:
                relevant[_passage_id(chunk_id, sample)] = 1.0
            for chunk_id in sample.negative_ids:  # a thumbs-down outranks the section label: a person judged it
                relevant[_passage_id(chunk_id, sample)] = 0.0
        labelled = bool(relevant)
        outcome = QueryOutcome(query_id=record.retrieval_request_id, ranked=list(dict.fromkeys(ids.values())),
                               relevant=relevant, answer=record.answer or "", passages=served, question=record.query,
                               passage_ids=ids, key_facts=tuple(example.key_facts) if example else ())
        method = str(record.params.get("answer") or "extractive")
        by_method.setdefault(method, []).append((outcome, labelled))
    report = QueryLogReport(queries=sum(len(v) for v in by_method.values()), skipped=skipped, by_method={},
                            unavailable={}, judge_model=judge.model if judge else None)
    for method, pairs in by_method.items():
        figures: dict[str, float] = {}
        notes: dict[str, dict[str, str]] = {}
        per_query: dict[str, dict[str, Any]] = {o.query_id: {"method": method, "retrieval_request_id": o.query_id,
                                                            "query": o.question, "answer": _text(o)}
                                                for o, _ in pairs}
        labelled = [o for o, has_labels in pairs if has_labels]
        for name, outcomes in (("answer_support", labelled), ("key_fact_recall", [o for o, _ in pairs])):
            if not outcomes:
                notes[name] = {"status": "not_applicable", "reason": "no logged query of this method has labels "
                                                                     "(thumbs or a labelled question)"}
                continue
            try:
                values = METRICS[name].score(outcomes)
            except MetricUnavailable as missing:
                notes[name] = missing.note()
                continue
            for outcome, value in zip(outcomes, values):
                per_query[outcome.query_id][name] = value
            value = _mean(values)
            if value is None:
                notes[name] = {"status": "not_applicable", "reason": "no query could be scored"}
            else:
                figures[name] = value
        for name in judged:
            if judge is None:
                notes[name] = {"status": "not_applicable", "reason": "no judge endpoint (GROUNDWORK_EVAL_JUDGE_URL "
                                                                     "and GROUNDWORK_EVAL_JUDGE_MODEL)"}
                continue
            items = [JudgeItem(o.question, _text(o), tuple(o.passages[n] for n in sorted(o.passages)))
                     for o, _ in pairs]
            values = judge.score(name, items)
            errors = [v for v in values if isinstance(v, str)]
            for (outcome, _), value in zip(pairs, values):
                per_query[outcome.query_id][name] = value
            if errors:
                notes[name] = {"status": "failed", "reason": f"judge {judge.model} failed on {len(errors)} of "
                                                             f"{len(items)} answers: {errors[0]}"}
                continue
            value = _mean([v for v in values if not isinstance(v, str)])
            if value is None:
                notes[name] = {"status": "not_applicable", "reason": "the judge found nothing to score"}
            else:
                figures[name] = value
        report.by_method[method] = figures
        report.unavailable[method] = notes
        report.per_query += list(per_query.values())
    return report


def _text(outcome: QueryOutcome) -> str:
    return outcome.answer.text if hasattr(outcome.answer, "text") else str(outcome.answer or "")
