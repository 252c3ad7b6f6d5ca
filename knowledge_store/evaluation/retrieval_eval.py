"""Retrieval quality of the real engine on a BEIR dataset: every metric of ``knowledge_store.evaluation.metrics.METRICS``.

Runs ``RetrievalEngine`` (the same code that serves) over the dataset's own
store (built by ``knowledge_store.evaluation.beir.ingest_beir`` through the normal ingestion path).
Chunks are mapped back to BEIR documents and deduplicated (a document ranks
where its best chunk ranks).  Query embeddings are computed once per query and
cached, so sweeping many configurations costs one embedding per query.

``evaluate_dataset`` is the one entry point: ``groundwork eval`` and the Dagster evaluation assets both call
it (the CLI ingests and fine-tunes the dataset's store and compares an adopted model with its base; the
assets evaluate stores the ``eval_datasets`` asset built, under the serving configuration's overrides).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import dedupe_ranking
from knowledge_store.core.progress import stage_progress
from knowledge_store.evaluation.beir import BeirDataset, beir_ids_by_doc_id, beir_settings, ingest_beir, load_beir
from knowledge_store.evaluation.metrics import QueryOutcome, metric_order, score_outcomes
from knowledge_store.evaluation.ragas_metrics import RagasJudge
from knowledge_store.evaluation.results_store import EvalRun
from knowledge_store.learning.finetune import base_index
from knowledge_store.models.embeddings import Embedder, settings_query_embedder
from knowledge_store.models.serving import load_record
from knowledge_store.retrieval.answer import Answer, GenerationError, LLMAnswerer, extractive_answer
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.reranker_registry import RERANKERS
from knowledge_store.retrieval.types import SearchHit

# the registries' names (retrieval/fusion.py, retrieval/reranker_registry.py), checked when a configuration is
# made (a name registered after this import is accepted, as everywhere else)
FusionName = FUSION_MODES.member()
RerankerName = RERANKERS.member()


class CachingEmbedder:
    """Wraps an Embedder; remembers each text's vector (queries repeat across configurations)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.torch_threads = inner.torch_threads
        self._cache: dict[str, np.ndarray] = {}

    def load(self):
        self.inner.load()
        return self

    def embed(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for text, vector in zip(missing, self.inner.embed(missing)):
                self._cache[text] = vector
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.dim), dtype=np.float32)


class EvalConfig(BaseModel):
    """One retrieval configuration to evaluate - the single definition the CLI, the notebooks, the quality
    report, the benchmarks and the Dagster evaluation assets (``pipelines.evaluation.CONFIGURATIONS``) share.

    A frozen pydantic model: bad values are refused where the configuration is written (the error names the
    field and the value), not in the middle of a run.  ``alpha=None`` means the engine's default.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = Field(None, description="What results are filed under (the scorecard's configuration and "
                                               "the Dagster asset retrieval_eval_<name>); default: the label.")
    alpha: float | None = Field(None, ge=0.0, le=1.0, description="0 = BM25 only, 1 = vector only; None = the "
                                                                  "engine's default.")
    fusion: FusionName = "weighted"  # type: ignore[valid-type]
    reranker: RerankerName = "none"  # type: ignore[valid-type]
    section_weight: float | None = None  # None = the engine's default for this corpus
    lead_weight: float | None = None

    @property
    def label(self) -> str:
        """A readable description of the configuration (``hybrid alpha=0.7 + mmr``)."""
        alpha = "default" if self.alpha is None else f"{self.alpha:g}"
        suffix = "" if self.reranker == "none" else f" + {self.reranker}"
        if self.section_weight is not None or self.lead_weight is not None:
            suffix = f" section={self.section_weight if self.section_weight is not None else 'default'}" \
                     f" lead={self.lead_weight if self.lead_weight is not None else 'default'}" + suffix
        if self.fusion != "weighted":
            return f"{self.fusion} (alpha {alpha})" + suffix
        name = {0.0: "BM25 only", 1.0: "vector only"}.get(self.alpha, f"hybrid alpha={alpha}")
        return name + suffix

    @property
    def configuration(self) -> str:
        """The name results are filed under: ``name`` when given, else the label."""
        return self.name or self.label


@dataclass
class EvalResult:
    """One configuration on one dataset split: the run's figures keyed by canonical metric name
    (``knowledge_store.evaluation.metrics.METRICS`` plus any ranking depth asked for) and each query's own values."""

    config: EvalConfig
    metrics: dict[str, float]
    queries: int
    per_query: list[dict] = field(default_factory=list)
    unavailable: dict[str, dict[str, str]] = field(default_factory=dict)  # metric -> {"status", "reason"}
    answer_method: str = "extractive"  # how the scored answers were written: "extractive" or "llm"
    judge_model: str | None = None  # the model that judged faithfulness and answer relevancy
    ragas_version: str | None = None  # the RAGAS that judged them
    seconds: dict[str, float] = field(default_factory=dict)  # metric -> seconds it took to compute

    @property
    def latency_p50_ms(self) -> float:
        return self.metrics["latency_p50_ms"]

    @property
    def latency_p95_ms(self) -> float:
        return self.metrics["latency_p95_ms"]

    def row(self) -> dict[str, object]:
        """The configuration and every figure, in column order (one line of a JSON report)."""
        return {
            "configuration": self.config.label, "alpha": self.config.alpha, "fusion": self.config.fusion,
            "reranker": self.config.reranker, "section_weight": self.config.section_weight,
            "lead_weight": self.config.lead_weight, **{name: self.metrics[name] for name in metric_order(self.metrics)},
            "queries": self.queries, "unavailable": self.unavailable, "answer_method": self.answer_method,
            "judge_model": self.judge_model, "ragas_version": self.ragas_version,
        }


