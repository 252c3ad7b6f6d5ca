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
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from knowledge_store.config.embedding_models import QUANTIZATION_RECIPES, model_facts
from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError

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
# quantises to int8 in 15 s and opens its ONNX session in 0.5 s.  They only tell waiting clients when to come back
# (``models.loading.ModelLoad``, a 503's Retry-After): a busier machine takes longer.
STEP_SECONDS = {"exporting": (6.0, 0.030), "quantising": (0.5, 0.034), "loading": (0.3, 0.0005),
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


_ARTIFACT_LOCKS: dict[str, threading.Lock] = {}
_ARTIFACT_LOCKS_GUARD = threading.Lock()


def _artifact_lock(path: Path) -> threading.Lock:
    """The lock of one derived model file in this process (exported or quantised once, by one thread)."""
    with _ARTIFACT_LOCKS_GUARD:
        return _ARTIFACT_LOCKS.setdefault(str(path), threading.Lock())


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
        self.model_id = inner.model_id
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


# ONNX export revision: part of the exported file's name, so a changed export is never confused
# with another file in the cache.  "eager1": attention exported in its eager form, which ONNX
# Runtime runs 1.1-1.3x faster than an SDPA export; same vectors.
ONNX_EXPORT_REVISION = "eager1"

_FP32_IN_INT8 = re.compile(r"/layer\.\d+/output/dense/MatMul$")


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


class OnnxEmbedder:
    """The same model run by ONNX Runtime: faster than torch on this CPU, same vectors in fp32.

    Used for *query* embedding in the serving path (one short text per request)
    and for *document* embedding in ingestion.  The ONNX graph
    is exported once from the local weights (``torch.onnx.export``, no download)
    into ``cache_dir`` and reused; tokenisation, mean pooling and L2
    normalisation mirror the sentence-transformers pipeline of
    all-MiniLM-L6-v2 (Transformer -> mean Pooling -> Normalize), so fp32 vectors
    match the torch ones to cosine >= 0.99999 and share their cache key.

    Throughput levers for documents (measured in bench/embed_throughput.py):

    - texts are tokenised once, sorted by length and cut into batches of
      ``batch_size`` (1 = no padding at all, and the activations stay in the
      core's cache: the fastest on this CPU);
    - ``parallel`` batches run at once, each on one thread of a shared session
      (``threads`` intra-op threads each).  One thread per batch beats one
      batch on two threads, most of all when other processes take a core;
    - ``quantization="int8"``: dynamic int8 (per-channel weights) for the weight
      MatMuls but each layer's feed-forward output projection, made from the fp32
      export with ONNX Runtime's quantiser; its own model id.
    """

    def __init__(self, model_path: Path, cache_dir: Path, threads: int = 1, dim: int | None = None,
                 max_length: int | None = None, quantization: str = "none", batch_size: int = 32, parallel: int = 1,
                 torch_fallback: bool = False, bare_weight: float = 0.0, prefix: str = "",
                 in_context_sentences: bool = False) -> None:
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
        self.quantization = quantization
        self.torch_fallback = torch_fallback
        self.base_model_id = model_id_for(self.model_path)
        # in_context_sentences: the embed stage pools sentence vectors from the chunks' own pass (embed_in_context)
        self.model_id = document_model_id(self.model_path, quantization, bare_weight, prefix, in_context_sentences)
        self._inputs: tuple[str, ...] = ()
        self._session = None
        self._tokenizer = None
        self._torch: Embedder | None = None
        self._lock = threading.Lock()
        self.on_phase: Callable[[str], None] | None = None  # told each loading step as it starts (``load_steps``)

    @property
    def backend(self) -> str:
        """What actually embeds: onnx, onnx-int8, or torch (the fp32 fallback)."""
        if self._torch is not None:
            return "torch"
        return "onnx" if self.quantization == "none" else f"onnx-{self.quantization}"

    @property
    def fp32_path(self) -> Path:
        return self.cache_dir / f"{self.base_model_id.replace(':', '-')}.{ONNX_EXPORT_REVISION}.onnx"

    @property
    def onnx_path(self) -> Path:
        if self.quantization == "none":
            return self.fp32_path
        return self.fp32_path.with_name(f"{self.fp32_path.stem}.{QUANTIZATION_RECIPES[self.quantization]}.onnx")

    @property
    def loaded(self) -> bool:
        return self._session is not None or self._torch is not None

    def _export(self) -> None:
        import torch  # noqa: PLC0415 - torch, ~1.5 s to import
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415 - transformers, ~0.7 s to import

        tokenizer = AutoTokenizer.from_pretrained(str(self.model_path), local_files_only=True)
        model = AutoModel.from_pretrained(str(self.model_path), local_files_only=True, attn_implementation="eager").eval()

        sample = tokenizer(["export sample"], return_tensors="pt")
        # BERT-like models (MiniLM) take token type ids, MPNet does not: the graph takes what the tokenizer gives
        names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in sample]

        class LastHiddenState(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *tensors):
                return self.inner(**dict(zip(names, tensors))).last_hidden_state

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.fp32_path.with_suffix(f".{os.getpid()}.tmp")
        axes = {0: "batch", 1: "tokens"}
        with torch.no_grad():
            torch.onnx.export(
                LastHiddenState(model), tuple(sample[n] for n in names), str(tmp),
                input_names=names, output_names=["last_hidden_state"],
                dynamic_axes={**{n: axes for n in names}, "last_hidden_state": axes},
                opset_version=17, dynamo=False,
            )
        os.replace(tmp, self.fp32_path)
        # an export without a revision in its name (SDPA attention) is never read: it goes
        (self.cache_dir / f"{self.base_model_id.replace(':', '-')}.onnx").unlink(missing_ok=True)

    def _quantize(self) -> None:
        import onnx  # noqa: PLC0415 - ONNX, ~0.2 s to import; only to quantize an export once
        from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415 - ONNX Runtime, ~0.4 s

        keep_fp32 = [node.name for node in onnx.load(str(self.fp32_path)).graph.node
                     if node.op_type == "MatMul" and _FP32_IN_INT8.search(node.name)]
        if not keep_fp32:  # the recipe names nodes of this export; another export needs another recipe tag
            raise RuntimeError(f"{self.fp32_path.name}: no feed-forward output MatMul found to keep in fp32")
        tmp = self.onnx_path.with_suffix(f".{os.getpid()}.tmp")
        quantize_dynamic(
            str(self.fp32_path), str(tmp), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
            nodes_to_exclude=keep_fp32, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        os.replace(tmp, self.onnx_path)

    def load_steps(self) -> list[tuple[str, float]]:
        """What ``load`` has left to do, as (step, expected seconds): exporting the ONNX graph when it is not in
        the cache yet, quantising it when the int8 graph is not, then loading the session."""
        if self.loaded:
            return []
        steps = [] if self.fp32_path.is_file() else [("exporting", step_seconds("exporting", self.model_path))]
        if self.onnx_path != self.fp32_path and not self.onnx_path.is_file():
            steps.append(("quantising", step_seconds("quantising", self.model_path)))
        return steps + [("loading", step_seconds("loading", self.model_path))]

    def _load_onnx(self) -> None:
        import onnxruntime as ort  # noqa: PLC0415 - ONNX Runtime, ~0.2 s to import

        # one export (and quantisation) of a model at a time in this process: a query model loading in the
        # background and an ingestion job's document model write the same files
        with _artifact_lock(self.fp32_path):
            if not self.fp32_path.is_file():
                report_step(self, "exporting")
                self._export()
            if not self.onnx_path.is_file():
                report_step(self, "quantising")
                self._quantize()
        report_step(self, "loading")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        tokenizer = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=self.max_length)  # [CLS] and [SEP] included, as sentence-transformers
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._session = ort.InferenceSession(str(self.onnx_path), options, providers=["CPUExecutionProvider"])
        self._inputs = tuple(i.name for i in self._session.get_inputs())

    def load(self) -> "OnnxEmbedder":
        with self._lock:
            if not self.loaded:
                try:
                    self._load_onnx()
                except Exception as error:
                    if not (self.torch_fallback and self.quantization == "none"):
                        raise
                    logging.getLogger(__name__).warning("ONNX encoder of %s unavailable (%s); using torch",
                                                        self.model_id, error)
                    fallback = Embedder(self.model_path, batch_size=32, torch_threads=self.torch_threads, dim=self.dim,
                                        prefix=self.prefix)
                    fallback.on_phase = self.on_phase
                    self._torch = fallback.load()  # kept once loaded: a failed fallback leaves this not loaded
        return self

    def _embed_batch(self, encodings: list, out: np.ndarray, rows: list[int],
                     spans: SentencePooling | None = None) -> None:
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
        hidden = self._session.run(None, {name: feeds[name] for name in self._inputs})[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        out[rows] = pooled
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
        encodings = self._tokenizer.encode_batch([self.prefix + t for t in texts] if self.prefix else list(texts))
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
    query through the int8 graph of the document recipe, whose vectors are within cosine ~0.99 of fp32;
    it has no torch fallback (torch would give other vectors than the ones asked for), so a failure to
    build it raises.  Query vectors are compared with the stored ones and never stored themselves.
    ``load=False``: the same embedder not loaded yet (nothing exported, imported or read; its model id and
    width are known): it loads on its first ``load`` or ``embed``, falling back to torch the same way.
    """
    if quantization != "none":
        if backend != "onnx":
            raise ConfigError("query_quantization", quantization, "needs query_encoder=onnx")
        embedder = OnnxEmbedder(model_path, cache_dir, threads=threads, dim=dim, prefix=prefix, quantization=quantization)
        return embedder.load() if load else embedder
    if backend == "onnx" and not load:
        return OnnxEmbedder(model_path, cache_dir, threads=threads, dim=dim, prefix=prefix, torch_fallback=True)
    if backend == "onnx":
        try:
            return OnnxEmbedder(model_path, cache_dir, threads=threads, dim=dim, prefix=prefix).load()
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
