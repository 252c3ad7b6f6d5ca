"""Self-tuning asset: the corpus's own headings, titles and FAQ questions -> the ranking it is served with.

``corpus_tuning`` runs ``knowledge_store.learning.tuning.tune_corpus`` on the published
index (it depends on ``search_index``, so selected together with the ingestion
assets it runs after the sync) and stores the choice in ``<index_dir>/tuned.json``,
where the engine, ``/api/knowledge/config`` and the console read it without a
restart.  The metadata shows what was measured: the pseudo-queries per kind,
built-in vs chosen ranking, the best configurations and nDCG@10 against alpha
per fusion mode.  A corpus too small to tune fails the run with the reason; no
made-up result is stored.  The check next to the asset warns when the choice
scores below the built-in default (it cannot by construction: a guard against
a broken sweep or a hand-edited file).

``query_adapter`` (after ``corpus_tuning``, same job and schedule) learns the corpus's query adapter
from its thumbs-up feedback (``knowledge_store.retrieval.query_adapter``) and stores it in
``<index_dir>/query_adapter.npz`` when held-out rated queries rank better with it.  Too little
feedback is a normal state of a young corpus, not a failure: the materialisation says so and
stores nothing.  Every decision, adopted or declined, is recorded in ``<index_dir>/feedback_learning.json``
(``knowledge_store.storage.feedback_learning``), which the console's Settings page shows.

``feedback_grew`` (on by default; off with ``GROUNDWORK_LEARN_FROM_FEEDBACK=false``) requests a run of
``query_adapter`` alone once ``GROUNDWORK_ADAPTER_RETRAIN_VOTES`` new thumbs-up have been given since the
last decision, so ratings change rankings without a command, under the same held-out rule.
"""

import base64
import io
from pathlib import Path

import dagster as dg

from knowledge_store.core.errors import IndexNotBuiltError
from knowledge_store.learning.adapter_training import adapt_corpus, retrain_threshold
from knowledge_store.learning.tuning import PSEUDO_QUERY_KINDS, TuningError, tune_corpus
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.query_adapter import QueryAdapterError, adapter_path, read_adapter
from knowledge_store.retrieval.ranking_defaults import ranking_sources
from knowledge_store.storage.feedback_learning import feedback_learning_path, load_feedback_learning, record_check
from knowledge_store.storage.query_log import QueryLog
from knowledge_store.storage.tuned import TunedConfig, load_tuned, tuned_path
from pipelines.ingestion import search_index
from pipelines.metadata import markdown_table
from pipelines.resources import EmbeddingModelResource, RetrievalResource

GROUP = "tuning"
TUNE_JOB_NAME = "tune"
TOP_ROWS = 15


class TuningConfig(dg.Config):
    limit: int = 300  # at most this many pseudo-queries (thumbs-up feedback included)


def _table_row(row: dict) -> dict[str, object]:
    return {"alpha": row["alpha"], "fusion": row["fusion"], "section_weight": row["section_weight"],
            "lead_weight": row["lead_weight"], "nDCG@10": round(row["ndcg@10"], 4), "Recall@5": round(row["recall@5"], 4),
            **{f"nDCG@10 {kind}": round(value, 4) for kind, value in row.get("ndcg@10_by_kind", {}).items()}}


def before_after_rows(tuned: TunedConfig) -> list[dict[str, object]]:
    rows = []
    for label, scores in (("built-in", tuned.before), ("chosen", tuned.after)):
        rows.append({"ranking": label, **scores["params"], "nDCG@10": scores["ndcg@10"], "Recall@5": scores["recall@5"]})
    rows.append({"ranking": "change", "alpha": "", "fusion": "", "section_weight": "", "lead_weight": "",
                 "nDCG@10": f"{tuned.after['ndcg@10'] - tuned.before['ndcg@10']:+.4f}",
                 "Recall@5": f"{tuned.after['recall@5'] - tuned.before['recall@5']:+.4f}"})
    return rows


