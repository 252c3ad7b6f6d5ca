"""Document embedding throughput (issue 12): our ingest embedder against a plain
``SentenceTransformer.encode`` of the same chunk texts, in one run.

Texts: the chunk texts (``embed_text``: header + chunk, exactly what ingestion embeds) of
the SciFact evaluation store (``data/eval/scifact-*/store``, built by
``evals/build_scifact_store.py``), a seeded sample of ``--texts``; without that store, the
first SciFact documents of ``../shared/datasets/scifact`` are scanned, parsed and chunked
by the ingestion stages into a temporary store.

Configurations (every one embeds the same texts):

(a)  plain ``SentenceTransformer(model_path).encode(texts, batch_size=32)``;
(b0) the ingest embedder before issue 12: torch ``Embedder`` (batch 32, torch_threads);
(b*) ``OnnxEmbedder`` as ingestion builds it (``document_embedder``) and variants of one
     lever each: batch size, one session on two threads, int8.

The texts are cut into blocks of ``--block`` (512 = ``write_batch_chunks``, what the embed
stage hands the model per call, in content-hash order); every configuration embeds each
block in turn, the order rotating per block, so load from other processes on this shared
machine falls on all of them alike.  Reported: chunks/s, ratio to (a), max |1 - cosine|
to (a)'s vectors, machine, date and load average before/after.

``--quality``: SciFact test-split nDCG@10 with each document encoder, identical everything
else: copies of the evaluation store whose vectors are (re)computed by the real embed
stage (``embed_missing``) with that encoder, published (``publish_index``) and queried by
the same engine, the same fp32 query vectors, vector-only and the default hybrid ranking.

    flock /tmp/groundwork-bench.lock .venv/bin/python bench/embed_throughput.py [--texts 2048] [--quality] [--write]

``--write`` replaces this benchmark's own sections in docs/BENCHMARKS.md and
docs/EVALUATION.md and writes docs/benchmarks/embed_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

SECTION = "## Document embedding throughput (issue 12)"
EVAL_SECTION = "## Document encoder quality: ONNX and int8 vectors (issue 12)"
SCIFACT = ROOT.parent / "shared" / "datasets" / "scifact"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def scifact_store() -> Path | None:
    """The SciFact evaluation store folder (``.../scifact-<sha>``), if one was built."""
    stores = sorted((ROOT / "data" / "eval").glob("scifact-*/store/store.duckdb"))
    return stores[0].parent.parent if stores else None


def store_texts(store: Path) -> list[tuple[str, str]]:
    """(content_hash, embed_text) of the store's live chunks, in content-hash order (as the embed stage reads them)."""
    from knowledge_store.store import store_connection

    with store_connection(store / "store" / "store.duckdb", read_only=True) as conn:
        return conn.execute(
            """
            SELECT c.content_hash, any_value(c.embed_text) FROM chunks c
            JOIN documents d ON d.doc_id = c.doc_id AND d.version = c.version
            WHERE d.status = 'active' GROUP BY c.content_hash ORDER BY c.content_hash
            """
        ).fetchall()


def chunked_corpus_texts(documents: int) -> list[tuple[str, str]]:
    """Chunk texts of the first SciFact documents, made by the ingestion stages (scan, parse, chunk; no embedding)."""
    from evals.beir import load_beir, materialise_corpus
    from knowledge_store.embeddings import token_counter
    from knowledge_store.ingest.chunk import chunk_parsed
    from knowledge_store.ingest.parse import parse_pending
    from knowledge_store.ingest.run import record_sources
    from knowledge_store.settings import Settings
    from knowledge_store.store import store_connection

    if not SCIFACT.is_dir():
        raise SystemExit(f"no SciFact evaluation store under data/eval and no corpus at {SCIFACT}")
    dataset = load_beir(SCIFACT)
    keep = dict(list(dataset.corpus.items())[:documents])
    dataset.corpus = keep
    work = Path(tempfile.mkdtemp(prefix="gw-embed-texts-"))
    materialise_corpus(dataset, work / "corpus")
    settings = Settings(data_dir=work / "data", sources=[work / "corpus"])
    raw = record_sources(settings)
    parse_pending(settings, raw.sync_run_id)
    chunk_parsed(settings, token_counter(str(settings.model_path)), raw.sync_run_id)
    with store_connection(settings.store_path, read_only=True) as conn:
        rows = conn.execute("SELECT content_hash, any_value(embed_text) FROM chunks GROUP BY 1 ORDER BY 1").fetchall()
    shutil.rmtree(work, ignore_errors=True)
    return rows


