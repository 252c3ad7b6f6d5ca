"""The retrieval engine: hybrid search -> fusion -> rerank -> citations -> answer -> query log.

``RetrievalEngine.search`` validates a ``SearchRequest`` (``request``), reads the served snapshot once and runs
the request through its LlamaIndex query engine (``query_engine``, built by ``query_engine.build_query_engine``):
the candidate retriever (``candidates``), the rerank step, the answer synthesizer and the query-log
instrumentation handler.  The engine keeps what those share: the query embedders and their loads, the snapshots,
filter masks, query adapter, reranker instances and the feedback cache, the corpus's ranking defaults and the
warm-up.  LlamaIndex loads with the first search (or ``warm_up``), not with this module: the CLI and the API's
other routes import the engine without paying for it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError, IndexNotBuiltError, ModelUnavailableError, QueryValidationError
from knowledge_store.models.embeddings import (
    BatchingEmbedder,
    Embedder,
    document_embedder,
    model_id_for,
    settings_query_embedder,
)
from knowledge_store.models.loading import ModelLoad
from knowledge_store.models.serving import model_path_for, serving_model_id, serving_model_path
from knowledge_store.retrieval.ann import AnnConfig
from knowledge_store.retrieval.answer import ANSWER_MODES
from knowledge_store.retrieval.evidence import QueryEvidence, lexical_evidence, mention_share, vector_evidence
from knowledge_store.retrieval.filters import MaskCache, SearchFilters
from knowledge_store.retrieval.fusion import FUSION_MODES, relevance
from knowledge_store.retrieval.query_adapter import AdapterCache, QueryAdapter
from knowledge_store.retrieval.query_cache import QueryEmbeddingCache
from knowledge_store.retrieval.query_form import alpha_for_form, query_form
from knowledge_store.retrieval.ranking import RankingPipeline
from knowledge_store.retrieval.ranking_defaults import effective_question_alpha, effective_ranking, effective_reranker
from knowledge_store.retrieval.request import (  # noqa: F401 - re-exported: where callers have found them
    ANSWER_PASSAGES,
    COVERAGE_LEVELS,
    NO_RESULTS,
    HybridCandidates,
    SearchRequest,
    SearchResponse,
    answered_coverage,
    coverage_label,
)
from knowledge_store.retrieval.reranker_registry import (
    RERANKER_REGISTRY,
    RERANKERS,
    RerankerContext,
    RerankerUnavailable,
    available_rerankers,
    register_node_postprocessors,
)
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot, SnapshotManager
from knowledge_store.storage.query_log import QueryLines, QueryLog, QueryLogRecord
from knowledge_store.storage.tuned import RankingParams

_SEARCH_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="bm25")


# LlamaIndex's package imports itself in a circle: two threads importing it at once (the server's warm-up and
# a first query) leave it half-initialised in one of them (ImportError there, KeyError in the other), so every
# deferred import of it in the engine takes this lock (re-entrant, so code run under it may take it again).
LLAMA_INDEX_IMPORT_LOCK = threading.RLock()


def _query_engine_module() -> Any:
    """``knowledge_store.retrieval.query_engine`` (LlamaIndex, ~1.5 s to import), imported on first use."""
    with LLAMA_INDEX_IMPORT_LOCK:
        from knowledge_store.retrieval import query_engine  # noqa: PLC0415 - LlamaIndex, ~1.5 s to import

    return query_engine


def searched_visibilities(params: Any) -> tuple[str, ...] | None:
    """The visibilities a logged search was filtered to (its ``params.filters.visibility``), sorted; None: all."""
    filters = (params or {}).get("filters") if isinstance(params, dict) else None
    visibility = (filters or {}).get("visibility") if isinstance(filters, dict) else None
    if isinstance(visibility, str):
        visibility = [visibility]
    return tuple(sorted(set(visibility))) if visibility else None


def check_ranking_names(settings: Settings) -> None:
    """The settings' default fusion and reranker are names the registries know (``ConfigError`` naming the setting):
    settings built before this package was imported were not checked against them."""
    for setting, vocabulary in (("default_fusion", FUSION_MODES), ("default_reranker", RERANKERS)):
        value = getattr(settings, setting)
        if value not in vocabulary:
            raise ConfigError(setting, value, vocabulary.one_of())


class WarmUpTracker:
    """The warm-up of one engine: at most one background attempt at a time, whether one has succeeded, and the
    last error.  Callers that must not wait (``/health``, the support tool's time budget) read it instead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._future: concurrent.futures.Future | None = None
        self._ready = False
        self._error: BaseException | None = None
        self._seconds: float | None = None
        self._started: float | None = None

    @property
    def ready(self) -> bool:
        return self._ready

    def start(self, warm: Callable[[], None]) -> concurrent.futures.Future:
        with self._lock:
            future = self._future
            if future is not None and not (future.done() and future.exception() is not None):
                return future  # running, or succeeded
            if future is None and self._ready:  # warmed up in the foreground
                future = concurrent.futures.Future()
                future.set_result(None)
                self._future = future
                return future
            future = self._future = concurrent.futures.Future()
            self._started = time.perf_counter()
        threading.Thread(target=self._run, args=(warm, future), daemon=True, name="engine-warm-up").start()
        return future

    @staticmethod
    def _run(warm: Callable[[], None], future: concurrent.futures.Future) -> None:
        try:
            warm()  # ``RetrievalEngine.warm_up`` records its own outcome
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(error)
        else:
            future.set_result(None)

    def succeeded(self, seconds: float) -> None:
        with self._lock:
            self._ready, self._error, self._seconds = True, None, seconds

    def failed(self, error: BaseException, seconds: float) -> None:
        with self._lock:
            self._error, self._seconds = error, seconds

    def status(self) -> dict[str, Any]:
        with self._lock:
            future, error = self._future, self._error
            warming = future is not None and not future.done()
            if self._ready:
                state = "ready"
            elif warming:
                state = "warming"
            else:
                state = "failed" if error is not None else "not_started"
            seconds = time.perf_counter() - self._started if warming and self._started is not None else self._seconds
            return {"state": state, "seconds": None if seconds is None else round(seconds, 2),
                    "error": None if error is None or self._ready else f"{type(error).__name__}: {error}"}


class RetrievalEngine:
    """Thread-safe; one per process.  Picks up new index snapshots without a restart."""

    def __init__(self, settings: Settings | None = None, embedder: Embedder | None = None, query_log: Any = None,
                 snapshot_dir: Path | None = None) -> None:
        """``snapshot_dir``: read snapshots from another folder than ``settings.index_dir`` (evaluation's copy of
        the corpus with the base model's vectors, ``learning.finetune.base_index``); the corpus's ranking
        defaults and query adapter still come from ``settings.index_dir``."""
        self.settings = settings or Settings()
        register_node_postprocessors(self.settings)
        check_ranking_names(self.settings)
        # the query embedder of each model a served snapshot was made with (the base model, a fine-tuned one):
        # a query is embedded with its snapshot's model (``embedder_for``); the configured one is made here, not
        # loaded: nothing is exported, imported or read until the first query or the warm-up (``model_load``)
        self._embedders: dict[str, QueryEmbeddingCache] = {}
        self._model_loads: dict[str, ModelLoad] = {}  # each query embedder's load, under the same key
        self._document_embedders: dict[str, Any] = {}
        self._embedders_lock = threading.Lock()
        self._default_key = model_id_for(self.settings.model_path)
        self._default_embedder = self._query_embedder(self.settings.model_path, embedder)
        # set by ``warm_up_in_background``: models load in the background and a query never waits for one
        self.loads_in_background = False
        self.snapshots = SnapshotManager(snapshot_dir or self.settings.index_dir, ann=AnnConfig.from_settings(self.settings))
        self.masks = MaskCache()
        self.adapters = AdapterCache(self.settings.index_dir, self.settings.embedding_dim)
        self._query_log = query_log
        self._log_lock = threading.Lock()
        self._query_engine_lock = threading.Lock()
        self._rerankers: dict[str, Any] = {}
        self._warm_up = WarmUpTracker()
        self._limit_threads()

    def _limit_threads(self) -> None:
        try:
            threadpool_limits(limits=self.settings.search_threads, user_api="blas")
        except Exception:  # noqa: BLE001 - thread limits are an optimisation
            pass

    # ---------------------------------------------------------------- plumbing
    def _query_embedder(self, model_path, embedder: Embedder | None = None) -> QueryEmbeddingCache:
        """The query embedder of ``model_path``'s snapshots: ``embedder`` when given (it stands for that model,
        whatever id it reports: tests wrap the real one), else that model's own."""
        # concurrent queries share model calls (see BatchingEmbedder); a lone query is not delayed;
        # repeated queries are served from QueryEmbeddingCache (retrieval/query_cache.py)
        model = embedder or settings_query_embedder(self.settings, model_path, load=False)
        wrapped = QueryEmbeddingCache(embedder or BatchingEmbedder(model, cache_size=0), size=self.settings.query_cache_size)
        key = model_id_for(model_path)
        self._embedders[key] = wrapped
        self._model_loads[key] = ModelLoad(model, wrapped, name=key)
        return wrapped

    def embedder_for(self, snapshot: LoadedSnapshot) -> QueryEmbeddingCache:
        """The query embedder of the model that made ``snapshot``'s vectors (its ``model_path``, else the model
        its id names: the configured base model or a fine-tuned one), loaded once: a query vector is only ever
        compared with vectors of its own model.  A snapshot whose model folder is gone raises
        ``ModelUnavailableError`` naming it."""
        key = (snapshot.info.model_id or "").split("+", 1)[0]
        found = self._embedders.get(key)
        if found is not None or not key:
            return found or self._default_embedder
        with self._embedders_lock:
            found = self._embedders.get(key)
            if found is None:
                path = snapshot.info.model_path or model_path_for(self.settings, snapshot.info.model_id)
                if path is None or not Path(path).is_dir():
                    raise ModelUnavailableError(snapshot.info.model_id, path)
                found = self._query_embedder(Path(path))
        return found

    def documents_embedder(self) -> Any:
        """What this process's ingestion jobs embed chunk texts with: the serving model (``models.serving``), as
        one of the loaded query embedders when its document vectors are plain fp32 ones (the same vectors, one
        model in memory), else a document embedder built once per model id."""
        model_id = serving_model_id(self.settings)
        # an int8 query graph must not embed fp32 documents: reuse a query embedder only when both are fp32
        loaded = self._embedders.get(model_id) if self.settings.query_quantization == "none" else None
        if loaded is not None:
            return loaded
        with self._embedders_lock:
            built = self._document_embedders.get(model_id)
            if built is None:
                built = document_embedder(self.settings, model_path=serving_model_path(self.settings))
                self._document_embedders[model_id] = built
        return built

    @property
    def embedder(self) -> QueryEmbeddingCache:
        """The query embedder of the served snapshot's model (the configured one before any snapshot)."""
        snapshot = self._snapshot_or_none()
        return self._default_embedder if snapshot is None else self.embedder_for(snapshot)

    def model_load(self, snapshot: LoadedSnapshot | None = None) -> ModelLoad:
        """The load of the query model of ``snapshot`` (default: the served one; the configured model before any
        snapshot): its state, step and estimate (``ModelLoad.status``).  ``ModelUnavailableError`` as
        ``embedder_for``."""
        snapshot = snapshot if snapshot is not None else self._snapshot_or_none()
        if snapshot is None:
            return self._model_loads[self._default_key]
        self.embedder_for(snapshot)  # made on first use
        key = (snapshot.info.model_id or "").split("+", 1)[0]
        return self._model_loads.get(key) or self._model_loads[self._default_key]

    def model_status(self) -> dict[str, Any]:
        """``ModelLoad.status`` of the served snapshot's query model (what ``/health`` reports); loading (phase
        starting) while the warm-up has not reached it yet."""
        return self.model_load().status(pending=self._warming())

    def _warming(self) -> bool:
        return self._warm_up.status()["state"] == "warming"

    def query_graph(self) -> dict[str, Any] | None:
        """Which ONNX graph embeds the configured model's queries on this CPU and why (``OnnxEmbedder.decision``: the
        quantised graph only where it passed its fidelity check), as far as it is known without building or
        checking anything; None for an embedder that runs no ONNX graph (torch)."""
        inner = self._default_embedder
        while hasattr(inner, "inner"):
            inner = inner.inner
        recorded = getattr(inner, "recorded_decision", None)
        decision = recorded() if recorded is not None else None
        return None if decision is None else decision.to_dict()

    def require_model(self, snapshot: LoadedSnapshot) -> None:
        """In an engine that loads its models in the background (``loads_in_background``, a server): raise at once
        when ``snapshot``'s query model is not loaded - ``ModelLoadingError`` while it loads (a load is started if
        none runs), ``ModelLoadFailedError`` after its load failed - rather than wait minutes for it.  Elsewhere
        (the CLI, evaluation) a query loads the model itself, and this does nothing."""
        if not self.loads_in_background:
            return
        load = self.model_load(snapshot)
        if not load.loaded:
            error = load.not_ready(pending=self._warming())
            if error is not None:
                raise error

    @property
    def query_log(self):
        """The query log, opened on first use.  Opened here, it also writes each query's JSON line to
        the rotated ``<data_dir>/logs/query.log`` - the CLI, MCP over stdio and the support tool log through
        this - but never to stdout, which may be a command's output or MCP's protocol channel."""
        if self._query_log is None:
            with self._log_lock:
                if self._query_log is None:
                    self._query_log = QueryLog(self.settings.logs_path, lines=QueryLines.for_file(self.settings))
        return self._query_log

    def warm_up(self) -> None:
        """Load the model, the snapshot and LlamaIndex now rather than on the first query (blocking).  The outcome
        is recorded for ``warm_up_status``: ready after the first success, else the last error.  The model comes
        first: it is what queries wait for (``require_model``); its load is recorded in ``model_status``."""
        started = time.perf_counter()
        try:
            self.model_load().load()
            self.embedder.embed(["warm up"])
            self.query_engine  # noqa: B018 - builds it (and imports LlamaIndex)
            # and the public view, so a public caller's first search does not build it
            self.searched_snapshot(SearchFilters().public_only(), self.snapshots.current())
        except Exception as error:
            self._warm_up.failed(error, time.perf_counter() - started)
            raise
        self._warm_up.succeeded(time.perf_counter() - started)

    def warm_up_in_background(self) -> concurrent.futures.Future:
        """``warm_up`` in one daemon thread, without waiting for it: idempotent while it runs or once it
        succeeded (the same future); after a failure, a new attempt.  The future carries the error, if any.
        From then on queries never wait for a model to load (``loads_in_background``, ``require_model``)."""
        self.loads_in_background = True
        return self._warm_up.start(self.warm_up)

    @property
    def warmed_up(self) -> bool:
        """A ``warm_up`` (in the background or not) has succeeded: queries do not wait for a model load."""
        return self._warm_up.ready

    def warm_up_status(self) -> dict[str, Any]:
        """``state`` (not_started | warming | ready | failed), ``seconds`` (of the last finished attempt, or so far
        while warming) and ``error`` (the last failed attempt's, kept while a new attempt runs; null once ready)."""
        return self._warm_up.status()

    def available_rerankers(self) -> list[str]:
        """The rerankers this configuration can run (what clients should offer)."""
        return list(available_rerankers(self.settings))

    def reranker(self, name: str, scope: list[str] | tuple[str, ...] | None = None):
        """The reranker registered as ``name`` (``reranker_registry``), built on first use and kept;
        None keeps the fused order.  RerankerUnavailable when these settings cannot run it.  One that reads
        feedback is built per ``scope`` (the visibilities a search is filtered to) and reads only the feedback
        given on searches of that scope (``feedback_rows``)."""
        spec = RERANKER_REGISTRY.get(name)
        if spec is None:
            raise QueryValidationError("reranker", name, RERANKERS.one_of())
        scope = tuple(sorted(set(scope))) if scope and spec.reads_feedback else None
        key = name if scope is None else f"{name}@{','.join(scope)}"
        if key in self._rerankers:
            return self._rerankers[key]
        if not spec.available(self.settings):
            raise RerankerUnavailable(name, f"{spec.unavailable_reason()}; available here: {', '.join(self.available_rerankers())}")
        with LLAMA_INDEX_IMPORT_LOCK:  # a reranker's module imports LlamaIndex
            reranker = spec.build(RerankerContext(self.settings, lambda: self.feedback_rows(scope),
                                                  lambda texts: self.embedder.embed(texts)))
        if reranker is not None:
            self._rerankers[key] = reranker
        return reranker

    def feedback_rows(self, scope: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Feedback joined with its query, with each rated chunk's content hash; cached for 2 s.  ``scope``: only
        the feedback on searches filtered to exactly those visibilities (the public surface's: ``("public",)``)."""
        now = time.monotonic()
        cached = getattr(self, "_feedback_cache", None)
        if cached is not None and now - cached[0] < 2.0:
            rows = cached[1]
        else:
            rows = []
            for row in self.query_log.feedback_with_queries():
                hashes = {r.get("chunk_id"): r.get("content_hash") for r in (row.get("results_pre") or []) + (row.get("results_post") or [])}
                rows.append({**row, "content_hash": hashes.get(row.get("chunk_id"))})
            self._feedback_cache = (now, rows)
        if scope is None:
            return rows
        return [row for row in rows if searched_visibilities(row.get("params")) == tuple(scope)]

    def forget_feedback_cache(self) -> None:
        self._feedback_cache = None

    def request(
        self,
        query: str,
        k: int | None = None,
        alpha: float | None = None,
        fusion: str | None = None,
        reranker: str | None = None,
        filters: SearchFilters | dict | None = None,
        min_relevance: float | None = None,
        answer: str = "extractive",
        client: str = "python",
        section_weight: float | None = None,
        lead_weight: float | None = None,
        question: str | None = None,
        selection: str | None = None,
        answer_sources: int | None = None,
    ) -> SearchRequest:
        """Validate and complete a request with the corpus's defaults (see ``ranking_defaults``); the alpha of a
        request that sets none is the corpus's for its query's form, resolved when it searches (``resolve``).
        ``question``, ``selection``, ``answer_sources``: the ask front ends' (``SearchRequest``)."""
        s = self.settings
        defaults = self.ranking_defaults()
        if not isinstance(query, str) or not query.strip():
            raise QueryValidationError("query", query, "must be a non-empty string")
        if len(query) > s.max_query_chars:
            raise QueryValidationError("query", f"{len(query)} characters", f"must be at most {s.max_query_chars} characters")
        k = s.default_k if k is None else k
        if not isinstance(k, int) or not 1 <= k <= 100:
            raise QueryValidationError("k", k, "must be an integer from 1 to 100")
        if isinstance(filters, dict):
            try:
                filters = SearchFilters(**filters)
            except Exception as error:  # pydantic ValidationError -> a field-named message
                raise QueryValidationError("filters", filters, str(error).splitlines()[0]) from error
        filters = filters or SearchFilters()
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                                  or not 0.0 <= float(alpha) <= 1.0):
            raise QueryValidationError("alpha", alpha, "must be between 0 (pure BM25) and 1 (pure vector)")
        fusion = fusion or defaults.fusion
        if fusion not in FUSION_MODES:
            raise QueryValidationError("fusion", fusion, FUSION_MODES.one_of())
        section_weight = defaults.section_weight if section_weight is None else section_weight
        lead_weight = defaults.lead_weight if lead_weight is None else lead_weight
        for name, value in (("section_weight", section_weight), ("lead_weight", lead_weight)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
                raise QueryValidationError(name, value, "must be between 0 and 1")
        reranker = reranker or self.default_reranker()
        if reranker not in RERANKERS:
            raise QueryValidationError("reranker", reranker, RERANKERS.one_of())
        if answer not in ANSWER_MODES:
            raise QueryValidationError("answer", answer, ANSWER_MODES.one_of())
        floor = s.min_relevance if min_relevance is None else min_relevance
        if answer_sources is not None and (not isinstance(answer_sources, int) or answer_sources < 1):
            raise QueryValidationError("answer_sources", answer_sources, "must be a positive integer")
        return SearchRequest(query=query.strip(), k=k, alpha=None if alpha is None else float(alpha), fusion=fusion,
                             reranker=reranker, filters=filters, min_relevance=float(floor), answer=answer,
                             client=client, section_weight=float(section_weight), lead_weight=float(lead_weight),
                             question=question, selection=selection, answer_sources=answer_sources)

    def resolve(self, request: SearchRequest, snapshot: LoadedSnapshot | None) -> SearchRequest:
        """``request`` with its query's form, read against the documents it searches (``searched_snapshot`` of
        ``snapshot``; with no snapshot, from the query's text alone), and the alpha it left to the corpus: the
        corpus's alpha for that form (questions get ``question_alpha``); unchanged once resolved."""
        if request.query_form is not None:
            return request
        form = query_form(request.query, None if snapshot is None else self.searched_snapshot(request.filters, snapshot))
        alpha = request.alpha
        if alpha is None:
            alpha = alpha_for_form(form, self.ranking_defaults().alpha, self.question_alpha())
        return dataclasses.replace(request, alpha=float(alpha), query_form=form)

    def query_adapter(self, snapshot: LoadedSnapshot | None = None) -> QueryAdapter | None:
        """The corpus's query adapter learned from feedback (``groundwork adapt``), or None: off in settings,
        never trained, its file damaged (logged once, see ``AdapterCache``), or trained on another model's
        vectors than ``snapshot``'s (a fine-tuned model adopted since); read per query, no restart."""
        adapter = self.adapters.current() if self.settings.use_query_adapter else None
        if adapter is not None and snapshot is not None and not adapter.fits(snapshot.info.model_id):
            return None
        return adapter

    def ranking_defaults(self) -> RankingParams:
        """The ranking a query gets when it does not say: settings set explicitly (environment,
        ``.env`` or code) win, then the corpus's self-tuned configuration, then the built-in defaults."""
        return effective_ranking(self.settings, self.settings.index_dir)

    def ranking_pipeline(self) -> RankingPipeline:
        """The ranking steps this engine's settings turn on (``ranking.RANKING_STEPS``)."""
        return RankingPipeline.served(self.settings)

    @staticmethod
    def searched_snapshot(filters: SearchFilters, snapshot: LoadedSnapshot) -> LoadedSnapshot:
        """What a search with ``filters`` runs on: ``snapshot``, or - when they name visibilities, as every search of
        the public surface does - its view of those sources alone (``LoadedSnapshot.view``), whose statistics
        (BM25, entities, sections) are its own: nothing a search of public sources answers depends on what
        internal sources hold."""
        return snapshot.view(filters.visibility) if filters.visibility else snapshot

    def _snapshot_or_none(self) -> LoadedSnapshot | None:
        """The served snapshot, or None before one is published (a request can be checked without an index)."""
        try:
            return self.snapshots.current()
        except IndexNotBuiltError:
            return None

    def question_alpha(self) -> float | None:
        """The alpha of questions that do not set one (None: the default alpha); see ``tuning.effective_question_alpha``."""
        return effective_question_alpha(self.settings, self.settings.index_dir)

    def default_reranker(self) -> str:
        """The reranker a query gets when it does not say: an explicit setting wins, then the one set in the
        console for this corpus (``tuned.json``), then the built-in ``none``; read per query, no restart."""
        return effective_reranker(self.settings, self.settings.index_dir)

    # ---------------------------------------------------------------- the work
    def candidates(self, request: SearchRequest, pool_size: int, snapshot: LoadedSnapshot | None = None) -> HybridCandidates:
        """Hybrid retrieval: BM25 and vector over the filtered ``snapshot`` (default: the served one), fused, best
        ``pool_size`` kept.  ``request``'s alpha is resolved against it when the request left it to the corpus."""
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        served = snapshot if snapshot is not None else self.snapshots.current()
        request = self.resolve(request, served)
        snapshot = self.searched_snapshot(request.filters, served)

        def lexical():
            started = time.perf_counter()
            result = lexical_evidence(snapshot, request.query)
            return result, (time.perf_counter() - started) * 1000

        # BM25 does not need the query vector: score it on the other core while the model runs
        bm25_future = _SEARCH_POOL.submit(lexical)
        query_vector = self.embedder_for(snapshot).embed([request.query])[0]
        adapter = self.query_adapter(snapshot)
        search_vector = query_vector if adapter is None else adapter.apply(query_vector)
        t1 = time.perf_counter()
        mask = self.masks.mask(snapshot, request.filters)
        vector_chunk, vector_lead, partial = vector_evidence(snapshot, search_vector, mask, self.settings.candidate_pool)
        t2 = time.perf_counter()
        (terms, bm25_chunk, bm25_section, coverage_mass), bm25_ms = bm25_future.result()
        t3 = time.perf_counter()
        evidence = QueryEvidence(terms, bm25_chunk, bm25_section, coverage_mass, vector_chunk, vector_lead, partial)
        pipeline = self.ranking_pipeline()
        context = pipeline.context(request.query, evidence, request.ranking, snapshot, search_vector, mask)
        fused = pipeline.rank(context)
        boost = context.entity_boost
        rows = fused.rows[:pool_size]
        total = terms.total_weight
        # absolute relevance is calibrated on the chunk's own cosine with the model's query vector, whatever the
        # ranking blend and the corpus's query adapter (which moves cosines but is not what relevance was fitted on)
        own = vector_chunk[rows] if adapter is None else snapshot.embeddings[rows] @ query_vector
        rel = relevance(own.astype(np.float64), coverage_mass[rows] / total if total > 0 else np.zeros(len(rows)))
        if boost is not None:
            # a passage naming every entity the query names is not "nothing relevant", whatever MiniLM makes
            # of "API 510": it is lifted to the floor (shown, coverage "low" unless it scores better)
            rel = np.where(mention_share(boost, rows) >= 1.0, np.maximum(rel, request.min_relevance), rel)
        hits = snapshot.hits_for_rows(rows.tolist())
        for i, hit in enumerate(hits):
            hit.score = float(fused.fused[i])
            hit.bm25_score = float(bm25_chunk[rows[i]])  # the chunk's own scores; ranks are of the blended evidence
            hit.vector_score = float(own[i])
            hit.bm25_rank = int(fused.bm25_rank[i]) or None
            hit.vector_rank = int(fused.vector_rank[i]) or None
            hit.fused_rank = i + 1
            hit.relevance = float(rel[i])
            hit.entity_boost = float(fused.boost[i]) if fused.boost is not None else 0.0
        t4 = time.perf_counter()
        # bm25 ran concurrently with embed: its own duration is reported, plus any wait after the vector step
        timings.update(embed=(t1 - t0) * 1000, vector=(t2 - t1) * 1000, bm25=bm25_ms, bm25_wait=(t3 - t2) * 1000,
                       fuse=(t4 - t3) * 1000)
        return HybridCandidates(snapshot, query_vector, hits, timings, terms.unknown_words, adapted=adapter is not None)

    def search(self, query: str | None = None, log: bool = True, snapshot: LoadedSnapshot | None = None,
               **params: Any) -> SearchResponse:
        """Answer one query with cited passages through the query engine; every call is logged (unless
        ``log=False``).  ``request``: a ``SearchRequest`` built by ``request`` (then ``query`` and the other
        parameters are not given), else one is built from ``query`` and ``params``.  ``snapshot``: the served
        snapshot the caller already read for this request (default: read here, once).

        Malformed input (``request`` raises ``QueryValidationError``) is refused unlogged; any
        failure after that (unavailable reranker, no index, an LLM that fails, a bug) is logged
        with its error and the latency so far, then re-raised unchanged."""
        started = time.perf_counter()
        request = params.pop("request", None) or self.request(query, **params)
        try:
            return self._search(request, started, log, snapshot)
        except Exception as error:
            if log:
                self._log_failure(request, error, started)
            raise

    def _search(self, request: SearchRequest, started: float, log: bool, snapshot: LoadedSnapshot | None) -> SearchResponse:
        served = snapshot if snapshot is not None else self._snapshot_or_none()
        if served is not None:  # without an index the query fails on that (IndexNotBuiltError), model or not
            self.require_model(served)
        reranker = self.reranker(request.reranker, request.filters.visibility)
        if served is None:
            served = self.snapshots.current()  # raises IndexNotBuiltError
        request = self.resolve(request, served)
        query_engine = self.query_engine
        search_query = _query_engine_module().SearchQuery(
            query_str=request.query, request=request, snapshot=served, reranker=reranker,
            query_log=self.query_log if log else None, started=started)
        return query_engine.query(search_query).metadata["search_response"]

    @property
    def query_engine(self):
        """The LlamaIndex ``RetrieverQueryEngine`` every search runs through (``query_engine.build_query_engine``),
        built on first use."""
        built = getattr(self, "_query_engine", None)
        if built is None:
            with self._query_engine_lock:
                built = getattr(self, "_query_engine", None)
                if built is None:
                    built = self._query_engine = _query_engine_module().build_query_engine(self)
        return built

    def _log_failure(self, request: SearchRequest, error: Exception, started: float) -> None:
        """Record a query that failed: its parameters, the error (``Type: message``, redacted by the
        query log) and how long it ran.  Never raises: the caller re-raises the original error."""
        try:
            self.query_log.append(QueryLogRecord(
                query=request.query,
                client=request.client,
                params=request.logged_params(),
                latency_ms={"total": round((time.perf_counter() - started) * 1000, 3)},
                error=f"{type(error).__name__}: {error}"[:2000],
            ))
        except Exception:  # noqa: BLE001 - logging must never hide the query's own error
            pass

    # -------------------------------------------------------------- LlamaIndex
    def as_retriever(self, **params: Any):
        """A LlamaIndex ``BaseRetriever`` over ``search``: same ranking, reranker fallback and query log."""
        with LLAMA_INDEX_IMPORT_LOCK:
            from knowledge_store.retrieval.llama import HybridRetriever  # noqa: PLC0415 - LlamaIndex, ~1.5 s to import

        return HybridRetriever(self, **params)

    def as_query_engine(self, reranker: str | None = None, **params: Any):
        """A LlamaIndex ``RetrieverQueryEngine``: the hybrid retriever (which runs ``search``, so the
        reranker, its timeout/fallback and the query log are the ones every other client gets) and the
        extractive synthesizer.  The response's metadata has ``retrieval_request_id`` for feedback."""
        with LLAMA_INDEX_IMPORT_LOCK:
            from llama_index.core.query_engine import RetrieverQueryEngine  # noqa: PLC0415 - LlamaIndex, ~1.5 s

            from knowledge_store.retrieval.llama import ExtractiveSynthesizer  # noqa: PLC0415 - LlamaIndex, ~1.5 s

        retriever = self.as_retriever(**params, reranker=reranker)
        return RetrieverQueryEngine(retriever=retriever, response_synthesizer=ExtractiveSynthesizer(
            top_k=params.get("k") or self.settings.default_k, retriever=retriever))
