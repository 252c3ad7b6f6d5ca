"""Retrieval recall scored by RAGAS, as a cross-check of our own ``recall_at_k``.

RAGAS 0.4.3 defines **ID-based context recall** (``IDBasedContextRecall``,
``ragas/metrics/_context_recall.py``) on a ``SingleTurnSample`` with
``retrieved_context_ids`` and ``reference_context_ids`` as::

    |set(reference ids) ∩ set(retrieved ids)| / |set(reference ids)|

i.e. the fraction of the (distinct) reference ids that are present anywhere
in the retrieved ids; ids are compared as strings, order and rank are ignored,
and RAGAS returns NaN (with a warning) when there are no reference ids.  No
LLM, no embeddings and no network are involved.

Relation to ``knowledge_store.evaluation.metrics.recall_at_k(ranked, relevant, k)``: ours counts
the relevant ids among ``ranked[:k]`` and divides by the number of distinct
relevant ids, so the two are **identical when the ids given to RAGAS are the
deduplicated top-k** — which is exactly what this module passes:
``dedupe_ranking(retrieved_ids)[:k]`` (a document ranks where its best chunk
ranks).  Two conventions are aligned with ours on top of RAGAS:

- duplicates in ``retrieved_ids`` are removed *before* the cut, so a repeated
  id never takes a top-k slot (``recall_at_k`` would instead raise on them);
- an empty reference set scores 0.0 (our convention: such a query should not be
  scored at all), not RAGAS's NaN.

The metric is imported from its defining module
(``ragas.metrics._context_recall``): ``from ragas.metrics import
IDBasedContextRecall`` works too but emits a DeprecationWarning pointing at
``ragas.metrics.collections``, which in 0.4.3 has no ID-based recall.  Importing
ragas takes a few seconds, so it happens lazily, once, on first use; importing
this module is cheap.  ``RAGAS_DO_NOT_TRACK`` is set to ``true`` (unless
already set) before ragas is imported, so no analytics are sent.

**Text-based context metrics** (no LLM, no network): ID-based recall says only whether a labelled
document was among the top five; it cannot see whether the passages actually served carry the
labelled text.  ``ragas_context_recall_batch`` and ``ragas_context_precision_batch`` score the
served passages' *text* against the labelled passages' text with RAGAS's ``NonLLMContextRecall``
(the share of labelled passages that some served passage reproduces: normalised Levenshtein
similarity > 0.5) and ``NonLLMContextPrecisionWithReference`` (average precision of the served
passages in order, a passage counting when its similarity to some labelled passage is >= 0.5),
both from ``ragas/metrics/_context_recall.py`` and ``_context_precision.py``.  A served chunk that
holds a third of a long labelled document counts as found for ``recall@5`` and as not found here.

**LLM-judged answer metrics** (``RagasJudge``): when an LLM wrote the answers through the configured
OpenAI-compatible endpoint, RAGAS ``Faithfulness`` (claims of the answer verified against the
served passages) and ``AnswerRelevancy`` (questions generated from the answer, compared with the
asked question by embedding cosine) are computed through the same endpoint
(``ragas.metrics.collections``, an ``AsyncOpenAI`` client wrapped by instructor in JSON-schema mode, so the
server constrains each reply to the schema RAGAS validates; embeddings from the endpoint's ``/embeddings``).  A request that fails is the
query's error, never a zero.  Nothing here tokenises with tiktoken, so no encoding is fetched.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from knowledge_store.config.settings import AnswerSettings, EvaluationSettings
from knowledge_store.core.errors import ConfigError
from knowledge_store.core.metrics import dedupe_ranking

__all__ = ["JudgeItem", "RagasJudge", "ragas_context_precision_batch", "ragas_context_recall_batch",
           "ragas_recall_at_k", "ragas_recall_batch", "ragas_version"]

JUDGE_CONCURRENCY = 4  # judge requests in flight at once: a local endpoint serves a few at a time
ERROR_CHARS = 300  # how much of a judge error a record keeps (enough for the status and the server's message)


@lru_cache(maxsize=1)
def _ragas() -> tuple[Any, Any]:
    """(the shared IDBasedContextRecall metric object, SingleTurnSample), imported once."""
    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
    from ragas.dataset_schema import SingleTurnSample  # noqa: PLC0415 - RAGAS, ~2.5 s to import
    from ragas.metrics._context_recall import IDBasedContextRecall  # noqa: PLC0415 - RAGAS, ~2.5 s to import

    return IDBasedContextRecall(), SingleTurnSample


def ragas_version() -> str:
    """The installed RAGAS version (read from the package metadata: RAGAS itself is not imported)."""
    try:
        return version("ragas")
    except PackageNotFoundError:
        return "not installed"


def _run(make: Callable[[], Awaitable[Any]]) -> Any:
    """Run the coroutine ``make()`` builds: in a new event loop, or through RAGAS's helper when one is running
    already (a notebook, an async server)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    from ragas.async_utils import run  # noqa: PLC0415 - RAGAS, ~2.5 s to import

    return run(make)


