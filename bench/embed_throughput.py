"""Document embedding throughput (issue 12): our ingest embedder against a plain
``SentenceTransformer.encode`` of the same chunk texts, in one run.

Texts: the chunk texts (``embed_text``: header + chunk, exactly what ingestion embeds) of
the SciFact evaluation store (``data/eval/scifact-*/store``, built by
``evals/experiments/build_scifact_store.py``), a seeded sample of ``--texts``; without that store, the
first SciFact documents of ``../shared/datasets/scifact`` are scanned, parsed and chunked
by the ingestion stages into a temporary store.

Configurations (every one embeds the same texts):

(a)  plain ``SentenceTransformer(model_path).encode(texts, batch_size=32)``;
(b0) the ingest embedder before the ONNX default: torch ``Embedder`` (batch 32, torch_threads);
(b*) ``OnnxEmbedder`` as ingestion builds it (``document_embedder``) and variants of one
     lever each: batch size, one session on two threads, int8 (shipped recipe and the first
     one tried).

The texts are cut into blocks of ``--block`` (512 = ``write_batch_chunks``, what the embed
stage hands the model per call, in content-hash order); every configuration embeds each
block in turn, the order rotating per block, so load from other processes on this shared
machine falls on all of them alike.  Reported: chunks/s, ratio to (a), max |1 - cosine|
to (a)'s vectors, machine, date and load average before/after.

``--quality``: nDCG@10 with each document encoder on SciFact test and the Debian docs set
(the evaluation stores built here), identical everything else: copies of the evaluation
store whose vectors are (re)computed by the real embed stage (``embed_missing``) with that
encoder, published (``publish_index``) and queried by the same engine with the same fp32
query vectors; vector-only and the default hybrid ranking.

    flock /tmp/groundwork-bench.lock .venv/bin/python bench/embed_throughput.py [--texts 2048] [--quality] [--write]

``--write`` replaces this benchmark's own sections in docs/BENCHMARKS.md and
docs/EVALUATION.md and keeps the numbers in docs/benchmarks/embed_throughput.json (a part
not re-run, e.g. ``--no-throughput``, is taken from there).
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
    from knowledge_store.storage.store import store_connection

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
    from knowledge_store.config.settings import Settings
    from knowledge_store.evaluation.beir import load_beir, materialise_corpus
    from knowledge_store.ingest.chunk import chunk_parsed
    from knowledge_store.ingest.parse import parse_pending
    from knowledge_store.ingest.run import record_sources
    from knowledge_store.models.embeddings import token_counter
    from knowledge_store.storage.store import store_connection

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


# --------------------------------------------------------------------------- encoders


def dynamic_int8(model_path: Path, cache_dir: Path, threads: int):
    """Per-tensor dynamic int8 with 7-bit weights, feed-forward outputs in fp32 (``quantize_dynamic``): the recipe the
    shipped blockwise one was measured against, registered for this process only, behind the same fidelity check."""
    from knowledge_store.config.embedding_models import QUANTIZATION_RECIPES
    from knowledge_store.models.artifacts import RECIPES, QuantisationRecipe
    from knowledge_store.models.embeddings import OnnxEmbedder

    recipe = QuantisationRecipe(tag="onnx-int8-dyn-pc2-rr", description="per-tensor dynamic int8, 7-bit weights",
                                method="dynamic", reduce_range=True, keep_fp32=r"/layer\.\d+/output/dense/MatMul$")
    RECIPES.setdefault(recipe.tag, recipe)
    QUANTIZATION_RECIPES.setdefault("int8-dynamic", recipe.tag)
    return OnnxEmbedder(model_path, cache_dir, threads=1, batch_size=1, parallel=threads, quantization="int8-dynamic")


# --------------------------------------------------------------------------- throughput


def configurations(model_path: Path, cache_dir: Path, threads: int) -> list[tuple[str, str, object]]:
    """(key, description, embedder) in report order; (a) first."""
    import torch
    from sentence_transformers import SentenceTransformer

    from knowledge_store.config.settings import Settings
    from knowledge_store.models.embeddings import Embedder, OnnxEmbedder, document_embedder

    torch.set_num_threads(threads)

    class Plain:
        def __init__(self) -> None:
            self.model = SentenceTransformer(str(model_path), device="cpu")

        def embed(self, texts):
            return self.model.encode(texts, batch_size=32)

    default = document_embedder(Settings(torch_threads=threads), cache_dir=cache_dir)  # what ingestion runs
    fp32 = dict(model_path=model_path, cache_dir=cache_dir)  # dim: settings.embedding_dim
    return [
        ("a", "plain `SentenceTransformer.encode(texts, batch_size=32)`, torch fp32", Plain()),
        ("b0", f"ingest before the ONNX default: torch `Embedder`, batch 32, {threads} torch threads", Embedder(model_path, 32, threads)),
        ("b1", f"**ingest now (default)**: ONNX Runtime fp32, length-sorted, batch {getattr(default, 'batch_size', '?')}, "
               f"{getattr(default, 'parallel', '?')} batches at once × {getattr(default, 'threads', '?')} thread", default),
        ("b2", f"ONNX fp32, batch 1, one batch at a time on {threads} intra-op threads",
         OnnxEmbedder(threads=threads, batch_size=1, parallel=1, **fp32)),
        ("b3", f"ONNX fp32, batch 1 (the default before), {threads} at once × 1 thread",
         OnnxEmbedder(threads=1, batch_size=1, parallel=threads, **fp32)),
        ("b4", f"ONNX fp32, length-sorted batch 32, {threads} at once × 1 thread",
         OnnxEmbedder(threads=1, batch_size=32, parallel=threads, **fp32)),
        ("b5", f"ONNX **int8** (`document_quantization=int8`: blockwise 8-bit weights and activations, blocks of 128), "
               f"batch 1, {threads} at once × 1 thread",
         OnnxEmbedder(threads=1, batch_size=1, parallel=threads, quantization="int8", **fp32)),
        ("b6", f"ONNX per-tensor dynamic int8, 7-bit weights (measured, not shipped), batch 1, {threads} at once × 1 thread",
         dynamic_int8(model_path, cache_dir, threads)),
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
        shift = (number * 3) % len(configs)  # rotate the order per block
        for key, _, embedder in configs[shift:] + configs[:shift]:
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


def quality_cases() -> list[tuple[str, Path, str, Path]]:
    """(label, BEIR folder, split, evaluation store root) of every dataset whose store is built here."""
    cases = []
    scifact = scifact_store()
    if scifact is not None and SCIFACT.is_dir():
        cases.append(("SciFact test", SCIFACT, "test", scifact))
    debian = sorted((ROOT / "data" / "eval").glob("debian-docs-*/store/store.duckdb"))
    folder = ROOT / "data" / "datasets" / "debian-docs"
    if debian and folder.is_dir():
        cases.append(("Debian docs (all)", folder, "all", debian[0].parent.parent))
    return cases


def quality(cache_dir: Path, threads: int) -> dict:
    """nDCG@10 per document encoder on each dataset: copies of its store re-embedded by the real embed stage."""
    from knowledge_store.config.settings import Settings
    from knowledge_store.evaluation.beir import beir_settings, load_beir
    from knowledge_store.evaluation.retrieval_eval import EvalConfig, evaluate, open_engine
    from knowledge_store.ingest.embed import embed_missing
    from knowledge_store.ingest.publish import publish_index
    from knowledge_store.ingest.sync_runs import start_sync_run
    from knowledge_store.models.embeddings import Embedder, OnnxEmbedder
    from knowledge_store.storage.store import store_connection

    model_path = Settings().model_path
    encoders = [  # label, embedder, drop the store's vectors first (same model id as the torch ones)
        ("torch fp32 (today's vectors)", lambda: Embedder(model_path, 32, threads), False),
        ("ONNX fp32 (re-embedded; default)", lambda: OnnxEmbedder(model_path, cache_dir, threads=1, batch_size=1,
                                                                  parallel=threads), True),
        ("ONNX int8 (re-embedded; `document_quantization=int8`)",
         lambda: OnnxEmbedder(model_path, cache_dir, threads=1, batch_size=1, parallel=threads, quantization="int8"), False),
        ("ONNX per-tensor dynamic int8, 7-bit weights (measured, not shipped)",
         lambda: dynamic_int8(model_path, cache_dir, threads), False),
    ]
    evals = [EvalConfig(alpha=1.0), EvalConfig(alpha=Settings().default_alpha)]
    out = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "load_before": load(),
           "configs": [c.label for c in evals], "datasets": []}
    for label, folder, split, store in quality_cases():
        dataset = load_beir(folder, split=split)
        entry = {"name": label, "queries": len(dataset.queries), "store": str(store.relative_to(ROOT)), "rows": []}
        work = Path(tempfile.mkdtemp(prefix="gw-embed-quality-"))
        try:
            for number, (name, make, wipe) in enumerate(encoders):
                embedder = make()
                data_root = work / f"v{number}"
                root = data_root / store.name
                (root / "store").mkdir(parents=True)
                shutil.copy2(store / "store" / "store.duckdb", root / "store" / "store.duckdb")
                shutil.copy2(store / "dataset.json", root / "dataset.json")
                (root / "corpus").symlink_to(store / "corpus")
                settings = beir_settings(dataset, data_root)
                with store_connection(settings.store_path) as conn:
                    if wipe:
                        conn.execute("DELETE FROM embeddings")
                    run_id = start_sync_run(conn, None, "bench")
                embed = embed_missing(settings, embedder, run_id)
                publish_index(settings, embedder.model_id, run_id)
                engine, doc_map = open_engine(folder, ingest=False, data_root=data_root)
                row = {"encoder": name, "model_id": embedder.model_id, "embedded": embed.computed,
                       "embed_stage_s": round(embed.seconds, 1), "model_s": round(embed.model_seconds, 1),
                       "embed_stage_chunks_per_s": round(embed.chunks_per_second, 1) if embed.computed else None}
                for config in evals:
                    result = evaluate(engine, dataset, config, doc_map)
                    row[config.label] = {"ndcg@10": round(result.metrics["ndcg@10"], 4),
                                         "recall@5": round(result.metrics["recall@5"], 4)}
                entry["rows"].append(row)
                print(label, json.dumps(row), flush=True)
                del engine, embedder
                shutil.rmtree(data_root, ignore_errors=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        out["datasets"].append(entry)
    out["load_after"] = load()
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


def quality_table(q: dict, with_recall: bool) -> str:
    cfgs = q["configs"]
    lines = []
    for entry in q["datasets"]:
        base = entry["rows"][0]
        for row in entry["rows"]:
            cells = " | ".join(
                (f"{row[c]['ndcg@10']:.4f} / {row[c]['recall@5']:.4f}" if with_recall else f"{row[c]['ndcg@10']:.4f}")
                + ("" if row is base else f" ({row[c]['ndcg@10'] - base[c]['ndcg@10']:+.4f})") for c in cfgs)
            lines.append(f"| {entry['name']} ({entry['queries']} q.) | {row['encoder']} | `{row['model_id']}` | {cells} |")
    return (f"| dataset | document vectors | model id | {' | '.join(cfgs)} |\n|---|---|---|{'---|' * len(cfgs)}\n"
            + "\n".join(lines))


def benchmarks_section(r: dict) -> str:
    t = r["throughput"]
    rows = "\n".join(
        f"| ({key}) | {v['description']} | {v['chunks_per_s']} | **{v['ratio_to_a']}×** | {v['max_abs_1_minus_cos']:.1e} |"
        for key, v in t["results"].items())
    q = r.get("quality")
    quality_lines = ""
    if q:
        quality_lines = (f"\nRetrieval quality of the same encoders ({q['date']}; nDCG@10, change against torch in "
                         "brackets; method in docs/EVALUATION.md):\n\n" + quality_table(q, with_recall=False) + "\n")
        stage = next((row for row in q["datasets"][0]["rows"] if row["embedded"]), None)
        if stage:
            quality_lines += (f"\nThe real embed stage (`embed_missing`, {stage['embedded']:,} {q['datasets'][0]['name'].split()[0]} "
                              f"chunks, ONNX fp32): {stage['embed_stage_s']} s, of which model {stage['model_s']} s "
                              f"({stage['embed_stage_chunks_per_s']} chunks/s).\n")
    return f"""{SECTION}

