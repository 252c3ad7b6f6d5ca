"""The embedding model and its tokenizer, loaded from a local folder only.

The chunker measures chunks with the model's *own* WordPiece tokenizer (the
fast ``tokenizers`` file shipped with the model), so "at most 254 content
tokens" means exactly what the model will see.  The model itself is loaded
lazily: parsing and chunking never pay for torch.
"""

from __future__ import annotations

import hashlib
import os
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from knowledge_store.errors import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class TokenCounter:
    """Counts word-pieces exactly as the embedding model's tokenizer does (no special tokens)."""

    def __init__(self, model_path: Path) -> None:
        from tokenizers import Tokenizer

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


class Embedder:
    """Sentence-transformers model loaded from a path, L2-normalised float32 output.

    Loading is lazy and thread-safe; ``torch_threads`` is set deliberately
    because on this shared 2-core machine an unbounded thread pool turns a
    17 ms query embedding into 500 ms whenever another process runs.
    """

    def __init__(self, model_path: Path, batch_size: int = 32, torch_threads: int = 1, dim: int = 384) -> None:
        self.model_path = Path(model_path)
        self.batch_size = batch_size
        self.torch_threads = torch_threads
        self.dim = dim
        self._model = None
        self._lock = threading.Lock()
        if not (self.model_path / "config.json").is_file():
            raise ConfigError("model_path", str(model_path), "not a sentence-transformers model folder (no config.json)")
        self.model_id = model_id_for(self.model_path)

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _load(self):
        with self._lock:
            if self._model is None:
                import torch
                from sentence_transformers import SentenceTransformer

                torch.set_num_threads(self.torch_threads)
                try:  # the weight-loading progress bar is noise in logs and CLIs
                    from transformers.utils import logging as hf_logging

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
            texts,
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
        from collections import OrderedDict

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


class OnnxEmbedder:
    """The same model run by ONNX Runtime: ~2.2x faster per query on this CPU, same vectors.

    Used for *query* embedding in the serving path, where one short text is
    embedded per request.  The ONNX graph is exported once from the local
    weights (``torch.onnx.export``, no download) into ``cache_dir`` and reused;
    tokenisation, mean pooling and L2 normalisation mirror the
    sentence-transformers pipeline of all-MiniLM-L6-v2 (Transformer -> mean
    Pooling -> Normalize), so its vectors match the torch ones to cosine
    >= 0.99999 (tests/test_retrieval.py) and share their cache key.
    """

    def __init__(self, model_path: Path, cache_dir: Path, threads: int = 1, dim: int = 384, max_length: int = 256) -> None:
        self.model_path = Path(model_path)
        self.cache_dir = Path(cache_dir)
        self.torch_threads = threads
        self.dim = dim
        self.max_length = max_length
        self.model_id = model_id_for(self.model_path)
        self._session = None
        self._tokenizer = None
        self._lock = threading.Lock()

    @property
    def onnx_path(self) -> Path:
        return self.cache_dir / f"{self.model_id.replace(':', '-')}.onnx"

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def _export(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(self.model_path), local_files_only=True)
        model = AutoModel.from_pretrained(str(self.model_path), local_files_only=True).eval()

        class LastHiddenState(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.inner(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

        sample = tokenizer(["export sample"], return_tensors="pt")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.onnx_path.with_suffix(f".{os.getpid()}.tmp")
        axes = {0: "batch", 1: "tokens"}
        with torch.no_grad():
            torch.onnx.export(
                LastHiddenState(model), (sample["input_ids"], sample["attention_mask"], sample["token_type_ids"]), str(tmp),
                input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["last_hidden_state"],
                dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes, "last_hidden_state": axes},
                opset_version=17, dynamo=False,
            )
        os.replace(tmp, self.onnx_path)

    def load(self) -> "OnnxEmbedder":
        with self._lock:
            if self._session is None:
                import onnxruntime as ort
                from transformers import AutoTokenizer

                if not self.onnx_path.is_file():
                    self._export()
                options = ort.SessionOptions()
                options.intra_op_num_threads = self.torch_threads
                options.inter_op_num_threads = 1
                options.log_severity_level = 3
                self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_path), local_files_only=True)
                self._session = ort.InferenceSession(str(self.onnx_path), options, providers=["CPUExecutionProvider"])
        return self

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load()
        encoded = self._tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="np")
        mask = encoded["attention_mask"].astype(np.int64)
        hidden = self._session.run(None, {
            "input_ids": encoded["input_ids"].astype(np.int64), "attention_mask": mask,
            "token_type_ids": encoded["token_type_ids"].astype(np.int64),
        })[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return np.ascontiguousarray(pooled, dtype=np.float32)


def query_embedder(model_path: Path, backend: str, cache_dir: Path, threads: int, dim: int = 384):
    """The embedder for queries: ONNX Runtime when asked for and it loads, else torch.

    Falls back to the sentence-transformers model (and says so in the log) if
    the ONNX graph cannot be exported or loaded, so serving never depends on it.
    """
    import logging

    if backend == "onnx":
        try:
            return OnnxEmbedder(model_path, cache_dir, threads=threads, dim=dim).load()
        except Exception as error:  # noqa: BLE001 - torch is always there to fall back on
            logging.getLogger(__name__).warning("ONNX query encoder unavailable (%s); using torch", error)
    return Embedder(model_path, batch_size=32, torch_threads=threads, dim=dim)