def _sample(retrieved_ids: Sequence[str], reference_ids: Sequence[str], k: int) -> Any:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    _, sample_cls = _ragas()
    top = dedupe_ranking(str(i) for i in retrieved_ids)[:k]
    return sample_cls(retrieved_context_ids=top, reference_context_ids=[str(i) for i in reference_ids])


def _clean(score: float) -> float:
    score = float(score)
    return 0.0 if math.isnan(score) else score


def ragas_recall_at_k(retrieved_ids: list[str], reference_ids: list[str], k: int = 5) -> float:
    """RAGAS ID-based context recall of the deduplicated top ``k`` of
    ``retrieved_ids`` against ``reference_ids`` (see the module docstring);
    0.0 when ``reference_ids`` is empty.  Scored with the metric's synchronous
    ``single_turn_score``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not reference_ids:
        return 0.0
    metric, _ = _ragas()
    return _clean(metric.single_turn_score(_sample(retrieved_ids, reference_ids, k)))


def ragas_recall_batch(samples: list[tuple[list[str], list[str]]], k: int = 5) -> list[float]:
    """``ragas_recall_at_k`` for many ``(retrieved_ids, reference_ids)`` pairs,
    in order.  One metric object; every sample is scored with its async
    ``single_turn_ascore``, all gathered in a single event loop (no
    ``ragas.evaluate``: it adds an executor, progress bars and a result
    dataset for no benefit on a metric this cheap)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not samples:
        return []
    metric, _ = _ragas()
    prepared = [(_sample(ret, ref, k) if ref else None) for ret, ref in samples]

    async def score_all() -> list[float]:
        async def one(sample: Any) -> float:
            return 0.0 if sample is None else _clean(await metric.single_turn_ascore(sample))

        return list(await asyncio.gather(*(one(s) for s in prepared)))

    return _run(score_all)


# ------------------------------------------------------------------ text-based context recall and precision


@lru_cache(maxsize=1)
def _text_metrics() -> tuple[Any, Any, Any]:
    """(NonLLMContextRecall, NonLLMContextPrecisionWithReference, SingleTurnSample), imported once."""
    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
    from ragas.dataset_schema import SingleTurnSample  # noqa: PLC0415 - RAGAS, ~2.5 s to import
    from ragas.metrics._context_precision import (  # noqa: PLC0415 - RAGAS, ~2.5 s to import
        NonLLMContextPrecisionWithReference,
    )
    from ragas.metrics._context_recall import NonLLMContextRecall  # noqa: PLC0415 - RAGAS, ~2.5 s to import

    return NonLLMContextRecall(), NonLLMContextPrecisionWithReference(), SingleTurnSample


