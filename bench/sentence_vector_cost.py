"""What ``sentence_vectors`` costs ingestion: the chunk vectors, then every chunk's sentences embedded alone.

The same chunks (a seeded sample of ``--texts`` from each evaluation store under ``data/eval``:
their ``embed_text`` and ``text``, what the embed stage reads) are embedded by the ingest embedder
(``document_embedder``): once as chunk vectors (``ingest.embed.chunk_vectors``), once as sentence
vectors (``ingest.embed.sentence_table``: the texts split by ``core/text.sentences_to_embed``), and once
as both from one pass (``sentence_encoding=in_context``: ``ingest.embed.in_context_vectors``).
Blocks of ``--block`` alternate which goes first, so load from other processes falls on both alike.
Memory: the served snapshot keeps 2 bytes x dimensions per sentence (float16).

    .venv/bin/python bench/sentence_vector_cost.py [--texts 1024] [--out docs/benchmarks/sentence_vector_cost.md]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bare_vector_cost import start_cost_bench, store_samples, time_alternating  # noqa: E402
from bench.embed_throughput import load  # noqa: E402
from bench.report import publish  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from knowledge_store.config.settings import Settings
    from knowledge_store.ingest.embed import chunk_vectors, in_context_vectors, sentence_table
    from knowledge_store.models.embeddings import document_embedder

    args, embedder, lines = start_cost_bench("sentence_vector_cost", __doc__.splitlines()[0],
                                             "## Sentence vectors: ingestion cost (`sentence_vectors`)", argv)
    lines += [
        "| store | chunks | sentences (per chunk) | chunk vectors: chunks/s | sentence vectors: chunks/s | "
        "embed stage with sentences ÷ without | both in one pass (in_context): chunks/s | in_context ÷ without | "
        "served memory per 100k chunks (float16) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    context = document_embedder(Settings(sentence_encoding="in_context"))
    context.load()
    for name, part in store_samples(args.texts):
        embedder.embed([m.embed_text for m in part[:4]])  # warm up outside the clock
        counted = {"sentences": 0}

        def sentences(block: list) -> None:
            counted["sentences"] += sentence_table(embedder, block).num_rows

        seconds = time_alternating(part, args.block, {"chunks": lambda block: chunk_vectors(embedder, block),
                                                      "sentences": sentences,
                                                      "in_context": lambda block: in_context_vectors(context, block)})
        per_chunk = counted["sentences"] / len(part)
        memory_mb = per_chunk * 100_000 * embedder.dim * 2 / 2**20
        lines.append(f"| {name} | {len(part)} | {counted['sentences']} ({per_chunk:.1f}) | "
                     f"{len(part) / seconds['chunks']:.1f} | {len(part) / seconds['sentences']:.1f} | "
                     f"{(seconds['chunks'] + seconds['sentences']) / seconds['chunks']:.2f}× | "
                     f"{len(part) / seconds['in_context']:.1f} | {seconds['in_context'] / seconds['chunks']:.2f}× | "
                     f"{memory_mb:.0f} MB |")
    lines += ["", f"Load average at the end: {load()}.", ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
