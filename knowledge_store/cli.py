"""The ``groundwork`` command.

    groundwork ingest [--sources DIR ...] [--data-dir DIR] [--json]
    groundwork status [--data-dir DIR] [--json] [--history]
    groundwork query "TEXT" [--k 5] [--alpha 0.5] [--reranker mmr] [--path FILE] [--meta K=V] [--json]
    groundwork eval DATASET_DIR [--alpha A] [--reranker R] [--k 10] [--json]
    groundwork notebook alpha_sweep -p dataset DIR -p alphas '[0, 0.5, 1]'
    groundwork serve [--host 127.0.0.1] [--port 8080]
    groundwork mcp
    groundwork sample-corpus DIR

``ingest`` materialises the Dagster ingestion assets headless (the same assets
and checks the UI runs; recorded in ``$DAGSTER_HOME`` when it is set) and prints
the sync summary.  Exit codes: 0 ok, 1 a run or asset check failed, 2 bad usage
or a store problem.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from knowledge_store.errors import GroundworkError
from knowledge_store.settings import Settings


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


_ARG_SETTINGS = {"data_dir": "data_dir", "host": "server_host", "port": "server_port"}


def _settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment with the command's options on top."""
    overrides: dict[str, object] = {
        setting: getattr(args, arg) for arg, setting in _ARG_SETTINGS.items() if getattr(args, arg, None)
    }
    if getattr(args, "sources", None):
        overrides["sources"] = ":".join(args.sources)
    return Settings(**overrides)


