"""The ``groundwork`` command.

    groundwork ingest [--sources DIR ...] [--data-dir DIR] [--json]
    groundwork sources add NAME --url URL [--depth N] [--include RE] [--exclude RE] [--render-js] | --folder DIR
    groundwork sources list|show|update|delete NAME
    groundwork sync NAME [--json]
    groundwork failures [retry FAILURE_ID]
    groundwork status [--data-dir DIR] [--json] [--history]
    groundwork query "TEXT" [--k 5] [--alpha 0.5] [--reranker mmr] [--path FILE] [--meta K=V] [--json]
    groundwork eval DATASET_DIR [--alpha A] [--reranker R] [--k 10] [--json]
    groundwork eval --suite evals/suites/docs.yaml [--write-baseline] [--json]
    groundwork tune [--limit N] [--dry-run] [--json] | --reset
    groundwork adapt [--labels FILE] [--dry-run] [--json] | --reset
    groundwork notebook alpha_sweep -p dataset DIR -p alphas '[0, 0.5, 1]'
    groundwork serve [--host 127.0.0.1] [--port 8080]
    groundwork run [--port 8080] [--dagster-host 127.0.0.1] [--dagster-port 3000] [--workspace workspace.yaml]
    groundwork mcp
    groundwork models prepare|status [--model NAME] [--json]
    groundwork sample-corpus DIR

``ingest`` materialises the Dagster ingestion assets headless (the same assets
and checks the UI runs; recorded in ``$DAGSTER_HOME`` when it is set) and prints
the sync summary.  Exit codes: 0 ok, 1 a run or asset check failed, 2 bad usage
or a store problem.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from knowledge_store.app.launcher import DEFAULT_STOP_TIMEOUT_S, run_together, workbench_commands
from knowledge_store.app.status import store_status
from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError, GroundworkError
from knowledge_store.core.progress import terminal_progress
from knowledge_store.evaluation.metrics import METRICS, metric_label, metric_spec
from knowledge_store.evaluation.notebooks import parse_value, run_notebook
from knowledge_store.evaluation.results_store import record_eval_results, results_path
from knowledge_store.evaluation.retrieval_eval import evaluate_dataset
from knowledge_store.evaluation.sample_eval import SAMPLE_DATASET, SAMPLE_SPLIT, evaluate_example_questions
from knowledge_store.evaluation.suite_runner import describe, run_suite
from knowledge_store.evaluation.suites import load_suite, write_baseline
from knowledge_store.ingest.failures import open_failures
from knowledge_store.ingest.sample_corpus import write_sample_corpus
from knowledge_store.ingest.source_actions import delete_source_now, describe_source, retry_failure, update_source_now
from knowledge_store.ingest.sources import (
    VISIBILITIES,
    add_source,
    check_renderer,
    get_source,
    list_sources,
    register_configured_sources,
    source_statistics,
)
from knowledge_store.ingest.sync_runs import get_sync_run
from knowledge_store.learning.adapter_training import adapt_corpus, read_labels
from knowledge_store.learning.finetune import finetune_corpus, rollback
from knowledge_store.learning.tuning import PSEUDO_QUERY_KINDS, TuningError, tune_corpus, tune_snapshot
from knowledge_store.models.embeddings import graph_status, prepare_embedders
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.query_adapter import QueryAdapterError, adapter_path, reset_adapter
from knowledge_store.retrieval.ranking_defaults import builtin_ranking, ranking_sources
from knowledge_store.retrieval.reranker_registry import RERANKERS
from knowledge_store.storage.query_log.retention import purge_query_log
from knowledge_store.storage.store import store_connection, utcnow
from knowledge_store.storage.tuned import reset_ranking, tuned_path


def format_table(rows: Sequence[dict[str, object]], columns: Sequence[str], max_width: int = 48) -> str:
    """A plain aligned text table (no dependency, readable in any terminal)."""
    if not rows:
        return "  (none)"

    def cell(value: object) -> str:
        text = "" if value is None else str(value)
        text = text.replace("\n", " ")
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  " + "  ".join("-" * w for w in widths))
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


_ARG_SETTINGS = {"data_dir": "data_dir", "host": "server_host", "port": "server_port", "ssl_certfile": "ssl_certfile",
                 "ssl_keyfile": "ssl_keyfile"}


def _settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment with the command's options on top."""
    overrides: dict[str, object] = {
        setting: getattr(args, arg) for arg, setting in _ARG_SETTINGS.items() if getattr(args, arg, None)
    }
    if getattr(args, "sources", None):
        overrides["sources"] = ":".join(args.sources)
    return Settings(**overrides)


@dataclass
class JobOutcome:
    """What a Dagster job run left in its instance: success, the failure message, asset checks, materialisations."""

    run_id: str
    success: bool
    error: str
    checks: dict[str, bool]
    materialized: dict[str, dict[str, object]]


# the Dagster project's names the CLI launches by (pipelines/definitions.py and pipelines/sources.py say them too;
# tests/integration/test_settings_and_cli.py checks they agree): the CLI starts jobs by name, it does not import them
INGEST_JOB_NAME = "ingest"
SYNC_SOURCE_JOB_NAME = "sync_source"
SOURCE_PARTITIONS_NAME = "sources"


def run_dagster_job(job: str, settings: Settings, tags: dict[str, str], run_config: dict[str, object],
                    partitions: tuple[str, str] | None = None) -> JobOutcome:
    """Run Dagster job ``job`` of the ``pipelines`` project the way Dagster's own CLI does (``dagster job execute``,
    a process of its own, the settings in its environment) and read the outcome from the instance.  The run is
    recorded where ``dagster dev`` shows it when ``DAGSTER_HOME`` is set, else in a temporary instance.
    ``partitions``: (dynamic partitions name, key) to run one partition of."""
    import dagster as dg  # noqa: PLC0415 - Dagster, ~1 s to import: only the commands that run jobs pay for it

    request = uuid.uuid4().hex
    home = os.environ.get("DAGSTER_HOME")
    scratch = tempfile.TemporaryDirectory(prefix="groundwork-dagster-") if not home else None
    home = home or scratch.name
    os.makedirs(home, exist_ok=True)
    try:
        instance = dg.DagsterInstance.from_config(home) if scratch else dg.DagsterInstance.get()
        run_tags = {**tags, "groundwork/cli_request": request}
        if partitions is not None:
            name, key = partitions
            if key not in instance.get_dynamic_partitions(name):
                instance.add_dynamic_partitions(name, [key])
            run_tags["dagster/partition"] = key
        config_path = os.path.join(home, f".groundwork-{request}.json")
        with open(config_path, "w") as handle:
            json.dump(run_config, handle)
        environment = {**os.environ, "DAGSTER_HOME": home, "GROUNDWORK_DATA_DIR": str(settings.data_dir),
                       "GROUNDWORK_TERMINAL_PROGRESS": "1"}
        if settings.sources:
            environment["GROUNDWORK_SOURCES"] = ":".join(str(p) for p in settings.sources)
        subprocess.run([sys.executable, "-m", "dagster", "job", "execute", "-m", "pipelines", "-j", job, "-c",
                        config_path, "--tags", json.dumps(run_tags)], env=environment, check=False)
        os.unlink(config_path)
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"groundwork/cli_request": request}), limit=1)
        if not runs:
            return JobOutcome("", False, f"the {job} job did not start (see the messages above)", {}, {})
        run = runs[0]
        checks: dict[str, bool] = {}
        materialized: dict[str, dict[str, object]] = {}
        error = ""
        for entry in instance.all_logs(run.run_id):
            if entry.asset_check_evaluation is not None:
                checks[entry.asset_check_evaluation.check_name] = entry.asset_check_evaluation.passed
            elif entry.asset_materialization is not None:
                materialization = entry.asset_materialization
                materialized[materialization.asset_key.to_user_string()] = {
                    key: getattr(value, "value", value) for key, value in materialization.metadata.items()}
            elif entry.dagster_event is not None and entry.dagster_event.is_failure and not error:
                error = entry.dagster_event.message or "run failed"
        return JobOutcome(run.run_id, run.status == dg.DagsterRunStatus.SUCCESS, error or "run failed", checks,
                          materialized)
    finally:
        if scratch is not None:
            scratch.cleanup()


