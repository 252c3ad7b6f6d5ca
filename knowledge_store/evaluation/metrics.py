"""Ranking metrics, as pure functions, and the registry of every metric an evaluation run records.

``METRICS`` (at the end of this module) maps each canonical metric name - ``recall@5``, ``ndcg@10``,
``ragas_recall@5``, ``faithfulness``, ``latency_p95_ms``, ... - to its ``MetricSpec`` (label, direction, how it is computed);
everything that stores, shows or gates a metric reads it, so adding a metric is one entry there.

The ranking metrics themselves and their conventions (BEIR / pytrec_eval: ids compared as strings,
graded relevance, recall over all relevant documents, an empty relevant set scoring 0.0, a repeated id
refused) are ``knowledge_store.core.metrics``; this module scores evaluation runs with them.

**A metric that has no value** for a run says why instead of a number: its score function raises
``MetricNotApplicable`` (grounding and the judged metrics of extractive answers, which are quoted from the passages and
would score 1.0 by construction) or ``MetricFailed`` (the judge endpoint failed: its error, never a 0).
``score_outcomes`` keeps these apart from the figures (``Scores.unavailable``: status and reason), and the
results store, the CLI, the Dagster metadata and the console show them as such.  A per-query value of
None means that query was not scored (an answer with nothing to judge); the run's figure aggregates the
scored ones.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from knowledge_store.core.errors import GroundworkError
from knowledge_store.core.metrics import (
    DEFAULT_KS,
    Relevant,
    mrr_at_k,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
)
from knowledge_store.core.text import contains_words
from knowledge_store.evaluation.grounding import grounding_score
from knowledge_store.evaluation.ragas_metrics import (  # each imports RAGAS on first use
    JudgeItem,
    RagasJudge,
    ragas_context_precision_batch,
    ragas_context_recall_batch,
    ragas_recall_batch,
)
from knowledge_store.retrieval.answer import NO_ANSWER, Answer, cited_markers


def score_query(ranked: Sequence[str], relevant: Relevant, ks: Iterable[int] = DEFAULT_KS) -> dict[str, float]:
    """Every metric at every k for one query: ``{"ndcg@10": ..., "recall@10": ..., ...}``."""
    scores: dict[str, float] = {}
    for k in ks:
        for family, (_, function, _) in RANKING_FAMILIES.items():
            scores[f"{family}@{k}"] = function(ranked, relevant, k)
    return scores


# ------------------------------------------------------------------ the metric registry
#
# Every metric an evaluation run records is one ``MetricSpec`` in ``METRICS``: its canonical name (the only
# spelling in code, storage and APIs), its display label, its direction and how it is computed from what the
# engine did with each query.  Evaluators return ``{canonical name: value}``; the results store keeps one row
# per metric; the CLI table, the Dagster scorecard and plot, the regression gate and the console read the
# registry for labels, column order and direction.  Adding a metric is one entry in ``METRICS``.


class MetricError(GroundworkError):
    """A metric name or value the registry cannot accept; ``metric`` names the metric, ``reason`` says why."""

    def __init__(self, metric: str, reason: str) -> None:
        self.metric = metric
        self.reason = reason
        super().__init__(f"metric {metric!r}: {reason}")


class UnknownMetricError(MetricError):
    """A name that is neither registered in ``METRICS`` nor ``<ranking family>@<k>`` (e.g. ``recall_at_5``)."""


UnavailableStatus = Literal["not_applicable", "failed"]


class MetricUnavailable(MetricError):
    """A metric with no value for this run; ``status`` says which kind, ``reason`` why."""

    status: UnavailableStatus

    def note(self) -> dict[str, str]:
        """What a run records in the value's place: ``{"status", "reason"}``."""
        return {"status": self.status, "reason": self.reason}


class MetricNotApplicable(MetricUnavailable):
    """The metric does not apply to these answers (e.g. grounding of extractive answers, quoted from the passages)."""

    status: UnavailableStatus = "not_applicable"


class MetricFailed(MetricUnavailable):
    """Computing the metric failed (the judge endpoint's error); recorded with its error, never as 0."""

    status: UnavailableStatus = "failed"


