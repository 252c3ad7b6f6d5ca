"""What ``bare_vector_weight`` costs ingestion: chunk vectors with and without the bare-text blend.

The same chunks (a seeded sample of ``--texts`` from each evaluation store under ``data/eval``:
their ``embed_text`` and ``text``, exactly what the embed stage reads) are embedded by the
ingest embedder (``document_embedder``) through ``ingest.embed.chunk_vectors`` twice: under the
plain model id (header + text, one pass) and under ``<id>+bare0.5`` (a second pass over every
chunk whose text differs from its embed text).  Blocks of ``--block`` alternate which goes
first, so load from other processes falls on both alike.

    flock /tmp/groundwork-bench.lock .venv/bin/python bench/bare_vector_cost.py [--texts 1024] [--out docs/benchmarks/bare_vector_cost.md]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.embed_throughput import cpu_model, load  # noqa: E402
from bench.report import publish  # noqa: E402


def sample(store: Path, count: int, seed: int = 7) -> list:
    import duckdb

    from knowledge_store.ingest.embed import MissingText

    conn = duckdb.connect(str(store), read_only=True)
    try:
        rows = conn.execute("SELECT DISTINCT content_hash, embed_text, text FROM chunks ORDER BY content_hash").fetchall()
    finally:
        conn.close()
    random.Random(seed).shuffle(rows)
    return [MissingText(*r) for r in rows[:count]]


def store_samples(count: int):
    """(name, sampled chunks) of each evaluation store under ``data/eval`` (not the baselines' or known items')."""
    for store in sorted((ROOT / "data" / "eval").glob("*/store/store.duckdb")):
        name = store.parent.parent.name.rsplit("-", 1)[0]
        if name not in ("baselines", "known-item"):
            yield name, sample(store, count)


def time_alternating(part: list, block: int, runs: dict) -> dict[str, float]:
    """Seconds each of ``runs`` (name -> function of a block of chunks) takes over ``part``, block by block,
    the order alternating per block so load from other processes falls on each alike."""
    seconds = dict.fromkeys(runs, 0.0)
    names = list(runs)
    for number, start in enumerate(range(0, len(part), block)):
        for name in (names if number % 2 == 0 else names[::-1]):
            started = time.perf_counter()
            runs[name](part[start:start + block])
            seconds[name] += time.perf_counter() - started
    return seconds


def header(title: str, reproduce: str, started_load: str) -> list[str]:
    return [title, "", f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {os.cpu_count()} cores "
            f"({cpu_model()}), load average at start {started_load}. Embedder: `document_embedder` (ONNX fp32, what "
            f"ingestion runs). Reproduce: `{reproduce}`.", ""]


def start_cost_bench(script: str, description: str, title: str, argv: list[str] | None):
    """An ingestion-cost bench's start: its arguments (``--texts``, ``--block``, ``--out``, by default
    ``docs/benchmarks/<script>.md``), the ingest embedder loaded, and the report's header lines."""
    from knowledge_store.config.settings import Settings
    from knowledge_store.models.embeddings import document_embedder

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--texts", type=int, default=1024, help="chunks sampled from each evaluation store")
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / f"{script}.md")
    args = parser.parse_args(argv)
    embedder = document_embedder(Settings())
    embedder.load()
    return args, embedder, header(title, f".venv/bin/python bench/{script}.py --texts {args.texts}", load())


def main(argv: list[str] | None = None) -> int:
    from knowledge_store.ingest.embed import chunk_vectors
    from knowledge_store.models.embeddings import chunk_vector_id

    args, embedder, lines = start_cost_bench(
        "bare_vector_cost", __doc__.splitlines()[0],
        "## Chunk vectors with the bare-text blend: ingestion cost (`bare_vector_weight`)", argv)
    plain_id = embedder.model_id
    lines += [
        "| store | chunks | with a header | header + text only: chunks/s | blend 0.5: chunks/s | time ratio |",
        "|---|---|---|---|---|---|",
    ]

    def vectors_as(model_id: str):
        def run(block: list) -> None:
            embedder.model_id = model_id
            chunk_vectors(embedder, block)
        return run

    for name, part in store_samples(args.texts):
        embedder.embed([m.embed_text for m in part[:4]])  # warm up outside the clock
        seconds = time_alternating(part, args.block, {"plain": vectors_as(plain_id),
                                                      "bare": vectors_as(chunk_vector_id(plain_id, 0.5))})
        embedder.model_id = plain_id
        headed = sum(1 for m in part if m.embed_text != m.text)
        lines.append(f"| {name} | {len(part)} | {headed} | {len(part) / seconds['plain']:.1f} | "
                     f"{len(part) / seconds['bare']:.1f} | {seconds['bare'] / seconds['plain']:.2f}× |")
    lines += ["", f"Load average at the end: {load()}.", ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