# --------------------------------------------------------------------------- throughput


def configurations(model_path: Path, cache_dir: Path, threads: int) -> list[tuple[str, str, object]]:
    """(key, description, embedder) in report order; (a) first."""
    from sentence_transformers import SentenceTransformer

    from knowledge_store.embeddings import Embedder, OnnxEmbedder, document_embedder
    from knowledge_store.settings import Settings

    import torch

    torch.set_num_threads(threads)

    class Plain:
        def __init__(self) -> None:
            self.model = SentenceTransformer(str(model_path), device="cpu")

        def embed(self, texts):
            return self.model.encode(texts, batch_size=32)

    default = document_embedder(Settings(torch_threads=threads), cache_dir=cache_dir)  # what ingestion runs
    fp32 = dict(model_path=model_path, cache_dir=cache_dir, dim=384)
    return [
        ("a", "plain `SentenceTransformer.encode(texts, batch_size=32)`, torch fp32", Plain()),
        ("b0", f"ingest before issue 12: torch `Embedder`, batch 32, {threads} torch threads", Embedder(model_path, 32, threads)),
        ("b1", f"**ingest now (default)**: ONNX Runtime fp32, length-sorted, batch {getattr(default, 'batch_size', '?')}, "
               f"{getattr(default, 'parallel', '?')} batches at once x {getattr(default, 'threads', '?')} thread", default),
        ("b2", f"ONNX fp32, batch 1, one batch at a time on {threads} intra-op threads",
         OnnxEmbedder(threads=threads, batch_size=1, parallel=1, **fp32)),
        ("b3", f"ONNX fp32, length-sorted batch 8, {threads} at once x 1 thread",
         OnnxEmbedder(threads=1, batch_size=8, parallel=threads, **fp32)),
        ("b4", f"ONNX fp32, length-sorted batch 32, {threads} at once x 1 thread",
         OnnxEmbedder(threads=1, batch_size=32, parallel=threads, **fp32)),
        ("b5", f"ONNX **int8** (`document_quantization=int8`), batch 1, {threads} at once x 1 thread",
         OnnxEmbedder(threads=1, batch_size=1, parallel=threads, quantization="int8", **fp32)),
    ]


def measure(texts: list[str], configs, block: int) -> dict[str, dict]:
    for _, _, embedder in configs:  # load and warm up outside the clock
        if hasattr(embedder, "load"):
            embedder.load()
        embedder.embed(texts[:4])
    seconds = {key: 0.0 for key, _, _ in configs}
    vectors = {key: [] for key, _, _ in configs}
    blocks = [texts[i:i + block] for i in range(0, len(texts), block)]
    for number, part in enumerate(blocks):
        rotated = configs[number % len(configs):] + configs[:number % len(configs)]
        for key, _, embedder in rotated:
            started = time.perf_counter()
            out = embedder.embed(part)
            seconds[key] += time.perf_counter() - started
            vectors[key].append(np.asarray(out, dtype=np.float32))
        print(f"block {number + 1}/{len(blocks)} done, load {load()}", flush=True)
    reference = np.concatenate(vectors["a"])
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    rate_a = len(texts) / seconds["a"]
    results = {}
    for key, description, embedder in configs:
        got = np.concatenate(vectors[key])
        got = got / np.linalg.norm(got, axis=1, keepdims=True)
        cosine = (got * reference).sum(axis=1)
        rate = len(texts) / seconds[key]
        results[key] = {
            "description": description, "seconds": round(seconds[key], 2), "chunks_per_s": round(rate, 1),
            "ratio_to_a": round(rate / rate_a, 2), "max_abs_1_minus_cos": float(np.abs(1 - cosine).max()),
            "mean_cos": float(cosine.mean()), "model_id": getattr(embedder, "model_id", None),
        }
    return results


# --------------------------------------------------------------------------- quality


