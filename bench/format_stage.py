"""The served query's format stage alone: citations with their snippets, the extractive answer and the sentence
cosines it reads (``AnswerSynthesizer.synthesize``), timed per question on a real store.

    .venv/bin/python bench/format_stage.py --data-dir STORE --queries-file QUERIES.jsonl
        [--repeats 5] [--json OUT.json]

Each question is searched once through ``RetrievalEngine.search`` (k = 5) to capture what the synthesizer is
handed (the query and its source nodes); then the synthesizer alone is called on those, ``--repeats`` times per
question, in two states:

- *first sight*: the passage caches (term spans, inline-markup removal, answer units) are cleared before each
  call, as when a question brings up passages no earlier question quoted;
- *seen*: the same call again with those caches warm, as for a passage quoted before.

Word-level caches (stemming, accent folding) stay warm in both: a serving process has seen most words.  Reported:
p50 / p95 of each state (wall time, and ``total_cpu``: the calling thread's CPU time, which other processes on a
busy machine stretch far less) and of its three parts, the load average, and a digest of every answer and snippet
so two versions of the code can be checked to write the same text (run this file from each checkout and compare).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.ingest_throughput import machine  # noqa: E402
from bench.query_latency import percentile  # noqa: E402

PARTS = ("attach_sentence_cosines", "build_citations", "extractive_answer")


WORD_CACHES = ("stem", "normalize")  # word-level: warm in a serving process, kept in both states


def passage_caches() -> list:
    """Every cache of the modules that read passages, but the word-level ones (cleared for *first sight*)."""
    from knowledge_store.core import text
    from knowledge_store.retrieval import answer_units, terms

    found = {id(fn): fn for module in (text, terms, answer_units) for fn in vars(module).values()
             if callable(getattr(fn, "cache_clear", None)) and getattr(fn, "__name__", "") not in WORD_CACHES}
    return list(found.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="a data folder with a published index")
    parser.add_argument("--queries-file", type=Path, required=True, help="BEIR queries (.jsonl, field text)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from knowledge_store.config.settings import Settings
    from knowledge_store.retrieval import synthesis
    from knowledge_store.retrieval.engine import RetrievalEngine

    questions = [json.loads(line)["text"] for line in args.queries_file.read_text().splitlines() if line.strip()]
    engine = RetrievalEngine(Settings(data_dir=args.data_dir))
    engine.warm_up()
    captured: list[tuple] = []
    shipped = synthesis.AnswerSynthesizer.synthesize

    def capture(self, query, nodes, *rest, **kwargs):
        captured.append((self, query, list(nodes)))
        return shipped(self, query, nodes, *rest, **kwargs)

    synthesis.AnswerSynthesizer.synthesize = capture
    try:
        for question in questions:
            engine.search(question, k=5, log=False)
    finally:
        synthesis.AnswerSynthesizer.synthesize = shipped

    spent: dict[str, float] = {}

    def timed(name, fn):
        def call(*a, **k):
            started = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + (time.perf_counter() - started) * 1000
        return call

    originals = {name: getattr(synthesis, name) for name in PARTS}
    for name, fn in originals.items():
        setattr(synthesis, name, timed(name, fn))
    caches = passage_caches()
    times: dict[str, dict[str, list[float]]] = {state: {"total": [], "total_cpu": [], **{p: [] for p in PARTS}}
                                                for state in ("first_sight", "seen")}
    digest = hashlib.sha256()
    load_start = os.getloadavg()
    try:
        for repeat in range(args.repeats):
            for synthesizer, query, nodes in captured:
                for state in ("first_sight", "seen"):
                    if state == "first_sight":
                        for cache in caches:
                            cache.cache_clear()
                    spent.clear()
                    started, cpu_started = time.perf_counter(), time.thread_time()
                    response = shipped(synthesizer, query, nodes).metadata["search_response"]
                    times[state]["total"].append((time.perf_counter() - started) * 1000)
                    times[state]["total_cpu"].append((time.thread_time() - cpu_started) * 1000)
                    for part in PARTS:
                        times[state][part].append(spent.get(part, 0.0))
                    if repeat == 0 and state == "first_sight":
                        digest.update(json.dumps([response.answer.text if response.answer else None,
                                                  response.coverage,
                                                  [(c.snippet, c.snippet_start, c.snippet_end) for c in response.results]],
                                                 ensure_ascii=False).encode())
    finally:
        for name, fn in originals.items():
            setattr(synthesis, name, fn)
    report = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
        "code": str(ROOT), "data_dir": str(args.data_dir), "questions": len(captured), "repeats": args.repeats,
        "load_start": [round(x, 2) for x in load_start], "load_end": [round(x, 2) for x in os.getloadavg()],
        "output_digest": digest.hexdigest()[:16],
        "ms": {state: {part: {"p50": round(statistics.median(v), 3), "p95": round(percentile(v, 0.95), 3),
                              "mean": round(statistics.fmean(v), 3)} for part, v in parts.items()}
               for state, parts in times.items()},
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