def cmd_ingest(args: argparse.Namespace) -> int:
    import dagster as dg

    from knowledge_store.ingest.sync_runs import get_sync_run
    from knowledge_store.status import store_status
    from knowledge_store.store import store_connection
    from pipelines.definitions import INGEST_JOB_NAME, build_definitions
    from pipelines.resources import KnowledgeStoreResource

    settings = _settings(args)
    for folder in settings.sources:
        if not folder.expanduser().is_dir():
            print(f"error: --sources {folder}: not a folder", file=sys.stderr)
            return 2
    store = KnowledgeStoreResource(
        data_dir=str(settings.data_dir), sources=":".join(str(p) for p in settings.sources) or None
    )
    home = os.environ.get("DAGSTER_HOME")
    if home:  # record the run where `dagster dev` will show it
        os.makedirs(home, exist_ok=True)
        instance = dg.DagsterInstance.get()
    else:
        instance = dg.DagsterInstance.ephemeral()
    started = time.perf_counter()
    job = build_definitions(store=store).resolve_job_def(INGEST_JOB_NAME)
    result = job.execute_in_process(
        instance=instance,
        tags={"groundwork/trigger": "cli", "groundwork/job": "ingest"},
        run_config={"loggers": {"console": {"config": {"log_level": "DEBUG" if args.verbose else "WARNING"}}}},
        raise_on_error=False,
    )
    seconds = time.perf_counter() - started
    checks = {
        evaluation.check_name: evaluation.passed for evaluation in result.get_asset_check_evaluations()
    }
    stage_metadata = {
        event.asset_key.to_user_string(): {
            key: getattr(value, "value", value) for key, value in event.materialization.metadata.items()
            if key in ("duration_s", "documents_parsed", "chunks_created", "embeddings_computed", "embeddings_reused",
                       "pages", "pages_per_minute", "chunks_per_second", "snapshot_version", "chunks_indexed")
        }
        for event in result.get_asset_materialization_events()
    }
    if not result.success:
        failure = next((e for e in result.all_events if e.is_failure), None)
        message = failure.message if failure is not None else "run failed"
        if args.json:
            print(json.dumps({"success": False, "error": message, "dagster_run_id": result.run_id}, indent=2))
        else:
            print(f"ingest FAILED (dagster run {result.run_id}): {message}", file=sys.stderr)
        return 1
    with store_connection(settings.store_path, read_only=True) as conn:
        run = get_sync_run(conn, result.run_id)
    status = store_status(settings, include_history=False)
    failures = [f for f in status["ingestion_failures"]]
    report = {
        "success": True,
        "dagster_run_id": result.run_id,
        "summary": run["summary"],
        **{k: run[k] for k in ("added", "updated", "removed", "unchanged", "failed", "chunks_created",
                               "embeddings_computed", "embeddings_reused", "snapshot_version")},
        "documents_indexed": status["index_snapshot"]["document_count"] if status["index_snapshot"] else 0,
        "chunks_indexed": status["index_snapshot"]["chunk_count"] if status["index_snapshot"] else 0,
        "seconds": round(seconds, 2),
        "stages": stage_metadata,
        "checks": checks,
        "open_failures": failures,
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


def cmd_status(args: argparse.Namespace) -> int:
    from knowledge_store.status import store_status

    settings = _settings(args)
    status = store_status(settings, include_history=args.history)
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    counts = status["counts"]
    snapshot = status["index_snapshot"]
    print(f"data dir: {status['data_dir']}")
    print("\nsources:")
    print(format_table(status["sources"], ["name", "kind", "location", "active_documents", "last_synced_at"], 60))
    print("\ndocuments:")
    print(format_table(status["documents"], ["title", "relative_path", "version", "status", "doc_type", "page_count", "chunks"], 40))
    print(
        f"\ncounts: {counts['active_documents']} active documents, {counts['pending_versions']} pending, "
        f"{counts['superseded_versions']} superseded, {counts['deleted_documents']} deleted, "
        f"{counts['failed_versions']} failed; {counts['active_chunks']} active chunks "
        f"({counts['all_chunks']} stored), {counts['embeddings']} embeddings"
    )
    if snapshot:
        print(
            f"index: snapshot {snapshot['snapshot_version']} ({snapshot['file']}), {snapshot['document_count']} documents, "
            f"{snapshot['chunk_count']} chunks, published {snapshot['created_at']}"
        )
    else:
        print("index: not published yet (run `groundwork ingest`)")
    if status["last_sync"]:
        last = status["last_sync"]
        print(f"last sync: {last['status']} at {last['started_at']}: {last['summary'] or '(in progress)'}")
    for failure in status.get("recent_run_failures", []):
        print(f"FAILED RUN {failure['at']}: job {failure['job']} ({failure['run_id'][:8]}) in {', '.join(failure['steps']) or 'setup'}: {failure['error'][:200]}")
    print(f"\ningestion failures ({len(status['ingestion_failures'])} open):")
    print(format_table(status["ingestion_failures"], ["path", "stage", "kind", "reason", "last_seen_at"], 80))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from knowledge_store.retrieval.engine import RetrievalEngine

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
    engine.warm_up()  # model + snapshot load are start-up, not query latency
    response = engine.search(
        args.query, k=args.k, alpha=args.alpha, fusion=args.fusion, reranker=args.reranker, filters=filters or None,
        min_relevance=args.min_relevance, answer="llm" if args.llm else ("none" if args.no_answer else "extractive"),
        client="cli",
    )
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
        print(f"\nanswer ({response.answer.method}): {response.answer.text}")
    lat = response.latency_ms
    print(
        f"\ncoverage: {response.coverage}; reranker: {response.reranker_status}; snapshot {response.snapshot_version}; "
        f"{lat['total']:.0f} ms (embed {lat['embed']:.0f}, bm25 {lat['bm25']:.0f}, vector {lat['vector']:.0f}, "
        f"fuse {lat['fuse']:.0f}, rerank {lat['rerank']:.0f}, format {lat['format']:.0f}); "
        f"request {response.retrieval_request_id}"
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from evals.beir import load_beir
    from evals.retrieval_eval import EvalConfig, evaluate, open_engine

    folder = Path(args.dataset)
    dataset = load_beir(folder, split=args.split)  # DatasetError (a GroundworkError) names the bad file
    engine, doc_map = open_engine(folder)
    config = EvalConfig(alpha=engine.settings.default_alpha if args.alpha is None else args.alpha,
                        fusion=args.fusion or engine.settings.default_fusion,
                        reranker=args.reranker or engine.settings.default_reranker)
    result = evaluate(engine, dataset, config, doc_map, ks=(5, args.k))
    m = result.metrics
    report = {
        "dataset": str(folder), "split": args.split, "queries": result.queries, "configuration": config.label,
        "alpha": config.alpha, "fusion": config.fusion, "reranker": config.reranker, "k": args.k,
        "recall@5": m["recall@5"], f"ndcg@{args.k}": m[f"ndcg@{args.k}"], f"mrr@{args.k}": m[f"mrr@{args.k}"],
        "precision@5": m["precision@5"], "ragas_recall@5": m["ragas_recall@5"], "grounding": m["grounding"],
        "latency_p50_ms": result.latency_p50_ms, "latency_p95_ms": result.latency_p95_ms,
        "store": str(engine.settings.data_dir),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{dataset.name} ({args.split}, {result.queries} queries), {config.label}, fusion {config.fusion}")
    print(format_table([{
        "Recall@5": f"{m['recall@5']:.3f}", f"nDCG@{args.k}": f"{m[f'ndcg@{args.k}']:.3f}",
        f"MRR@{args.k}": f"{m[f'mrr@{args.k}']:.3f}", "P@5": f"{m['precision@5']:.3f}",
        "RAGAS R@5": f"{m['ragas_recall@5']:.3f}", "grounding": f"{m['grounding']:.3f}",
        "p50 ms": f"{result.latency_p50_ms:.1f}", "p95 ms": f"{result.latency_p95_ms:.1f}",
    }], ["Recall@5", f"nDCG@{args.k}", f"MRR@{args.k}", "P@5", "RAGAS R@5", "grounding", "p50 ms", "p95 ms"]))
    print(f"store: {engine.settings.data_dir} (re-used while corpus.jsonl is unchanged)")
    return 0


def cmd_notebook(args: argparse.Namespace) -> int:
    from evals.notebooks import parse_value, run_notebook

    parameters = {key: parse_value(value) for key, value in (args.parameter or [])}
    run = run_notebook(args.name, parameters, _settings(args))
    print(f"executed {args.name} in {run.seconds:.0f} s")
    print(f"notebook: {run.output_notebook}")
    for path in run.plots + run.tables:
        print(f"output:   {path}")
    if run.summary:
        print(f"summary:  {json.dumps(run.summary)}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from knowledge_store.server.app import serve

    settings = _settings(args)
    print(f"Groundwork API and console on http://{settings.server_host}:{settings.server_port} "
          f"(OpenAPI /docs, MCP /mcp); data dir {settings.data_dir}", file=sys.stderr)
    serve(settings)
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from knowledge_store.server.mcp_server import run_stdio

    run_stdio(_settings(args))
    return 0


def cmd_sample_corpus(args: argparse.Namespace) -> int:
    from pathlib import Path

    from knowledge_store.sample_corpus import write_sample_corpus

    paths = write_sample_corpus(Path(args.target))
    for path in paths:
        print(path)
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

    status = sub.add_parser("status", help="sources, documents with versions, counts and failures")
    status.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    status.add_argument("--history", action="store_true", help="include superseded and deleted versions")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    query = sub.add_parser("query", help="hybrid search with citations")
    query.add_argument("query")
    query.add_argument("--k", type=int, default=None, help="passages to return (default GROUNDWORK_DEFAULT_K)")
    query.add_argument("--alpha", type=float, default=None, help="0 = pure BM25, 1 = pure vector")
    query.add_argument("--fusion", choices=["weighted", "rrf"], default=None)
    query.add_argument("--reranker", choices=["none", "mmr", "feedback", "cross-encoder"], default=None)
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

    ev = sub.add_parser("eval", help="Recall@5, nDCG, MRR, P@5 and latency on a BEIR-format folder")
    ev.add_argument("dataset", help="folder with corpus.jsonl, queries.jsonl, qrels.tsv")
    ev.add_argument("--alpha", type=float, default=None, help="fusion weight (default: settings)")
    ev.add_argument("--fusion", choices=["weighted", "rrf"], default=None)
    ev.add_argument("--reranker", choices=["none", "mmr", "feedback", "cross-encoder"], default=None)
    ev.add_argument("--k", type=int, default=10, help="depth for nDCG and MRR (default 10)")
    ev.add_argument("--split", default="test", help="test (default) or train")
    ev.add_argument("--json", action="store_true", help="machine-readable output")
    ev.set_defaults(func=cmd_eval)

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
    serve.set_defaults(func=cmd_serve)

    mcp = sub.add_parser("mcp", help="serve the MCP tools over stdio (for IDEs and agents)")
    mcp.add_argument("--data-dir", help="store location (default: GROUNDWORK_DATA_DIR or ./data)")
    mcp.set_defaults(func=cmd_mcp)

    sample = sub.add_parser("sample-corpus", help="write the generated sample documents to a folder")
    sample.add_argument("target")
    sample.set_defaults(func=cmd_sample_corpus)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
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