def quality(store: Path, cache_dir: Path, threads: int) -> dict:
    """nDCG@10 on SciFact test with the store's torch vectors vs the ONNX fp32 and int8 ones."""
    from evals.beir import beir_settings, load_beir
    from evals.retrieval_eval import EvalConfig, evaluate, open_engine
    from knowledge_store.embeddings import Embedder, OnnxEmbedder
    from knowledge_store.ingest.embed import embed_missing
    from knowledge_store.ingest.publish import publish_index
    from knowledge_store.ingest.sync_runs import start_sync_run
    from knowledge_store.settings import Settings
    from knowledge_store.store import store_connection

    dataset = load_beir(SCIFACT, split="test")
    model_path = Settings().model_path
    encoders = [
        ("torch fp32 (today's vectors)", Embedder(model_path, 32, threads), False),
        ("ONNX fp32 (re-embedded)", OnnxEmbedder(model_path, cache_dir, threads=1, batch_size=1, parallel=threads), True),
        ("ONNX int8 (re-embedded)", OnnxEmbedder(model_path, cache_dir, threads=1, batch_size=1, parallel=threads,
                                                 quantization="int8"), False),
    ]
    defaults = Settings()
    evals = [EvalConfig(1.0), EvalConfig(defaults.default_alpha)]
    out = {"dataset": "scifact test", "queries": len(dataset.queries), "rows": []}
    work = Path(tempfile.mkdtemp(prefix="gw-embed-quality-"))
    try:
        for number, (label, embedder, wipe) in enumerate(encoders):
            data_root = work / f"v{number}"
            root = data_root / store.name
            (root / "store").mkdir(parents=True)
            shutil.copy2(store / "store" / "store.duckdb", root / "store" / "store.duckdb")
            shutil.copy2(store / "dataset.json", root / "dataset.json")
            (root / "corpus").symlink_to(store / "corpus")
            settings = beir_settings(dataset, data_root)
            with store_connection(settings.store_path) as conn:
                if wipe:  # same model id as the torch vectors: drop them so every vector is this encoder's
                    conn.execute("DELETE FROM embeddings")
                run_id = start_sync_run(conn, None, "bench")
            embed = embed_missing(settings, embedder, run_id)
            publish_index(settings, embedder.model_id, run_id)
            engine, doc_map = open_engine(SCIFACT, ingest=False, data_root=data_root)
            row = {"encoder": label, "model_id": embedder.model_id, "embedded": embed.computed,
                   "embed_stage_chunks_per_s": round(embed.chunks_per_second, 1) if embed.computed else None}
            for config in evals:
                result = evaluate(engine, dataset, config, doc_map)
                row[config.label] = {"ndcg@10": round(result.metrics["ndcg@10"], 4),
                                     "recall@5": round(result.metrics["recall@5"], 4)}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            del engine
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["configs"] = [c.label for c in evals]
    return out


# --------------------------------------------------------------------------- report


def replace_section(path: Path, heading: str, text: str) -> None:
    content = path.read_text()
    if heading in content:
        start = content.index(heading)
        nxt = content.find("\n## ", start + len(heading))
        content = content[:start] + text.rstrip("\n") + "\n" + (content[nxt:] if nxt != -1 else "")
    else:
        content = content.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    path.write_text(content)


def benchmarks_section(r: dict) -> str:
    rows = "\n".join(
        f"| ({key}) | {v['description']} | {v['chunks_per_s']} | **{v['ratio_to_a']}×** | {v['max_abs_1_minus_cos']:.1e} |"
        for key, v in r["throughput"].items()
    )
    q = r.get("quality")
    quality_lines = ""
    if q:
        cfgs = q["configs"]
        quality_lines = "\nSciFact test nDCG@10 (300 queries, same store, same query vectors; docs/EVALUATION.md):\n\n" + \
            f"| document vectors | model id | {' | '.join(cfgs)} |\n|---|---|{'---|' * len(cfgs)}\n" + "\n".join(
                f"| {row['encoder']} | `{row['model_id']}` | " + " | ".join(f"{row[c]['ndcg@10']:.4f}" for c in cfgs) + " |"
                for row in q["rows"]) + "\n"
    return f"""{SECTION}

`bench/embed_throughput.py`, {r['date']}. Machine: {r['machine']}; load average {r['load_before']} before,
{r['load_after']} after (shared machine; run under `flock /tmp/groundwork-bench.lock`). onnxruntime
{r['versions']['onnxruntime']}, torch {r['versions']['torch']}. Texts: {r['texts']} chunk texts (header + chunk, as
embedded) sampled from {r['source']}; median {r['median_tokens']} word-pieces. Each configuration embeds the same
blocks of {r['block']} texts (what the embed stage hands the model per call), in rotating order.

| | configuration | chunks/s | vs (a) | max \\|1 − cos\\| to (a) |
|---|---|---|---|---|
{rows}
{quality_lines}
Why the ingest stage ran at 11–19 chunks/s: it was the plain torch model — (b0) runs at
(a)'s speed; no extra loss in the stage (one model call per 512-text write batch, the
store write outside the model time is <1% of it). The gains come from the runtime:
ONNX Runtime's kernels, length-sorted batch-1 calls (no padding, activations stay in the
2 MiB L2), and one single-threaded batch per core instead of one batch on two threads
(no per-operator barrier, which stalls whenever another process holds a core). fp32 ONNX
vectors equal torch's (|1 − cos| ≈ 1e-7), so they keep torch's model id and existing
caches stay valid; int8 vectors differ (cos ≈ 0.995) and are stored under their own id.
Reproduce: `flock /tmp/groundwork-bench.lock .venv/bin/python bench/embed_throughput.py --quality --write`.
"""


