"""Run an evaluation suite (``suites.Suite``): every set of it under every configuration, through the runners the
rest of the evaluation uses (``retrieval_eval.evaluate_dataset`` for BEIR sets, ``sample_eval`` for the sample
corpus's example questions, ``log_eval`` for the feedback and query logs), and gate the figures against the
suite's baseline.  What ``groundwork eval --suite`` and the Dagster evaluation assets call."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knowledge_store.config.settings import Settings
from knowledge_store.evaluation import log_eval
from knowledge_store.evaluation.results_store import EvalRun, record_eval_results, results_path
from knowledge_store.evaluation.retrieval_eval import evaluate_dataset
from knowledge_store.evaluation.sample_eval import SAMPLE_SPLIT, evaluate_example_configs
from knowledge_store.evaluation.suites import GateFailure, SetManifest, Suite, gate_failures, load_baseline
from knowledge_store.storage.store import utcnow

__all__ = ["SuiteResult", "SuiteRow", "run_suite"]


@dataclass
class SuiteRow:
    set: str
    split: str
    configuration: str
    queries: int
    metrics: dict[str, float]  # the suite's metrics only
    unavailable: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.set}/{self.configuration}"


@dataclass
class SuiteResult:
    suite: Suite
    run_id: str
    rows: list[SuiteRow]
    skipped: list[dict[str, str]]  # {"set", "reason"}: sets that could not run (not built, no log)
    failures: list[GateFailure]
    baseline_path: Path
    recorded_in: Path | None = None

    def figures(self) -> dict[str, dict[str, float]]:
        return {row.key: dict(row.metrics) for row in self.rows}

    @property
    def passed(self) -> bool:
        return not self.failures


def _beir(manifest: SetManifest, suite: Suite, settings: Settings, data_root: Path, ingest: bool,
          log: Callable[[str], None]) -> tuple[list[SuiteRow], list[EvalRun], str | None]:
    folder = manifest.folder(suite.root)
    if folder is None or not (folder / "corpus.jsonl").is_file():
        how = f"; build it with `{manifest.build}`" if manifest.build else ""
        return [], [], f"{folder} does not hold a BEIR set{how}"
    rows, runs = [], []
    for config in suite.configurations:
        root = data_root / f"model-{config.model}" if config.model else data_root
        done = evaluate_dataset(folder, manifest.split, config.eval_config(), ingest=ingest, data_root=root,
                                compare_base=False, embedding_model=config.model,
                                candidate_pool=settings.candidate_pool)
        metrics = {m: done.result.metrics[m] for m in suite.metrics if m in done.result.metrics}
        unavailable = {m: note for m, note in done.result.unavailable.items() if m in suite.metrics}
        rows.append(SuiteRow(manifest.name, manifest.split, config.name, done.result.queries, metrics, unavailable))
        runs.append(done)
        log(f"{manifest.name} {config.name}: " + ", ".join(f"{m} {v:.4f}" for m, v in metrics.items()))
    return rows, runs, None


def run_suite(suite: Suite, settings: Settings | None = None, *, data_root: Path | None = None, ingest: bool = True,
              record: bool = True, log: Callable[[str], None] = lambda _: None) -> SuiteResult:
    """Every set of ``suite`` under every configuration; the figures gated against the suite's baseline and
    (``record``) appended to ``<data_dir>/eval/results.duckdb`` under configuration ``<suite>:<configuration>``."""
    settings = settings or Settings()
    data_root = Path(data_root) if data_root else settings.data_dir / "eval"
    run_id = f"suite-{suite.name}-{uuid.uuid4().hex[:10]}"
    rows: list[SuiteRow] = []
    skipped: list[dict[str, str]] = []
    records: list[EvalRun] = []
    now = utcnow()
    for manifest in suite.sets:
        if manifest.kind == "beir":
            found, runs, reason = _beir(manifest, suite, settings, data_root, ingest, log)
            rows += found
            records += [done.run_record(run_id, now, configuration=f"{suite.name}:{row.configuration}")
                        for done, row in zip(runs, found)]
        elif manifest.kind == "sample":
            configs = [c.eval_config() for c in suite.configurations]
            try:
                results = evaluate_example_configs(settings, configs)
                reason = None
            except Exception as error:  # noqa: BLE001 - SampleEvaluationError, IndexNotBuiltError: reported as skipped
                results, reason = [], f"{type(error).__name__}: {error}"
            for config, result in zip(suite.configurations, results):
                metrics = {m: result.metrics[m] for m in suite.metrics if m in result.metrics}
                rows.append(SuiteRow(manifest.name, SAMPLE_SPLIT, config.name, result.queries, metrics,
                                     {m: n for m, n in result.unavailable.items() if m in suite.metrics}))
                records.append(EvalRun.from_result(result, run_id=run_id, dataset=manifest.name, split=SAMPLE_SPLIT,
                                                   created_at=now, configuration=f"{suite.name}:{config.name}"))
                log(f"{manifest.name} {config.name}: " + ", ".join(f"{m} {v:.4f}" for m, v in metrics.items()))
        elif manifest.kind == "feedback":
            report = log_eval.feedback_evaluation(settings, suite.configurations)
            reason = None if report.samples else "no rated query with an up-rated passage in the query log"
            for config, figures in report.by_configuration.items():
                metrics = {m: figures[m] for m in suite.metrics if m in figures}
                rows.append(SuiteRow(manifest.name, "feedback", config, report.samples, metrics))
        else:  # query_log
            report = log_eval.query_log_evaluation(settings)
            reason = None if report.queries else "no logged query with an answer"
            for method, figures in report.by_method.items():
                metrics = {m: figures[m] for m in suite.metrics if m in figures}
                rows.append(SuiteRow(manifest.name, "query log", method, report.queries, metrics,
                                     {m: n for m, n in report.unavailable.get(method, {}).items()}))
        if reason:
            skipped.append({"set": manifest.name, "reason": reason})
            log(f"{manifest.name}: skipped: {reason}")
    baseline_path = suite.baseline_path()
    baseline = load_baseline(baseline_path)
    figures = {row.key: row.metrics for row in rows}
    failures = gate_failures(figures, baseline, suite.gate.margin, [suite.gate.metric])
    result = SuiteResult(suite, run_id, rows, skipped, failures, baseline_path)
    if record and records:
        result.recorded_in = results_path(settings.data_dir)
        record_eval_results(result.recorded_in, records)
    return result


def describe(result: SuiteResult) -> dict[str, Any]:
    """JSON-ready summary of a suite run (``groundwork eval --suite --json``)."""
    return {"suite": result.suite.name, "run_id": result.run_id, "passed": result.passed,
            "gate": {**result.suite.gate.model_dump(), "baseline_path": str(result.baseline_path)},
            "rows": [{"set": r.set, "split": r.split, "configuration": r.configuration, "queries": r.queries,
                      "metrics": r.metrics, "unavailable": r.unavailable} for r in result.rows],
            "skipped": result.skipped, "failures": [vars(f) for f in result.failures],
            "recorded_in": str(result.recorded_in) if result.recorded_in else None}