def _text_batch(which: int, samples: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[float]:
    """Score ``(served passage texts in order, labelled passage texts)`` pairs with text metric ``which``
    (0 recall, 1 precision).  A pair with no served passage or no labelled text scores 0.0 (RAGAS would
    fail on the empty maximum, or give NaN): nothing served covers nothing."""
    if not samples:
        return []
    metrics = _text_metrics()
    metric, sample_cls = metrics[which], metrics[2]
    prepared = [sample_cls(retrieved_contexts=[str(t) for t in served], reference_contexts=[str(t) for t in labelled])
                if served and labelled else None for served, labelled in samples]

    async def score_all() -> list[float]:
        async def one(sample: Any) -> float:
            return 0.0 if sample is None else _clean(await metric.single_turn_ascore(sample))

        return list(await asyncio.gather(*(one(s) for s in prepared)))

    return _run(score_all)


def ragas_context_recall_batch(samples: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[float]:
    """RAGAS ``NonLLMContextRecall`` of each ``(served passages, labelled passages)`` pair, in order: the share
    of labelled passages that some served passage reproduces (Levenshtein similarity > 0.5)."""
    return _text_batch(0, samples)


def ragas_context_precision_batch(samples: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[float]:
    """RAGAS ``NonLLMContextPrecisionWithReference`` of each ``(served passages, labelled passages)`` pair, in
    order: average precision of the served passages, one counting when it matches a labelled passage
    (Levenshtein similarity >= 0.5)."""
    return _text_batch(1, samples)


# ------------------------------------------------------------------ LLM-judged answer metrics

JudgedMetric = Literal["faithfulness", "answer_relevancy"]


@dataclass(frozen=True)
class JudgeItem:
    """One generated answer to judge: the question, the answer's text and the passages it was written from."""

    question: str
    answer: str
    passages: tuple[str, ...]


@dataclass(frozen=True)
class RagasJudge:
    """RAGAS faithfulness and answer relevancy through an OpenAI-compatible endpoint.

    ``model`` judges (chat completions), ``embedding_model`` embeds for answer relevancy (``/embeddings``).
    ``max_retries``: retries of one request by the OpenAI client (timeouts, 429, 5xx)."""

    base_url: str
    model: str
    embedding_model: str
    api_key: str | None = None
    timeout_s: float = 60.0
    max_retries: int = 2

    def __repr__(self) -> str:  # no key
        return f"RagasJudge(base_url={self.base_url!r}, model={self.model!r}, embedding_model={self.embedding_model!r})"

    @classmethod
    def from_settings(cls, settings: Any) -> RagasJudge | None:
        """The judge of ``settings`` (an ``AnswerSettings`` and ``EvaluationSettings``, e.g. ``Settings``):
        ``eval_judge_url`` with ``eval_judge_model`` when set, else the answering endpoint with ``eval_judge_model``
        or the answering model; None without an endpoint."""
        if not isinstance(settings, AnswerSettings) or not isinstance(settings, EvaluationSettings):
            raise TypeError(f"settings must be AnswerSettings and EvaluationSettings, got {type(settings).__name__}")
        if settings.eval_judge_url:  # a judge endpoint of its own (GROUNDWORK_EVAL_JUDGE_URL)
            if not settings.eval_judge_model:
                raise ConfigError("eval_judge_model", None, "GROUNDWORK_EVAL_JUDGE_URL needs GROUNDWORK_EVAL_JUDGE_MODEL "
                                                            "(the model the endpoint judges with)")
            return cls(base_url=str(settings.eval_judge_url).rstrip("/"), model=settings.eval_judge_model,
                       embedding_model=settings.eval_judge_embedding_model or settings.eval_judge_model,
                       timeout_s=settings.eval_judge_timeout_s)
        if not settings.llm_configured:
            return None
        model = settings.eval_judge_model or settings.llm_model
        return cls(base_url=str(settings.llm_base_url).rstrip("/"), model=model,
                   embedding_model=settings.eval_judge_embedding_model or model,
                   api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None)

    @property
    def ragas_version(self) -> str:
        return ragas_version()

    def score(self, metric: JudgedMetric, items: Sequence[JudgeItem | None]) -> list[float | None | str]:
        """One entry per item, in order: the score; None for an item that is None or that the judge found
        nothing to score in (RAGAS's NaN: no statement in the answer); or the error text of a failed request
        (``ERROR_CHARS`` at most, the key removed)."""
        if metric not in ("faithfulness", "answer_relevancy"):
            raise ValueError(f"metric must be 'faithfulness' or 'answer_relevancy', got {metric!r}")
        if not any(items):
            return [None] * len(items)

        async def score_all() -> list[float | None | str]:
            scorer = self._metric(metric)
            gate = asyncio.Semaphore(JUDGE_CONCURRENCY)

            async def one(item: JudgeItem | None) -> float | None | str:
                if item is None:
                    return None
                async with gate:
                    try:
                        if metric == "faithfulness":
                            result = await scorer.ascore(user_input=item.question, response=item.answer,
                                                         retrieved_contexts=list(item.passages))
                        else:
                            result = await scorer.ascore(user_input=item.question, response=item.answer)
                    except Exception as error:  # any failure of the judge is this query's error, not a score
                        return self._error_text(error)
                value = float(result.value)
                return None if math.isnan(value) else value

            return list(await asyncio.gather(*(one(item) for item in items)))

        return _run(score_all)

    def _metric(self, metric: JudgedMetric) -> Any:
        os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
        import instructor  # noqa: PLC0415 - instructor (RAGAS's structured output), ~0.5 s to import
        from openai import AsyncOpenAI  # noqa: PLC0415 - openai, ~0.5 s to import
        from ragas.embeddings.openai_provider import OpenAIEmbeddings  # noqa: PLC0415 - RAGAS, ~2.5 s to import
        from ragas.llms.base import InstructorLLM, InstructorModelArgs  # noqa: PLC0415 - RAGAS, ~2.5 s to import
        from ragas.metrics.collections import AnswerRelevancy, Faithfulness  # noqa: PLC0415 - RAGAS, ~2.5 s to import

        client = AsyncOpenAI(base_url=self.base_url, api_key=self.api_key or "not-needed", timeout=self.timeout_s,
                             max_retries=self.max_retries)
        # the judge's replies are constrained to each RAGAS step's JSON schema (``response_format`` json_schema,
        # which llama.cpp, Ollama, vLLM and OpenAI enforce while decoding), not only asked for JSON: a small local
        # model asked for "JSON" writes JSON of its own shape and every answer fails validation
        llm = InstructorLLM(client=instructor.from_openai(client, mode=instructor.Mode.JSON_SCHEMA), model=self.model,
                            provider="openai", model_args=InstructorModelArgs())
        if metric == "faithfulness":
            return Faithfulness(llm=llm)
        return AnswerRelevancy(llm=llm, embeddings=OpenAIEmbeddings(client=client, model=self.embedding_model))

    def _error_text(self, error: BaseException) -> str:
        text = " ".join(f"{type(error).__name__}: {error}".split())
        if self.api_key:
            text = text.replace(self.api_key, "***")
        return text[:ERROR_CHARS]