def evaluate(engine, dataset: BeirDataset, config: EvalConfig, doc_map: dict[str, str], chunks: int = 40,
             ks: tuple[int, ...] = (5, 10), keep_hits: int = 0,
             judged_as: Callable[[str, SearchHit], str] | None = None) -> EvalResult:
    """Run every query of ``dataset`` through ``engine.search`` and score what it did with each one.

    This collects one ``QueryOutcome`` per query (the deduplicated document ranking, the answer a user would
    get and its passages, the labelled documents' texts, the latency); which metrics are computed from them is
    the registry's business (``knowledge_store.evaluation.metrics.score_outcomes``): every registered metric,
    plus each ranking family at the depths ``ks``.  ``judged_as(query_id, hit)`` is the id a passage is judged as
    (what the qrels name); default: its dataset document (``doc_map``).  Every metric ranks these ids (a judged
    unit ranks where its best passage ranks) and the answer metrics look up the cited passages' ids.
    ``keep_hits``: each query's row in ``per_query`` also lists the best passage of its first this many judged
    units (``hits``: rank in that ranking - the rank recall@k counts -, document, judged id, whether it is judged
    relevant, title, section, chunk id, text) for a page that shows what each question found.

    The answers are extractive, or - with an endpoint configured and ``eval_llm_answers`` on - written by the
    endpoint's model (``LLMAnswerer``, after the search: its time is not in the latency) and judged by RAGAS
    through it (``RagasJudge``)."""
    settings = engine.settings
    answerer = judge = None
    if settings.llm_configured and settings.eval_llm_answers:
        answerer = LLMAnswerer(settings.llm_base_url, settings.llm_model,
                               settings.llm_api_key.get_secret_value() if settings.llm_api_key else None)
        judge = RagasJudge.from_settings(settings)
    outcomes: list[QueryOutcome] = []
    kept: list[list[dict[str, Any]]] = []
    counts = stage_progress("eval", "queries").start(len(dataset.queries))
    for query_id, text in dataset.queries.items():
        counts.advance()
        request = engine.request(text, k=min(100, max(chunks, 4 * max(ks))), alpha=config.alpha, fusion=config.fusion,
                                 reranker=config.reranker, section_weight=config.section_weight,
                                 lead_weight=config.lead_weight, min_relevance=0.0, answer="none", client="eval")
        response = engine.search(request=request, log=False)
        latency_ms = response.latency_ms["total"] - response.latency_ms["embed"] + engine_embed_ms(engine)
        # the answer a user would get (extractive, from the top 5 passages): what grounding scores
        served = response.hits[:5]
        answer: Answer | str = ""
        answer_error = None
        if answerer is None:
            answer = extractive_answer(text, served)
        else:
            try:
                answer = answerer.answer(text, served)
            except GenerationError as error:  # recorded: the answer-based metrics of this run fail with it
                answer_error = str(error)
        qrels = dataset.qrels[query_id]
        judged = [judged_as(query_id, h) if judged_as else doc_map.get(h.doc_id, h.doc_id) for h in response.hits]
        outcomes.append(QueryOutcome(
            query_id=query_id, ranked=dedupe_ranking(judged), relevant=qrels, answer=answer,
            passages={i + 1: h.text for i, h in enumerate(served)},
            passage_ids={i + 1: judged[i] for i in range(len(served))},
            latency_ms=latency_ms, question=text, answer_error=answer_error,
            references={doc: _labelled_text(dataset, doc) for doc in qrels if doc in dataset.corpus},
            key_facts=tuple(dataset.key_facts.get(query_id, ()))))
        kept.append(_first_units(response.hits, judged, qrels, doc_map, keep_hits) if keep_hits else [])
    counts.finish()
    scores = score_outcomes(outcomes, ks, judge=judge)
    if keep_hits:
        for row, hits in zip(scores.per_query, kept):
            row["hits"] = hits
    return EvalResult(config, scores.figures, len(scores.per_query), scores.per_query, unavailable=scores.unavailable,
                      answer_method="extractive" if answerer is None else "llm",
                      judge_model=judge.model if judge else None, ragas_version=judge.ragas_version if judge else None,
                      seconds=scores.seconds)


