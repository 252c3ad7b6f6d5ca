"""Evaluation assets: datasets -> one retrieval evaluation per configuration -> scorecard.

The engine is the one that serves (``RetrievalResource``); each BEIR dataset is
ingested into its own store through the normal pipeline (``evals.beir``).
Results are appended to ``<data_dir>/eval/results.duckdb`` (table
``eval_results``), the scorecard is rewritten there (table ``scorecard``) and
shown in the asset's metadata as a markdown table and a plot; ``feedback_eval``
and ``query_log_drift`` append their figures there too (``evals.results_store``
owns the tables; the console's Evaluation page reads them).  The regression
check next to the scorecard fails when Recall@5 of any configuration drops by
more than ``recall_drop_margin`` against its previous run or a stored baseline.
"""

import base64
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from evals import results_store
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.settings import PROJECT_ROOT, Settings
from knowledge_store.store import utcnow
from pipelines.metadata import markdown_table
from pipelines.resources import RetrievalResource

GROUP = "evaluation"
DEFAULT_DATASET = PROJECT_ROOT.parent / "shared" / "datasets" / "scifact"


@dataclass(frozen=True)
class Configuration:
    key: str
    alpha: float | None  # None = the engine's default
    fusion: str = "weighted"
    reranker: str = "none"


CONFIGURATIONS = (
    Configuration("bm25", 0.0),
    Configuration("vector", 1.0),
    # one hybrid configuration per fusion mode of retrieval.fusion.FUSION_MODES ("hybrid" is the weighted one)
    *(Configuration("hybrid" if mode == "weighted" else f"hybrid_{mode}", None, mode) for mode in FUSION_MODES),
    Configuration("hybrid_mmr", None, "weighted", "mmr"),
)


class EvaluationResource(dg.ConfigurableResource):
    """Which labelled sets to evaluate on and how strict the regression gate is."""

    datasets: list[str] = []  # BEIR folders; empty = ../shared/datasets/scifact when present
    split: str = "test"
    data_dir: str | None = None
    recall_drop_margin: float = 0.02
    baseline_path: str | None = None  # JSON {"<dataset>/<configuration>": recall@5}
    logs_path: str | None = None  # the query log to learn from; default: the serving store's logs.duckdb

    def folders(self) -> list[Path]:
        if self.datasets:
            return [Path(d) for d in self.datasets]
        return [DEFAULT_DATASET] if DEFAULT_DATASET.is_dir() else []

    def eval_root(self) -> Path:
        base = Path(self.data_dir) if self.data_dir else Settings().data_dir
        return base / "eval"

    def results_path(self) -> Path:
        return self.eval_root() / results_store.RESULTS_FILE


def _results(resource: EvaluationResource):
    return results_store.open_results(resource.results_path())


@dg.asset(group_name=GROUP, kinds={"duckdb"}, description="BEIR datasets ingested into their own stores (cached by corpus checksum).")
def eval_datasets(context: dg.AssetExecutionContext, evaluation: EvaluationResource) -> dg.MaterializeResult:
    from evals.beir import ingest_beir, load_beir

    folders = evaluation.folders()
    if not folders:
        raise dg.Failure("no evaluation datasets: set EvaluationResource.datasets or provide ../shared/datasets/scifact")
    rows = []
    for folder in folders:
        started = time.perf_counter()
        settings, report = ingest_beir(folder, data_root=evaluation.eval_root())
        dataset = load_beir(folder, split=evaluation.split)
        rows.append({
            "dataset": dataset.name, "documents": len(dataset.corpus), "queries": len(dataset.queries),
            "chunks": report.publish.chunk_count, "sync": report.summary,
            "seconds": round(time.perf_counter() - started, 1), "store": str(settings.data_dir),
        })
        context.log.info(f"{dataset.name}: {report.summary}; {report.publish.chunk_count} chunks")
    return dg.MaterializeResult(metadata={"datasets": markdown_table(rows), "count": len(rows),
                                          "queries": sum(r["queries"] for r in rows)})