@dataclass(frozen=True)
class QueryOutcome:
    """What the engine did with one labelled query: everything a metric may score.

    Kept whole (not pre-scored) so that a new metric needs no change to the evaluator that collects these.
    """

    query_id: str
    ranked: list[str]  # deduplicated doc ids, best first (``dedupe_ranking``)
    relevant: Mapping[str, float]  # the query's qrels: doc id -> grade
    answer: Answer | str = ""  # the answer a user would get (extractive, from the served passages), or its text
    passages: Mapping[int, str] = field(default_factory=dict)  # the served passages by citation number
    latency_ms: float = 0.0  # search latency including one real query embedding
    question: str = ""  # the query's text (what a judge asks about)
    references: Mapping[str, str] = field(default_factory=dict)  # labelled doc id -> its text (text-based metrics)
    answer_error: str | None = None  # the answering endpoint's error when the answer could not be written
    passage_ids: Mapping[int, str] = field(default_factory=dict)  # the judged id of each served passage, by citation number
    key_facts: Sequence[str] = ()  # what a correct answer must contain, every one (sets that have them)


ScoreValue = float | None  # None: this query was not scored


ScoreFn = Callable[..., list[ScoreValue]]  # (outcomes) -> values; (outcomes, judge) for a judged metric
AggregateFn = Callable[[Sequence[float]], float]


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean (``math.fsum``, so the order of the queries does not change the last digits)."""
    return math.fsum(values) / len(values)


def nearest_rank_percentile(share: float) -> AggregateFn:
    """The value at index ``int(share * (n - 1))`` of the sorted values (no interpolation: a latency that
    was actually observed)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"percentile share must be within [0, 1], got {share}")

    def percentile(values: Sequence[float]) -> float:
        ordered = sorted(values)
        return ordered[int(share * (len(ordered) - 1))]

    return percentile


def each_query(score: Callable[[QueryOutcome], float]) -> ScoreFn:
    """A ``ScoreFn`` from a function of one query (most metrics; RAGAS scores a batch at once)."""
    return lambda outcomes: [score(outcome) for outcome in outcomes]


@dataclass(frozen=True)
class MetricSpec:
    """One metric: what it is called, how it is shown and how it is computed.

    ``score`` gives one value per query (in the order given), ``aggregate`` turns them into the run's
    figure (the mean unless said otherwise).  ``headline`` metrics are shown with their change since the
    previous run (console) and drawn in the scorecard plot; ``gated`` ones fail the regression check
    when they worsen by more than its margin.  ``judged``: ``score`` also gets the run's ``RagasJudge``
    (None when no LLM wrote the answers).
    """

    name: str
    label: str
    higher_is_better: bool
    score: ScoreFn
    aggregate: AggregateFn = mean
    digits: int = 3
    headline: bool = False
    gated: bool = False
    description: str = ""
    judged: bool = False

    def public(self) -> dict[str, object]:
        """What an API client needs to show the metric (no functions)."""
        return {"name": self.name, "label": self.label, "higher_is_better": self.higher_is_better,
                "digits": self.digits, "headline": self.headline, "gated": self.gated,
                "description": self.description}


# the ranking metrics at any depth k: name "<family>@<k>", label "<label>@<k>"
RANKING_FAMILIES: dict[str, tuple[str, Callable[[Sequence[str], Relevant, int], float], str]] = {
    "ndcg": ("nDCG", ndcg_at_k, "graded nDCG of the document ranking"),
    "recall": ("Recall", recall_at_k, "share of the relevant documents found"),
    "precision": ("P", precision_at_k, "relevant documents divided by k"),
    "mrr": ("MRR", mrr_at_k, "reciprocal rank of the first relevant document"),
}
_RANKING_NAME = re.compile(r"^([a-z]+)@([1-9][0-9]*)$")