def _first_units(hits: list[SearchHit], judged: list[str], qrels: dict[str, int], doc_map: dict[str, str],
                 keep: int) -> list[dict[str, Any]]:
    """The best passage of each of the first ``keep`` judged units, ranked as the metrics rank them."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for hit, unit in zip(hits, judged):
        if unit in seen:
            continue
        seen.add(unit)
        rows.append({"rank": len(rows) + 1, "document": doc_map.get(hit.doc_id, hit.doc_id), "judged_as": unit,
                     "relevant": qrels.get(unit, 0) > 0, "title": hit.title, "section": hit.section,
                     "chunk_id": hit.chunk_id, "text": hit.text})
        if len(rows) == keep:
            break
    return rows


def _labelled_text(dataset: BeirDataset, doc_id: str) -> str:
    """A labelled document's text as its chunks carry it: the body (the title lives in the front matter), or
    the title when the body is empty (``beir.materialise_corpus`` writes it so)."""
    doc = dataset.corpus[doc_id]
    return doc.text.strip() or doc.title.strip()


_EMBED_MS: dict[int, float] = {}


def engine_embed_ms(engine) -> float:
    """Median query-embedding time of this engine's model (measured once, uncached),
    so reported latency includes a real embedding although vectors are cached."""
    key = id(engine)
    if key not in _EMBED_MS:
        inner = getattr(engine.embedder, "inner", engine.embedder)
        samples = []
        for i in range(15):
            started = time.perf_counter()
            inner.embed([f"calibration query number {i} about retrieval latency"])
            samples.append((time.perf_counter() - started) * 1000)
        _EMBED_MS[key] = statistics.median(samples[3:])
    return _EMBED_MS[key]


def open_engine(folder: Path, embedder: Embedder | None = None, ingest: bool = True, data_root: Path | None = None,
                embedding_model: str | None = None, **overrides):
    """The engine over ``folder``'s store (ingesting it first when asked) and the doc-id -> BEIR-id map.

    Stores live under ``data_root`` (default ``<GROUNDWORK_DATA_DIR>/eval``), one per corpus checksum.
    Queries are embedded by the same encoder the server uses (``settings_query_embedder``).
    """

    base_settings = Settings()
    data_root = data_root or base_settings.data_dir / "eval"
    if ingest:
        settings, _ = ingest_beir(folder, data_root=data_root, embedder=embedder, embedding_model=embedding_model)
    else:
        settings = beir_settings(load_beir(folder), data_root, embedding_model)
    settings = settings.model_copy(update=overrides)
    base = embedder or settings_query_embedder(settings)  # the machine's model cache, as the server's
    engine = RetrievalEngine(settings, embedder=CachingEmbedder(base), query_log=NullQueryLog())
    engine.warm_up()
    return engine, beir_ids_by_doc_id(settings)


class NullQueryLog:
    """Evaluation queries are not user traffic: they are not written to the query log."""

    def append(self, record) -> str:
        return ""

    def flush(self, timeout_s: float = 0) -> bool:
        return True

    def feedback_with_queries(self, limit: int = 10000) -> list:
        return []

    def close(self) -> None:
        return None


@dataclass
class DatasetEvaluation:
    """One configuration on one dataset split, with what it ran on: the served model, the alphas the queries got,
    and (when the store serves a fine-tuned model) the base model's figures beside it."""

    dataset: BeirDataset
    split: str
    result: EvalResult
    alpha: float  # the alpha of every query that is not a question
    question_alpha: float | None  # the alpha of questions (None: an explicit alpha applied to every query)
    model_id: str
    store: Path
    base_model_id: str | None = None
    base_metrics: dict[str, float] | None = None
    finetune: dict[str, Any] | None = None  # the store's last fine-tuning decision (learning.finetune)

    @property
    def config(self) -> EvalConfig:
        return self.result.config

    def run_record(self, run_id: str, created_at: datetime, configuration: str | None = None) -> EvalRun:
        """What the results store keeps of it (``results_store.EvalRun``)."""
        return EvalRun.from_result(self.result, run_id=run_id, dataset=self.dataset.name, split=self.split,
                                   created_at=created_at, configuration=configuration)

    def to_dict(self) -> dict[str, Any]:
        config = self.config
        return {
            "dataset": str(self.dataset.folder), "split": self.split, "queries": self.result.queries,
            "configuration": config.label, "alpha": self.alpha, "question_alpha": self.question_alpha,
            "fusion": config.fusion, "reranker": config.reranker, **self.result.metrics,
            "unavailable": self.result.unavailable, "answer_method": self.result.answer_method,
            "judge_model": self.result.judge_model, "ragas_version": self.result.ragas_version,
            "model_id": self.model_id, "base": self.base_metrics,
            "finetune": None if self.finetune is None else {k: self.finetune.get(k) for k in (
                "decision", "reason", "gain", "standard_error", "pairs", "held_out", "seconds", "candidate_model_id")},
            "store": str(self.store),
        }