def cmd_ingest(args: argparse.Namespace) -> int:
    settings = _settings(args)
    for folder in settings.sources:
        if not folder.expanduser().is_dir():
            print(f"error: --sources {folder}: not a folder", file=sys.stderr)
            return 2
    started = time.perf_counter()
    outcome = run_dagster_job(
        INGEST_JOB_NAME, settings, tags={"groundwork/trigger": "cli", "groundwork/job": "ingest"},
        run_config={"loggers": {"console": {"config": {"log_level": "DEBUG" if args.verbose else "WARNING"}}}})
    seconds = time.perf_counter() - started
    checks = outcome.checks
    stage_metadata = {
        asset: {key: value for key, value in metadata.items()
                if key in ("duration_s", "documents_parsed", "chunks_created", "embeddings_computed", "embeddings_reused",
                           "pages", "pages_per_minute", "chunks_per_second", "snapshot_version", "chunks_indexed")}
        for asset, metadata in outcome.materialized.items()
    }
    if not outcome.success:
        if args.json:
            print(json.dumps({"success": False, "error": outcome.error, "dagster_run_id": outcome.run_id}, indent=2))
        else:
            print(f"ingest FAILED (dagster run {outcome.run_id}): {outcome.error}", file=sys.stderr)
        return 1
    with store_connection(settings.store_path, read_only=True) as conn:
        run = get_sync_run(conn, outcome.run_id)
    status = store_status(settings, include_history=False)
    failures = [f for f in status["ingestion_failures"]]
    skipped_kinds = (run.get("details") or {}).get("skipped") or {}
    report = {
        "success": True,
        "dagster_run_id": outcome.run_id,
        "summary": run["summary"],
        **{k: run[k] for k in ("added", "updated", "removed", "unchanged", "excluded", "failed", "chunks_created",
                               "embeddings_computed", "embeddings_reused", "snapshot_version")},
        "documents_indexed": status["index_snapshot"]["document_count"] if status["index_snapshot"] else 0,
        "chunks_indexed": status["index_snapshot"]["chunk_count"] if status["index_snapshot"] else 0,
        "seconds": round(seconds, 2),
        "stages": stage_metadata,
        "checks": checks,
        "open_failures": failures,
        # files this run parsed but left out on purpose (kind -> count; too_short: a Markdown stub), and the open
        # rows of those kinds
        "skipped": skipped_kinds,
        "skipped_files": [f for f in failures if f["kind"] in skipped_kinds],
    }
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(f"sync: {run['summary']}")
        print(
            f"index snapshot {report['snapshot_version']}: {report['documents_indexed']} documents, "
            f"{report['chunks_indexed']} chunks; {run['embeddings_computed']} embeddings computed, "
            f"{run['embeddings_reused']} reused; {seconds:.1f} s"
        )
        print("checks: " + ", ".join(f"{name} {'ok' if ok else 'FAILED'}" for name, ok in sorted(checks.items())))
        if failures:
            print(f"\nopen ingestion failures ({len(failures)}):")
            print(format_table(failures, ["path", "stage", "kind", "reason"], max_width=90))
    return 0 if all(checks.values()) else 1


def _web_options(args: argparse.Namespace) -> dict[str, object]:
    """Crawl options given on the command line (None = not given)."""
    options: dict[str, object] = {}
    for key in ("depth", "max_pages", "requests_per_second", "llms_full_max_mb"):
        if getattr(args, key, None) is not None:
            options[key] = getattr(args, key)
    for key in ("include", "exclude"):
        if getattr(args, key, None):
            options[key] = getattr(args, key)
        if getattr(args, f"clear_{key}", False):
            options[key] = []
    for flag, key in (("robots", "respect_robots"), ("llms_txt", "use_llms_txt"), ("sitemap", "use_sitemap"),
                      ("render_js", "render_js")):
        value = getattr(args, flag, None)
        if value is not None:
            options[key] = value
    return options


def _print_source(detail: dict[str, object]) -> None:
    stats = detail.get("statistics") or {}
    print(f"{detail['name']}  ({detail['kind']}, {'enabled' if detail['enabled'] else 'disabled'}"
          f"{', DELETED ' + str(detail['deleted_at']) if detail.get('deleted_at') else ''})")
    print(f"  location: {detail['location']}  ({detail.get('visibility', 'internal')})")
    if detail.get("config"):
        print("  options:  " + ", ".join(f"{k}={v}" for k, v in sorted(detail["config"].items())))
    if stats:
        print(f"  content:  {stats['documents']} documents, {stats['pages']} pages, {stats['chunks']} chunks; "
              f"{stats['pending_versions']} pending, {stats['failed_versions']} failed, {stats['deleted_documents']} deleted; "
              f"{stats['open_failures']} open failures")
    last = detail.get("last_sync")
    if last:
        crawl = last.get("crawl") or {}
        print(f"  last sync: {detail.get('last_synced_at')}: {last.get('added', 0)} added, {last.get('updated', 0)} updated, "
              f"{last.get('removed', 0)} removed, {last.get('unchanged', 0)} unchanged, {last.get('excluded', 0)} excluded, "
              f"{last.get('failed', 0)} failed" + (f"; crawl: {crawl.get('requests', 0)} requests, "
                                                   f"{'complete' if crawl.get('complete') else 'INCOMPLETE: ' + str(crawl.get('aborted_reason'))}"
                                                   if crawl else ""))
        excluded = last.get("excluded_items") or []
        if excluded:
            print(f"  excluded ({last.get('excluded', len(excluded))}" + (", first shown" if last.get("excluded", 0) > len(excluded) else "") + "):")
            for item in excluded:
                print(f"    {item['path']}: {item['reason']}")
    else:
        print("  last sync: never (run `groundwork sync " + str(detail["name"]) + "`)")
    if detail.get("resync_needed"):
        print("  re-sync needed: the options changed since the last sync")
    failures = detail.get("open_failures") or []
    if failures:
        print(f"  open failures ({len(failures)}):")
        print(format_table(failures, ["failure_id", "path", "stage", "kind", "reason"], 70))


def cmd_sources(args: argparse.Namespace) -> int:
    settings = _settings(args)
    action = args.sources_command
    if action == "add":
        if bool(args.url) == bool(args.folder):
            print("error: give exactly one of --url URL or --folder DIR", file=sys.stderr)
            return 2
        options = _web_options(args)
        if args.folder and options:
            print(f"error: crawl options ({', '.join(sorted(options))}) apply to --url sources only", file=sys.stderr)
            return 2
        check_renderer(settings, options)
        with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
            source = add_source(conn, args.name, "web" if args.url else "folder", args.url or args.folder, options,
                                enabled=not args.disabled, visibility=args.visibility)
        if args.json:
            print(json.dumps(source.as_dict(), indent=2, default=str))
        else:
            print(f"added source {source.name} ({source.kind}): {source.location}")
            print(f"visibility: {source.visibility}" + (" (only callers with the admin token are answered from it)"
                                                        if source.visibility == "internal" else
                                                        " (the widget and callers without the admin token may cite it)"))
            print(f"run `groundwork sync {source.name}` to index it (or pick partition '{source.name}' of the "
                  "sync_source job in Dagster)")
        return 0
    if action == "list":
        with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
            configured = {s.source_id for s in register_configured_sources(conn, settings)}
            sources = list_sources(conn, include_deleted=args.all)
            rows = []
            for source in sources:
                stats = source_statistics(conn, source.source_id)
                # registered from the settings, which do not name it now: kept as indexed, not synced
                detached = source.origin == "settings" and source.source_id not in configured
                rows.append({**source.as_dict(), **stats, "configured": not detached})
        if args.json:
            print(json.dumps(rows, indent=2, default=str))
            return 0
        for row in rows:
            row["state"] = ("deleted" if row["deleted_at"] else "not configured" if not row["configured"]
                            else "enabled" if row["enabled"] else "disabled")
            row["resync"] = "needed" if row["resync_needed"] else ""
        print(format_table(rows, ["name", "kind", "state", "visibility", "location", "documents", "chunks",
                                  "open_failures", "last_synced_at", "resync"], 50))
        if any(not row["configured"] and not row["deleted_at"] for row in rows):
            print("\n'not configured': folders GROUNDWORK_SOURCES no longer names; what they indexed stays searchable "
                  "but is not synced - `groundwork sources delete NAME` removes it")
        return 0
    if action == "show":
        detail = describe_source(settings, args.name)
        if args.json:
            print(json.dumps(detail, indent=2, default=str))
        else:
            _print_source(detail)
        return 0
    if action == "update":
        changes = _web_options(args)
        if args.enable and args.disable:
            print("error: --enable and --disable contradict each other", file=sys.stderr)
            return 2
        if args.enable or args.disable:
            changes["enabled"] = bool(args.enable)
        if args.rename:
            changes["name"] = args.rename
        if args.visibility:
            changes["visibility"] = args.visibility
        if not changes:
            print("error: nothing to update (see `groundwork sources update --help`)", file=sys.stderr)
            return 2
        source, changed, resync, published = update_source_now(settings, args.name, changes)
        if args.json:
            print(json.dumps({**source.as_dict(), "changed": changed, "resync_needed_now": resync,
                              "snapshot_version": published}, indent=2, default=str))
        else:
            print(f"updated {source.name}: {', '.join(changed) or 'nothing changed'}")
            if published is not None:
                print(f"now {source.visibility}: snapshot {published} published")
            if resync:
                print(f"re-sync needed: run `groundwork sync {source.name}` to apply the new rules "
                      "(the index keeps the current pages until then)")
        return 0
    if action == "delete":
        result = delete_source_now(settings, args.name)
        if args.json:
            print(json.dumps(result, indent=2, default=str))
        else:
            print(f"deleted source {args.name}: {result['documents_deleted']} documents removed from the index "
                  f"(snapshot {result['snapshot_version']}, {result['chunks_indexed']} chunks); "
                  f"purged after {result['purge_after_days']:g} days")
        return 0
    raise AssertionError(action)