def ranking_metric(family: str, k: int, **flags: bool) -> MetricSpec:
    """``<family>@<k>`` (e.g. ``recall@5``) as a ``MetricSpec`` over each query's deduplicated ranking."""
    if family not in RANKING_FAMILIES:
        raise UnknownMetricError(f"{family}@{k}", f"no ranking family {family!r}; known: {', '.join(RANKING_FAMILIES)}")
    if k < 1:
        raise MetricError(f"{family}@{k}", "k must be >= 1")
    label, function, description = RANKING_FAMILIES[family]
    return MetricSpec(f"{family}@{k}", f"{label}@{k}", True,
                      each_query(lambda outcome: function(outcome.ranked, outcome.relevant, k)),
                      description=f"{description} in the top {k}", **flags)


def _ragas_recall_at_5(outcomes: Sequence[QueryOutcome]) -> list[float]:
    return ragas_recall_batch([(outcome.ranked[:5], list(outcome.relevant)) for outcome in outcomes], k=5)


def _served_and_labelled(outcome: QueryOutcome) -> tuple[list[str], list[str]]:
    """The served passages' texts in citation order and the labelled documents' texts (those the dataset has)."""
    served = [outcome.passages[n] for n in sorted(outcome.passages)]
    labelled = [outcome.references[doc] for doc, grade in outcome.relevant.items()
                if grade > 0 and outcome.references.get(doc)]
    return served, labelled


def _ragas_context_recall(outcomes: Sequence[QueryOutcome]) -> list[float]:
    return ragas_context_recall_batch([_served_and_labelled(outcome) for outcome in outcomes])


def _ragas_context_precision(outcomes: Sequence[QueryOutcome]) -> list[float]:
    return ragas_context_precision_batch([_served_and_labelled(outcome) for outcome in outcomes])


EXTRACTIVE = "extractive answers"


def _extractive(outcome: QueryOutcome) -> bool:
    return isinstance(outcome.answer, Answer) and outcome.answer.method == "extractive"


def _answered(outcomes: Sequence[QueryOutcome], metric: str) -> None:
    """MetricNotApplicable when every answer is extractive; MetricFailed when the endpoint wrote none of some."""
    if all(_extractive(outcome) for outcome in outcomes):
        raise MetricNotApplicable(metric, EXTRACTIVE)
    failed = [outcome for outcome in outcomes if outcome.answer_error]
    if failed:
        raise MetricFailed(metric, f"no answer for {len(failed)} of {len(outcomes)} queries: {failed[0].answer_error}")


def _answer_text(outcome: QueryOutcome) -> str:
    return outcome.answer.text if isinstance(outcome.answer, Answer) else str(outcome.answer or "")


def _grounding(outcomes: Sequence[QueryOutcome]) -> list[ScoreValue]:
    _answered(outcomes, "grounding")
    return [None if _extractive(outcome) else grounding_score(outcome.answer, dict(outcome.passages)).score
            for outcome in outcomes]


def _judged(metric: Literal["faithfulness", "answer_relevancy"]) -> ScoreFn:
    """The judge's ``metric`` per query: not applicable to extractive answers, failed (with the first error and
    the count) when any request failed; an answer with nothing to judge (no answer, no passage) is not scored."""

    def score(outcomes: Sequence[QueryOutcome], judge: RagasJudge | None) -> list[ScoreValue]:
        _answered(outcomes, metric)
        if judge is None:
            raise MetricNotApplicable(metric, "no judge: the answers were not written by the configured endpoint")
        items = []
        for outcome in outcomes:
            text = _answer_text(outcome).strip()
            served = tuple(outcome.passages[n] for n in sorted(outcome.passages))
            judgeable = text and text != NO_ANSWER and served and outcome.question and not _extractive(outcome)
            items.append(JudgeItem(outcome.question, text, served) if judgeable else None)
        values = judge.score(metric, items)
        errors = [value for value in values if isinstance(value, str)]
        if errors:
            raise MetricFailed(metric, f"judge {judge.model} failed on {len(errors)} of "
                                       f"{sum(1 for item in items if item)} answers: {errors[0]}")
        return [None if isinstance(value, str) else value for value in values]

    return score


def _cited(outcome: QueryOutcome) -> list[int]:
    """The citation numbers the answer uses (an ``Answer``'s, or the ``[n]`` markers of a plain text)."""
    if isinstance(outcome.answer, Answer) and outcome.answer.citations:
        return list(outcome.answer.citations)
    return cited_markers(_answer_text(outcome), max(outcome.passages, default=0))


