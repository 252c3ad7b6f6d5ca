"""Ingestion throughput on the shared PDF manuals, and the cost of a no-change re-sync.

    .venv/bin/python bench/ingest_throughput.py [--pdfs ../shared/datasets/pdfs] [--threads 2]
        [--out docs/benchmarks/ingest.md]

Measures, stage by stage (the same functions the Dagster assets call):
scan+hash, parse (pages/min), chunk (chunks/s), embed (chunks/s), publish;
then the whole pipeline with and without embeddings, and a no-change re-sync
of the default corpus (in-process stages and through `groundwork ingest`).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import publish  # noqa: E402


def machine() -> str:
    """The machine a benchmark ran on: cores, CPU model and the instruction-set flags its int8 kernels depend on
    (a CPU with AVX-512 VNNI or AVX-VNNI runs other kernels than one with AVX2 alone), memory, versions, load."""
    cpu, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags.update(line.split(":", 1)[1].split())
    except OSError:
        pass
    shown = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f in flags]
    cpu += f"; flags {', '.join(shown) or 'no AVX2'}" + ("" if {"avx512_vnni", "avx_vnni"} & flags else " (no VNNI)")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import duckdb
    import torch

    return (
        f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}, "
        f"duckdb {duckdb.__version__}, torch {torch.__version__}, load average at start {os.getloadavg()[0]:.2f}"
    )


def run_stages(settings, embedder, counter, embed: bool) -> dict[str, float]:
    from knowledge_store.ingest.chunk import chunk_parsed
    from knowledge_store.ingest.embed import embed_missing
    from knowledge_store.ingest.parse import parse_pending
    from knowledge_store.ingest.publish import publish_index
    from knowledge_store.ingest.run import record_sources

    t0 = time.perf_counter()
    raw = record_sources(settings, trigger="bench")
    t1 = time.perf_counter()
    parse = parse_pending(settings, raw.sync_run_id)
    t2 = time.perf_counter()
    chunk = chunk_parsed(settings, counter, raw.sync_run_id)
    t3 = time.perf_counter()
    out = {
        "files": raw.files_seen, "pages": parse.pages, "chunks": chunk.chunks,
        "scan_s": t1 - t0, "parse_s": t2 - t1, "chunk_s": t3 - t2,
    }
    if embed:
        result = embed_missing(settings, embedder, raw.sync_run_id)
        t4 = time.perf_counter()
        published = publish_index(settings, embedder.model_id, raw.sync_run_id)
        t5 = time.perf_counter()
        out.update(embed_s=t4 - t3, model_s=result.model_seconds, embedded=result.computed, publish_s=t5 - t4,
                   build_s=published.build_seconds, summary=published.sync_run.get("summary"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdfs", type=Path, default=ROOT.parent / "shared" / "datasets" / "pdfs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "ingest.md")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    if not args.pdfs.is_dir():
        print(f"no PDFs at {args.pdfs}", file=sys.stderr)
        return 2

    from knowledge_store.config.settings import Settings
    from knowledge_store.ingest.run import run_sync
    from knowledge_store.models.embeddings import Embedder, token_counter

    info = machine()
    embedder = Embedder(Settings().model_path, batch_size=32, torch_threads=args.threads).load()
    counter = token_counter(str(Settings().model_path))
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # 1. without embeddings: scan + parse + chunk only
        s1 = Settings(data_dir=tmp / "noembed", sources=[args.pdfs])
        no_embed = run_stages(s1, embedder, counter, embed=False)
        # 2. the full pipeline on a fresh store
        s2 = Settings(data_dir=tmp / "full", sources=[args.pdfs])
        full = run_stages(s2, embedder, counter, embed=True)
        full_total = full["scan_s"] + full["parse_s"] + full["chunk_s"] + full["embed_s"] + full["publish_s"]
        prep_total = no_embed["scan_s"] + no_embed["parse_s"] + no_embed["chunk_s"]
        # 3. no-change re-sync of the same PDFs
        t = time.perf_counter()
        again = run_sync(s2, embedder)
        pdf_noop = time.perf_counter() - t
        # 4. the default corpus: first sync, then no-change re-sync, in-process and via the CLI
        s3 = Settings(data_dir=tmp / "default")
        run_sync(s3, embedder)
        timings = []
        for _ in range(5):
            t = time.perf_counter()
            report = run_sync(s3, embedder)
            timings.append(time.perf_counter() - t)
        env = {**os.environ, "GROUNDWORK_DATA_DIR": str(s3.data_dir)}
        env.pop("DAGSTER_HOME", None)
        t = time.perf_counter()
        cli = subprocess.run([sys.executable, "-m", "knowledge_store.cli", "ingest", "--json"], env=env,
                             capture_output=True, text=True, cwd=ROOT)
        cli_s = time.perf_counter() - t
        if cli.returncode != 0:
            print(cli.stderr[-2000:], file=sys.stderr)

    pages, chunks = full["pages"], full["chunks"]
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines += [
        "## Ingestion throughput (issue 2)",
        "",
        f"Date: {date}. Machine: {info}. Torch threads: {args.threads}. "
        f"Corpus: {full['files']} shared PDF manuals, {pages} pages -> {chunks} chunks. "
        "Reproduce: `.venv/bin/python bench/ingest_throughput.py`.",
        "",
        "| stage | seconds | throughput |",
        "|---|---|---|",
        f"| scan + SHA-256 | {full['scan_s']:.2f} | {full['files']} files |",
        f"| parse (PyMuPDF) | {full['parse_s']:.2f} | {60 * pages / full['parse_s']:,.0f} pages/min |",
        f"| chunk (tokenizer-measured) | {full['chunk_s']:.2f} | {chunks / full['chunk_s']:,.0f} chunks/s |",
        f"| embed (MiniLM, batch 32) | {full['embed_s']:.2f} | {full['embedded'] / full['model_s']:,.1f} chunks/s (model time {full['model_s']:.1f} s) |",
        f"| publish snapshot (copy + fts build) | {full['publish_s']:.2f} | build {full['build_s']:.2f} s |",
        f"| **whole pipeline, with embeddings** | **{full_total:.1f}** | **{60 * pages / full_total:,.0f} pages/min, {chunks / full_total:,.1f} chunks/s** |",
        f"| **scan + parse + chunk, no embeddings** | **{prep_total:.1f}** | **{60 * no_embed['pages'] / prep_total:,.0f} pages/min, {no_embed['chunks'] / prep_total:,.0f} chunks/s** |",
        "",
        f"No-change re-sync of the same PDFs: {pdf_noop:.2f} s ({again.summary}).",
        "",
        f"No-change re-sync of the default corpus ({report.raw.files_seen} files): in-process stages "
        f"median {sorted(timings)[len(timings) // 2]:.2f} s (min {min(timings):.2f}, max {max(timings):.2f}, 5 runs); "
        f"`groundwork ingest` end to end (new Python process, Dagster job, checks) {cli_s:.1f} s.",
        "",
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
