"""Evaluation assets: datasets -> one retrieval evaluation per configuration -> scorecard; RAGAS on the logs.

Which sets, configurations, metrics and gate margins: the suites in ``evals/suites/`` (``scifact.yaml`` and
``docs.yaml`` for the labelled sets, ``feedback.yaml`` for ``feedback_eval``, ``logs.yaml`` for
``query_log_eval``), loaded by ``knowledge_store.evaluation.suites.load_suite``; a new set or configuration is a
YAML change.  The regression gates compare with ``evals/baseline.json``.

The engine is the one that serves (``RetrievalResource``); each BEIR dataset is
ingested into its own store through the normal pipeline (``knowledge_store.evaluation.beir``).
Results are appended to ``<data_dir>/eval/results.duckdb`` (tables
``eval_runs`` and, long-form, ``eval_metrics``), the scorecard (the latest run
per dataset and configuration) is shown in the asset's metadata as a markdown
table and a plot; ``feedback_eval`` and ``query_log_drift`` append their
figures there too (``knowledge_store.evaluation.results_store`` owns the tables; the console's
Evaluation page reads them).  Which metrics, their labels, order and direction
come from ``knowledge_store.evaluation.metrics.METRICS``.  The regression check next to the
scorecard fails when a gated metric (``MetricSpec.gated``: Recall@5) of any
configuration worsens by more than ``recall_drop_margin`` against its previous
run or a stored baseline.
"""

import base64
import io
import json
import math
import time
from pathlib import Path
from typing import Any

import dagster as dg

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError, IndexNotBuiltError
from knowledge_store.evaluation import results_store
from knowledge_store.evaluation.beir import ingest_beir, load_beir
from knowledge_store.evaluation.feedback_gold import helpful_by_config
from knowledge_store.evaluation.log_eval import feedback_evaluation, query_log_evaluation
from knowledge_store.evaluation.log_replay import replay
from knowledge_store.evaluation.metrics import METRICS, PRIMARY_METRIC, check_metric_value, metric_label, metric_spec
from knowledge_store.evaluation.notebooks import run_notebook
from knowledge_store.evaluation.ragas_metrics import ragas_version
from knowledge_store.evaluation.retrieval_eval import EvalConfig, evaluate_dataset
from knowledge_store.evaluation.sample_eval import SampleEvaluationError, evaluate_example_questions
from knowledge_store.evaluation.suites import Suite, SuiteConfig, gate_failures, load_baseline, load_suite
from knowledge_store.retrieval.ranking_defaults import effective_question_alpha
from knowledge_store.storage.query_log import QueryLog
from knowledge_store.storage.store import utcnow
from pipelines.metadata import markdown_table
from pipelines.resources import RetrievalResource

GROUP = "evaluation"


# Evaluation as data: the suites in evals/suites/ say which sets, configurations, metrics and gate margin. The
# labelled-set suites give one retrieval_eval_<configuration> asset per configuration (a configuration in two
# suites is one asset, run on both suites' sets); feedback.yaml drives feedback_eval, logs.yaml query_log_eval.
SUITES_DIR = Path(__file__).resolve().parent.parent / "evals" / "suites"
LABELLED_SUITES = ("scifact", "docs")
FEEDBACK_SUITE = "feedback"
QUERY_LOG_SUITE = "logs"


def _load(name: str) -> Suite:
    return load_suite(SUITES_DIR / f"{name}.yaml")  # SuiteError names the file and field: the code location fails


def _configurations(suites: list[Suite]) -> tuple[tuple[EvalConfig, ...], dict[str, SuiteConfig]]:
    configs: dict[str, SuiteConfig] = {}
    for suite in suites:
        for config in suite.configurations:
            known = configs.setdefault(config.name, config)
            if known != config:
                raise ConfigError(f"{suite.path}: configurations.{config.name}", config.model_dump(),
                                  f"another suite defines {config.name!r} as {known.model_dump()}; one name, one "
                                  "configuration")
    return tuple(c.eval_config() for c in configs.values()), configs