def _evaluation_asset(config: Configuration) -> dg.AssetsDefinition:
    @dg.asset(
        name=f"retrieval_eval_{config.key}", group_name=GROUP, deps=[eval_datasets], kinds={"ragas"},
        description=f"Recall@5 (RAGAS-compatible), nDCG@10, MRR@10, P@5 and latency for configuration '{config.key}'.",
    )
    def _asset(context: dg.AssetExecutionContext, evaluation: EvaluationResource, retrieval: RetrievalResource) -> dg.MaterializeResult:
        from evals.beir import load_beir
        from evals.retrieval_eval import EvalConfig, evaluate, open_engine

        base = retrieval.settings()
        alpha = base.default_alpha if config.alpha is None else config.alpha
        eval_config = EvalConfig(alpha=alpha, fusion=config.fusion, reranker=config.reranker)
        rows = []
        for folder in evaluation.folders():
            dataset = load_beir(folder, split=evaluation.split)
            engine, doc_map = open_engine(folder, ingest=False, data_root=evaluation.eval_root(),
                                          candidate_pool=base.candidate_pool, default_alpha=base.default_alpha)
            result = evaluate(engine, dataset, eval_config, doc_map)
            m = result.metrics
            rows.append({
                "run_id": context.run.run_id, "dataset": dataset.name, "split": evaluation.split,
                "configuration": config.key, "alpha": alpha, "fusion": config.fusion, "reranker": config.reranker,
                "queries": result.queries, "recall_at_5": m["recall@5"], "ndcg_at_10": m["ndcg@10"],
                "mrr_at_10": m["mrr@10"], "precision_at_5": m["precision@5"], "p50_ms": result.latency_p50_ms,
                "p95_ms": result.latency_p95_ms, "created_at": utcnow(),
                "ragas_recall_at_5": m["ragas_recall@5"], "grounding": m["grounding"],
            })
            context.log.info(f"{dataset.name} {config.key}: recall@5 {m['recall@5']:.3f} ndcg@10 {m['ndcg@10']:.3f}")
        results_store.record_eval_results(evaluation.results_path(), rows)
        first = rows[0] if rows else {}
        return dg.MaterializeResult(metadata={
            "recall_at_5": float(first.get("recall_at_5", 0.0)), "ndcg_at_10": float(first.get("ndcg_at_10", 0.0)),
            "mrr_at_10": float(first.get("mrr_at_10", 0.0)), "precision_at_5": float(first.get("precision_at_5", 0.0)),
            "ragas_recall_at_5": float(first.get("ragas_recall_at_5", 0.0)), "grounding": float(first.get("grounding", 0.0)),
            "latency_p95_ms": float(first.get("p95_ms", 0.0)),
            "results": markdown_table([{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                                        if k not in ("run_id", "created_at")} for r in rows]),
        })

    return _asset


EVAL_ASSETS = [_evaluation_asset(c) for c in CONFIGURATIONS]


