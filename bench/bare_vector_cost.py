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


def main(argv: list[str] | None = None) -> int:
    from knowledge_store.embeddings import chunk_vector_id, document_embedder
    from knowledge_store.ingest.embed import chunk_vectors
    from knowledge_store.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1024, help="chunks sampled from each evaluation store")
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "bare_vector_cost.md")
    args = parser.parse_args(argv)

    settings = Settings()
    embedder = document_embedder(settings)
    embedder.load()
    plain_id = embedder.model_id
    started_load = load()
    lines = [
        "## Chunk vectors with the bare-text blend: ingestion cost (`bare_vector_weight`)", "",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {os.cpu_count()} cores ({cpu_model()}), "
        f"load average at start {started_load}. Embedder: `document_embedder` (ONNX fp32, what ingestion runs). "
        f"Reproduce: `.venv/bin/python bench/bare_vector_cost.py --texts {args.texts}`.", "",
        "| store | chunks | with a header | header + text only: chunks/s | blend 0.5: chunks/s | time ratio |",
        "|---|---|---|---|---|---|",
    ]
    for store in sorted((ROOT / "data" / "eval").glob("*/store/store.duckdb")):
        name = store.parent.parent.name.rsplit("-", 1)[0]
        if name in ("baselines", "known-item"):
            continue
        part = sample(store, args.texts)
        embedder.embed([m.embed_text for m in part[:4]])  # warm up outside the clock
        seconds = {"plain": 0.0, "bare": 0.0}
        blocks = [part[i:i + args.block] for i in range(0, len(part), args.block)]
        for number, block in enumerate(blocks):
            order = ("plain", "bare") if number % 2 == 0 else ("bare", "plain")
            for key in order:
                embedder.model_id = plain_id if key == "plain" else chunk_vector_id(plain_id, 0.5)
                started = time.perf_counter()
                chunk_vectors(embedder, block)
                seconds[key] += time.perf_counter() - started
        embedder.model_id = plain_id
        headed = sum(1 for m in part if m.embed_text != m.text)
        lines.append(f"| {name} | {len(part)} | {headed} | {len(part) / seconds['plain']:.1f} | "
                     f"{len(part) / seconds['bare']:.1f} | {seconds['bare'] / seconds['plain']:.2f}× |")
    lines += ["", f"Load average at the end: {load()}.", ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