def plot_ndcg_vs_alpha(tuned: TunedConfig) -> bytes:
    """PNG: per fusion mode, nDCG@10 against alpha (the best section/lead weights at each alpha);
    the built-in default and the chosen configuration marked."""
    import matplotlib  # noqa: PLC0415 - matplotlib, ~0.5 s to import with pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib, ~0.5 s to import with pyplot

    best: dict[str, dict[float, float]] = {}
    for row in tuned.table:
        by_alpha = best.setdefault(row["fusion"], {})
        by_alpha[row["alpha"]] = max(by_alpha.get(row["alpha"], 0.0), row["ndcg@10"])
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    modes = [m for m in FUSION_MODES if m in best] + sorted(m for m in best if m not in FUSION_MODES)
    for mode in modes:
        alphas = sorted(best[mode])
        ax.plot(alphas, [best[mode][a] for a in alphas], marker="o", markersize=4, label=mode)
    for label, scores, marker in (("built-in", tuned.before, "s"), ("chosen", tuned.after, "*")):
        ax.scatter([scores["params"]["alpha"]], [scores["ndcg@10"]], marker=marker, s=140 if marker == "*" else 70,
                   facecolors="none" if marker == "s" else "black", edgecolors="black", zorder=5,
                   label=f"{label}: {scores['params']['fusion']} alpha={scores['params']['alpha']:g}")
    values = [v for by_alpha in best.values() for v in by_alpha.values()]
    low = min(values + [tuned.before["ndcg@10"]])
    ax.set_ylim(max(0.0, low - 0.05), min(1.02, max(values) + 0.05))
    ax.set_xlabel("alpha (0 = BM25, 1 = vector)")
    ax.set_ylabel("nDCG@10 (best section/lead weights)")
    ax.set_title(f"Self-tuning on {sum(tuned.pseudo_queries.values())} pseudo-queries (snapshot {tuned.snapshot_version})")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


@dg.asset(
    group_name=GROUP, deps=[search_index], kinds={"numpy"},
    description="Ranking (alpha, fusion, section and lead weights) self-tuned on the corpus's own headings, titles, "
                "FAQ questions and thumbs-up feedback; stored in index/tuned.json, used for every query that does not say.",
)
def corpus_tuning(context: dg.AssetExecutionContext, config: TuningConfig, retrieval: RetrievalResource,
                  model: EmbeddingModelResource) -> dg.MaterializeResult:
    settings = retrieval.settings()
    try:
        tuned = tune_corpus(settings, embedder=model.embedder(quantization=settings.query_quantization, settings=settings), limit=config.limit, save=True)
    except (TuningError, IndexNotBuiltError) as error:
        # no made-up result: the run fails with the reason, tuned.json stays as it was
        raise dg.Failure(description=f"cannot tune the ranking of {settings.data_dir}: {error}", allow_retries=False) from error
    before, after = tuned.before, tuned.after
    counts = tuned.pseudo_queries
    context.log.info(
        f"tuned on {sum(counts.values())} pseudo-queries ({counts}): {tuned.params.label}; nDCG@10 "
        f"{before['ndcg@10']:.4f} -> {after['ndcg@10']:.4f}, Recall@5 {before['recall@5']:.4f} -> {after['recall@5']:.4f}"
    )
    decision = tuned.decision or {}
    if decision:
        context.log.info(decision["reason"])
    sources = ranking_sources(settings, settings.index_dir)
    explicit = sorted(name for name, source in sources.items() if source == "setting")
    if explicit:
        context.log.warning(f"{', '.join(explicit)} set explicitly: the setting wins over the tuned value when serving")
    png = plot_ndcg_vs_alpha(tuned)
    plot_path = settings.data_dir / "tuning" / "ndcg_vs_alpha.png"
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot_path.write_bytes(png)
    image = f"![nDCG@10 vs alpha](data:image/png;base64,{base64.b64encode(png).decode()})"
    return dg.MaterializeResult(metadata={
        "pseudo_queries": dg.MetadataValue.json(counts),
        "pseudo_queries_total": int(sum(counts.values())),
        **{f"pseudo_queries_{kind}": int(counts.get(kind, 0)) for kind in PSEUDO_QUERY_KINDS},
        "chosen": tuned.params.label,
        "alpha": float(tuned.params.alpha),
        "fusion": tuned.params.fusion,
        "section_weight": float(tuned.params.section_weight),
        "lead_weight": float(tuned.params.lead_weight),
        "ndcg_at_10_before": float(before["ndcg@10"]),
        "ndcg_at_10_after": float(after["ndcg@10"]),
        "ndcg_at_10_delta": float(round(after["ndcg@10"] - before["ndcg@10"], 4)),
        "recall_at_5_before": float(before["recall@5"]),
        "recall_at_5_after": float(after["recall@5"]),
        "recall_at_5_delta": float(round(after["recall@5"] - before["recall@5"], 4)),
        "decision": decision.get("reason", ""),
        "best_gain_ndcg_at_10": float(decision.get("gain", 0.0)),
        "best_gain_standard_error": float(decision.get("standard_error", 0.0)),
        "gain_required": float(decision.get("required", 0.0)),
        "duration_s": float(tuned.seconds),
        "snapshot_version": int(tuned.snapshot_version),
        "configurations": len(tuned.table),
        "before_after": markdown_table(before_after_rows(tuned)),
        "top_configurations": markdown_table([_table_row(r) for r in tuned.table], limit=TOP_ROWS),
        "plot": dg.MetadataValue.md(image),
        "plot_path": dg.MetadataValue.path(str(plot_path)),
        "tuned_path": dg.MetadataValue.path(str(tuned_path(settings.index_dir))),
        "ranking_sources": dg.MetadataValue.json(sources),
    })