SUITES = [_load(name) for name in LABELLED_SUITES]
# one retrieval_eval_<name> asset each; alpha None = the serving settings' default_alpha
CONFIGURATIONS, SUITE_CONFIGS = _configurations(SUITES)
# a baseline file's bare number (its format before the registry, when the gate checked Recall@5 only)
LEGACY_BASELINE_METRIC = "recall@5"


class EvaluationResource(dg.ConfigurableResource):
    """Which labelled sets to evaluate on and how strict the regression gate is."""

    # BEIR folders; empty = GROUNDWORK_EVAL_DATASETS when set, else the suites' sets (evals/suites) that exist
    datasets: list[str] = []
    split: str | None = None  # None: each suite set's own split (its manifest); "test" for folders named here
    data_dir: str | None = None
    recall_drop_margin: float | None = None  # how far a gated metric may worsen; None: the suite's gate margin
    # JSON {"<dataset>/<configuration>": {"<metric>": value}} (a bare number: recall@5); None: the suite's baseline
    baseline_path: str | None = None
    logs_path: str | None = None  # the query log to learn from; default: the serving store's logs.duckdb
    feedback_suite: str | None = None  # default evals/suites/feedback.yaml
    query_log_suite: str | None = None  # default evals/suites/logs.yaml
    query_log_sample: int = 200  # newest answered queries query_log_eval reads

    def _sets(self, configuration: str | None = None) -> list[tuple[Path, str]]:
        """(folder, split) of every BEIR set to run ``configuration`` on (all of them for None)."""
        if self.datasets:
            return [(Path(d), self.split or "test") for d in self.datasets]
        settings = Settings()
        if "eval_datasets" in settings.model_fields_set:  # GROUNDWORK_EVAL_DATASETS wins over the suites
            return [(folder, self.split or "test") for folder in settings.eval_datasets if folder.is_dir()]
        found: dict[Path, str] = {}
        for suite in SUITES:
            if configuration is not None and configuration not in {c.name for c in suite.configurations}:
                continue
            for manifest in suite.beir_sets():
                folder = manifest.folder(suite.root)
                if folder is not None and (folder / "corpus.jsonl").is_file():
                    found.setdefault(folder, self.split or manifest.split)
        return list(found.items())

    def folders(self, configuration: str | None = None) -> list[Path]:
        return [folder for folder, _ in self._sets(configuration)]

    def split_of(self, folder: Path) -> str:
        return dict(self._sets()).get(Path(folder), self.split or "test")

    def margin(self) -> float:
        return self.recall_drop_margin if self.recall_drop_margin is not None else SUITES[0].gate.margin

    def baseline(self) -> dict[str, Any]:
        path = Path(self.baseline_path) if self.baseline_path else SUITES[0].baseline_path()
        return json.loads(path.read_text()) if path.is_file() else {}

    def suite(self, which: str) -> Suite:
        given = self.feedback_suite if which == FEEDBACK_SUITE else self.query_log_suite
        return load_suite(given) if given else _load(which)

    def eval_root(self) -> Path:
        base = Path(self.data_dir) if self.data_dir else Settings().data_dir
        return base / "eval"

    def results_path(self) -> Path:
        return self.eval_root() / results_store.RESULTS_FILE