def cmd_sync(args: argparse.Namespace) -> int:
    """Re-sync one source: the Dagster ``sync_source`` job for that partition, headless."""
    settings = _settings(args)
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        register_configured_sources(conn, settings)
        source = get_source(conn, args.name)  # SourceNotFoundError lists the known names
    if not source.enabled:
        print(f"error: source {source.name!r} is disabled; `groundwork sources update {source.name} --enable` first",
              file=sys.stderr)
        return 2
    started = time.perf_counter()
    outcome = run_dagster_job(
        SYNC_SOURCE_JOB_NAME, settings, tags={"groundwork/trigger": "cli", "groundwork/job": "ingest"},
        run_config={"loggers": {"console": {"config": {"log_level": "INFO" if args.verbose else "WARNING"}}},
                    "ops": {"source_sync": {"config": {"refresh": bool(args.refresh)}}}},
        partitions=(SOURCE_PARTITIONS_NAME, source.name))
    seconds = time.perf_counter() - started
    if not outcome.success:
        if args.json:
            print(json.dumps({"success": False, "source": source.name, "error": outcome.error,
                              "dagster_run_id": outcome.run_id}, indent=2))
        else:
            print(f"sync {source.name} FAILED (dagster run {outcome.run_id}): {outcome.error}", file=sys.stderr)
        return 1
    with store_connection(settings.store_path, read_only=True) as conn:
        run = get_sync_run(conn, outcome.run_id)
    detail = describe_source(settings, source.name)
    per_source = (run.get("details") or {}).get("per_source", {}).get(source.source_id, {})
    last = detail.get("last_sync") or {}
    report = {
        "success": True, "source": source.name, "kind": source.kind, "dagster_run_id": outcome.run_id,
        "summary": run["summary"],
        **{k: run[k] for k in ("added", "updated", "removed", "unchanged", "excluded", "failed")},
        "seen": per_source.get("seen", 0),
        "snapshot_version": run["snapshot_version"], "chunks_created": run["chunks_created"],
        "embeddings_computed": run["embeddings_computed"], "embeddings_reused": run["embeddings_reused"],
        "documents": detail["statistics"]["documents"], "chunks": detail["statistics"]["chunks"],
        "crawl": last.get("crawl"), "open_failures": detail["open_failures"], "seconds": round(seconds, 2),
    }
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"sync {source.name}: {run['summary']}")
    crawl = report["crawl"]
    if crawl:
        print(f"crawl: {crawl.get('requests', 0)} requests, {crawl.get('fetched', 0)} fetched, "
              f"{crawl.get('not_modified', 0)} not modified, {crawl.get('excluded', 0)} excluded, "
              f"{crawl.get('failed', 0)} failed" + ("" if crawl.get("complete") else f"; INCOMPLETE: {crawl.get('aborted_reason')}"))
    print(f"{source.name} now: {report['documents']} documents, {report['chunks']} chunks; index snapshot "
          f"{report['snapshot_version']}; {run['embeddings_computed']} embeddings computed; {seconds:.1f} s")
    if report["open_failures"]:
        print(f"\nopen failures ({len(report['open_failures'])}), retry one with `groundwork failures retry ID`:")
        print(format_table(report["open_failures"], ["failure_id", "path", "kind", "reason"], 70))
    return 0