@dg.asset_check(asset=corpus_tuning, description="The chosen ranking's nDCG@10 on the pseudo-queries is at least the built-in default's.")
def tuning_not_worse_than_builtin(retrieval: RetrievalResource) -> dg.AssetCheckResult:
    settings = retrieval.settings()
    tuned = load_tuned(settings.index_dir)
    if tuned is None:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata={
            "reason": f"no readable {tuned_path(settings.index_dir)}: the engine uses the built-in defaults"})
    before, after = float(tuned.before["ndcg@10"]), float(tuned.after["ndcg@10"])
    return dg.AssetCheckResult(
        passed=after >= before, severity=dg.AssetCheckSeverity.WARN,
        metadata={"ndcg_at_10_before": before, "ndcg_at_10_after": after, "delta": round(after - before, 4),
                  "chosen": tuned.params.label, "snapshot_version": int(tuned.snapshot_version)},
    )


@dg.asset(
    group_name=GROUP, deps=[corpus_tuning], kinds={"torch"},
    description="Query adapter learned from thumbs-up feedback (index/query_adapter.npz): one linear map of the query "
                "vector, stored only when held-out rated queries rank better with it.",
)
def query_adapter(context: dg.AssetExecutionContext, retrieval: RetrievalResource,
                  model: EmbeddingModelResource) -> dg.MaterializeResult:
    settings = retrieval.settings()
    path = adapter_path(settings.index_dir)
    decision_path = feedback_learning_path(settings.index_dir)
    try:
        training = adapt_corpus(settings, embedder=model.embedder(quantization=settings.query_quantization, settings=settings), save=True,
                                trigger=context.run.tags.get("groundwork/trigger", "dagster"))
    except IndexNotBuiltError as error:
        raise dg.Failure(description=f"cannot train a query adapter for {settings.data_dir}: {error}",
                         allow_retries=False) from error
    except QueryAdapterError as error:  # too little feedback yet: nothing stored, nothing made up
        context.log.warning(str(error))
        return dg.MaterializeResult(metadata={"adopted": False, "reason": str(error),
                                              "adapter_path": dg.MetadataValue.path(str(path)),
                                              "decision_path": dg.MetadataValue.path(str(decision_path))})
    (context.log.info if training.adapter is not None else context.log.warning)(training.reason)
    rows = [{"adapter": "none", "l2": "", "nDCG@10": training.without["ndcg@10"], "Recall@5": training.without["recall@5"]}]
    rows += [{"adapter": "trained", "l2": r["l2"], "nDCG@10": r["ndcg@10"], "Recall@5": r["recall@5"]}
             for r in training.table]
    best = max(training.table, key=lambda r: (r["ndcg@10"], r["recall@5"]))
    return dg.MaterializeResult(metadata={
        "adopted": training.adapter is not None,
        "reason": training.reason,
        "rated_queries": training.rated_queries,
        "held_out_queries": training.held_out_queries,
        "ndcg_at_10_without": float(training.without["ndcg@10"]),
        "ndcg_at_10_with": float(best["ndcg@10"]),
        "recall_at_5_without": float(training.without["recall@5"]),
        "recall_at_5_with": float(best["recall@5"]),
        "paired_gain": float(training.decision.get("gain", 0.0)),
        "gain_standard_error": float(training.decision.get("standard_error", 0.0)),
        "gain_required": float(training.decision.get("required", 0.0)),
        "held_out_table": markdown_table(rows),
        "duration_s": float(training.seconds),
        "adapter_path": dg.MetadataValue.path(str(path)),
        "decision_path": dg.MetadataValue.path(str(decision_path)),
    })


@dg.asset_check(asset=query_adapter, description="A stored query adapter ranked its held-out rated queries better "
                                                 "than no adapter (or none is stored).")