@dg.asset(group_name=GROUP, kinds={"duckdb"}, description="BEIR datasets ingested into their own stores (cached by corpus checksum).")
def eval_datasets(context: dg.AssetExecutionContext, evaluation: EvaluationResource) -> dg.MaterializeResult:
    folders = evaluation.folders()
    if not folders:
        raise dg.Failure("no evaluation datasets: set EvaluationResource.datasets or GROUNDWORK_EVAL_DATASETS (none of "
                         f"{', '.join(str(p) for p in Settings().eval_datasets) or 'nothing'} exists)")
    rows = []
    for folder in folders:
        started = time.perf_counter()
        settings, report = ingest_beir(folder, data_root=evaluation.eval_root())
        dataset = load_beir(folder, split=evaluation.split_of(folder))
        rows.append({
            "dataset": dataset.name, "documents": len(dataset.corpus), "queries": len(dataset.queries),
            "chunks": report.publish.chunk_count, "sync": report.summary,
            "seconds": round(time.perf_counter() - started, 1), "store": str(settings.data_dir),
        })
        context.log.info(f"{dataset.name}: {report.summary}; {report.publish.chunk_count} chunks")
    return dg.MaterializeResult(metadata={"datasets": markdown_table(rows), "count": len(rows),
                                          "queries": sum(r["queries"] for r in rows)})


def _rounded(value: Any, name: str) -> Any:
    return round(value, metric_spec(name).digits) if isinstance(value, float) else value


