"""Build (or re-sync) the SciFact evaluation store under data/eval/.

    GROUNDWORK_TORCH_THREADS=2 .venv/bin/python evals/experiments/build_scifact_store.py

The first run embeds every chunk (minutes); later runs only hash the files.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from knowledge_store.evaluation.beir import ingest_beir  # noqa: E402
from knowledge_store.storage.store import store_connection  # noqa: E402

SCIFACT = Path("/work/main/../shared/datasets/scifact").resolve()
DATA_ROOT = Path("/work/main/data/eval")


def main() -> None:
    started = time.perf_counter()
    settings, report = ingest_beir(SCIFACT, DATA_ROOT)
    elapsed = time.perf_counter() - started
    with store_connection(settings.store_path, read_only=True) as conn:
        documents = conn.execute("SELECT count(*) FROM documents WHERE status = 'active'").fetchone()[0]
        per_doc = [
            n
            for (n,) in conn.execute(
                "SELECT count(c.chunk_id) FROM documents d LEFT JOIN chunks c ON c.doc_id = d.doc_id AND c.version = d.version "
                "WHERE d.status = 'active' GROUP BY d.doc_id"
            ).fetchall()
        ]
        failures = conn.execute("SELECT count(*) FROM ingestion_failures WHERE resolved_at IS NULL").fetchone()[0] if _has_table(conn, "ingestion_failures") else None
    chunks = sum(per_doc)
    print(f"store: {settings.data_dir}")
    print(f"index: {settings.index_dir} (snapshot {report.publish.snapshot_version})")
    print(f"sync summary: {report.summary}")
    print(f"active documents: {documents}   chunks: {chunks}   failures recorded: {failures}")
    if per_doc:
        counts = Counter(per_doc)
        print(
            f"chunks per document: min {min(per_doc)}  median {statistics.median(per_doc):g}  "
            f"mean {statistics.fmean(per_doc):.2f}  max {max(per_doc)}"
        )
        print("  distribution: " + ", ".join(f"{k} chunk{'s' if k != 1 else ''}: {counts[k]}" for k in sorted(counts)))
    print(f"chunk tokens this run: {report.chunk.token_stats}")
    embed = report.embed
    print(
        f"embedding: {embed.computed} computed, {embed.reused} reused, model {embed.model_seconds:.1f}s "
        f"({embed.chunks_per_second:.1f} chunks/s), stage {embed.seconds:.1f}s"
    )
    print(
        f"time: {elapsed:.1f}s total (sync {report.seconds:.1f}s: parse {report.parse.seconds:.1f}s, "
        f"chunk {report.chunk.seconds:.1f}s, publish {report.publish.seconds:.1f}s)"
    )


def _has_table(conn, name: str) -> bool:
    return bool(conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()[0])


if __name__ == "__main__":
    main()