`bench/embed_throughput.py`, {t['date']}. Machine: {t['machine']}; load average {t['load_before']} before,
{t['load_after']} after (shared machine; run under `flock /tmp/groundwork-bench.lock`). onnxruntime
{t['versions']['onnxruntime']}, torch {t['versions']['torch']}. Texts: {t['texts']} chunk texts (header + chunk, as
embedded) sampled from {t['source']}; median {t['median_tokens']} word-pieces. Every configuration embeds the same
blocks of {t['block']} texts (what the embed stage hands the model per call), in an order rotating per block, so
load from other processes falls on all of them alike.

| | configuration | chunks/s | vs (a) | max \\|1 − cos\\| to (a) |
|---|---|---|---|---|
{rows}
{quality_lines}
Why the ingest stage ran at 11–19 chunks/s: it *was* a plain torch encode — (b0) runs at
(a)'s speed, one model call per 512-text write batch, and the store writes around it are
a small share of the stage. The gains come from how the model is run: ONNX Runtime's
kernels with an eager-attention export, texts tokenised once and length-sorted into
small batches (8 texts of nearly equal length: almost no padding, and the activations
still fit the core's 2 MiB L2; batch 32 spills it — (b4)), and one single-threaded call
per core instead of one call on two threads (no per-operator barrier, which stalls
whenever another process holds a core — (b2)). fp32 ONNX vectors equal torch's
(|1 − cos| ~1e-7, far below ranking effects), so they keep torch's model id and existing
caches stay valid. Ratios move with the load on this shared machine (the configurations
share it alike, block by block); batch 8 was ahead of batch 1 in both recorded runs
(2.11× vs 1.99×, then 2.41× vs 1.93×). int8 (opt-in) is faster still; its vectors differ
(mean cos {t['results']['b5']['mean_cos']:.4f} to (a)) and are
stored under their own model id. Reproduce: `flock /tmp/groundwork-bench.lock .venv/bin/python
bench/embed_throughput.py --quality --write`.
"""


def evaluation_section(r: dict) -> str:
    q = r["quality"]
    t = r.get("throughput", {}).get("results", {})
    speed = ""
    if t:
        speed = (f" Speed on the same machine (docs/BENCHMARKS.md): ONNX fp32 {t['b1']['ratio_to_a']}×, int8 "
                 f"{t['b5']['ratio_to_a']}× (first recipe {t['b6']['ratio_to_a']}×) a plain `SentenceTransformer.encode`.")
    return f"""{EVAL_SECTION}

{q['date']} (load average {q['load_before']} before, {q['load_after']} after). Each dataset's
evaluation store embedded four ways, everything else identical: every variant is a copy of the
store whose vectors are computed by the real embed stage (`embed_missing`) with that encoder,
published with `publish_index` and queried by the same engine with the same fp32 ONNX query
vectors (`bench/embed_throughput.py --quality`); vector-only and the default hybrid ranking.
Cells: nDCG@10 / Recall@5, nDCG@10 change against today's torch vectors in brackets.

{quality_table(q, with_recall=True)}

Bar: within 0.005 nDCG@10 of today's fp32 torch vectors. ONNX fp32 — the default
document encoder — gives the torch vectors (same model id) and the same rankings. int8 stays
behind `GROUNDWORK_DOCUMENT_QUANTIZATION=int8` with its own model id; the shipped recipe keeps
each layer's feed-forward output projection in fp32, the first recipe (every MatMul int8)
is shown for comparison.{speed}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=2048, help="chunk texts to embed (a seeded sample)")
    parser.add_argument("--block", type=int, default=512, help="texts per embed call (the embed stage's write batch)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quality", action="store_true", help="also nDCG@10 per document encoder (re-embeds the eval stores)")
    parser.add_argument("--no-throughput", action="store_true", help="skip the throughput part (--write keeps the stored one)")
    parser.add_argument("--write", action="store_true", help="write the sections into docs/BENCHMARKS.md and docs/EVALUATION.md")
    args = parser.parse_args()

    import onnxruntime
    import torch

    from knowledge_store.config.settings import Settings
    from knowledge_store.models.embeddings import token_counter

    settings = Settings()
    cache_dir = settings.models_cache_dir
    out = ROOT / "docs" / "benchmarks" / "embed_throughput.json"
    result = json.loads(out.read_text()) if out.is_file() else {}
    if not args.no_throughput:
        load_before = load()
        store = scifact_store()
        if store is not None:
            rows, source = store_texts(store), f"the SciFact evaluation store (`{store.relative_to(ROOT)}`)"
        else:
            rows, source = chunked_corpus_texts(2000), "the first 2,000 SciFact documents, chunked by the ingestion stages"
        sample = sorted(random.Random(12).sample(rows, min(args.texts, len(rows))))  # content-hash order, as ingestion
        texts = [text for _, text in sample]
        tokens = sorted(token_counter(str(settings.model_path)).count_many(texts))
        configs = configurations(settings.model_path, cache_dir, args.threads)
        results = measure(texts, configs, args.block)
        for key, value in results.items():
            print(f"({key}) {value['chunks_per_s']:6.1f} chunks/s  {value['ratio_to_a']:.2f}x  "
                  f"max|1-cos| {value['max_abs_1_minus_cos']:.1e}  {value['description']}", flush=True)
        del configs
        result["throughput"] = {
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "versions": {"onnxruntime": onnxruntime.__version__, "torch": torch.__version__},
            "threads": args.threads, "texts": len(texts), "block": args.block, "source": source,
            "median_tokens": tokens[len(tokens) // 2], "results": results, "load_before": load_before,
            "load_after": load(),
        }
    if args.quality:
        if not quality_cases():
            raise SystemExit("--quality needs an evaluation store (evals/experiments/build_scifact_store.py)")
        result["quality"] = quality(cache_dir, args.threads)
    print(json.dumps(result, indent=2))
    if args.write:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        if "throughput" in result:
            replace_section(ROOT / "docs" / "BENCHMARKS.md", SECTION, benchmarks_section(result))
        if "quality" in result:
            replace_section(ROOT / "docs" / "EVALUATION.md", EVAL_SECTION, evaluation_section(result))


if __name__ == "__main__":
    main()