def _metric_columns(metrics: dict[str, float], unavailable: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{label: rounded value}`` in the registry's column order (a markdown table's metric columns); a metric
    without a value shows ``n/a`` (not applicable) or ``failed``."""
    unavailable = unavailable or {}
    return {metric_label(name): ({"not_applicable": "n/a"}.get(unavailable[name]["status"], "failed")
                                 if name in unavailable else _rounded(metrics.get(name), name)) for name in METRICS}


def _evaluation_asset(config: EvalConfig) -> dg.AssetsDefinition:
    if not config.name:
        raise ConfigError("EvalConfig.name", config.name, "a Dagster evaluation configuration needs a name (its "
                                                          "asset is retrieval_eval_<name>)")

    @dg.asset(
        name=f"retrieval_eval_{config.name}", group_name=GROUP, deps=[eval_datasets], kinds={"ragas"},
        description=f"{', '.join(spec.label for spec in METRICS.values())} for configuration '{config.name}'.",
    )
    def _asset(context: dg.AssetExecutionContext, evaluation: EvaluationResource, retrieval: RetrievalResource) -> dg.MaterializeResult:
        base = retrieval.settings()
        # alpha None = the serving path's per-query default: the serving alpha, and its question alpha for questions
        runs: list[results_store.EvalRun] = []
        seconds: dict[str, dict[str, float]] = {}  # dataset -> metric -> seconds it took to compute
        model = SUITE_CONFIGS[config.name].model if config.name in SUITE_CONFIGS else None
        root = evaluation.eval_root() / f"model-{model}" if model else evaluation.eval_root()
        for folder in evaluation.folders(config.name):
            done = evaluate_dataset(folder, evaluation.split_of(folder), config, ingest=model is not None,
                                    data_root=root, embedding_model=model,
                                    compare_base=False, candidate_pool=base.candidate_pool,
                                    default_alpha=base.default_alpha,
                                    question_alpha=effective_question_alpha(base, base.index_dir))
            runs.append(done.run_record(context.run.run_id, utcnow()))
            context.log.info(f"{done.dataset.name} {config.name}: " + ", ".join(
                f"{name} {done.result.metrics[name]:.3f}" for name in METRICS
                if metric_spec(name).headline and name in done.result.metrics))
            seconds[done.dataset.name] = done.result.seconds
            for name, note in done.result.unavailable.items():
                context.log.info(f"{done.dataset.name} {config.name}: {name} {note['status']}: {note['reason']}")
        results_store.record_eval_results(evaluation.results_path(), runs)
        first = runs[0] if runs else None
        return dg.MaterializeResult(metadata={
            # the first dataset's figures, one entry per metric (plotted across runs); none: null, reason below
            **{name: (float(first.metrics[name]) if first and name in first.metrics else dg.MetadataValue.null())
               for name in METRICS},
            "results": markdown_table([{"dataset": r.dataset, "split": r.split, "configuration": r.configuration,
                                        "alpha": r.alpha, "fusion": r.fusion, "reranker": r.reranker,
                                        "queries": r.queries, "answers": r.answer_method,
                                        **_metric_columns(dict(r.metrics), dict(r.unavailable))} for r in runs]),
            "unavailable": markdown_table([{"dataset": r.dataset, "metric": name, "status": note["status"],
                                            "reason": note["reason"]} for r in runs
                                           for name, note in r.unavailable.items()]),
            "answer_method": str(first.answer_method) if first else "none",
            "judge_model": str(first.judge_model) if first and first.judge_model else "none (no LLM answers)",
            "ragas_version": str(first.ragas_version) if first and first.ragas_version else ragas_version(),
            "ragas_seconds": round(sum(s.get(name, 0.0) for s in seconds.values() for name in METRICS
                                       if name.startswith("ragas_") or metric_spec(name).judged), 2),
            "metric_seconds": dg.MetadataValue.json({dataset: {name: round(value, 3) for name, value in s.items()}
                                                     for dataset, s in seconds.items()}),
        })

    return _asset


EVAL_ASSETS = [_evaluation_asset(c) for c in CONFIGURATIONS]


@dg.asset(group_name=GROUP, kinds={"duckdb"},
          description="The sample corpus's example questions on the served index (seconds, no labelled set needed): "
                      "a scorecard row, an alpha sweep and each question's hits for the console's Evaluation page.")
def example_questions_eval(context: dg.AssetExecutionContext, retrieval: RetrievalResource) -> dg.MaterializeResult:
    settings = retrieval.settings()
    try:
        done = evaluate_example_questions(settings)
    except (SampleEvaluationError, IndexNotBuiltError) as error:
        # another corpus is served, or none yet: nothing to evaluate, nothing made up; the labelled sets still run
        context.log.warning(f"example questions not evaluated: {error}")
        return dg.MaterializeResult(metadata={"evaluated": False, "reason": str(error)})
    metrics = done.served.metrics
    context.log.info(f"{done.found} of {done.served.queries} example questions found their answering section in "
                     f"the top 5 in {done.seconds:.1f} s; " + ", ".join(f"{metric_label(name)} {metrics[name]:.3f}"
                                                                      for name in METRICS
                                                                      if metric_spec(name).headline and name in metrics))
    return dg.MaterializeResult(metadata={
        "evaluated": True, "run_id": done.run_id, "questions": done.served.queries, "found_in_top5": done.found,
        **{name: float(metrics[name]) for name in METRICS if name in metrics},
        "unavailable": markdown_table([{"metric": name, "status": note["status"], "reason": note["reason"]}
                                       for name, note in done.served.unavailable.items()]),
        "questions_table": markdown_table([{"question": q.query, "expected": q.expected,
                                            "found at": q.found_rank or "not in the first 5",
                                            **{metric_label(name): q.scores.get(name) for name in
                                               ("answer_support", "key_fact_recall")}} for q in done.questions]),
        "alpha_sweep": markdown_table([{"alpha": p.alpha, **{metric_label(k): round(v, 3) for k, v in p.metrics.items()}}
                                       for p in done.sweep]),
        "duration_s": float(done.seconds), "results_path": dg.MetadataValue.path(str(done.results_path)),
    })


def _plot(rows: list[dict]) -> bytes:
    """A PNG bar chart of the headline metrics (``MetricSpec.headline``) per dataset and configuration."""
    import matplotlib  # noqa: PLC0415 - matplotlib, ~0.5 s to import with pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib, ~0.5 s to import with pyplot

    headline = [spec for spec in METRICS.values() if spec.headline]
    labels = [f"{r['dataset']}\n{r['configuration']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 3.5))
    xs = range(len(rows))
    width = 0.8 / max(1, len(headline))
    for index, spec in enumerate(headline):
        offset = (index - (len(headline) - 1) / 2) * width
        values = [r["metrics"].get(spec.name) for r in rows]
        ax.bar([x + offset for x in xs], [math.nan if v is None else v for v in values], width=width, label=spec.label)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    ax.set_title("Retrieval and answer quality per configuration")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


@dg.asset(group_name=GROUP, deps=[*EVAL_ASSETS, example_questions_eval], kinds={"duckdb"}, description="Latest result per dataset and configuration, as a table, markdown and a plot.")
def eval_scorecard(context: dg.AssetExecutionContext, evaluation: EvaluationResource) -> dg.MaterializeResult:
    rows = results_store.read_scorecard(evaluation.results_path())
    png = _plot(rows) if rows else b""
    plot_path = evaluation.eval_root() / "scorecard.png"
    if png:
        plot_path.write_bytes(png)
    shown = [{"dataset": r["dataset"], "configuration": r["configuration"],
              **_metric_columns(r["metrics"], r.get("unavailable"))} for r in rows]
    scored = [r for r in rows if r["metrics"].get(PRIMARY_METRIC) is not None]
    sign = 1 if metric_spec(PRIMARY_METRIC).higher_is_better else -1
    best = max(scored, key=lambda r: sign * r["metrics"][PRIMARY_METRIC])["configuration"] if scored else None
    image = f"\n\n![scorecard](data:image/png;base64,{base64.b64encode(png).decode()})" if png else ""
    return dg.MaterializeResult(metadata={
        "scorecard": dg.MetadataValue.md(markdown_table(shown).value + image),
        "best_configuration": str(best), "rows": len(rows), "plot_path": dg.MetadataValue.path(str(plot_path)),
    })


def _baseline_references(baseline: dict[str, Any], key: str) -> dict[str, float]:
    """``{metric: reference}`` for ``<dataset>/<configuration>`` from a baseline file (a bare number is the
    format from before the registry: Recall@5)."""
    entry = baseline.get(key)
    if entry is None:
        return {}
    if isinstance(entry, (int, float)) and not isinstance(entry, bool):
        return {LEGACY_BASELINE_METRIC: float(entry)}
    if not isinstance(entry, dict):
        raise ConfigError(f"baseline[{key!r}]", entry, "expected {\"<metric>\": value} or a number (Recall@5)")
    # MetricError names a misspelt metric (e.g. recall_at_5) or a value that is not a number
    return {name: check_metric_value(name, value) for name, value in entry.items()}


def regressions(rows: list[dict[str, Any]], baseline: dict[str, Any], margin: float) -> list[dict[str, Any]]:
    """Each gated metric (``MetricSpec.gated``) of each latest run that is worse than its reference - the
    baseline's value when given, else the previous run's - by more than ``margin`` (in the metric's own
    direction).  ``rows`` are ``results_store.read_scorecard`` rows."""
    if not isinstance(baseline, dict):
        raise ConfigError("baseline", baseline, 'expected {"<dataset>/<configuration>": {"<metric>": value}}')
    drops = []
    for row in rows:
        references = _baseline_references(baseline, f"{row['dataset']}/{row['configuration']}")
        previous = (row.get("previous") or {}).get("metrics", {})
        for spec in METRICS.values():
            value = row["metrics"].get(spec.name)
            reference = references.get(spec.name, previous.get(spec.name))
            if not spec.gated or value is None or reference is None:
                continue
            worse_by = reference - value if spec.higher_is_better else value - reference
            if worse_by > margin:
                drops.append({"dataset": row["dataset"], "configuration": row["configuration"], "metric": spec.name,
                              "value": round(value, 4), "reference": round(reference, 4), "drop": round(worse_by, 4)})
    return drops


@dg.asset_check(asset=eval_scorecard, description="No gated metric (Recall@5) of any configuration worsened by more than the margin vs its previous run or the baseline.")
def recall_did_not_regress(evaluation: EvaluationResource) -> dg.AssetCheckResult:
    margin = evaluation.margin()
    drops = regressions(results_store.read_scorecard(evaluation.results_path()), evaluation.baseline(), margin)
    return dg.AssetCheckResult(
        passed=not drops, severity=dg.AssetCheckSeverity.ERROR,
        description="; ".join(f"{d['dataset']}/{d['configuration']} {d['metric']} {d['value']} vs {d['reference']}"
                              for d in drops) or None,
        metadata={"margin": margin, "regressions": markdown_table(drops), "count": len(drops)},
    )


EVALUATION_ASSETS = [eval_datasets, *EVAL_ASSETS, eval_scorecard, example_questions_eval]
EVALUATION_CHECKS = [recall_did_not_regress]


def _notebook_asset(name: str, description: str) -> dg.AssetsDefinition:
    @dg.asset(name=f"{name}_notebook", group_name="notebooks", deps=[eval_datasets], kinds={"jupyter"},
              description=description)
    def _asset(context: dg.AssetExecutionContext, evaluation: EvaluationResource) -> dg.MaterializeResult:
        folders = evaluation.folders()
        if not folders:
            raise dg.Failure("no evaluation dataset configured")
        settings = Settings(**({"data_dir": evaluation.data_dir} if evaluation.data_dir else {}))
        run = run_notebook(name, {"dataset": str(folders[0]), "split": evaluation.split_of(folders[0]),
                                  "suite": str(SUITES[0].path)}, settings)
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
    path = Path(evaluation.logs_path) if evaluation.logs_path else retrieval.settings().logs_path
    return QueryLog(path)


@dg.asset(group_name=GROUP, kinds={"ragas", "duckdb"},
          description="RAGAS on the feedback log: each rated query a reference (up-rated passages relevant, "
                      "down-rated not), today's engine scored per configuration of evals/suites/feedback.yaml with "
                      "context recall@5 (ids and text) and context precision; helpful rate per logged configuration.")
def feedback_eval(context: dg.AssetExecutionContext, evaluation: EvaluationResource,
                  retrieval: RetrievalResource) -> dg.MaterializeResult:
    suite = evaluation.suite(FEEDBACK_SUITE)
    log = _serving_log(evaluation, retrieval)
    try:
        helpful = helpful_by_config(log)
    finally:
        log.close()
    settings = retrieval.settings()
    # the report reads the rated queries itself: every one is either scored or has down-ratings only
    report = feedback_evaluation(settings, suite.configurations, engine=retrieval.engine(),
                                 log_path=Path(evaluation.logs_path) if evaluation.logs_path else None)
    rated = report.samples + report.negative_only
    hybrid = next(iter(report.by_configuration.values()), {})
    figures = {"samples": rated, "samples_with_references": report.samples,
               "recall@5": float(hybrid.get("ragas_recall@5", 0.0)),
               "unhelpful_passages_in_top5": int(round(hybrid.get("downrated_in_top5", 0.0) * report.samples))}
    now = utcnow()
    results_store.record_feedback_eval(evaluation.results_path(), context.run.run_id, now, figures, helpful)
    results_store.record_feedback_ragas(evaluation.results_path(), context.run.run_id, now, report.samples,
                                        report.by_configuration)
    for name, values in report.by_configuration.items():
        context.log.info(f"feedback {name}: " + ", ".join(f"{m} {v:.3f}" for m, v in values.items()))
    gated = suite.gate.metric
    return dg.MaterializeResult(metadata={
        "samples": rated, "samples_with_references": report.samples, "suite": str(suite.path),
        "ragas_version": report.ragas_version,
        # one entry per configuration: the gated metric, plotted across runs in the asset's history
        **{f"{gated}/{name}": float(values[gated]) for name, values in report.by_configuration.items()
           if gated in values},
        "by_configuration": markdown_table([{"configuration": name, **{m: round(v, 4) for m, v in values.items()}}
                                            for name, values in report.by_configuration.items()]),
        "not_scored": markdown_table([{"configuration": k, "reason": v} for k, v in report.not_scored.items()]),
        "helpful_rate_by_configuration": markdown_table([{k: v for k, v in row.items()} for row in helpful]),
    })


@dg.asset_check(asset=feedback_eval, description="No configuration of evals/suites/feedback.yaml lost more of "
                "its gated metric (RAGAS context recall@5 on the thumbs' references) than the suite's margin, "
                "against the baseline's feedback/<configuration> entry or else the previous feedback_eval run.")
def feedback_recall_did_not_regress(evaluation: EvaluationResource) -> dg.AssetCheckResult:
    suite = evaluation.suite(FEEDBACK_SUITE)
    run = results_store.latest_feedback_ragas(evaluation.results_path()) or {}
    current = {f"feedback/{name}": values for name, values in (run.get("by_configuration") or {}).items()}
    previous = {f"feedback/{name}": values for name, values in results_store.previous_feedback_ragas(
        evaluation.results_path(), str(run.get("run_id"))).items()}
    committed = load_baseline(suite.baseline_path())
    reference = {key: committed.get(key) or previous.get(key, {}) for key in current}
    failures = gate_failures(current, reference, suite.gate.margin, [suite.gate.metric])
    return dg.AssetCheckResult(
        passed=not failures, severity=dg.AssetCheckSeverity.ERROR,
        description="; ".join(str(f) for f in failures) or None,
        metadata={"margin": suite.gate.metric + " " + str(suite.gate.margin), "count": len(failures),
                  "regressions": markdown_table([vars(f) for f in failures]),
                  "compared": markdown_table([{"configuration": key, "value": current[key].get(suite.gate.metric),
                                               "reference": reference[key].get(suite.gate.metric)}
                                              for key in current])},
    )


@dg.asset(group_name=GROUP, kinds={"ragas", "duckdb"},
          description="RAGAS on the query log: a sample of logged answers with the passages served; faithfulness "
                      "and answer relevancy through the judge endpoint (GROUNDWORK_EVAL_JUDGE_URL / _MODEL) when "
                      "one is set; answer support and key-fact recall always (per answer method).")
def query_log_eval(context: dg.AssetExecutionContext, evaluation: EvaluationResource,
                   retrieval: RetrievalResource) -> dg.MaterializeResult:
    suite = evaluation.suite(QUERY_LOG_SUITE)
    settings = retrieval.settings()
    report = query_log_evaluation(settings, limit=evaluation.query_log_sample,
                                  log_path=Path(evaluation.logs_path) if evaluation.logs_path else None)
    results_store.record_query_log_eval(evaluation.results_path(), context.run.run_id, utcnow(), report)
    for method, values in report.by_method.items():
        context.log.info(f"query log {method}: " + ", ".join(f"{m} {v:.3f}" for m, v in values.items()))
    return dg.MaterializeResult(metadata={
        "queries": report.queries, "skipped": report.skipped, "suite": str(suite.path),
        "judge_model": report.judge_model or "none (no judge endpoint: answer support and key facts only)",
        "ragas_version": report.ragas_version,
        **{f"{metric}/{method}": float(value) for method, values in report.by_method.items()
           for metric, value in values.items() if metric in suite.metrics},
        "by_method": markdown_table([{"answer method": method, **{m: round(v, 4) for m, v in values.items()}}
                                     for method, values in report.by_method.items()]),
        "unavailable": markdown_table([{"answer method": method, "metric": m, **note}
                                       for method, notes in report.unavailable.items() for m, note in notes.items()]),
    })


@dg.asset(group_name=GROUP, kinds={"duckdb"}, description="Query-log replay: how many of each logged query's top-5 results changed since it was asked.")
def query_log_drift(context: dg.AssetExecutionContext, evaluation: EvaluationResource, retrieval: RetrievalResource) -> dg.MaterializeResult:
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


EVALUATION_ASSETS += [feedback_eval, query_log_eval, query_log_drift]
EVALUATION_CHECKS += [feedback_recall_did_not_regress]