def cmd_failures(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.failures_command == "retry":
        outcome = retry_failure(settings, args.failure_id)
        if args.json:
            print(json.dumps(outcome, indent=2, default=str))
        else:
            state = "resolved" if outcome["resolved"] else f"still failing: {outcome['still_failing']['reason']}"
            print(f"retried {outcome['path']} ({outcome['stage']}): {state}; sync: {outcome['summary']}; "
                  f"snapshot {outcome['snapshot_version']}; {outcome['seconds']} s")
        return 0 if outcome["resolved"] else 1
    with store_connection(settings.store_path, read_only=True, timeout_s=settings.lock_timeout_s) as conn:
        failures = open_failures(conn)
    if args.json:
        print(json.dumps(failures, indent=2, default=str))
    else:
        print(format_table(failures, ["failure_id", "path", "stage", "kind", "reason", "last_seen_at"], 70))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    settings = _settings(args)
    status = store_status(settings, include_history=args.history, needs_review=args.needs_review)
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    counts = status["counts"]
    snapshot = status["index_snapshot"]
    print(f"data dir: {status['data_dir']}")
    print("\nsources:")
    print(format_table(status["sources"], ["name", "kind", "location", "active_documents", "last_synced_at"], 60))
    print("\ndocuments needing review (low-confidence OCR regions):" if args.needs_review else "\ndocuments:")
    print(format_table(status["documents"], ["title", "relative_path", "version", "status", "doc_type", "page_count", "chunks"]
                       + (["low_confidence_regions"] if args.needs_review else []), 40))
    print(
        f"\ncounts: {counts['active_documents']} active documents, {counts['pending_versions']} pending, "
        f"{counts['superseded_versions']} superseded, {counts['deleted_documents']} deleted, "
        f"{counts['failed_versions']} failed; {counts['active_chunks']} active chunks "
        f"({counts['all_chunks']} stored), {counts['embeddings']} embeddings; {counts['needs_review_documents']} "
        f"need review ({counts['low_confidence_regions']} low-confidence OCR regions: `groundwork status --needs-review`)"
    )
    if snapshot:
        print(
            f"index: snapshot {snapshot['snapshot_version']} ({snapshot['file']}), {snapshot['document_count']} documents, "
            f"{snapshot['chunk_count']} chunks, published {snapshot['created_at']}"
        )
    else:
        print("index: not published yet (run `groundwork ingest`)")
    vectors = status["chunk_vectors"]
    if vectors["model_id"]:
        print(f"chunk vectors: {vectors['model_id']} (bare-text share {vectors['bare_vector_weight']:g})" + (
            f"; GROUNDWORK_BARE_VECTOR_WEIGHT is {vectors['configured_bare_vector_weight']:g}: the next sync "
            "re-embeds every chunk before the index switches" if vectors["re_embed_pending"] else ""))
        how = {"in_context": "pooled from their chunks' pass", "separate": "each embedded on its own"}
        print("sentence vectors: " + (
            f"in the index ({how.get(vectors['sentence_encoding'], vectors['sentence_encoding'])}), sentence "
            f"evidence weight {vectors['sentence_weight']:g}"
            + ("" if vectors["sentence_evidence"] else " (off: GROUNDWORK_SENTENCE_WEIGHT=0)")
            + (f"; GROUNDWORK_SENTENCE_ENCODING is {vectors['configured_sentence_encoding']}: the next sync "
               "re-embeds every chunk before the index switches" if vectors["sentence_re_embed_pending"] else "")
            if vectors["sentence_vectors"] else
            "not in the index yet: the next sync embeds them (GROUNDWORK_SENTENCE_VECTORS)"
            if vectors["sentence_vectors_pending"] else "off (GROUNDWORK_SENTENCE_VECTORS=false)"))
    model = status["embedding_model"]
    last = model["last_decision"]
    print(f"embedding model: {model['embedding_model']} ({model['dimensions']} dimensions, chunks of at most "
          f"{model['max_chunk_tokens']} word-pieces), vectors {model['served_model_id'] or model['base_model_id']}"
          + (f" (fine-tuned for this corpus, adopted {model['adopted_at']})" if model["fine_tuned"] else " (base model)")
          + ("" if model["finetune_enabled"] else "; fine-tuning off (GROUNDWORK_FINETUNE_EMBEDDER=false)"))
    _print_graphs(model["graphs"])
    if last:
        print(f"last fine-tuning: {last['created_at']}: {last['reason']}")
    ranking = status["ranking"]
    tuned = ranking["tuned"]
    print(f"ranking: {ranking['effective']}" + (
        f" (self-tuned {tuned['created_at']}: pseudo-query nDCG@10 {tuned['before']['ndcg@10']:.3f} -> "
        f"{tuned['after']['ndcg@10']:.3f})" if tuned else " (not self-tuned: `groundwork tune`)"))
    adapter = ranking["query_adapter"]
    if adapter is None:
        print("query adapter: none (`groundwork adapt` learns one from thumbs-up feedback)")
    elif adapter.get("error"):
        print(f"query adapter: not in use - {adapter['error']}")
    else:
        decision = adapter.get("decision") or {}  # the cross-validated paired gain, when the file records it
        print(f"query adapter: trained {adapter['trained_at']} on {adapter['rated_queries']} rated queries; held-out "
              f"nDCG@10 {adapter['held_out_without']['ndcg@10']:.3f} -> {adapter['held_out_with']['ndcg@10']:.3f}"
              + (f" (paired gain {decision['gain']:+.3f} ± {decision['standard_error']:.3f}, {adapter.get('folds')}-fold)"
                 if "gain" in decision else "")
              + ("" if adapter["in_use"] else " (not in use: GROUNDWORK_USE_QUERY_ADAPTER is false)"))
    learning = status["feedback_learning"]
    decision = learning["last_decision"]
    print("learning from feedback: " + (
        f"on (the query adapter is retrained every {learning['retrain_votes']} new thumbs-up, checked every "
        f"{learning['check_interval_s']:g} s)" if learning["enabled"] else "off (GROUNDWORK_LEARN_FROM_FEEDBACK=false)")
        + (f"; last decision {decision.get('decided_at', '')}: {decision.get('decision', '')} - {decision.get('reason', '')}"
           if decision else "; no decision yet"))
    if status["last_sync"]:
        last = status["last_sync"]
        if last.get("interrupted_reason"):
            print(f"last sync: interrupted - started at {last['started_at']}, stopped before it finished: "
                  f"{last['interrupted_reason']}")
        elif last["status"] == "running":
            where = f" by process {last['pid']} on {last['hostname']}" if last.get("pid") else ""
            print(f"last sync: running since {last['started_at']}{where} (in progress)")
        else:
            print(f"last sync: {last['status']} at {last['started_at']}: {last['summary'] or '(no summary)'}")
    for failure in status.get("recent_run_failures", []):
        print(f"FAILED RUN {failure['at']}: job {failure['job']} ({failure['run_id'][:8]}) in {', '.join(failure['steps']) or 'setup'}: {failure['error'][:200]}")
    print(f"\ningestion failures ({len(status['ingestion_failures'])} open):")
    print(format_table(status["ingestion_failures"], ["path", "stage", "kind", "reason", "last_seen_at"], 80))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``groundwork export --llamaindex PATH``: the served snapshot as a DuckDBVectorStore file."""
    from knowledge_store.retrieval.llama_export import export_llamaindex  # noqa: PLC0415 - LlamaIndex, ~1.5 s

    settings = _settings(args)
    engine = RetrievalEngine(settings)
    snapshot = engine.snapshots.current()
    written = export_llamaindex(snapshot, args.llamaindex, overwrite=args.overwrite)
    print(f"wrote {written} chunks of snapshot {snapshot.info.snapshot_version} ({snapshot.info.model_id}) to "
          f"{args.llamaindex} (DuckDBVectorStore table 'documents')")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    settings = _settings(args)
    filters: dict[str, object] = {}
    if args.source:
        filters["sources"] = args.source
    if args.path:
        filters["paths"] = args.path
    if args.doc:
        filters["doc_ids"] = args.doc
    if args.meta:
        meta: dict[str, str] = {}
        for item in args.meta:
            if "=" not in item:
                print(f"error: --meta {item!r}: expected KEY=VALUE", file=sys.stderr)
                return 2
            key, value = item.split("=", 1)
            meta[key.strip()] = value.strip()
        filters["metadata"] = meta
    if args.include_superseded:
        filters["include_superseded"] = True
    engine = RetrievalEngine(settings)
    if (args.reranker or engine.default_reranker()) in engine.available_rerankers():
        engine.warm_up()  # model + snapshot load are start-up, not query latency
    # else the search fails at once naming the reranker (and logs the failure): no model load first
    response = engine.search(request=engine.request(
        args.query, k=args.k, alpha=args.alpha, fusion=args.fusion, section_weight=args.section_weight,
        lead_weight=args.lead_weight, reranker=args.reranker, filters=filters or None,
        min_relevance=args.min_relevance, answer="llm" if args.llm else ("none" if args.no_answer else "extractive"),
        client="cli",
    ))
    engine.query_log.flush(timeout_s=2.0)
    if args.json:
        print(json.dumps({
            "retrieval_request_id": response.retrieval_request_id,
            "results": [
                {"chunk_id": c.chunk_id, "doc_id": c.doc_id, "version": c.version, "title": c.title,
                 "section": c.section, "pages": c.pages, "snippet": c.snippet, "url": c.url, "score": c.score,
                 "bm25_score": c.bm25_score, "vector_score": c.vector_score, "relevance": c.relevance,
                 "rerank_score": c.rerank_score}
                for c in response.results
            ],
            "answer": response.answer.text if response.answer else None,
            "answer_confidence": response.answer.confidence if response.answer else None,
            "coverage": response.coverage,
            "reranker_status": response.reranker_status,
            "latency_ms": response.latency_ms,
            "snapshot_version": response.snapshot_version,
        }, indent=2))
        return 0
    if not response.results:
        print(f"{response.message or 'No relevant content found.'} (coverage: none, {response.latency_ms['total']:.0f} ms)")
        return 0
    rows = [
        {"#": c.n, "title": c.title, "section": c.section.split(" > ")[-1] if c.section else "",
         "pages": f"{c.pages[0]}-{c.pages[-1]}" if len(c.pages) > 1 else (str(c.pages[0]) if c.pages else ""),
         "score": f"{c.score:.3f}", "bm25": f"{c.bm25_score:.2f}", "vector": f"{c.vector_score:.2f}",
         "rel": f"{c.relevance:.2f}", "snippet": c.snippet}
        for c in response.results
    ]
    print(format_table(rows, ["#", "title", "section", "pages", "score", "bm25", "vector", "rel", "snippet"], 60))
    print()
    for c in response.results:
        print(f"[{c.n}] {c.url}")
    if response.answer:
        confidence = "" if response.answer.confidence is None else f", confidence {response.answer.confidence:.2f}"
        print(f"\nanswer ({response.answer.method}{confidence}): {response.answer.text}")
    lat = response.latency_ms
    print(
        f"\ncoverage: {response.coverage}; reranker: {response.reranker_status}; snapshot {response.snapshot_version}; "
        f"{lat['total']:.0f} ms (embed {lat['embed']:.0f}, bm25 {lat['bm25']:.0f}, vector {lat['vector']:.0f}, "
        f"fuse {lat['fuse']:.0f}, rerank {lat['rerank']:.0f}, format {lat['format']:.0f}); "
        f"request {response.retrieval_request_id}"
    )
    return 0


def cmd_sample_eval(args: argparse.Namespace) -> int:
    """``groundwork eval --sample``: the example questions on the served index, recorded for the Evaluation page."""
    done = evaluate_example_questions(_settings(args))
    m = done.served.metrics
    if args.json:
        print(json.dumps({"run_id": done.run_id, "dataset": SAMPLE_DATASET, "split": SAMPLE_SPLIT,
                          "queries": done.served.queries, "found_in_top5": done.found, "metrics": m,
                          "sweep": [{"alpha": p.alpha, **p.metrics} for p in done.sweep],
                          "questions": [{"query": q.query, "expected": q.expected, "found_rank": q.found_rank}
                                        for q in done.questions],
                          "seconds": done.seconds, "recorded_in": str(done.results_path)}, indent=2))
        return 0
    print(f"{SAMPLE_DATASET} ({done.served.queries} {SAMPLE_SPLIT}), served defaults: " + ", ".join(
        f"{metric_label(name)} {m[name]:.{metric_spec(name).digits}f}" for name in METRICS
        if metric_spec(name).headline and name in m))
    for q in done.questions:
        print(f"  {'#' + str(q.found_rank) if q.found_rank else 'not in top 5':>13}  {q.query}  ->  {q.expected}")
    best = max(done.sweep, key=lambda p: (p.metrics["ndcg@10"], -abs(p.alpha - 0.5)))
    print(f"alpha sweep ({len(done.sweep)} points): best nDCG@10 {best.metrics['ndcg@10']:.3f} at alpha {best.alpha:g}")
    print(f"recorded in {done.results_path} in {done.seconds:.1f} s (the console's Evaluation page shows it)")
    return 0


def cmd_suite_eval(args: argparse.Namespace) -> int:
    """``groundwork eval --suite evals/suites/<name>.yaml``: every set and configuration of the suite, recorded and
    gated against the suite's baseline (exit 1 naming each set, configuration and metric that dropped)."""
    suite = load_suite(args.suite)  # SuiteError names the file and field of a bad suite before anything runs
    result = run_suite(suite, _settings(args), ingest=not args.no_ingest,
                       log=(lambda line: None) if args.json else (lambda line: print(line, flush=True)))
    if args.write_baseline:
        write_baseline(result.baseline_path, result.figures(), suite.metrics,
                       about="groundwork eval --suite --write-baseline; gate: evals/suites/*.yaml")
    if args.json:
        print(json.dumps(describe(result), indent=2))
    else:
        columns = list(suite.metrics)
        rows = [{"set": r.set, "configuration": r.configuration, "queries": r.queries,
                 **{metric_label_or_name(m): (f"{r.metrics[m]:.4f}" if m in r.metrics else "n/a") for m in columns}}
                for r in result.rows]
        print(format_table(rows, ["set", "configuration", "queries", *(metric_label_or_name(m) for m in columns)], 60))
        for skip in result.skipped:
            print(f"{skip['set']}: not evaluated: {skip['reason']}")
        if result.recorded_in:
            print(f"recorded in {result.recorded_in} (the console's Evaluation page reads it)")
        if args.write_baseline:
            print(f"baseline written: {result.baseline_path}")
        gate = suite.gate
        print(f"gate: {gate.metric} may fall by at most {gate.margin} against {result.baseline_path}: "
              + ("passed" if result.passed else "FAILED"))
        for failure in result.failures:
            print(f"  regression: {failure}")
    return 0 if result.passed or args.write_baseline else 1


def metric_label_or_name(name: str) -> str:
    return metric_label(name) if name in METRICS else name


def cmd_eval(args: argparse.Namespace) -> int:
    if args.suite:
        if args.sample or args.dataset:
            raise ConfigError("eval", args.suite, "--suite runs the suite's own sets: give no folder and no --sample")
        return cmd_suite_eval(args)
    if args.sample == bool(args.dataset):
        raise ConfigError("eval", args.dataset, "give a BEIR folder, --sample (the sample corpus's example "
                                                "questions) or --suite evals/suites/<name>.yaml, exactly one of them")
    if args.sample:
        return cmd_sample_eval(args)
    # every registered metric (knowledge_store.evaluation.metrics.METRICS, what the scorecard records), plus nDCG and MRR at --k
    ks = tuple(sorted({5, 10, args.k}))
    # alpha None = the engine's own per-query default: questions get the corpus's question alpha
    evaluation = evaluate_dataset(Path(args.dataset), args.split, alpha=args.alpha, fusion=args.fusion,
                                  reranker=args.reranker, ks=ks)
    recorded = _record_eval(evaluation)
    report = {**evaluation.to_dict(), "k": args.k, "recorded_in": str(recorded)}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    m, base, config = evaluation.result.metrics, evaluation.base_metrics, evaluation.config
    columns = [*METRICS, *(name for name in (f"ndcg@{args.k}", f"mrr@{args.k}") if name not in METRICS)]
    alphas = f"alpha {report['alpha']:g}" + (f", questions {report['question_alpha']:g}"
                                              if report["question_alpha"] is not None else "")
    print(f"{evaluation.dataset.name} ({args.split}, {report['queries']} queries), {config.label} ({alphas}), "
          f"fusion {config.fusion}")
    unavailable = evaluation.result.unavailable

    def shown(figures: dict[str, float], name: str) -> str:  # n/a: not applicable; failed: see the reasons below
        if name in figures:
            return f"{figures[name]:.{metric_spec(name).digits}f}"
        return "n/a" if unavailable.get(name, {}).get("status") == "not_applicable" else "failed"

    rows = [{"model": f"base {evaluation.base_model_id}", **{metric_label(n): shown(base, n) for n in columns}}
            ] if base is not None else []
    rows.append({"model": ("fine-tuned " if base is not None else "") + evaluation.model_id,
                 **{metric_label(name): shown(m, name) for name in columns}})
    print(format_table(rows, ["model", *(metric_label(name) for name in columns)], 60))
    for name, note in unavailable.items():
        print(f"{metric_label(name)}: {'not applicable' if note['status'] == 'not_applicable' else 'failed'}: "
              f"{note['reason']}")
    if evaluation.result.judge_model:
        print(f"answers written by the configured endpoint; judged by {evaluation.result.judge_model} "
              f"(RAGAS {evaluation.result.ragas_version})")
    if evaluation.finetune:
        print(f"fine-tuning: {evaluation.finetune.get('reason')}")
    print(f"store: {evaluation.store} (re-used while corpus.jsonl is unchanged)")
    print(f"recorded in {recorded} (the console's Evaluation page and the scorecard read it)")
    return 0


def _record_eval(evaluation) -> os.PathLike:
    """Append this run to the evaluation results the Dagster assets write (``knowledge_store.evaluation.results_store``),
    as configuration ``<label> (groundwork eval)``; returns the results file."""
    path = results_path(Settings().data_dir)
    record_eval_results(path, [evaluation.run_record(f"cli-{uuid.uuid4().hex[:12]}", utcnow(),
                                                     configuration=f"{evaluation.config.label} (groundwork eval)")])
    return path


def _ranking_row(label: str, scores: dict[str, object]) -> dict[str, object]:
    params = scores["params"]
    return {"": label, "alpha": f"{params['alpha']:g}", "fusion": params["fusion"],
            "section": f"{params['section_weight']:g}", "lead": f"{params['lead_weight']:g}",
            "nDCG@10": f"{scores['ndcg@10']:.3f}", "Recall@5": f"{scores['recall@5']:.3f}"}


def cmd_tune(args: argparse.Namespace) -> int:
    """Self-tune the ranking of the configured store (``knowledge_store.learning.tuning``) or forget the tuned choice."""
    settings = _settings(args)
    path = tuned_path(settings.index_dir)
    if args.reset:
        builtin = builtin_ranking(settings)
        removed = reset_ranking(settings.index_dir)  # the tuned and the console-set ranking both go
        if args.json:
            print(json.dumps({"reset": True, "removed": removed, "path": str(path), "ranking": builtin.to_dict()}, indent=2))
        elif removed:
            print(f"removed {path}: ranking back to the built-in defaults ({builtin.label})")
        else:
            print(f"no tuned ranking at {path}: already on the built-in defaults ({builtin.label})")
        return 0
    # IndexNotBuiltError and TuningError are GroundworkErrors: main() prints them on one line, exit code 2
    try:
        tuned = tune_corpus(settings, feedback=None, limit=args.limit, save=not args.dry_run)
    except TuningError as error:
        needed = inspect.signature(tune_snapshot).parameters["min_queries"].default
        if args.limit < needed:
            raise TuningError(f"{error} (--limit {args.limit} is below the {needed} pseudo-queries tuning needs)") from error
        raise
    if args.json:
        print(json.dumps(tuned.to_dict(), indent=2))
        return 0
    counts = tuned.pseudo_queries
    kinds = [k for k in PSEUDO_QUERY_KINDS if k in counts] + sorted(k for k in counts if k not in PSEUDO_QUERY_KINDS)
    print(f"self-tuned ranking for {settings.data_dir} (index snapshot {tuned.snapshot_version}), {tuned.seconds:.1f} s")
    print(f"pseudo-queries: {sum(counts.values())} (" + ", ".join(f"{k} {counts[k]}" for k in kinds) + ")")
    before, after = tuned.before, tuned.after
    delta = {"": "change", "nDCG@10": f"{after['ndcg@10'] - before['ndcg@10']:+.3f}",
             "Recall@5": f"{after['recall@5'] - before['recall@5']:+.3f}"}
    columns = ["", "alpha", "fusion", "section", "lead", "nDCG@10", "Recall@5"]
    print()
    print(format_table([_ranking_row("built-in", before), _ranking_row("chosen", after), delta], columns))
    if tuned.decision:
        print(tuned.decision["reason"])
    print(f"\ntop {min(5, len(tuned.table))} of {len(tuned.table)} configurations:")
    top = [{"#": i, "alpha": f"{r['alpha']:g}", "fusion": r["fusion"], "section": f"{r['section_weight']:g}",
            "lead": f"{r['lead_weight']:g}", "nDCG@10": f"{r['ndcg@10']:.3f}", "Recall@5": f"{r['recall@5']:.3f}",
            "nDCG@10 by kind": ", ".join(f"{k} {v:.3f}" for k, v in r.get("ndcg@10_by_kind", {}).items())}
           for i, r in enumerate(tuned.table[:5], 1)]
    print(format_table(top, ["#", "alpha", "fusion", "section", "lead", "nDCG@10", "Recall@5", "nDCG@10 by kind"], 80))
    print()
    if args.dry_run:
        print(f"dry run: nothing saved ({path} {'unchanged' if path.exists() else 'not written'})")
        return 0
    print(f"saved to {path}: queries that do not set alpha, fusion, section_weight or lead_weight now use the chosen "
          "values (the server picks them up without a restart); `groundwork tune --reset` goes back to the built-in defaults")
    explicit = [name for name, source in ranking_sources(settings, settings.index_dir).items() if source == "setting"]
    if explicit:
        print(f"note: {', '.join(explicit)} set explicitly (environment or .env): the setting wins over the tuned value")
    if not settings.use_tuned_ranking:
        print("note: GROUNDWORK_USE_TUNED_RANKING is false: the tuned values are stored but not used")
    return 0


def cmd_adapt_embedder(args: argparse.Namespace) -> int:
    """Fine-tune the embedding model on the corpus and adopt it only when it helps (``learning.finetune``), or
    roll back to the base model."""
    settings = _settings(args)
    if args.rollback:
        result = rollback(settings)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"serving the base model {result['model_id']} again: snapshot {result['snapshot_version']} "
                  f"({result['chunks']} chunks)" + (f", rolled back from {result['rolled_back_from']}"
                                                    if result["rolled_back_from"] else ""))
        return 0
    decision = finetune_corpus(settings, budget_s=args.budget, force=args.force,
                               log=None if args.json else lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(decision.to_dict(), indent=2, default=str))
        return 0
    print(f"fine-tuning for {settings.data_dir}: {decision.pairs} training pairs {decision.pair_kinds}, "
          f"{decision.held_out} held-out pseudo-queries, {decision.seconds:.0f} s "
          f"({', '.join(f'{k} {v:.0f} s' for k, v in decision.seconds_by_stage.items())})")
    if decision.before:
        rows = [{"": "served " + decision.served_model_id, **{k: f"{v:.4f}" for k, v in decision.before.items()}},
                {"": "fine-tuned " + str(decision.candidate_model_id), **{k: f"{v:.4f}" for k, v in decision.after.items()}}]
        print()
        print(format_table(rows, ["", "ndcg@10", "recall@5"], 70))
        print()
    print(decision.reason)
    memory = decision.memory
    if memory.get("peak_mb_after_training") is not None:
        print(f"memory: this process peaked at {memory['peak_mb_after_training'] / 1024:.2f} GB while training "
              f"(estimated {memory['estimate_mb'] / 1024:.2f} GB, GROUNDWORK_FINETUNE_MEMORY_GB "
              f"{memory['budget_mb'] / 1024:g}; {decision.peak_rss_mb / 1024:.2f} GB over the whole run)")
        later = [f"{memory[key] / 1024:.2f} GB after {stage}" for key, stage in (
            ("peak_mb_after_reembedding", "re-embedding"), ("peak_mb_after_decision", "the decision"))
            if memory.get(key) is not None]
        if later:
            print(f"memory: the peak so far was {', '.join(later)}")
    if decision.decision == "adopted":
        print(f"snapshot {decision.snapshot_version} serves {decision.candidate_model_id}; "
              "`groundwork adapt --embedder --rollback` serves the base model again")
    return 0


