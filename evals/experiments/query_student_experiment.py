"""Can a small query encoder, distilled on one corpus, stand in for mpnet's at query time?

The query's p95 at 100k chunks is over its 50 ms target on both CPU kinds, and about half of it is mpnet
embedding the question (12 layers, 768 wide).  Documents need the large model's quality; a query only has
to land near where mpnet would put it.  This trains a *student*: all-MiniLM-L6-v2 (6 layers, 384 wide,
about a sixth of mpnet's encoder work per word-piece) with a linear map to 768 dimensions, taught to
reproduce mpnet's vectors (mean squared error between unit vectors) of query-like texts taken from the
corpus itself, with no labels: self-tuning's pseudo-queries (headings, FAQ questions, titles) and sentences
of the chunks.  The labelled questions only score the result, with the default ranking as served
(``RankingPipeline``: BM25, vectors, sentence evidence, feedback step; ``adapter_eval.ranked_rows``):

- ``mpnet (served graph)``: the store's own query embedder, as the server runs it;
- ``mpnet fp32``: the teacher the student learns from;
- ``MiniLM + linear map``: MiniLM unchanged, its vectors mapped by least squares (no training);
- ``student``: MiniLM and the map trained on the teacher's vectors.

``--student mpnet-layers:N`` trains a student that starts in mpnet's own space instead: its embeddings and first
N layers, pooled as mpnet pools (the untrained row is that truncation as it is).

Each row gives nDCG@10, Recall@5, the questions' mean and minimum cosine to the teacher, and each query
encoder's time per question (one at a time, one thread, fastest of two passes).  The hyperparameters are set
before looking at any labelled question (texts, epochs, learning rate: the arguments' defaults).

    .venv/bin/python -m evals.experiments.query_student_experiment debian --out evals/results/query_student_debian.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
from pathlib import Path

import numpy as np

from evals.experiments.adapter_eval import ranked_rows
from evals.experiments.dev_store import open_dev_store
from knowledge_store.config.embedding_models import EMBEDDER_REGISTRY
from knowledge_store.config.settings import Settings
from knowledge_store.core.text import sentences_to_embed
from knowledge_store.learning.tuning import build_pseudo_queries

RIDGE = 1.0


def training_texts(snapshot, count: int, seed: int = 13) -> list[str]:
    """Query-like texts of the corpus: every pseudo-query, then sentences of its chunks (3-40 words) to ``count``."""
    queries = list(dict.fromkeys(q.query for q in build_pseudo_queries(snapshot, limit=10**9, seed=seed)))
    sentences = []
    for text in snapshot.records.column("text").to_pylist():
        sentences.extend(s for s in sentences_to_embed(text or "") if 3 <= len(s.split()) <= 40)
    sentences = list(dict.fromkeys(sentences))
    random.Random(seed).shuffle(sentences)
    return (queries + sentences)[:count]


def unit(vectors: np.ndarray) -> np.ndarray:
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def per_question_ms(embed, questions: list[str]) -> tuple[float, float]:
    """p50 and p95 ms of embedding each question alone, fastest of two passes per question."""
    best = []
    for q in questions:
        times = []
        for _ in range(2):
            start = time.perf_counter()
            embed([q])
            times.append((time.perf_counter() - start) * 1000)
        best.append(min(times))
    return float(np.percentile(best, 50)), float(np.percentile(best, 95))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("set", help="a dev set: debian, perl, scifact (evals.experiments.dev_store)")
    parser.add_argument("--student", default="minilm",
                        help="minilm (MiniLM and a linear map to 768 dimensions) or mpnet-layers:N (mpnet's first N layers)")
    parser.add_argument("--texts", type=int, default=8000, help="training texts from the corpus")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=2e-5, help="the encoder's learning rate (the map's: 5x)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64, help="word-pieces the student and teacher read")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the teacher and training")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/query-student"),
                        help="where the teacher's vectors of the training texts are kept between runs")
    args = parser.parse_args()

    import torch  # heavy (~1 s, 300 MB): the student is trained with torch
    import torch.nn.functional as F
    from sentence_transformers import SentenceTransformer, models

    torch.manual_seed(13)
    torch.set_num_threads(args.threads)
    dev = open_dev_store(args.set)
    settings = Settings()
    ids = list(dev.dataset.queries)
    questions = [dev.dataset.queries[i] for i in ids]

    load_at_start = os.getloadavg()
    started = time.time()
    texts = training_texts(dev.snapshot, args.texts)
    teacher = SentenceTransformer(str(dev.store.model_path), device="cpu")
    window, teacher.max_seq_length = teacher.max_seq_length, args.max_tokens
    key = hashlib.sha256("\x1e".join([str(dev.store.model_path), str(args.max_tokens), *texts]).encode()).hexdigest()
    cached = args.cache / f"{key[:16]}.npy"
    from_cache = cached.exists()
    if from_cache:
        targets = np.load(cached)
    else:
        targets = unit(teacher.encode(texts, batch_size=64, convert_to_numpy=True))
        args.cache.mkdir(parents=True, exist_ok=True)
        np.save(cached, targets)
    teacher_seconds = time.time() - started
    print(f"{len(texts)} training texts, teacher vectors in {teacher_seconds:.0f} s", flush=True)
    teacher.max_seq_length = window  # questions are read as the model reads them

    if args.student == "minilm":
        student = SentenceTransformer(str(EMBEDDER_REGISTRY["minilm"].locate()), device="cpu")
        student.max_seq_length = args.max_tokens
        base = unit(student.encode(texts, batch_size=64, convert_to_numpy=True))
        # ridge regression from MiniLM's unit vectors (and a constant) to the teacher's: the map's start, and a row
        # of its own; the penalty keeps the map's weights small, so training the encoder under it stays stable
        x = np.c_[base, np.ones(len(base))].astype(np.float64)
        weights = np.linalg.solve(x.T @ x + RIDGE * np.eye(x.shape[1]), x.T @ targets)
        fit = np.sum(unit((x @ weights).astype(np.float32)) * targets, axis=1)
        print(f"linear map: cosine to the teacher on the training texts {fit.mean():.4f}, "
              f"weight norm {np.linalg.norm(weights):.1f}", flush=True)
        dense = models.Dense(base.shape[1], targets.shape[1], bias=True, activation_function=torch.nn.Identity())
        with torch.no_grad():
            dense.linear.weight.copy_(torch.from_numpy(weights[:-1].T.astype(np.float32)))
            dense.linear.bias.copy_(torch.from_numpy(weights[-1].astype(np.float32)))
        student.append(dense)
        groups = [{"params": student[0].parameters(), "lr": args.lr}, {"params": dense.parameters(), "lr": 5 * args.lr}]
        untrained = "MiniLM + linear map"
    else:  # mpnet-layers:N: mpnet's embeddings and first N layers, the same width and pooling (its own space)
        layers = int(args.student.split(":", 1)[1])
        student = SentenceTransformer(str(dev.store.model_path), device="cpu")
        student.max_seq_length = args.max_tokens
        encoder = student[0].auto_model
        encoder.encoder.layer = encoder.encoder.layer[:layers]
        encoder.config.num_hidden_layers = layers
        # the word-piece embeddings stay as mpnet has them: they are most of the parameters (23M) and updating
        # them with AdamW each step costs more than the four layers' backward pass
        encoder.embeddings.requires_grad_(False)
        groups = [{"params": [q for q in student.parameters() if q.requires_grad], "lr": args.lr}]
        untrained = f"mpnet's first {layers} layers, untrained"

    def student_embed(batch: list[str]) -> np.ndarray:
        return unit(student.encode(batch, batch_size=64, convert_to_numpy=True))

    vectors = {"mpnet (served graph)": dev.embedder.embed(questions),
               "mpnet fp32": unit(teacher.encode(questions, batch_size=64, convert_to_numpy=True)),
               untrained: student_embed(questions)}

    student.train()
    optimiser = torch.optim.AdamW(groups)
    steps = args.epochs * ((len(texts) + args.batch - 1) // args.batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: min(1.0, (s + 1) / (0.1 * steps)) *
                                                 max(0.0, (steps - s) / steps))
    order = list(range(len(texts)))
    started = time.time()
    for epoch in range(args.epochs):
        random.Random(epoch).shuffle(order)
        losses = []
        for i in range(0, len(order), args.batch):
            rows = order[i:i + args.batch]
            features = student.tokenize([texts[r] for r in rows])
            out = F.normalize(student(features)["sentence_embedding"], dim=-1)
            loss = ((out - torch.from_numpy(targets[rows])) ** 2).sum(dim=1).mean()
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
            optimiser.step()
            schedule.step()
            losses.append(loss.item())
            if len(losses) in (1, 20, 100):
                print(f"  step {len(losses)}: loss {np.mean(losses[-20:]):.4f}", flush=True)
        print(f"epoch {epoch + 1}: mean loss {np.mean(losses):.4f} (cosine {1 - np.mean(losses) / 2:.4f}), "
              f"{time.time() - started:.0f} s", flush=True)
    train_seconds = time.time() - started
    student.eval()
    vectors["student"] = student_embed(questions)

    teacher_q = vectors["mpnet fp32"]
    timings = {"mpnet (served graph)": per_question_ms(dev.embedder.embed, questions),
               "mpnet fp32": None, untrained: None}
    torch.set_num_threads(1)
    timings["student"] = per_question_ms(student_embed, questions)
    timings["mpnet fp32"] = per_question_ms(lambda b: teacher.encode(b, convert_to_numpy=True), questions)

    rows = {}
    for name, vecs in vectors.items():
        ndcg, recall = dev.mean_scores(
            (qid, dev.ranked_docs(ranked_rows(dev.snapshot, dev.dataset.queries[qid], v.astype(np.float32),
                                              dev.params, settings, settings.question_alpha)))
            for qid, v in zip(ids, vecs))
        cos = np.sum(unit(vecs) * teacher_q, axis=1)
        rows[name] = {"ndcg@10": ndcg, "recall@5": recall, "cosine_to_teacher_mean": round(float(cos.mean()), 4),
                      "cosine_to_teacher_min": round(float(cos.min()), 4),
                      "embed_ms_p50_p95": None if timings.get(name) is None else [round(t, 1) for t in timings[name]]}
        print(f"{name:22s} nDCG@10 {ndcg:.4f}  Recall@5 {recall:.4f}  cosine to teacher "
              f"{cos.mean():.4f} / {cos.min():.4f}  embed ms p50/p95 {rows[name]['embed_ms_p50_p95']}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({
            "set": args.set, "student": args.student, "questions": len(ids), "training_texts": len(texts), "epochs": args.epochs,
            "lr": args.lr, "batch": args.batch, "max_tokens": args.max_tokens, "teacher_seconds": round(teacher_seconds),
            "teacher_vectors_from_cache": from_cache, "load_average_start": list(load_at_start),
            "load_average_end": list(os.getloadavg()),
            "train_seconds": round(train_seconds), "rows": rows,
            "note": "embed timings: one question at a time; the served graph as the server runs it (ONNX), "
                    "the student and mpnet fp32 in torch on one thread"}, indent=2) + "\n")


if __name__ == "__main__":
    main()
