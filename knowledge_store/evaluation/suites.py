"""Evaluation suites and set manifests: evaluation as data (``evals/suites/*.yaml``, ``evals/sets/*.yaml``).

A **set manifest** names one labelled set and where it comes from::

    name: scifact
    kind: beir                       # beir | sample | feedback | query_log
    path: ../shared/datasets/scifact # BEIR folder, relative to the repository root (the folder holding evals/)
    split: test
    build: python -m evals.experiments.debian_docs   # how to make it when it is built, not shipped

A **suite** says which sets, which configurations, which metrics and how strict the regression gate is::

    name: docs
    sets: [debian-docs, perl-docs]   # manifests evals/sets/<name>.yaml
    configurations:
      - {name: hybrid, fusion: weighted}
      - {name: bm25, alpha: 0.0}
      - {name: mpnet-mmr, model: mpnet, reranker: mmr}
    metrics: [recall@5, ndcg@10]     # names of knowledge_store.evaluation.metrics.METRICS (or FEEDBACK_METRICS)
    gate: {metric: recall@5, margin: 0.02, baseline: evals/baseline.json}

Loading checks everything before a run starts: a misspelt key, an unknown fusion mode, reranker or metric, a
set without a manifest or an alpha outside [0, 1] is a ``SuiteError`` naming the file and the field.  The
runners stay in the library (``retrieval_eval``, ``sample_eval``, ``log_eval``); the CLI (``groundwork eval
--suite``), the Dagster evaluation assets and the notebooks read suites through ``load_suite``.

The **gate** (``gate_failures``) compares a run's figures with ``evals/baseline.json`` (``{"<set>/<configuration>":
{"<metric>": value}}``) and names every set, configuration and metric that fell by more than the margin.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from knowledge_store.config.embedding_models import EMBEDDING_MODELS
from knowledge_store.core.errors import GroundworkError
from knowledge_store.evaluation.metrics import METRICS, MetricError, check_metric_value, metric_spec
from knowledge_store.evaluation.retrieval_eval import EvalConfig
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.reranker_registry import RERANKERS

__all__ = ["FEEDBACK_METRICS", "QUERY_LOG_METRICS", "Gate", "GateFailure", "SetManifest", "Suite", "SuiteConfig",
           "SuiteError", "gate_failures", "load_baseline", "load_set", "load_suite", "repository_root",
           "write_baseline"]

SetKind = Literal["beir", "sample", "feedback", "query_log"]
# the figures log_eval computes from the feedback log (per configuration) and the query log (per answer method)
FEEDBACK_METRICS = ("ragas_recall@5", "ragas_context_recall@5", "ragas_context_precision@5", "downrated_in_top5")
QUERY_LOG_METRICS = ("faithfulness", "answer_relevancy", "answer_support", "key_fact_recall")


class SuiteError(GroundworkError):
    """A suite or set manifest that cannot be used: ``path`` is the file, ``field`` the offending entry."""

    def __init__(self, path: Path | str, field: str, reason: str) -> None:
        self.path, self.field, self.reason = str(path), field, reason
        super().__init__(f"{path}: {field}: {reason}")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SetManifest(_Strict):
    """One labelled set (``evals/sets/<name>.yaml``)."""

    name: str
    kind: SetKind
    description: str = ""
    path: str | None = Field(None, description="BEIR folder relative to the repository root (kind beir)")
    split: str = "test"
    build: str | None = Field(None, description="the command that builds the set when it is not shipped")
    source: str | None = None
    licence: str | None = None
    key_facts: bool = False  # the set's questions carry key facts (key_fact_recall applies)

    def folder(self, root: Path) -> Path | None:
        return None if self.path is None else (root / self.path).resolve()


class SuiteConfig(_Strict):
    """One configuration of a suite: what ``EvalConfig`` takes plus the embedding model of the stores."""

    name: str
    alpha: float | None = Field(None, ge=0.0, le=1.0)
    fusion: str = "weighted"
    reranker: str = "none"
    model: str | None = Field(None, description="embedding model of the evaluation stores (None: the settings')")

    def eval_config(self) -> EvalConfig:
        return EvalConfig(name=self.name, alpha=self.alpha, fusion=self.fusion, reranker=self.reranker)


class Gate(_Strict):
    metric: str = "recall@5"
    margin: float = Field(0.02, ge=0.0, le=1.0)
    baseline: str = "evals/baseline.json"


class Suite(_Strict):
    """A suite as loaded: its sets resolved to manifests."""

    name: str
    description: str = ""
    sets: list[SetManifest]
    configurations: list[SuiteConfig]
    metrics: list[str]
    gate: Gate = Gate()
    path: Path
    root: Path  # the repository root: manifests' paths and the baseline are relative to it

    @field_validator("configurations")
    @classmethod
    def _unique(cls, configs: list[SuiteConfig]) -> list[SuiteConfig]:
        names = [c.name for c in configs]
        if len(names) != len(set(names)):
            raise ValueError(f"configuration names repeat: {names}")
        return configs

    def baseline_path(self) -> Path:
        return (self.root / self.gate.baseline).resolve()

    def beir_sets(self) -> list[SetManifest]:
        return [s for s in self.sets if s.kind == "beir"]


def repository_root(path: Path) -> Path:
    """The folder holding ``evals/`` for a suite or manifest at ``evals/<kind>/<file>.yaml``."""
    return Path(path).resolve().parent.parent.parent


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as error:
        raise SuiteError(path, "(file)", "does not exist") from error
    except yaml.YAMLError as error:
        raise SuiteError(path, "(file)", f"not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise SuiteError(path, "(file)", f"expected a mapping at the top, got {type(data).__name__}")
    return data


def _first_error(path: Path, error: ValidationError, prefix: str = "") -> SuiteError:
    first = error.errors()[0]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]).lstrip(".")
    value = first.get("input")
    return SuiteError(path, prefix + where, f"{first['msg']} (got {value!r})")


def load_set(path: Path) -> SetManifest:
    """A set manifest; ``SuiteError`` names the file and field of a bad one."""
    data = _read_yaml(path)
    try:
        manifest = SetManifest(**data)
    except ValidationError as error:
        raise _first_error(path, error) from error
    except TypeError as error:
        raise SuiteError(path, "(file)", str(error)) from error
    if manifest.kind == "beir" and not manifest.path:
        raise SuiteError(path, "path", "a beir set needs the BEIR folder (relative to the repository root)")
    return manifest


def _check_config(path: Path, index: int, config: SuiteConfig) -> None:
    where = f"configurations[{index}]"
    if config.fusion not in FUSION_MODES:
        raise SuiteError(path, f"{where}.fusion", f"must be one of {', '.join(FUSION_MODES)} (got {config.fusion!r})")
    if config.reranker not in RERANKERS:
        raise SuiteError(path, f"{where}.reranker",
                         f"must be one of {', '.join(RERANKERS)} (got {config.reranker!r})")
    if config.model is not None and config.model not in EMBEDDING_MODELS:
        raise SuiteError(path, f"{where}.model", f"must be one of {', '.join(EMBEDDING_MODELS)} (got {config.model!r})")


def _check_metric(path: Path, field: str, name: str, kinds: set[str]) -> None:
    if name in METRICS:
        return
    if "feedback" in kinds and name in FEEDBACK_METRICS or "query_log" in kinds and name in QUERY_LOG_METRICS:
        return
    known = [*METRICS] + (list(FEEDBACK_METRICS) if "feedback" in kinds else []) + (
        list(QUERY_LOG_METRICS) if "query_log" in kinds else [])
    raise SuiteError(path, field, f"unknown metric {name!r}; known: {', '.join(dict.fromkeys(known))}")


def load_suite(path: Path | str, sets_dir: Path | None = None) -> Suite:
    """The suite at ``path`` with its sets' manifests (``sets_dir``, default ``evals/sets`` beside the suites'
    folder).  ``SuiteError`` names the file and field of anything wrong, before anything runs."""
    path = Path(path).resolve()
    data = _read_yaml(path)
    root = repository_root(path)
    sets_dir = Path(sets_dir) if sets_dir else path.parent.parent / "sets"
    names = data.get("sets")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise SuiteError(path, "sets", f"expected a non-empty list of set names (evals/sets/<name>.yaml), got {names!r}")
    manifests = []
    for index, name in enumerate(names):
        manifest_path = sets_dir / f"{name}.yaml"
        if not manifest_path.is_file():
            raise SuiteError(path, f"sets[{index}]", f"no manifest {manifest_path} for set {name!r}")
        manifests.append(load_set(manifest_path))
    configs = data.get("configurations")
    if not isinstance(configs, list) or not configs:
        raise SuiteError(path, "configurations", f"expected a non-empty list of configurations, got {configs!r}")
    try:
        suite = Suite(**{**data, "sets": manifests, "path": path, "root": root})
    except ValidationError as error:
        raise _first_error(path, error) from error
    except TypeError as error:
        raise SuiteError(path, "(file)", str(error)) from error
    for index, config in enumerate(suite.configurations):
        _check_config(path, index, config)
    kinds = {s.kind for s in suite.sets}
    if not suite.metrics:
        raise SuiteError(path, "metrics", "expected at least one metric")
    for index, name in enumerate(suite.metrics):
        _check_metric(path, f"metrics[{index}]", name, kinds)
    _check_metric(path, "gate.metric", suite.gate.metric, kinds)
    if suite.gate.metric not in suite.metrics:
        raise SuiteError(path, "gate.metric", f"{suite.gate.metric!r} is not among the suite's metrics {suite.metrics}")
    return suite


# ------------------------------------------------------------------ the regression gate


@dataclass(frozen=True)
class GateFailure:
    set: str
    configuration: str
    metric: str
    value: float
    baseline: float
    drop: float

    def __str__(self) -> str:
        return (f"{self.set}/{self.configuration} {self.metric}: {self.value:.4f} vs baseline {self.baseline:.4f} "
                f"(worse by {self.drop:.4f})")


def _higher_is_better(metric: str) -> bool:
    try:
        return metric_spec(metric).higher_is_better
    except MetricError:
        return metric != "downrated_in_top5"  # the log evaluations' own figures: all but this one rise with quality


def load_baseline(path: Path) -> dict[str, dict[str, float]]:
    """``{"<set>/<configuration>": {"<metric>": value}}``; {} when the file does not exist yet."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SuiteError(path, "(file)", f"not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise SuiteError(path, "(file)", 'expected {"<set>/<configuration>": {"<metric>": value}}')
    out: dict[str, dict[str, float]] = {}
    for key, entry in data.items():
        if key.startswith("_"):  # "_about": what produced the file
            continue
        if not isinstance(entry, dict):
            raise SuiteError(path, key, f'expected {{"<metric>": value}}, got {entry!r}')
        figures = {}
        for name, value in entry.items():
            try:
                figures[name] = check_metric_value(name, value) if name in METRICS else float(value)
            except (MetricError, TypeError, ValueError) as error:
                raise SuiteError(path, f"{key}.{name}", f"not a metric value: {value!r}") from error
        out[key] = figures
    return out