def _answer_support(outcomes: Sequence[QueryOutcome]) -> list[ScoreValue]:
    """1 for an answer that cites passages and only passages whose document is judged relevant to the query, else 0
    (no answer, "No relevant content found.", or a citation of an unjudged or irrelevant passage); an answer the
    endpoint failed to write is not scored."""
    if not any(outcome.passage_ids for outcome in outcomes):
        raise MetricNotApplicable("answer_support", "the evaluation did not record which document each served "
                                                    "passage is")
    values: list[ScoreValue] = []
    for outcome in outcomes:
        if outcome.answer_error:
            values.append(None)
            continue
        cited = _cited(outcome)
        judged = [_grade(outcome.relevant, outcome.passage_ids.get(n)) for n in cited]
        values.append(1.0 if judged and all(grade > 0 for grade in judged) else 0.0)
    return values


def _grade(relevant: Mapping[str, float], judged_id: str | None) -> float:
    if judged_id is None:
        return 0.0
    return float(relevant.get(judged_id, relevant.get(str(judged_id), 0.0)) or 0.0)


def _key_fact_recall(outcomes: Sequence[QueryOutcome]) -> list[ScoreValue]:
    """1 for an answer holding every key fact of its query (``core.text.contains_words``: case, markup and
    punctuation aside), else 0; queries without key facts, and answers the endpoint failed to write, are not
    scored; a set without any key facts is not applicable."""
    if not any(outcome.key_facts for outcome in outcomes):
        raise MetricNotApplicable("key_fact_recall", "the set has no key facts (the sample corpus's example "
                                                     "questions have them)")
    return [None if not outcome.key_facts or outcome.answer_error
            else float(all(contains_words(_answer_text(outcome), fact) for fact in outcome.key_facts))
            for outcome in outcomes]


def _latency(outcome: QueryOutcome) -> float:
    return outcome.latency_ms


METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in (
    ranking_metric("recall", 5, headline=True, gated=True),
    ranking_metric("ndcg", 10, headline=True),
    ranking_metric("mrr", 10),
    ranking_metric("precision", 5),
    MetricSpec("ragas_recall@5", "RAGAS recall@5", True, _ragas_recall_at_5,
               description="RAGAS IDBasedContextRecall over the top five retrieved ids: equals recall@5 by "
                           "construction (a cross-check)"),
    MetricSpec("ragas_context_recall@5", "RAGAS context recall (text)", True, _ragas_context_recall,
               description="RAGAS NonLLMContextRecall: share of the labelled passages whose text one of the five "
                           "served passages reproduces (Levenshtein similarity > 0.5)"),
    MetricSpec("ragas_context_precision@5", "RAGAS context precision (text)", True, _ragas_context_precision,
               description="RAGAS NonLLMContextPrecisionWithReference: average precision of the five served "
                           "passages, one counting when its text matches a labelled passage (similarity >= 0.5)"),
    MetricSpec("answer_support", "Answer support", True, _answer_support, headline=True,
               description="share of answers (extractive, from the five served passages, or the endpoint's) that "
                           "cite only passages whose document is judged relevant to the query"),
    MetricSpec("key_fact_recall", "Key-fact recall", True, _key_fact_recall, headline=True,
               description="share of answers holding every key fact of their question (normalised text match); "
                           "sets with key facts only (the sample corpus's example questions)"),
    MetricSpec("grounding", "Grounding", True, _grounding,
               description="share of a generated answer's sentences supported by the passages they cite; not "
                           "applicable to extractive answers (quoted from the passages)"),
    MetricSpec("faithfulness", "Faithfulness", True, _judged("faithfulness"), judged=True,
               description="RAGAS Faithfulness of a generated answer, judged through the configured endpoint: "
                           "share of its claims the served passages support"),
    MetricSpec("answer_relevancy", "Answer relevancy", True, _judged("answer_relevancy"), judged=True,
               description="RAGAS AnswerRelevancy of a generated answer, judged through the configured endpoint: "
                           "cosine of the question with questions generated from the answer"),
    MetricSpec("latency_p50_ms", "p50 ms", False, each_query(_latency), aggregate=statistics.median, digits=1,
               description="median search latency including one query embedding"),
    MetricSpec("latency_p95_ms", "p95 ms", False, each_query(_latency), aggregate=nearest_rank_percentile(0.95),
               digits=1, description="95th-percentile search latency including one query embedding"),
)}
"""Every metric each evaluation run computes and records, in the order tables show them."""