def evaluate_dataset(folder: Path, split: str = "test", config: EvalConfig | None = None, *, ingest: bool = True,
                     data_root: Path | None = None, compare_base: bool = True, ks: tuple[int, ...] = (5, 10),
                     alpha: float | None = None, fusion: str | None = None, reranker: str | None = None,
                     embedding_model: str | None = None, **overrides: Any) -> DatasetEvaluation:
    """Evaluate ``folder``'s ``split`` through the serving engine over the dataset's own store.

    ``ingest``: sync the store first (and fine-tune the embedder when that is on, ``beir.ingest_beir``); else the
    store must exist.  ``config``: the configuration to run; None = the store's own defaults (its tuned ranking,
    its default reranker) with ``alpha``/``fusion``/``reranker`` set where given.  ``overrides``: settings of the
    evaluation's engine (``candidate_pool``, ``default_alpha``, ...).  ``compare_base``: when the store serves an
    adopted fine-tuned model, evaluate its base model's snapshot too (``base_metrics``)."""
    dataset = load_beir(folder, split=split)  # DatasetError (a GroundworkError) names the bad file
    engine, doc_map = open_engine(folder, ingest=ingest, data_root=data_root, embedding_model=embedding_model,
                                  **overrides)
    defaults = engine.ranking_defaults()  # explicit settings > the store's tuned ranking > built-in
    if config is None:
        config = EvalConfig(alpha=alpha, fusion=fusion or defaults.fusion, reranker=reranker or engine.default_reranker())
    result = evaluate(engine, dataset, config, doc_map, ks=ks)
    record = load_record(engine.settings.index_dir)
    served_model = engine.snapshots.current().info.model_id
    evaluation = DatasetEvaluation(
        dataset=dataset, split=split, result=result, alpha=defaults.alpha if config.alpha is None else config.alpha,
        question_alpha=engine.question_alpha() if config.alpha is None else None, model_id=served_model,
        store=engine.settings.data_dir, finetune=record.decision if record else None)
    fine_tuned = record is not None and record.model_path and served_model.split("+", 1)[0] != record.base_model_id
    if compare_base and fine_tuned:
        base_engine = RetrievalEngine(engine.settings, query_log=engine.query_log, snapshot_dir=base_index(engine.settings))
        evaluation.base_metrics = evaluate(base_engine, dataset, config, doc_map, ks=ks).metrics
        evaluation.base_model_id = record.base_model_id
    return evaluation