def evaluation_section(r: dict) -> str:
    q = r["quality"]
    cfgs = q["configs"]
    base = q["rows"][0]
    lines = []
    for row in q["rows"]:
        deltas = ", ".join(f"{c}: {row[c]['ndcg@10'] - base[c]['ndcg@10']:+.4f}" for c in cfgs)
        lines.append(f"| {row['encoder']} | `{row['model_id']}` | " + " | ".join(
            f"{row[c]['ndcg@10']:.4f} / {row[c]['recall@5']:.4f}" for c in cfgs) + f" | {deltas} |")
    throughput = r["throughput"]
    return f"""{EVAL_SECTION}

{r['date']}. SciFact test split ({q['queries']} queries), the evaluation store's chunks embedded
three ways, everything else identical: each variant is a copy of the store whose vectors are
computed by the real embed stage (`embed_missing`) with that encoder, published with
`publish_index`, and queried by the same engine with the same fp32 ONNX query vectors
(`bench/embed_throughput.py --quality`). Cells: nDCG@10 / Recall@5.

| document vectors | model id | {' | '.join(cfgs)} | nDCG@10 vs torch |
|---|---|{'---|' * len(cfgs)}---|
{chr(10).join(lines)}

Bar (issue 12): within 0.005 nDCG@10 of today's fp32 torch vectors. Speed of the same
encoders on {r['texts']} of these texts: ONNX fp32 {throughput['b1']['ratio_to_a']}× and int8
{throughput['b5']['ratio_to_a']}× a plain `SentenceTransformer.encode` (docs/BENCHMARKS.md).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=2048, help="chunk texts to embed (a seeded sample)")
    parser.add_argument("--block", type=int, default=512, help="texts per embed call (the embed stage's write batch)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quality", action="store_true", help="also SciFact nDCG@10 per document encoder (re-embeds the store twice)")
    parser.add_argument("--write", action="store_true", help="write the sections into docs/BENCHMARKS.md and docs/EVALUATION.md")
    args = parser.parse_args()

    import onnxruntime
    import torch

    from knowledge_store.embeddings import token_counter
    from knowledge_store.settings import Settings

    load_before = load()
    settings = Settings()
    cache_dir = settings.models_cache_dir
    store = scifact_store()
    if store is not None:
        rows, source = store_texts(store), f"the SciFact evaluation store (`{store.relative_to(ROOT)}`)"
    else:
        rows, source = chunked_corpus_texts(2000), "the first 2,000 SciFact documents, chunked by the ingestion stages"
    sample = sorted(random.Random(12).sample(rows, min(args.texts, len(rows))))  # content-hash order, as ingestion
    texts = [text for _, text in sample]
    tokens = sorted(token_counter(str(settings.model_path)).count_many(texts))
    configs = configurations(settings.model_path, cache_dir, args.threads)
    throughput = measure(texts, configs, args.block)
    for key, value in throughput.items():
        print(f"({key}) {value['chunks_per_s']:6.1f} chunks/s  {value['ratio_to_a']:.2f}x  "
              f"max|1-cos| {value['max_abs_1_minus_cos']:.1e}  {value['description']}", flush=True)
    del configs
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "versions": {"onnxruntime": onnxruntime.__version__, "torch": torch.__version__},
        "threads": args.threads, "texts": len(texts), "block": args.block, "source": source,
        "median_tokens": tokens[len(tokens) // 2], "throughput": throughput, "load_before": load_before,
    }
    if args.quality:
        if store is None:
            raise SystemExit("--quality needs the SciFact evaluation store (evals/build_scifact_store.py)")
        result["quality"] = quality(store, cache_dir, args.threads)
    result["load_after"] = load()
    print(json.dumps(result, indent=2))
    if args.write:
        out = ROOT / "docs" / "benchmarks" / "embed_throughput.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        replace_section(ROOT / "docs" / "BENCHMARKS.md", SECTION, benchmarks_section(result))
        if "quality" in result:
            replace_section(ROOT / "docs" / "EVALUATION.md", EVAL_SECTION, evaluation_section(result))


if __name__ == "__main__":
    main()