def cmd_adapt(args: argparse.Namespace) -> int:
    """Learn the corpus's query adapter from its thumbs-up feedback (``retrieval.query_adapter``) or remove it."""
    if args.embedder or args.rollback:
        if args.labels or args.reset or args.dry_run:
            print("error: --embedder fine-tunes the embedding model; --labels, --reset and --dry-run are the query "
                  "adapter's", file=sys.stderr)
            return 2
        return cmd_adapt_embedder(args)

    settings = _settings(args)
    path = adapter_path(settings.index_dir)
    if args.reset and args.labels:
        raise QueryAdapterError("--labels trains an adapter and --reset removes it: use one of them")
    if args.reset:
        removed = reset_adapter(settings.index_dir)
        if args.json:
            print(json.dumps({"reset": True, "removed": removed, "path": str(path)}, indent=2))
        else:
            print(f"removed {path}: queries use the model's vectors as they are" if removed
                  else f"no query adapter at {path}: nothing to remove")
        return 0
    # IndexNotBuiltError and QueryAdapterError are GroundworkErrors: main() prints them on one line, exit code 2
    labels = read_labels(args.labels) if args.labels else None
    training = adapt_corpus(settings, save=not args.dry_run, labels=labels, trigger="labels" if labels else "cli")
    if args.json:
        print(json.dumps(training.to_dict(), indent=2))
        return 0
    print(f"query adapter for {settings.data_dir}: {training.rated_queries} rated queries, each held out once "
          f"(cross-validated), {training.seconds:.1f} s")
    if labels:
        print(f"labels: {training.labels_used} of {len(labels)} used as thumbs-up"
              + (f"; {len(training.labels_unmatched)} name no indexed document (first: line "
                 f"{training.labels_unmatched[0]['line']}, {training.labels_unmatched[0]['document']!r})"
                 if training.labels_unmatched else ""))
    rows = [{"": "no adapter", "l2": "", "nDCG@10": f"{training.without['ndcg@10']:.3f}",
             "Recall@5": f"{training.without['recall@5']:.3f}"}]
    rows += [{"": "adapter", "l2": f"{r['l2']:g}", "nDCG@10": f"{r['ndcg@10']:.3f}", "Recall@5": f"{r['recall@5']:.3f}"}
             for r in training.table]
    print()
    print(format_table(rows, ["", "l2", "nDCG@10", "Recall@5"]))
    print()
    print(training.reason)
    if args.dry_run:
        print(f"dry run: nothing saved ({path} {'unchanged' if path.exists() else 'not written'})")
    elif training.adapter is not None:
        print(f"saved to {path}: every query vector now goes through it (the server picks it up without a restart); "
              "`groundwork adapt --reset` removes it")
        if not settings.use_query_adapter:
            print("note: GROUNDWORK_USE_QUERY_ADAPTER is false: the adapter is stored but not used")
    return 0