def _plot(rows: list[dict]) -> bytes:
    """A PNG bar chart of Recall@5 and nDCG@10 per dataset and configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['dataset']}\n{r['configuration']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["recall_at_5"] for r in rows], width=0.4, label="Recall@5")
    ax.bar([x + 0.2 for x in xs], [r["ndcg_at_10"] for r in rows], width=0.4, label="nDCG@10")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    ax.set_title("Retrieval quality per configuration")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


@dg.asset(group_name=GROUP, deps=EVAL_ASSETS, kinds={"duckdb"}, description="Latest result per dataset and configuration, as a table, markdown and a plot.")
def eval_scorecard(context: dg.AssetExecutionContext, evaluation: EvaluationResource) -> dg.MaterializeResult:
    rows = results_store.refresh_scorecard(evaluation.results_path())
    png = _plot(rows) if rows else b""
    plot_path = evaluation.eval_root() / "scorecard.png"
    if png:
        plot_path.write_bytes(png)
    shown = [{"dataset": r["dataset"], "configuration": r["configuration"], "recall@5": round(r["recall_at_5"], 3),
              "RAGAS recall@5": round(r["ragas_recall_at_5"], 3), "nDCG@10": round(r["ndcg_at_10"], 3),
              "MRR@10": round(r["mrr_at_10"], 3), "P@5": round(r["precision_at_5"], 3),
              "grounding": round(r["grounding"], 3), "p95 ms": round(r["p95_ms"], 1)} for r in rows]
    best = max(rows, key=lambda r: r["ndcg_at_10"])["configuration"] if rows else None
    image = f"\n\n![scorecard](data:image/png;base64,{base64.b64encode(png).decode()})" if png else ""
    return dg.MaterializeResult(metadata={
        "scorecard": dg.MetadataValue.md(markdown_table(shown).value + image),
        "best_configuration": str(best), "rows": len(rows), "plot_path": dg.MetadataValue.path(str(plot_path)),
    })


@dg.asset_check(asset=eval_scorecard, description="Recall@5 of no configuration dropped by more than the margin vs its previous run or the baseline.")
def recall_did_not_regress(evaluation: EvaluationResource) -> dg.AssetCheckResult:
    baseline = json.loads(Path(evaluation.baseline_path).read_text()) if evaluation.baseline_path else {}
    conn = _results(evaluation)
    try:
        rows = conn.execute(
            """
            SELECT dataset, configuration, recall_at_5, lag(recall_at_5) OVER w AS previous, row_number() OVER w2 AS rn
            FROM eval_results
            WINDOW w AS (PARTITION BY dataset, split, configuration ORDER BY created_at),
                   w2 AS (PARTITION BY dataset, split, configuration ORDER BY created_at DESC)
            """
        ).fetchall()
    finally:
        conn.close()
    drops = []
    for dataset, configuration, recall, previous, rn in rows:
        if rn != 1:
            continue
        reference = baseline.get(f"{dataset}/{configuration}", previous)
        if reference is not None and recall < reference - evaluation.recall_drop_margin:
            drops.append({"dataset": dataset, "configuration": configuration, "recall@5": round(recall, 4),
                          "reference": round(reference, 4), "drop": round(reference - recall, 4)})
    return dg.AssetCheckResult(
        passed=not drops, severity=dg.AssetCheckSeverity.ERROR,
        metadata={"margin": evaluation.recall_drop_margin, "regressions": markdown_table(drops), "count": len(drops)},
    )


EVALUATION_ASSETS = [eval_datasets, *EVAL_ASSETS, eval_scorecard]
EVALUATION_CHECKS = [recall_did_not_regress]


def _notebook_asset(name: str, description: str) -> dg.AssetsDefinition:
    @dg.asset(name=f"{name}_notebook", group_name="notebooks", deps=[eval_datasets], kinds={"jupyter"},
              description=description)
    def _asset(context: dg.AssetExecutionContext, evaluation: EvaluationResource) -> dg.MaterializeResult:
        from evals.notebooks import run_notebook

        folders = evaluation.folders()
        if not folders:
            raise dg.Failure("no evaluation dataset configured")
        settings = Settings(**({"data_dir": evaluation.data_dir} if evaluation.data_dir else {}))
        run = run_notebook(name, {"dataset": str(folders[0]), "split": evaluation.split}, settings)
        context.log.info(f"{name}: executed in {run.seconds:.0f} s -> {run.output_notebook}")
        metadata: dict[str, object] = {
            "output_notebook": dg.MetadataValue.path(str(run.output_notebook)),
            "duration_s": round(run.seconds, 1), "summary": dg.MetadataValue.json(run.summary),
        }
        if run.plots:
            png = run.plots[0].read_bytes()
            metadata["plot_path"] = dg.MetadataValue.path(str(run.plots[0]))
            metadata["plot"] = dg.MetadataValue.md(f"![{name}](data:image/png;base64,{base64.b64encode(png).decode()})")
        if run.tables:
            metadata["table_path"] = dg.MetadataValue.path(str(run.tables[0]))
        return dg.MaterializeResult(metadata=metadata)

    return _asset


NOTEBOOK_ASSETS = [
    _notebook_asset("alpha_sweep", "notebooks/alpha_sweep.ipynb run by papermill: recall@5 / nDCG vs alpha."),
    _notebook_asset("reranker_comparison", "notebooks/reranker_comparison.ipynb run by papermill: metrics and latency per reranker."),
]


def _serving_log(evaluation: EvaluationResource, retrieval: RetrievalResource):
    from knowledge_store.query_log import QueryLog

    path = Path(evaluation.logs_path) if evaluation.logs_path else retrieval.settings().logs_path
    return QueryLog(path)


@dg.asset(group_name=GROUP, kinds={"duckdb"}, description="Feedback-derived gold set: queries whose passages people rated; recall of today's engine on them and the helpful rate per configuration.")
def feedback_eval(context: dg.AssetExecutionContext, evaluation: EvaluationResource, retrieval: RetrievalResource) -> dg.MaterializeResult:
    from evals.feedback_gold import feedback_gold_set, helpful_by_config

    log = _serving_log(evaluation, retrieval)
    try:
        samples = feedback_gold_set(log)
        helpful = helpful_by_config(log)
    finally:
        log.close()
    engine = retrieval.engine()
    recalls, negatives = [], []
    for sample in samples:
        if not sample.has_references:
            continue
        response = engine.search(sample.query, k=5, min_relevance=0.0, answer="none", log=False, client="eval")
        top = response.hits[:5]
        found = sum(1 for ref, digest in zip(sample.reference_ids, sample.reference_hashes or [None] * len(sample.reference_ids))
                    if any(h.chunk_id == ref or (digest and h.content_hash == digest) for h in top))
        recalls.append(found / len(sample.reference_ids))
        bad = set(sample.negative_ids) | set(sample.negative_hashes)
        negatives.append(sum(1 for h in top if h.chunk_id in bad or h.content_hash in bad))
    with_refs = len(recalls)
    context.log.info(f"feedback gold set: {len(samples)} samples, {with_refs} with helpful passages")
    figures = {"samples": len(samples), "samples_with_references": with_refs,
               "recall_at_5": float(sum(recalls) / with_refs) if with_refs else 0.0,
               "unhelpful_passages_in_top5": int(sum(negatives))}
    results_store.record_feedback_eval(evaluation.results_path(), context.run.run_id, utcnow(), figures, helpful)
    return dg.MaterializeResult(metadata={
        **figures,
        "helpful_rate_by_configuration": markdown_table([{k: v for k, v in row.items()} for row in helpful]),
    })


@dg.asset(group_name=GROUP, kinds={"duckdb"}, description="Query-log replay: how many of each logged query's top-5 results changed since it was asked.")
def query_log_drift(context: dg.AssetExecutionContext, evaluation: EvaluationResource, retrieval: RetrievalResource) -> dg.MaterializeResult:
    from evals.log_replay import replay

    log = _serving_log(evaluation, retrieval)
    try:
        report = replay(log, retrieval.engine(), limit=500, k=5)
    finally:
        log.close()
    results_store.record_drift(evaluation.results_path(), context.run.run_id, utcnow(), report)
    rows = report.to_rows()
    changed = [r for r in rows if r.get("added") or r.get("removed")]
    context.log.info(f"replayed {report.queries} queries: mean top-5 overlap {report.mean_overlap:.3f}, {report.changed_queries} changed")
    return dg.MaterializeResult(metadata={
        "queries_replayed": report.queries, "mean_top5_overlap": float(report.mean_overlap),
        "changed_queries": report.changed_queries, "skipped": len(report.skipped),
        "changed": markdown_table([{k: r.get(k) for k in ("query", "overlap", "added", "removed")} for r in changed]),
    })


EVALUATION_ASSETS += [feedback_eval, query_log_drift]