def gate_failures(figures: Mapping[str, Mapping[str, float]], baseline: Mapping[str, Mapping[str, float]],
                  margin: float, metrics: Iterable[str]) -> list[GateFailure]:
    """Every ``<set>/<configuration>`` of ``figures`` whose metric among ``metrics`` is worse than the baseline's
    by more than ``margin`` (in the metric's direction).  Entries without a baseline value are not compared."""
    failures = []
    for key, values in figures.items():
        reference = baseline.get(key, {})
        for metric in metrics:
            if metric not in values or metric not in reference:
                continue
            value, base = float(values[metric]), float(reference[metric])
            drop = base - value if _higher_is_better(metric) else value - base
            if drop > margin + 1e-12:
                set_name, _, config = key.partition("/")
                failures.append(GateFailure(set_name, config, metric, round(value, 4), round(base, 4), round(drop, 4)))
    return failures


def write_baseline(path: Path, figures: Mapping[str, Mapping[str, float]], metrics: Sequence[str],
                   about: str) -> dict[str, Any]:
    """Merge ``figures`` (only ``metrics``) into the baseline file at ``path``; returns what was written."""
    path = Path(path)
    current = json.loads(path.read_text()) if path.is_file() else {}
    current["_about"] = about
    for key, values in figures.items():
        current[key] = {m: round(float(values[m]), 4) for m in metrics if m in values}
    ordered = {"_about": current.pop("_about"), **dict(sorted(current.items()))}
    path.write_text(json.dumps(ordered, indent=2) + "\n")
    return ordered