def cmd_notebook(args: argparse.Namespace) -> int:
    parameters = {key: parse_value(value) for key, value in (args.parameter or [])}
    run = run_notebook(args.name, parameters, _settings(args))
    print(f"executed {args.name} in {run.seconds:.0f} s")
    print(f"notebook: {run.output_notebook}")
    for path in run.plots + run.tables:
        print(f"output:   {path}")
    if run.summary:
        print(f"summary:  {json.dumps(run.summary)}")
    return 0


def _options_to_environment(args: argparse.Namespace) -> None:
    """Put the command's setting options into this process's environment (``GROUNDWORK_*``), for the processes
    it starts; the settings are checked first, so a bad value is one ``error:`` line."""
    _settings(args)
    os.environ.update({f"GROUNDWORK_{setting.upper()}": str(getattr(args, arg))
                       for arg, setting in _ARG_SETTINGS.items() if getattr(args, arg, None)})


def _launch_server(args: argparse.Namespace, command: str) -> int:
    """Become ``python -m knowledge_store.server COMMAND`` with this command's options in the environment: the
    settings are checked here first (a bad value is one ``error:`` line), then the process is replaced, so the
    server keeps this process's id, signals and standard streams (MCP over stdio speaks on them)."""
    _options_to_environment(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "knowledge_store.server", command])
    return 0  # not reached


def cmd_serve(args: argparse.Namespace) -> int:
    return _launch_server(args, "serve")


def cmd_mcp(args: argparse.Namespace) -> int:
    return _launch_server(args, "mcp")


def cmd_models(args: argparse.Namespace) -> int:
    """``prepare``: build the configured model's graphs in the per-user cache and check them on this CPU (what
    ``make install`` runs); ``status``: what is known of them without building anything."""
    settings = Settings(**({"embedding_model": args.model} if args.model else {}))
    if args.models_command == "prepare":
        start = time.perf_counter()
        decisions = prepare_embedders(settings, on_phase=lambda state: print(f"{settings.embedding_model}: {state}",
                                                                             file=sys.stderr, flush=True))
        report = {"model": settings.embedding_model, "seconds": round(time.perf_counter() - start, 1),
                  **{purpose: decision.to_dict() for purpose, decision in decisions.items()},
                  **{k: v for k, v in graph_status(settings).items() if k in ("cache_dir", "cpu")}}
    else:
        report = {"model": settings.embedding_model, **graph_status(settings)}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"model {report['model']}")
    _print_graphs(report)
    return 0


def _print_graphs(graphs: dict) -> None:
    """Which graph embeds documents and queries on this CPU, and why (``models.embeddings.graph_status``)."""
    print(f"model graphs on {graphs['cpu']} (cache {graphs['cache_dir']}):")
    for purpose in ("documents", "queries"):
        decision = graphs[purpose]
        running = {"none": "fp32", None: "not known yet"}.get(decision["in_effect"], decision["in_effect"])
        print(f"  {purpose}: {running} (asked for {decision['requested']}): {decision['reason']}")