def adapter_helps_held_out_queries(retrieval: RetrievalResource) -> dg.AssetCheckResult:
    path = adapter_path(retrieval.settings().index_dir)
    if not path.exists():
        return dg.AssetCheckResult(passed=True, metadata={"stored": False})
    try:
        info = read_adapter(path).info
    except QueryAdapterError as error:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata={"reason": str(error)})
    without, with_ = float(info["held_out_without"]["ndcg@10"]), float(info["held_out_with"]["ndcg@10"])
    return dg.AssetCheckResult(passed=with_ > without, severity=dg.AssetCheckSeverity.WARN, metadata={
        "stored": True, "ndcg_at_10_without": without, "ndcg_at_10_with": with_,
        "rated_queries": int(info["rated_queries"]), "trained_at": str(info["trained_at"])})


def up_votes(settings) -> int | None:
    """Thumbs-up stored in the corpus's query log; None when there is no log yet."""
    if not Path(settings.logs_path).exists():
        return None
    log = QueryLog(settings.logs_path, lock_timeout_s=5.0)
    try:
        return log.feedback_counts()["up"]
    finally:
        log.close()


def feedback_check(settings, cursor: str | None,
                   in_flight: bool) -> tuple[dg.RunRequest | dg.SkipReason, str | None, int | None]:
    """One evaluation of ``feedback_grew``: (what to do, the new cursor, the thumbs-up counted).  New thumbs-up
    are counted from the last decision (``feedback_learning.json``: a retrain by hand resets the count too) or
    the last request, whichever is later; a query adapter run is requested when they reach
    ``retrain_threshold``."""
    if not settings.learn_from_feedback:
        return dg.SkipReason("GROUNDWORK_LEARN_FROM_FEEDBACK is false: ratings are stored, no run retrains the "
                             "query adapter from them (`groundwork adapt` still does)"), cursor, None
    try:
        ups = up_votes(settings)
        decided = (load_feedback_learning(settings.index_dir).last_decision or {}).get("up_votes")
    except Exception as error:  # noqa: BLE001 - a busy or damaged log: try again next tick, say why
        return dg.SkipReason(f"cannot read the query log {settings.logs_path}: {error}"), cursor, None
    if ups is None:
        return dg.SkipReason(f"no query log at {settings.logs_path} yet"), cursor, None
    requested = int(cursor or 0)
    if ups < requested:  # the log was purged or replaced: count from here
        return dg.SkipReason(f"{ups} thumbs-up, fewer than at the last request ({requested}): counting from here"), str(ups), ups
    last = max(requested, decided if isinstance(decided, int) and decided <= ups else 0)
    needed = retrain_threshold(settings)
    if ups - last < needed:
        since = "the last decision" if last and last == decided else "the last request" if last else "the start"
        return dg.SkipReason(f"{ups - last} new thumbs-up since {since} ({ups} in all); the query adapter is "
                             f"retrained at {needed}"), cursor, ups
    if in_flight:
        return dg.SkipReason(f"{ups - last} new thumbs-up, but a tune run is in progress; will look again"), cursor, ups
    return dg.RunRequest(run_key=f"feedback-{ups}", asset_selection=[query_adapter.key],
                         tags={"groundwork/trigger": "feedback", "groundwork/up_votes": str(ups)}), str(ups), ups


def build_feedback_sensor(job, interval_s: int = 300) -> dg.SensorDefinition:
    @dg.sensor(
        name="feedback_grew",
        job=job,
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Retrains the query adapter (tune job, query_adapter asset) once GROUNDWORK_ADAPTER_RETRAIN_VOTES "
                    "new thumbs-up have been given since the last decision; it is adopted only when the rated "
                    "queries, each held out once, rank clearly better. GROUNDWORK_LEARN_FROM_FEEDBACK=false stops it.",
    )
    def feedback_grew(context: dg.SensorEvaluationContext, retrieval: RetrievalResource):
        settings = retrieval.settings()
        in_flight = bool(context.instance.get_runs(filters=dg.RunsFilter(
            job_name=TUNE_JOB_NAME,
            statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]), limit=1))
        result, cursor, ups = feedback_check(settings, context.cursor, in_flight)
        if cursor != context.cursor:
            context.update_cursor(cursor)
        message = (result.skip_message if isinstance(result, dg.SkipReason)
                   else f"requested run {result.run_key} to retrain the query adapter")
        try:  # the console shows when the sensor last looked and what it found
            record_check(settings.index_dir, ups, message)
        except OSError as error:
            context.log.warning(f"cannot note the check in {settings.index_dir}: {error}")
        return result

    return feedback_grew


TUNING_ASSETS = [corpus_tuning, query_adapter]
TUNING_CHECKS = [tuning_not_worse_than_builtin, adapter_helps_held_out_queries]