PRIMARY_METRIC = "ndcg@10"
"""Sorts the scorecard and names its best configuration."""


def metric_spec(name: str) -> MetricSpec:
    """The registered metric ``name``, or ``<family>@<k>`` of a ranking family at any depth."""
    if name in METRICS:
        return METRICS[name]
    match = _RANKING_NAME.match(name)
    if match and match.group(1) in RANKING_FAMILIES:
        return ranking_metric(match.group(1), int(match.group(2)))
    raise UnknownMetricError(name, f"not in knowledge_store.evaluation.metrics.METRICS ({', '.join(METRICS)}) and not "
                                   f"<{'|'.join(RANKING_FAMILIES)}>@<k>")


def metric_label(name: str) -> str:
    """The display label of ``name``; an unknown name (a metric stored by an older run and since removed from
    the registry) is shown as itself."""
    try:
        return metric_spec(name).label
    except UnknownMetricError:
        return name


def metric_order(names: Iterable[str]) -> list[str]:
    """``names`` in column order: the registry's order first, then any others by name."""
    present = set(names)
    return [n for n in METRICS if n in present] + sorted(present - set(METRICS))


def check_metric_value(name: str, value: object) -> float:
    """``value`` as a float; MetricError for a name outside the registry or a value that is not a finite number."""
    metric_spec(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MetricError(name, f"value must be a finite number, got {value!r}")
    return float(value)


class Scores(NamedTuple):
    """What ``score_outcomes`` gives: the run's figures ``{name: value}`` in column order, one row per query
    (``{"query_id", name: value or None, ...}``), the metrics without a value (``{name: {"status",
    "reason"}}``) and the seconds each metric took to compute."""

    figures: dict[str, float]
    per_query: list[dict[str, object]]
    unavailable: dict[str, dict[str, str]]
    seconds: dict[str, float]


def score_outcomes(outcomes: Sequence[QueryOutcome], ks: Iterable[int] = (),
                   judge: RagasJudge | None = None) -> Scores:
    """Every registered metric, plus each ranking family at the depths ``ks``, over ``outcomes``; ``judge``
    scores the judged metrics (None: no LLM wrote the answers).

    A metric that raises ``MetricUnavailable`` is listed in ``unavailable`` (and is None in every query's row),
    as is one that scored no query at all.  Empty ``outcomes`` give empty ``Scores``: there is nothing to
    average.
    """
    if not outcomes:
        return Scores({}, [], {}, {})
    specs = list(METRICS.values())
    names = set(METRICS)
    for k in ks:
        for family in RANKING_FAMILIES:
            if f"{family}@{k}" not in names:
                specs.append(ranking_metric(family, k))
                names.add(f"{family}@{k}")
    per_query: list[dict[str, object]] = [{"query_id": outcome.query_id} for outcome in outcomes]
    figures: dict[str, float] = {}
    unavailable: dict[str, dict[str, str]] = {}
    seconds: dict[str, float] = {}
    for spec in specs:
        started = time.perf_counter()
        try:
            raw = spec.score(outcomes, judge) if spec.judged else spec.score(outcomes)
        except MetricUnavailable as missing:
            raw, unavailable[spec.name] = [None] * len(outcomes), missing.note()
        seconds[spec.name] = time.perf_counter() - started
        if len(raw) != len(outcomes):
            raise MetricError(spec.name, f"scored {len(raw)} values for {len(outcomes)} queries")
        values = [None if value is None else float(value) for value in raw]
        for row, value in zip(per_query, values):
            row[spec.name] = value
        scored = [value for value in values if value is not None]
        if scored:
            figures[spec.name] = float(spec.aggregate(scored))
        elif spec.name not in unavailable:
            unavailable[spec.name] = {"status": "not_applicable", "reason": "no query could be scored"}
    return Scores(figures, per_query, unavailable, seconds)