def cmd_run(args: argparse.Namespace) -> int:
    """``groundwork serve`` and ``dagster dev`` side by side, stopped together (``app.launcher``): what
    ``make run`` starts.  The options reach both through the environment (the Dagster project reads the data
    dir from it too)."""
    if not args.stop_timeout > 0:  # NaN too
        raise ConfigError("--stop-timeout", args.stop_timeout, "must be more than 0 seconds")
    commands = workbench_commands(Path(args.workspace), args.dagster_host, args.dagster_port)
    if args.data_dir:  # absolute: every process they start reads the same folder, whatever its working directory
        args.data_dir = str(Path(args.data_dir).resolve())
    _options_to_environment(args)
    return run_together(commands, args.stop_timeout)


def cmd_sample_corpus(args: argparse.Namespace) -> int:
    paths = write_sample_corpus(Path(args.target))
    for path in paths:
        print(path)
    return 0


_FUSION_HELP = "how BM25 and vector scores are combined (default: the tuned value or GROUNDWORK_DEFAULT_FUSION)"
_RERANKER_HELP = "how the fused candidates are reordered (default: the console's value or GROUNDWORK_DEFAULT_RERANKER)"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def cmd_logs_purge(args: argparse.Namespace) -> int:
    """Apply the query-log retention now (``storage.query_log.purge_query_log``)."""
    if args.older_than_days is not None and args.older_than_days < 0:
        raise ConfigError("--older-than-days", args.older_than_days, "must be 0 or more")
    settings = Settings()
    result = purge_query_log(settings, args.older_than_days)
    if args.json:
        print(json.dumps({**result.to_dict(), "log": str(settings.logs_path)}, indent=2))
    elif result.kept_everything:
        print(f"query-log retention is off (GROUNDWORK_QUERY_LOG_RETENTION_DAYS=0): nothing deleted, "
              f"{result.queries_left} queries kept in {settings.logs_path}")
    else:
        print(f"deleted {result.queries_deleted} queries logged before {result.cutoff} (older than {result.days:g} days) "
              f"and their feedback; {result.queries_left} left in {settings.logs_path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="groundwork", description="Groundwork: grounded retrieval with citations.")
    sub = parser.add_subparsers(dest="command", required=True)

    ingest = sub.add_parser("ingest", help="sync the sources and publish a new index snapshot")
    ingest.add_argument("--sources", nargs="+", metavar="DIR", help="folders to ingest (default: GROUNDWORK_SOURCES or the sample corpus)")
    ingest.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    ingest.add_argument("--json", action="store_true", help="machine-readable output")
    ingest.add_argument("--verbose", action="store_true", help="show Dagster's event log")
    ingest.set_defaults(func=cmd_ingest)

    sources = sub.add_parser("sources", help="add, list, show, update and delete sources (folders and web sites)")
    sources_sub = sources.add_subparsers(dest="sources_command", required=True)

    def web_flags(p: argparse.ArgumentParser, update: bool = False) -> None:
        p.add_argument("--depth", type=int, help="link hops followed from the base URL, 0-5 (default 2)")
        p.add_argument("--include", action="append", metavar="REGEX", help="only URLs matching (full URL, re.search); repeatable")
        p.add_argument("--exclude", action="append", metavar="REGEX", help="skip URLs matching; repeatable")
        p.add_argument("--max-pages", type=int, help="page cap (default 500)")
        p.add_argument("--requests-per-second", type=float, help="politeness limit per host (default 5)")
        p.add_argument("--llms-full-max-mb", type=float, help="size limit for llms-full.txt (default 10)")
        p.add_argument("--ignore-robots", dest="robots", action="store_false", default=None, help="do not obey robots.txt")
        p.add_argument("--no-llms-txt", dest="llms_txt", action="store_false", default=None, help="skip llms.txt / llms-full.txt")
        p.add_argument("--no-sitemap", dest="sitemap", action="store_false", default=None, help="skip sitemap.xml")
        p.add_argument("--render-js", dest="render_js", action="store_true", default=None,
                       help="render HTML pages in headless Chromium first (sites built by JavaScript; "
                            "GROUNDWORK_CHROMIUM_PATH, default /usr/bin/chromium)")
        if update:
            p.add_argument("--respect-robots", dest="robots", action="store_true", default=None)
            p.add_argument("--use-llms-txt", dest="llms_txt", action="store_true", default=None)
            p.add_argument("--use-sitemap", dest="sitemap", action="store_true", default=None)
            p.add_argument("--no-render-js", dest="render_js", action="store_false", default=None,
                           help="read pages as served, without running their scripts")
            p.add_argument("--clear-include", action="store_true", help="drop every include rule")
            p.add_argument("--clear-exclude", action="store_true", help="drop every exclude rule")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    s_add = sources_sub.add_parser("add", help="register a web site (--url) or a folder (--folder)")
    s_add.add_argument("name")
    s_add.add_argument("--url", help="base URL of a documentation site")
    s_add.add_argument("--folder", help="a folder of documents")
    s_add.add_argument("--disabled", action="store_true", help="register without syncing it")
    s_add.add_argument("--visibility", choices=VISIBILITIES, default="internal",
                       help="public: the widget and callers without the admin token may be answered from it "
                            "(default internal: admin callers only)")
    web_flags(s_add)
    common(s_add)
    s_list = sources_sub.add_parser("list", help="every source with counts and last sync")
    s_list.add_argument("--all", action="store_true", help="include deleted sources")
    common(s_list)
    s_show = sources_sub.add_parser("show", help="one source: options, counts, last sync, open failures")
    s_show.add_argument("name")
    common(s_show)
    s_update = sources_sub.add_parser("update", help="change options; says when a re-sync is needed")
    s_update.add_argument("name")
    s_update.add_argument("--rename", metavar="NEW_NAME")
    s_update.add_argument("--enable", action="store_true")
    s_update.add_argument("--disable", action="store_true")
    s_update.add_argument("--visibility", choices=VISIBILITIES, help="public or internal; applies at once (publishes a snapshot)")
    web_flags(s_update, update=True)
    common(s_update)
    s_delete = sources_sub.add_parser("delete", help="soft-delete a source: its chunks leave the index now, purged after retention")
    s_delete.add_argument("name")
    common(s_delete)
    sources.set_defaults(func=cmd_sources)

    sync = sub.add_parser("sync", help="re-sync one source now and publish the index")
    sync.add_argument("name")
    sync.add_argument("--verbose", action="store_true", help="show the run's log (crawl progress)")
    sync.add_argument("--refresh", action="store_true",
                      help="web: download every page again, ignoring sitemap <lastmod> and ETag/Last-Modified")
    common(sync)
    sync.set_defaults(func=cmd_sync)

    failures = sub.add_parser("failures", help="open ingestion failures; retry one")
    failures_sub = failures.add_subparsers(dest="failures_command")
    f_retry = failures_sub.add_parser("retry", help="run one failed item again (page fetch, parse, or its source's scan)")
    f_retry.add_argument("failure_id")
    common(f_retry)
    common(failures)
    failures.set_defaults(func=cmd_failures)

    status = sub.add_parser("status", help="sources, documents with versions, counts and failures")
    status.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    status.add_argument("--history", action="store_true", help="include superseded and deleted versions")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--needs-review", action="store_true",
                        help="list only documents with low-confidence OCR regions (GROUNDWORK_OCR_LOW_CONFIDENCE)")
    status.set_defaults(func=cmd_status)

    query = sub.add_parser("query", help="hybrid search with citations")
    query.add_argument("query")
    query.add_argument("--k", type=int, default=None, help="passages to return (default GROUNDWORK_DEFAULT_K)")
    query.add_argument("--alpha", type=float, default=None, help="0 = pure BM25, 1 = pure vector")
    query.add_argument("--fusion", choices=list(FUSION_MODES), default=None, help=_FUSION_HELP)
    query.add_argument("--section-weight", type=float, default=None,
                       help="0-1: share of the BM25 evidence taken from the chunk's whole section (default: tuned or settings)")
    query.add_argument("--lead-weight", type=float, default=None,
                       help="0-1: share of the vector evidence taken from the section's first chunk (default: tuned or settings)")
    query.add_argument("--reranker", choices=list(RERANKERS), default=None, help=_RERANKER_HELP)
    query.add_argument("--source", action="append", help="only this source (name or id); repeatable")
    query.add_argument("--path", action="append", help="only this file (path, relative path or glob); repeatable")
    query.add_argument("--doc", action="append", help="only this document id; repeatable")
    query.add_argument("--meta", action="append", metavar="KEY=VALUE", help="document metadata filter, e.g. product=aurora-hub")
    query.add_argument("--include-superseded", action="store_true", help="also search older versions")
    query.add_argument("--min-relevance", type=float, default=None, help="below this best relevance: no results")
    query.add_argument("--llm", action="store_true", help="generate the answer with the configured LLM endpoint")
    query.add_argument("--no-answer", action="store_true", help="passages only")
    query.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    query.add_argument("--json", action="store_true", help="machine-readable output")
    query.set_defaults(func=cmd_query)

    export = sub.add_parser("export", help="write the published index in another tool's format")
    export.add_argument("--llamaindex", metavar="PATH", required=True, type=Path,
                        help="a DuckDB file that LlamaIndex's DuckDBVectorStore opens (table 'documents')")
    export.add_argument("--overwrite", action="store_true", help="replace PATH if it exists")
    export.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    export.set_defaults(func=cmd_export)

    ev = sub.add_parser("eval", help="Recall@5, nDCG, MRR, P@5, RAGAS recall and context recall/precision, grounding, faithfulness and answer "
                        "relevancy (LLM answers) and latency on a BEIR-format folder, or (--sample) on the sample corpus's example questions")
    ev.add_argument("dataset", nargs="?", help="folder with corpus.jsonl, queries.jsonl, qrels.tsv")
    ev.add_argument("--sample", action="store_true", help="evaluate the sample corpus's example questions on the "
                    "index as it is (seconds; a scorecard row, an alpha sweep and each question's hits for the "
                    "console's Evaluation page)")
    ev.add_argument("--suite", help="an evaluation suite (evals/suites/<name>.yaml): its sets, configurations and "
                    "metrics, gated against its baseline (exit 1 when a gated metric drops beyond the margin)")
    ev.add_argument("--write-baseline", action="store_true", help="with --suite: write this run's figures into the "
                    "suite's baseline file (evals/baseline.json) instead of failing on a drop")
    ev.add_argument("--no-ingest", action="store_true", help="with --suite: use the sets' stores as they are")
    ev.add_argument("--data-dir", help="store location for --sample and --suite (default: GROUNDWORK_DATA_DIR or ./data)")
    ev.add_argument("--alpha", type=float, default=None, help="fusion weight (default: settings)")
    ev.add_argument("--fusion", choices=list(FUSION_MODES), default=None, help=_FUSION_HELP)
    ev.add_argument("--reranker", choices=list(RERANKERS), default=None, help=_RERANKER_HELP)
    ev.add_argument("--k", type=int, default=10, help="depth for nDCG and MRR (default 10)")
    ev.add_argument("--split", default="test", help="test (default) or train")
    ev.add_argument("--json", action="store_true", help="machine-readable output")
    ev.set_defaults(func=cmd_eval)

    tune = sub.add_parser("tune", help="self-tune the ranking on this corpus's headings, titles and FAQ questions")
    tune.add_argument("--limit", type=_positive_int, default=300, help="at most this many pseudo-queries (default 300)")
    tune_mode = tune.add_mutually_exclusive_group()
    tune_mode.add_argument("--dry-run", action="store_true", help="measure and show the choice without saving it")
    tune_mode.add_argument("--reset", action="store_true", help="delete the tuned choice: back to the built-in defaults")
    tune.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    tune.add_argument("--json", action="store_true", help="machine-readable output (the whole tuned configuration)")
    tune.set_defaults(func=cmd_tune)

    adapt = sub.add_parser("adapt", help="learn a query adapter from thumbs-up feedback (kept only if held-out rated queries rank better)")
    adapt_mode = adapt.add_mutually_exclusive_group()
    adapt_mode.add_argument("--dry-run", action="store_true", help="train and measure without saving")
    adapt_mode.add_argument("--reset", action="store_true", help="delete the stored adapter")
    adapt.add_argument("--labels", metavar="FILE", help="also learn from a labelled set: JSON lines "
                       '{"query": "...", "document": "<relative path>"} (each an up-vote on that document)')
    adapt.add_argument("--embedder", action="store_true", help="fine-tune the embedding model on this corpus (no "
                       "labels needed) and serve it only if held-out pseudo-queries rank clearly better")
    adapt.add_argument("--rollback", action="store_true", help="with --embedder: serve the base model again")
    adapt.add_argument("--budget", type=float, metavar="SECONDS",
                       help="with --embedder: training time (default GROUNDWORK_FINETUNE_BUDGET_S, 900)")
    adapt.add_argument("--force", action="store_true", help="with --embedder: train and decide again even when these "
                       "pairs were decided before")
    adapt.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    adapt.add_argument("--json", action="store_true", help="machine-readable output")
    adapt.set_defaults(func=cmd_adapt)

    nb = sub.add_parser("notebook", help="run a parameterised notebook (alpha_sweep, reranker_comparison) with papermill")
    nb.add_argument("name")
    nb.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("KEY", "VALUE"),
                    help="notebook parameter; VALUE is JSON when it parses (e.g. -p alphas '[0, 0.5, 1]')")
    nb.add_argument("--data-dir", help="where executed notebooks are kept (default: GROUNDWORK_DATA_DIR or ./data)")
    nb.set_defaults(func=cmd_notebook)

    serve = sub.add_parser("serve", help="start the HTTP API, console and MCP endpoint")
    serve.add_argument("--host", help="bind address (default GROUNDWORK_SERVER_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default GROUNDWORK_SERVER_PORT or 8080)")
    serve.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    serve.add_argument("--ssl-certfile", help="TLS certificate (PEM); with --ssl-keyfile (default GROUNDWORK_SSL_CERTFILE)")
    serve.add_argument("--ssl-keyfile", help="TLS private key (PEM); with --ssl-certfile (default GROUNDWORK_SSL_KEYFILE)")
    serve.set_defaults(func=cmd_serve)

    run = sub.add_parser("run", help="start the console/API (groundwork serve) and the Dagster UI (dagster dev) "
                                     "together; Ctrl-C, SIGTERM or SIGHUP stops both and everything they started")
    run.add_argument("--host", help="API bind address (default GROUNDWORK_SERVER_HOST or 127.0.0.1)")
    run.add_argument("--port", type=int, help="API port (default GROUNDWORK_SERVER_PORT or 8080)")
    run.add_argument("--data-dir", help="store location, for both (default: GROUNDWORK_DATA_DIR or ./data)")
    run.add_argument("--dagster-host", default="127.0.0.1", help="Dagster UI bind address (default 127.0.0.1)")
    run.add_argument("--dagster-port", type=int, default=3000, help="Dagster UI port (default 3000)")
    run.add_argument("--workspace", default="workspace.yaml", help="Dagster workspace file (default workspace.yaml)")
    run.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S, metavar="SECONDS",
                     help="after a stop, kill what is still running after this long (default %(default)g)")
    run.set_defaults(func=cmd_run)

    mcp = sub.add_parser("mcp", help="serve the MCP tools over stdio (for IDEs and agents)")
    mcp.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    mcp.set_defaults(func=cmd_mcp)

    logs = sub.add_parser("logs", help="the query log: purge queries older than the retention")
    logs_sub = logs.add_subparsers(dest="logs_command", required=True)
    purge = logs_sub.add_parser("purge", help="delete logged queries (and their feedback) older than the retention "
                                              "(GROUNDWORK_QUERY_LOG_RETENTION_DAYS) or --older-than-days")
    purge.add_argument("--older-than-days", type=float, default=None, metavar="DAYS",
                       help="delete queries older than this (0 = every query logged so far); default: the retention")
    purge.add_argument("--json", action="store_true")
    purge.set_defaults(func=cmd_logs_purge)

    models = sub.add_parser("models", help="the embedding model's ONNX graphs: build and check them on this CPU, or show them")
    models.add_argument("models_command", choices=("prepare", "status"),
                        help="prepare: export and quantise once per machine (per-user cache) and check the quantised "
                             "graph's fidelity on this CPU; status: what is known without building anything")
    models.add_argument("--model", help="a registry name or model folder (default: GROUNDWORK_EMBEDDING_MODEL)")
    models.add_argument("--json", action="store_true")
    models.set_defaults(func=cmd_models)

    sample = sub.add_parser("sample-corpus", help="write the generated sample documents to a folder")
    sample.add_argument("target")
    sample.set_defaults(func=cmd_sample_corpus)
    return parser


LONG_COMMANDS = frozenset({"ingest", "sync", "eval", "tune", "adapt"})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "command", None) in LONG_COMMANDS:
            # counts, rate and ETA of every stage on stderr: a bar on a terminal, periodic lines otherwise
            with terminal_progress():
                return int(args.func(args))
        return int(args.func(args))
    except GroundworkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # pydantic ValidationError for bad settings, etc.
        if type(error).__name__ == "ValidationError":
            print(f"error: invalid setting: {error}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
