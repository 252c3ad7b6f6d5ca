"""The embedding model and its tokenizer, loaded from a local folder only.

The chunker measures chunks with the model's *own* WordPiece tokenizer (the
fast ``tokenizers`` file shipped with the model), so "at most 254 content
tokens" means exactly what the model will see.  The model itself is loaded
lazily: parsing and chunking never pay for torch.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from knowledge_store.config.embedding_models import QUANTIZATION_RECIPES, model_facts
from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError
from knowledge_store.models.artifacts import (
    PROBE_TEXTS,
    FidelityRecord,
    ModelArtifacts,
    cpu_identity,
    fastest_alternating_ms,
    judge,
    now_iso,
    timed_median_ms,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class TokenCounter:
    """Counts word-pieces exactly as the embedding model's tokenizer does (no special tokens)."""

    def __init__(self, model_path: Path) -> None:
        tokenizer_file = Path(model_path) / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ConfigError("model_path", str(model_path), "no tokenizer.json in the model folder")
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        return [len(e.ids) for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` that fits in ``max_tokens`` word-pieces, cut at a word boundary."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        if len(encoding.ids) <= max_tokens:
            return text
        if max_tokens <= 0:
            return ""
        end = encoding.offsets[max_tokens - 1][1]
        # never end inside a word: back off to the last whitespace if there is one
        cut = text.rfind(" ", 0, end + 1)
        if cut > 0 and text[end:end + 1] not in ("", " "):
            end = cut
        return text[:end].rstrip()

    def split_offsets(self, text: str, max_tokens: int) -> list[tuple[int, int]]:
        """Character spans covering ``text`` with at most ``max_tokens`` word-pieces each.

        Used only for a single unit (one enormous sentence or code line) that
        cannot fit a chunk on its own; spans end at whitespace where possible.
        """
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        offsets = encoding.offsets
        spans: list[tuple[int, int]] = []
        start_token = 0
        start_char = 0
        while start_token < len(offsets):
            end_token = min(start_token + max_tokens, len(offsets))
            if end_token < len(offsets):
                # back off to a token that starts a new word (preceded by whitespace)
                candidate = end_token
                while candidate > start_token + max_tokens // 2:
                    begin = offsets[candidate][0]
                    if begin > 0 and text[begin - 1].isspace():
                        break
                    candidate -= 1
                if candidate > start_token + max_tokens // 2:
                    end_token = candidate
                end_char = offsets[end_token][0]
            else:
                end_char = len(text)
            spans.append((start_char, end_char))
            start_char = end_char
            start_token = end_token
        return spans


@lru_cache(maxsize=4)
def token_counter(model_path: str) -> TokenCounter:
    return TokenCounter(Path(model_path))


def model_id_for(model_path: Path) -> str:
    """A short, stable identity of the model weights' configuration.

    Embeddings are cached per (content_hash, model_id): pointing the settings at
    a different model can never mix its vectors with the old ones.
    """
    model_path = Path(model_path)
    digest = hashlib.sha256()
    for name in ("config.json", "modules.json", "sentence_bert_config.json"):
        file = model_path / name
        if file.is_file():
            digest.update(file.read_bytes())
    weights = model_path / "model.safetensors"
    if weights.is_file():
        digest.update(str(weights.stat().st_size).encode())
    name = model_path.name if model_path.name != "model" else model_path.parent.name
    return f"{name}:{digest.hexdigest()[:12]}"


# Seconds each loading step takes on the 2-core reference machine, as (fixed, per MB of weights); the fixed part is
# mostly imports (torch and transformers to export, sentence-transformers to run torch).  Measured on a fresh cache:
# all-MiniLM-L6-v2 (91 MB) exports in 9 s and loads in torch in 7 s; all-mpnet-base-v2 (438 MB) exports in 19 s,
# quantises to int8 in 15 s, is checked against fp32 on the CPU in about 6 s and opens its ONNX session in 0.5 s.
# They only tell waiting clients when to come back
# (``models.loading.ModelLoad``, a 503's Retry-After): a busier machine takes longer.
STEP_SECONDS = {"exporting": (6.0, 0.030), "quantising": (0.5, 0.034), "checking": (2.0, 0.010), "loading": (0.3, 0.0005),
                "loading torch": (7.0, 0.002)}


def step_seconds(step: str, model_path: Path) -> float:
    """The expected seconds of loading ``step`` (``STEP_SECONDS``) for the weights in ``model_path``."""
    fixed, per_mb = STEP_SECONDS[step]
    weights = [p for p in (Path(model_path) / name for name in ("model.safetensors", "pytorch_model.bin")) if p.is_file()]
    megabytes = weights[0].stat().st_size / 1e6 if weights else 100.0
    return round(fixed + per_mb * megabytes, 1)


def report_step(embedder, step: str) -> None:
    """Tell ``embedder.on_phase`` (when someone listens) that loading ``step`` starts."""
    listener = getattr(embedder, "on_phase", None)
    if listener is not None:
        listener(step)


class Embedder:
    """Sentence-transformers model loaded from a path, L2-normalised float32 output.

    Loading is lazy and thread-safe; ``torch_threads`` is set deliberately
    because on this shared 2-core machine an unbounded thread pool turns a
    17 ms query embedding into 500 ms whenever another process runs.
    ``dim`` is the width the model must produce (checked at load); None = the
    configured ``settings.embedding_dim``, the width of the store's vectors.
    """

    def __init__(self, model_path: Path, batch_size: int = 32, torch_threads: int = 1, dim: int | None = None,
                 bare_weight: float = 0.0, prefix: str = "") -> None:
        self.model_path = Path(model_path)
        self.batch_size = batch_size
        self.torch_threads = torch_threads
        self.dim = model_dim(self.model_path) if dim is None else dim
        self.prefix = prefix
        self._model = None
        self._lock = threading.Lock()
        self.on_phase: Callable[[str], None] | None = None  # told each loading step as it starts (``load_steps``)
        if not (self.model_path / "config.json").is_file():
            raise ConfigError("model_path", str(model_path), "not a sentence-transformers model folder (no config.json)")
        # ``bare_weight`` only names the chunk-vector recipe (ingestion's ``embed_chunks`` reads it off the id);
        # ``embed`` always embeds the texts it is given, as queries need
        self.model_id = chunk_vector_id(with_prefix(model_id_for(self.model_path), prefix), bare_weight)

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load_steps(self) -> list[tuple[str, float]]:
        """What ``load`` has left to do, as (step, expected seconds): reading the weights with torch."""
        return [] if self.loaded else [("loading", step_seconds("loading torch", self.model_path))]

    def _load(self):
        with self._lock:
            if self._model is None:
                report_step(self, "loading")
                import torch  # noqa: PLC0415 - torch, ~1.5 s to import
                from sentence_transformers import SentenceTransformer  # noqa: PLC0415 - sentence-transformers, ~6 s

                torch.set_num_threads(self.torch_threads)
                try:  # the weight-loading progress bar is noise in logs and CLIs
                    from transformers.utils import logging as hf_logging  # noqa: PLC0415 - transformers, ~0.7 s

                    hf_logging.disable_progress_bar()
                except ImportError:  # pragma: no cover
                    pass
                model = SentenceTransformer(str(self.model_path), device="cpu", local_files_only=True)
                produced = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") else model.get_sentence_embedding_dimension()
                if produced != self.dim:
                    raise ConfigError("model_path", str(self.model_path), f"model produces {produced}-d vectors, expected {self.dim}")
                self._model = model
        return self._model

    def load(self) -> "Embedder":
        """Load the model now (so timings of ``embed`` measure inference only)."""
        self._load()
        return self

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        vectors = model.encode(
            [self.prefix + t for t in texts] if self.prefix else texts,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

class BatchingEmbedder:
    """Coalesces concurrent single-query embeddings into one model call.

    Under concurrent load (an API with many clients) each request embeds one
    short query; run one by one they queue behind each other on the CPU.  This
    wrapper lets requests that arrive while the model is busy ride in the next
    batch (up to ``max_batch``), which costs little more than a single query,
    and caches recent query vectors (repeated questions are common).  With one
    client it adds no waiting: a lone request is embedded immediately.
    """

    def __init__(self, inner: Embedder, max_batch: int = 32, cache_size: int = 2048) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.torch_threads = inner.torch_threads
        self.max_batch = max_batch
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cond = threading.Condition()
        self._pending: list[tuple[str, dict]] = []
        self._busy = False
        self.batches = 0
        self.batched_texts = 0

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def loaded(self) -> bool:
        return self.inner.loaded

    def load(self) -> "BatchingEmbedder":
        self.inner.load()
        return self

    def _cached(self, text: str) -> np.ndarray | None:
        if not self.cache_size:
            return None
        with self._cond:
            vector = self._cache.get(text)
            if vector is not None:
                self._cache.move_to_end(text)
            return vector

    def _remember(self, texts: list[str], vectors: np.ndarray) -> None:
        for text, vector in zip(texts, vectors):
            self._cache[text] = vector
            self._cache.move_to_end(text)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def embed(self, texts: list[str]) -> np.ndarray:
        if len(texts) != 1:  # bulk calls (ingestion, evaluation) go straight through
            return self.inner.embed(texts)
        text = texts[0]
        cached = self._cached(text)
        if cached is not None:
            return cached[None, :]
        slot: dict = {}
        with self._cond:
            self._pending.append((text, slot))
            while "vector" not in slot and "error" not in slot:
                if not self._busy:
                    # become the leader: embed everything pending (including our own text)
                    batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
                    self._busy = True
                    self._cond.release()
                    try:
                        try:
                            vectors = self.inner.embed([t for t, _ in batch])
                            self.batches += 1
                            self.batched_texts += len(batch)
                            for (t, s), v in zip(batch, vectors):
                                s["vector"] = v
                        except BaseException as error:  # every waiter of this batch gets the error
                            for _, s in batch:
                                s["error"] = error
                    finally:
                        self._cond.acquire()
                        self._busy = False
                        if "vector" in slot:
                            self._remember([t for t, s in batch if "vector" in s], [s["vector"] for _, s in batch if "vector" in s])
                        self._cond.notify_all()
                else:
                    self._cond.wait(timeout=1.0)
        if "error" in slot:
            raise slot["error"]
        return slot["vector"][None, :]


def document_model_id(model_path: Path, quantization: str = "none", bare_weight: float = 0.0, prefix: str = "",
                      in_context_sentences: bool = False) -> str:
    """The cache identity of document vectors made with ``quantization`` and ``bare_weight``.

    fp32 ONNX Runtime and torch share the model's id: their vectors agree to
    |1 - cosine| < 1e-6 (measured in bench/embed_throughput.py and
    tests/integration/test_document_embedding.py), far below any ranking effect.  Each
    quantisation gets its own id (``<model id>+<recipe>``), and so does each bare-text blend
    (``+bare0.5``): changing either setting re-embeds on the next sync instead of mixing vectors.
    ``in_context_sentences`` (settings ``sentence_encoding=in_context``): the sentence vectors stored under
    this id are pooled from their chunk's forward pass (``+ctxsent``), never taken for sentences embedded
    on their own.
    """
    if quantization not in QUANTIZATION_RECIPES:
        raise ConfigError("document_quantization", quantization, f"must be one of {', '.join(QUANTIZATION_RECIPES)}")
    base = model_id_for(model_path)
    recipe = QUANTIZATION_RECIPES[quantization]
    model_id = with_prefix(f"{base}+{recipe}" if recipe else base, prefix)
    return chunk_vector_id(f"{model_id}+ctxsent" if in_context_sentences else model_id, bare_weight)


def with_prefix(model_id: str, prefix: str) -> str:
    """``model_id`` of vectors of texts embedded behind ``prefix`` (e5's ``passage: ``): ``+p<hash>``, so texts
    embedded with and without one are never taken for each other."""
    return f"{model_id}+p{hashlib.sha256(prefix.encode()).hexdigest()[:8]}" if prefix else model_id


def model_dim(model_path: Path) -> int:
    """The width of ``model_path``'s vectors: what its pooling config says, else the configured width."""
    return model_facts(Path(model_path)).dim or Settings().embedding_dim


def chunk_vector_id(model_id: str, bare_weight: float) -> str:
    """``model_id`` of chunk vectors blended with ``bare_weight`` of their bare text (``embed_chunks``)."""
    if not 0.0 <= bare_weight <= 1.0:
        raise ConfigError("bare_vector_weight", bare_weight, "must be between 0 and 1")
    return f"{model_id}+bare{bare_weight:g}" if bare_weight else model_id


def in_context_sentences_of(model_id: str) -> bool:
    """The sentence vectors of ``model_id`` are pooled from their chunks' forward pass (``document_model_id``)."""
    return re.search(r"\+ctxsent(\+|$)", model_id or "") is not None


def bare_weight_of(model_id: str) -> float:
    """The bare-text share the vectors of ``model_id`` were made with (``chunk_vector_id``), 0 for none."""
    match = re.search(r"\+bare([0-9.eE-]+)$", model_id or "")
    return float(match.group(1)) if match else 0.0


def embed_chunks(embed: Callable[[list[str]], np.ndarray], embed_texts: list[str], texts: list[str],
                 bare_weight: float) -> np.ndarray:
    """Chunk vectors: ``normalise((1 - w) * embed(header + text) + w * embed(text))``, w = ``bare_weight``.

    Why blend: the "title > section" header in front of every chunk (chunking.py) pulls the chunks of
    one long page towards each other and towards its title; the text embedded alone ranks by what the
    passage says.  Neither alone is best: on the documentation dev sets the 50/50 blend ranks better
    than the header vectors, and the bare text alone worse (docs/EVALUATION.md).  A chunk without a
    header (``embed_text == text``) is embedded once.
    """
    if len(embed_texts) != len(texts):
        raise ValueError(f"{len(embed_texts)} embed texts for {len(texts)} chunk texts")
    return blend_bare(embed(embed_texts), embed, embed_texts, texts, bare_weight)


def blend_bare(vectors: np.ndarray, embed: Callable[[list[str]], np.ndarray], embed_texts: list[str],
               texts: list[str], bare_weight: float) -> np.ndarray:
    """``embed_chunks`` given the vectors of ``embed_texts`` already made (``vectors``): the blend with the
    bare texts, embedded here, for the texts that have a header."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if not bare_weight or not len(texts):
        return vectors
    differ = [i for i, (a, b) in enumerate(zip(embed_texts, texts)) if a != b]
    if not differ:
        return vectors
    bare = vectors.copy()
    bare[differ] = np.asarray(embed([texts[i] for i in differ]), dtype=np.float32)
    blend = (1.0 - bare_weight) * vectors + bare_weight * bare
    norms = np.linalg.norm(blend, axis=1, keepdims=True)
    return np.ascontiguousarray(blend / np.where(norms > 0, norms, 1.0), dtype=np.float32)


class SentencePooling:
    """Span vectors pooled from token states (``OnnxEmbedder.embed_in_context``): text ``i``'s spans are
    rows ``first[i]:first[i + 1]`` of ``vectors``; each batch fills the rows of its own texts."""

    def __init__(self, spans: list[list[tuple[int, int]]], dim: int, shift: int) -> None:
        self.spans = spans
        self.shift = shift  # characters of the prefix in front of every text
        self.first = np.concatenate([[0], np.cumsum([len(s) for s in spans])]).astype(np.int64)
        self.vectors = np.zeros((int(self.first[-1]), dim), dtype=np.float32)
        self.covered = np.zeros(int(self.first[-1]), dtype=bool)

    def pool(self, i: int, encoding, hidden: np.ndarray) -> None:
        """Fill text ``i``'s span rows from its token ``encoding`` and ``hidden`` states (padding rows after)."""
        if not self.spans[i]:
            return
        offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
        starts, ends = offsets[:, 0], offsets[:, 1]
        real = ends > starts  # special tokens ([CLS], [SEP]) have empty offsets
        states = hidden[:len(offsets)]
        for j, (start, end) in enumerate(self.spans[i]):
            inside = real & (ends > start + self.shift) & (starts < end + self.shift)
            if not inside.any():
                continue
            vector = states[inside].mean(axis=0)
            norm = float(np.linalg.norm(vector))
            if norm > 0:
                self.vectors[self.first[i] + j] = vector / norm
                self.covered[self.first[i] + j] = True


@dataclass(frozen=True)
class RecipeDecision:
    """Which graph an ``OnnxEmbedder`` runs, and why: the quantisation asked for, the one in effect, the check."""

    requested: str  # the setting: none | int8
    in_effect: str  # what runs: none (the fp32 graph) | int8
    recipe: str  # the quantised graph's recipe tag ("" when none was asked for)
    reason: str
    fidelity: FidelityRecord | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "in_effect": self.in_effect, "recipe": self.recipe, "reason": self.reason,
                "fidelity": None if self.fidelity is None else self.fidelity.to_dict()}


class _Graph:
    """One ONNX Runtime session over a graph file, with the model's tokenizer: token states and pooled vectors.

    ``spin``: ONNX Runtime's threads wait for the next piece of work by spinning (its default), which suits batches
    of documents; a query is one short run beside the BM25 thread and the ranking on the same cores, where spinning
    threads take their time, so query sessions wait without spinning (docs/BENCHMARKS.md, query threads)."""

    def __init__(self, path: Path, tokenizer: Tokenizer, threads: int, spin: bool = True) -> None:
        import onnxruntime as ort  # noqa: PLC0415 - ONNX Runtime, ~0.2 s to import

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        if not spin:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.path = path
        self.tokenizer = tokenizer
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = tuple(i.name for i in self.session.get_inputs())

    def hidden(self, encodings: list, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(token states, attention mask) of ``encodings[rows]`` run as one padded batch."""
        width = max(len(encodings[i].ids) for i in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        types = np.zeros((len(rows), width), dtype=np.int64)
        for row, i in enumerate(rows):
            encoding = encodings[i]
            length = len(encoding.ids)
            ids[row, :length] = encoding.ids
            mask[row, :length] = 1
            types[row, :length] = encoding.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return self.session.run(None, {name: feeds[name] for name in self.inputs})[0], mask

    def vectors(self, texts: list[str], batch_size: int) -> np.ndarray:
        """Mean-pooled, normalised vectors of ``texts`` in batches of ``batch_size`` (in the given order)."""
        encodings = self.tokenizer.encode_batch(list(texts))
        out = np.empty((len(texts), 0 if not texts else 1), dtype=np.float32)
        parts = []
        for first in range(0, len(texts), batch_size):
            rows = list(range(first, min(first + batch_size, len(texts))))
            hidden, mask = self.hidden(encodings, rows)
            parts.append(mean_pool(hidden, mask))
        return np.vstack(parts) if parts else out


FP32_ASKED_FOR = RecipeDecision("none", "none", "", "fp32 asked for")  # frozen: one instance serves every embedder


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling and normalisation of token states under an attention mask."""
    weights = mask[..., None].astype(np.float32)
    pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
    pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
    return pooled.astype(np.float32)


class OnnxEmbedder:
    """The same model run by ONNX Runtime: faster than torch on this CPU, same vectors in fp32.

    Used for *query* embedding in the serving path (one short text per request)
    and for *document* embedding in ingestion.  The ONNX graphs come from the
    per-user model cache (``models.artifacts``: exported once per machine from the
    local weights, no download); tokenisation, mean pooling and L2
    normalisation mirror the sentence-transformers pipeline
    (Transformer -> mean Pooling -> Normalize), so fp32 vectors
    match the torch ones to cosine >= 0.99999 and share their cache key.

    Throughput levers for documents (measured in bench/embed_throughput.py):

    - texts are tokenised once, sorted by length and cut into batches of
      ``batch_size`` (1 = no padding at all, and the activations stay in the
      core's cache: the fastest on this CPU);
    - ``parallel`` batches run at once, each on one thread of a shared session
      (``threads`` intra-op threads each).  One thread per batch beats one
      batch on two threads, most of all when other processes take a core;
    - ``quantization="int8"``: the int8 graph of ``QUANTIZATION_RECIPES["int8"]``, used only where it passed the
      fidelity check on this CPU (``models.artifacts``); where it failed, the fp32 graph runs and the vectors
      carry the fp32 model id (``decision`` says why).  Of two graphs that both pass, the one that was faster
      on this CPU runs: for ``purpose="queries"`` on the probe queries one at a time (query vectors are never
      stored), for documents on the probe set in the embedder's batches (int8 kernels differ by CPU: without
      VNNI the blockwise graph can be slower than fp32; the vectors then carry the fp32 model id).
    """

    def __init__(self, model_path: Path, cache_dir: Path, threads: int = 1, dim: int | None = None,
                 max_length: int | None = None, quantization: str = "none", batch_size: int = 32, parallel: int = 1,
                 torch_fallback: bool = False, bare_weight: float = 0.0, prefix: str = "",
                 in_context_sentences: bool = False, purpose: str = "documents") -> None:
        if quantization not in QUANTIZATION_RECIPES:
            raise ConfigError("document_quantization", quantization, f"must be one of {', '.join(QUANTIZATION_RECIPES)}")
        self.model_path = Path(model_path)
        self.cache_dir = Path(cache_dir)
        self.threads = max(1, threads)
        self.parallel = max(1, parallel)
        self.torch_threads = self.threads * self.parallel  # cores used (the name other embedders report)
        self.dim = model_dim(self.model_path) if dim is None else dim  # None: what the model says, as Embedder
        # the model's own window (256 all-MiniLM-L6-v2, 384 all-mpnet-base-v2), as sentence-transformers truncates
        self.max_length = max_length or model_facts(self.model_path).max_tokens or 256
        self.prefix = prefix
        self.batch_size = max(1, batch_size)
        self.requested_quantization = quantization
        self.purpose = purpose
        self.torch_fallback = torch_fallback
        self.bare_weight = bare_weight
        self.in_context_sentences = in_context_sentences
        self.base_model_id = model_id_for(self.model_path)
        self._artifacts: ModelArtifacts | None = None
        self._decision: RecipeDecision | None = None
        self._graph: _Graph | None = None
        self._torch: Embedder | None = None
        self._lock = threading.RLock()
        self.on_phase: Callable[[str], None] | None = None  # told each loading step as it starts (``load_steps``)

    # ------------------------------------------------------------------ which graph
    @property
    def artifacts(self) -> ModelArtifacts:
        """The model's graphs in the per-user cache (the weights are fingerprinted on first use)."""
        if self._artifacts is None:
            self._artifacts = ModelArtifacts(self.model_path, self.cache_dir)
        return self._artifacts

    @property
    def decision(self) -> RecipeDecision:
        """Which graph runs: fp32 when asked for; else the quantised one where it passed its fidelity check on this
        CPU (checked now, building the graphs first, when this CPU has no recorded check)."""
        if self._decision is None:
            with self._lock:
                if self._decision is None:
                    self._decision = self._decide()
        return self._decision

    def recorded_decision(self) -> RecipeDecision | None:
        """``decision`` if it is known without building or checking anything (for status pages), else None.  Never
        waits for ``_lock``: a load holds it while it waits for another process's graph build, and ``/health``
        must answer meanwhile."""
        if self._decision is not None:
            return self._decision
        if self.requested_quantization == "none":
            return FP32_ASKED_FOR
        record = self._recorded_fidelity(QUANTIZATION_RECIPES[self.requested_quantization])
        return None if self._needs_check(record) else self._decision_from(record)

    def _decide(self) -> RecipeDecision:
        if self.requested_quantization == "none":
            return FP32_ASKED_FOR
        tag = QUANTIZATION_RECIPES[self.requested_quantization]
        record = self._recorded_fidelity(tag)
        if self._needs_check(record):
            record = self._check(tag)
        decision = self._decision_from(record)
        if decision.in_effect == "none" and not record.passed:
            logging.getLogger(__name__).warning("%s: the %s graph is not used on this CPU, fp32 serves instead: %s",
                                                self.base_model_id, tag, record.reason)
        return decision

    def _recorded_fidelity(self, tag: str) -> FidelityRecord | None:
        """This CPU's recorded check of the ``tag`` graph in the cache (None: no graph, or never checked here)."""
        return self.artifacts.fidelity(tag) if self.artifacts.graph_path(tag).is_file() else None

    def _needs_check(self, record: FidelityRecord | None) -> bool:
        """Never checked on this CPU, or (for documents) checked before the probe set's batches were timed."""
        return record is None or (self.purpose == "documents" and not record.batch_ms)

    def _decision_from(self, record: FidelityRecord) -> RecipeDecision:
        tag = QUANTIZATION_RECIPES[self.requested_quantization]
        if not record.passed:
            return RecipeDecision(self.requested_quantization, "none", tag, record.reason + "; fp32 serves", record)
        if self.purpose == "queries" and record.faster_for_queries() == "fp32":
            return RecipeDecision(self.requested_quantization, "none", tag,
                                  f"{record.reason}; fp32 embeds queries faster on this CPU "
                                  f"({record.query_ms['fp32']:.1f} vs {record.query_ms['quantised']:.1f} ms)", record)
        if self.purpose == "documents" and record.faster_for_documents() == "fp32":
            return RecipeDecision(self.requested_quantization, "none", tag,
                                  f"{record.reason}; fp32 embeds documents faster on this CPU "
                                  f"({record.batch_ms['fp32']:.1f} vs {record.batch_ms['quantised']:.1f} ms per text "
                                  "in a batch)", record)
        return RecipeDecision(self.requested_quantization, self.requested_quantization, tag, record.reason, record)

    def _check(self, tag: str) -> FidelityRecord:
        """Build fp32 and ``tag`` graphs if missing, embed the probe set with both (one at a time, and the candidate
        in one padded batch too), time the short probe texts on each (and, for documents, the probe set in the
        embedder's batches), and record the verdict for this CPU."""
        start = time.perf_counter()
        fp32_path = self.artifacts.ensure("", self._phase)
        candidate_path = self.artifacts.ensure(tag, self._phase)
        report_step(self, "checking")
        tokenizer = self._make_tokenizer()
        reference, candidate = _Graph(fp32_path, tokenizer, self.threads), _Graph(candidate_path, tokenizer, self.threads)
        texts = list(PROBE_TEXTS)
        truth = reference.vectors(texts, 1)
        cosines = [float(c) for c in (candidate.vectors(texts, 1) * truth).sum(axis=1)]
        cosines += [float(c) for c in (candidate.vectors(texts, len(texts)) * truth).sum(axis=1)]
        mean, low, passed = judge(cosines)
        short = [t for t in texts if len(t) < 60]
        query_ms = {"fp32": timed_median_ms(lambda: reference.vectors(short, 1), 5),
                    "quantised": timed_median_ms(lambda: candidate.vectors(short, 1), 5)}
        query_ms = {name: round(ms / len(short), 2) for name, ms in query_ms.items()}
        batch_ms = {}
        if self.purpose == "documents":  # the probe set as ingestion embeds texts: length-sorted, in batches
            ordered = sorted(texts, key=len)
            batch_ms = fastest_alternating_ms({"fp32": lambda: reference.vectors(ordered, self.batch_size),
                                               "quantised": lambda: candidate.vectors(ordered, self.batch_size)}, 2)
            batch_ms = {name: round(ms / len(texts), 2) for name, ms in batch_ms.items()}
        cpu = cpu_identity()
        record = FidelityRecord(cpu_key=cpu.key, cpu=cpu.describe(), flags=list(cpu.flags), onnxruntime=cpu.onnxruntime,
                                texts=len(texts), mean=round(mean, 5), min=round(low, 5), passed=passed,
                                checked_at=now_iso(), seconds=round(time.perf_counter() - start, 2), query_ms=query_ms,
                                batch_ms=batch_ms)
        self.artifacts.record_fidelity(tag, record)
        logging.getLogger(__name__).info("%s %s: %s", self.base_model_id, tag, record.reason)
        return record

    @property
    def quantization(self) -> str:
        """The quantisation in effect (``decision``): none or the requested one."""
        return "none" if self.requested_quantization == "none" else self.decision.in_effect

    @property
    def model_id(self) -> str:
        """The id of the vectors this embedder makes: the recipe in effect is part of it, so vectors of a graph that
        failed its check (fp32 served instead) never mix with int8 ones."""
        return document_model_id(self.model_path, self.quantization, self.bare_weight, self.prefix,
                                 self.in_context_sentences)

    @property
    def backend(self) -> str:
        """What actually embeds: onnx, onnx-int8, or torch (the fp32 fallback)."""
        if self._torch is not None:
            return "torch"
        return "onnx" if self.quantization == "none" else f"onnx-{self.quantization}"

    @property
    def onnx_path(self) -> Path:
        """The graph that runs."""
        tag = QUANTIZATION_RECIPES[self.quantization]
        return self.artifacts.graph_path(tag)

    @property
    def loaded(self) -> bool:
        return self._graph is not None or self._torch is not None

    @property
    def input_names(self) -> tuple[str, ...]:
        """The loaded ONNX graph's inputs (MPNet takes no ``token_type_ids``); empty under the torch fallback."""
        self.load()
        return () if self._graph is None else self._graph.inputs

    def _make_tokenizer(self) -> Tokenizer:
        tokenizer = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=self.max_length)  # [CLS] and [SEP] included, as sentence-transformers
        tokenizer.no_padding()
        return tokenizer

    def _phase(self, state: str) -> None:
        """``ModelArtifacts.ensure``'s states (exporting, quantising, idle) as loading steps."""
        if state != "idle":
            report_step(self, state)

    def load_steps(self) -> list[tuple[str, float]]:
        """What ``load`` has left to do, as (step, expected seconds): exporting the ONNX graph when the machine's
        cache does not hold it yet, quantising it when the quantised graph is missing, checking that graph on this
        CPU when it never was, then loading the session."""
        if self.loaded:
            return []
        tag = QUANTIZATION_RECIPES[self.requested_quantization]
        artifacts = self.artifacts
        steps = [] if artifacts.fp32_path.is_file() else [("exporting", step_seconds("exporting", self.model_path))]
        if tag and not artifacts.graph_path(tag).is_file():
            steps.append(("quantising", step_seconds("quantising", self.model_path)))
        if tag and self._decision is None and self._needs_check(self._recorded_fidelity(tag)):
            steps.append(("checking", step_seconds("checking", self.model_path)))
        return steps + [("loading", step_seconds("loading", self.model_path))]

    def _load_onnx(self) -> None:
        path = self.artifacts.ensure(QUANTIZATION_RECIPES[self.quantization], self._phase)
        report_step(self, "loading")
        self._graph = _Graph(path, self._make_tokenizer(), self.threads, spin=self.purpose != "queries")

    def load(self) -> "OnnxEmbedder":
        with self._lock:
            if not self.loaded:
                try:
                    self._load_onnx()
                except Exception as error:
                    if not (self.torch_fallback and self.requested_quantization == "none"):
                        raise
                    logging.getLogger(__name__).warning("ONNX encoder of %s unavailable (%s); using torch",
                                                        self.base_model_id, error)
                    fallback = Embedder(self.model_path, batch_size=32, torch_threads=self.torch_threads, dim=self.dim,
                                        prefix=self.prefix)
                    fallback.on_phase = self.on_phase
                    self._torch = fallback.load()  # kept once loaded: a failed fallback leaves this not loaded
        return self

    def _embed_batch(self, encodings: list, out: np.ndarray, rows: list[int],
                     spans: SentencePooling | None = None) -> None:
        hidden, mask = self._graph.hidden(encodings, rows)
        out[rows] = mean_pool(hidden, mask)
        if spans is not None:
            for row, i in enumerate(rows):
                spans.pool(i, encodings[i], hidden[row])

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._run(texts)

    def embed_in_context(self, texts: list[str], spans: list[list[tuple[int, int]]]
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``embed(texts)`` and, from the same forward pass, one vector per span of each text: the mean of the
        token states whose characters overlap the span, L2-normalised (a sentence read in its chunk's context).

        Returns (text vectors, span vectors (every span in order, text by text), covered): ``covered[j]`` is
        False for a span with no token inside the model's window (cut off by truncation); its row is zeros and
        the caller embeds that sentence on its own.  Needs the ONNX graph (its token states): the torch
        fallback has none, and asking it raises."""
        if len(spans) != len(texts):
            raise ValueError(f"{len(spans)} span lists for {len(texts)} texts")
        pooling = SentencePooling(spans, self.dim, len(self.prefix))
        vectors = self._run(texts, pooling)
        return vectors, pooling.vectors, pooling.covered

    def _run(self, texts: list[str], spans: SentencePooling | None = None) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load()
        if self._torch is not None:
            if spans is not None:
                raise RuntimeError(f"{self.model_id}: sentence vectors in context need the ONNX graph, and it could "
                                   "not be loaded (the torch fallback gives no token states)")
            return self._torch.embed(texts)
        tokenizer = self._graph.tokenizer
        encodings = tokenizer.encode_batch([self.prefix + t for t in texts] if self.prefix else list(texts))
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))  # longest first: little padding
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if self.parallel > 1 and len(batches) > 1:
            # ONNX Runtime releases the GIL while it runs: one batch per thread keeps every core busy
            with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="embed") as pool:
                for _ in pool.map(lambda rows: self._embed_batch(encodings, out, rows, spans), batches):
                    pass
        else:
            for rows in batches:
                self._embed_batch(encodings, out, rows, spans)
        return out


def query_embedder(model_path: Path, backend: str, cache_dir: Path, threads: int, dim: int | None = None,
                   prefix: str = "", quantization: str = "none", load: bool = True):
    """The embedder for queries: ONNX Runtime when asked for and it loads, else torch.

    Falls back to the sentence-transformers model (and says so in the log) if
    the fp32 ONNX graph cannot be exported or loaded, so serving never depends on it.
    ``quantization`` (settings ``query_quantization``, independent of the documents'): ``int8`` runs the
    query through the int8 graph of the document recipe where that graph passed its fidelity check on this
    CPU and embeds queries faster than fp32 there (``OnnxEmbedder.decision``), else through the fp32 graph;
    it has no torch fallback (torch would give other vectors than the ones asked for), so a failure to
    build the graphs raises.  Query vectors are compared with the stored ones and never stored themselves.
    ``load=False``: the same embedder not loaded yet (nothing exported, imported or read; its model id and
    width are known): it loads on its first ``load`` or ``embed``, falling back to torch the same way.
    """
    if quantization != "none":
        if backend != "onnx":
            raise ConfigError("query_quantization", quantization, "needs query_encoder=onnx")
        embedder = OnnxEmbedder(model_path, cache_dir, threads=threads, dim=dim, prefix=prefix, quantization=quantization,
                                purpose="queries")
        return embedder.load() if load else embedder
    if backend == "onnx" and not load:
        return OnnxEmbedder(model_path, cache_dir, threads=threads, dim=dim, prefix=prefix, torch_fallback=True,
                            purpose="queries")
    if backend == "onnx":
        try:
            return OnnxEmbedder(model_path, cache_dir, threads=threads, dim=dim, prefix=prefix, purpose="queries").load()
        except Exception as error:  # noqa: BLE001 - torch is always there to fall back on
            logging.getLogger(__name__).warning("ONNX query encoder unavailable (%s); using torch", error)
    return Embedder(model_path, batch_size=32, torch_threads=threads, dim=dim, prefix=prefix)


def settings_query_embedder(settings: Settings, model_path: Path | None = None, cache_dir: Path | None = None,
                            threads: int | None = None, load: bool = True):
    """``query_embedder`` as the settings describe it (encoder, width, query prefix, quantisation): every
    place that embeds queries (the engine, evaluation, fine-tuning's decision) embeds them alike.
    ``model_path`` (default ``settings.model_path``), ``cache_dir`` (default ``settings.models_cache_dir``) and
    ``threads`` (default ``settings.query_torch_threads``) are for callers that embed with another model,
    cache or core count; ``load=False`` leaves the loading to the embedder's first use (the engine)."""
    return query_embedder(Path(model_path or settings.model_path), settings.query_encoder,
                          cache_dir or settings.models_cache_dir, threads or settings.query_torch_threads,
                          settings.embedding_dim, settings.embedding_query_prefix, settings.query_quantization, load)


def document_embedder(settings, workers: int = 1, cache_dir: Path | None = None, model_path: Path | None = None):
    """The embedder ingestion uses for chunk texts, from the settings.

    ``document_encoder=onnx`` (default): ONNX Runtime, ``onnx_batch_size`` texts
    per call, ``torch_threads // workers`` batches at once (``workers``: processes
    embedding shards at the same time), ``document_quantization`` none or int8;
    an fp32 graph that cannot be exported or loaded falls back to torch (same
    vectors, same model id).  ``torch``: the sentence-transformers model,
    ``embed_batch_size`` texts per batch.  ``bare_vector_weight`` > 0: ingestion blends each chunk's
    vector with its text embedded without the header (``embed_chunks``), under its own model id.
    Loading is lazy: a sync with nothing to embed never pays for it.  ``model_path``: the model to embed with
    (default ``settings.model_path``; ingestion passes the serving one, ``models.serving.serving_model_path``).
    """
    cores = max(1, settings.torch_threads // max(1, workers))
    model_path = Path(model_path or settings.model_path)
    if settings.document_encoder == "torch":
        if settings.document_quantization != "none":
            raise ConfigError("document_quantization", settings.document_quantization, "needs document_encoder=onnx")
        return Embedder(model_path, settings.embed_batch_size, cores, settings.embedding_dim,
                        bare_weight=settings.bare_vector_weight, prefix=settings.embedding_passage_prefix)
    return OnnxEmbedder(
        model_path, cache_dir or settings.models_cache_dir, threads=1, dim=settings.embedding_dim,
        quantization=settings.document_quantization, batch_size=settings.onnx_batch_size, parallel=cores,
        torch_fallback=True, bare_weight=settings.bare_vector_weight, prefix=settings.embedding_passage_prefix,
        in_context_sentences=settings.in_context_sentences,
    )


def prepare_embedders(settings: Settings, model_path: Path | None = None,
                      on_phase: Callable[[str], None] | None = None) -> dict[str, RecipeDecision]:
    """Build the settings' model graphs in the per-user cache and check them on this CPU, as the document and the
    query embedders will run them; returns each one's ``RecipeDecision``.  What ``make install`` runs
    (``groundwork models prepare``), so a first ingest or ``groundwork serve`` finds everything made."""
    decisions: dict[str, RecipeDecision] = {}
    for purpose, encoder, quantization in (("documents", settings.document_encoder, settings.document_quantization),
                                           ("queries", settings.query_encoder, settings.query_quantization)):
        if encoder != "onnx":
            decisions[purpose] = RecipeDecision("none", "none", "", f"{encoder} runs the model (no ONNX graph)")
            continue
        embedder = OnnxEmbedder(Path(model_path or settings.model_path), settings.models_cache_dir,
                                quantization=quantization, batch_size=settings.onnx_batch_size, purpose=purpose)
        embedder.on_phase = on_phase
        embedder.artifacts.ensure("", embedder._phase)
        decisions[purpose] = embedder.decision
    return decisions


def recorded_recipe_decision(settings: Settings, purpose: str, model_path: Path | None = None) -> RecipeDecision | None:
    """What the ``purpose`` (documents or queries) embedder of ``settings`` runs on this CPU, as far as it is known
    without building or checking anything: fp32 where fp32 is asked for or the encoder is not ONNX, else this CPU's
    recorded verdict, or None when this CPU has none yet (the first embedding checks)."""
    encoder, quantization = ((settings.document_encoder, settings.document_quantization) if purpose == "documents"
                             else (settings.query_encoder, settings.query_quantization))
    if encoder != "onnx" or quantization == "none":
        return RecipeDecision(quantization, "none", "", "fp32 asked for")
    return OnnxEmbedder(Path(model_path or settings.model_path), settings.models_cache_dir, quantization=quantization,
                        purpose=purpose).recorded_decision()


def graph_status(settings: Settings, model_path: Path | None = None) -> dict[str, Any]:
    """What the document and the query embedders run on this CPU, as far as it is known without building or
    checking anything: ``groundwork status``, ``/api/knowledge/config`` and the console's Settings page."""
    path = Path(model_path or settings.model_path)
    cpu = cpu_identity()
    status: dict[str, Any] = {"cache_dir": str(settings.models_cache_dir), "cpu": cpu.describe(), "cpu_key": cpu.key}
    for purpose, quantization in (("documents", settings.document_quantization), ("queries", settings.query_quantization)):
        try:
            known = recorded_recipe_decision(settings, purpose, path)
        except Exception as error:  # noqa: BLE001 - a status page reports what it cannot read
            status[purpose] = {"requested": quantization, "in_effect": None, "recipe": QUANTIZATION_RECIPES[quantization],
                               "reason": f"cannot read the model cache: {error}", "fidelity": None}
            continue
        status[purpose] = known.to_dict() if known is not None else {
            "requested": quantization, "in_effect": None, "recipe": QUANTIZATION_RECIPES[quantization],
            "reason": "not checked on this CPU yet: the first embedding builds and checks the graph", "fidelity": None}
    return status
