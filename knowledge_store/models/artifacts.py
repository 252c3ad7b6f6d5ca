"""The ONNX graphs of an embedding model: built once per machine, shared by every data dir, checked on each CPU.

Exporting all-mpnet-base-v2 to ONNX and quantising it takes a minute or two; doing it once per data dir (as a
``<data_dir>/models`` folder did) made every new corpus pay for it, and made ``groundwork serve`` on a fresh data dir
wait for it.  The graphs depend only on the model's weights, the export code and ONNX Runtime's quantiser, so
they live in one per-user cache (``settings.models_cache_dir``, default ``~/.cache/groundwork/models``), laid out
by what they depend on (``config.settings.default_models_cache_dir``)::

    <cache>/<model name>-<sha256 of the weights, 16 hex>/onnxruntime-<version>/
        fp32.<export revision>.onnx                       the model as exported (vectors = torch's)
        <recipe tag>.<export revision>.onnx               a quantised graph (QUANTIZATION_RECIPES)
        <recipe tag>.<export revision>.fidelity.json      its fidelity, measured per CPU (FidelityRecord)
        .lock                                             one builder at a time, across processes

Every file is written to a temporary name and renamed: a kill leaves the old file or none, never half of one.

**Why a quantised graph is checked on every CPU that runs it.**  ONNX Runtime's dynamic int8 runs other
kernels on other CPUs: with signed 8-bit weights on an x86 CPU with AVX2 but no VNNI, its u8 x s8 kernel
adds pairs of products in 16 bits, which saturates, and the vectors become noise (cosine -0.05 to 0.18 with
the model's, measured on an AMD EPYC) while the same file is right on a CPU with VNNI.  A graph is therefore
never trusted on a CPU it was not checked on: ``FidelityCheck`` embeds a fixed probe set (short and long texts,
one at a time and in a padded batch) with the fp32 graph and the candidate, and the candidate serves only when
the cosines reach ``FIDELITY_MIN_MEAN`` on average and ``FIDELITY_MIN`` on every text.  The verdict is kept
per CPU (``cpu_identity``: model name, the instruction-set flags the kernels dispatch on, ONNX Runtime's
version) in the graph's fidelity file, so the check runs once per CPU kind, not per process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from knowledge_store.core.errors import GroundworkError
from knowledge_store.core.files import exclusive_lock, write_json_atomic

log = logging.getLogger(__name__)

# ONNX export revision: part of every graph's file name, so a changed export is never confused with another
# file in the cache.  "eager1": attention exported in its eager form, which ONNX Runtime runs 1.1-1.3x
# faster than an SDPA export; same vectors.
ONNX_EXPORT_REVISION = "eager1"

# The fidelity gate: a quantised graph serves only if its vectors of the probe set have at least this cosine
# with the fp32 graph's on average and on every single text (one at a time and batched).  A right int8
# graph reaches 0.993 / 0.981 on the probe set; a saturating one is far below (cosine -0.05 to 0.18).
FIDELITY_MIN_MEAN = 0.99
FIDELITY_MIN = 0.98

# The probe set: what the product embeds, in the shapes that matter to quantised kernels - a one-word text,
# an identifier, short questions, a table row, code, and passages up to and past the model's window - so a
# kernel that fails on short or long inputs, or on padding in a batch, shows here.
PROBE_TEXTS: tuple[str, ...] = (
    "Pump",
    "ASSET-1042",
    "what does error E42 mean",
    "how do I get the pump ready to run",
    "Does the thermostat need a C-wire?",
    "| E47 | No contact with the Hub for more than 15 minutes | See the offline steps |",
    "def embed(texts):\n    return model.encode(texts, normalize_embeddings=True)",
    "E42 means the thermostat lost contact with the HVAC controller for more than 60 seconds. Check the C-wire "
    "and the fuse on the controller board, then power-cycle the unit before you call support.",
    "The pump P-100 needs priming before start: open the vent valve and fill the casing with water, then close "
    "the valve and press start. Never run it dry; a dry start damages the mechanical seal within seconds.",
    "Each API client may send 10 requests per second with bursts of up to 20. Requests above the limit are "
    "answered with 429 Too Many Requests and a Retry-After header giving the number of seconds to wait.",
    "Read the pre-charge pressure at the gas valve with a calibrated gauge: it must be 1.0 bar, plus or minus "
    "0.1 bar. Recharge with nitrogen if it is low. Look for corrosion, bulges and weeping welds on the shell, "
    "and record the wall thickness at the four marked points. Open the isolation valve again and refill the "
    "system to 1.5 bar.",
    " ".join((
        "Dynamic quantisation stores the weights of every matrix multiplication in eight bits and quantises",
        "the activations on the fly, one scale per tensor, which keeps the model's size and most of its",
        "speed gain without calibration data. Its error grows with outliers: a few hidden dimensions of a",
        "transformer carry values far larger than the rest, and a single scale per tensor spends most of",
        "its range on them. The feed-forward output projections, whose inputs come straight from the GELU,",
        "have the largest outliers, which is why recipes keep them in floating point. A text long enough to",
        "fill the window exercises every position embedding and the softmax over hundreds of keys, where",
        "rounding errors add up across layers; short texts exercise the opposite end, where one token's",
        "error is the whole vector.",
    ) * 4),
)


class ModelArtifactError(GroundworkError):
    """A model graph cannot be built or read (export, quantisation, or the cache folder itself)."""


# ----------------------------------------------------------------------------------------------- the CPU

# the x86 instruction-set flags ONNX Runtime's kernels choose their code by (MLAS dispatch); a CPU with
# the same model name and flags runs the same kernels
_DISPATCH_FLAGS = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                   "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm")


@dataclass(frozen=True)
class CpuIdentity:
    """What decides which kernels run a graph: the CPU's model name and dispatch flags, and ONNX Runtime's version."""

    model: str
    flags: tuple[str, ...]
    onnxruntime: str

    @property
    def key(self) -> str:
        text = json.dumps([self.model, self.flags, self.onnxruntime, platform.machine()])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def has_vnni(self) -> bool:
        return "avx512_vnni" in self.flags or "avx_vnni" in self.flags

    def describe(self) -> str:
        shown = [f for f in self.flags if f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp")]
        return f"{self.model} ({', '.join(shown) or 'no AVX2'})"


def _read_cpuinfo() -> tuple[str, tuple[str, ...]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return model, ()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and value.strip():
            model = value.strip()
        elif name in ("flags", "Features"):
            flags.update(value.split())
    return model, tuple(f for f in _DISPATCH_FLAGS if f in flags)


_CPU: CpuIdentity | None = None


def cpu_identity() -> CpuIdentity:
    """This machine's ``CpuIdentity`` (read once per process)."""
    global _CPU
    if _CPU is None:
        import onnxruntime  # noqa: PLC0415 - ONNX Runtime, ~0.2 s to import

        model, flags = _read_cpuinfo()
        _CPU = CpuIdentity(model, flags, onnxruntime.__version__)
    return _CPU


# ----------------------------------------------------------------------------------------- fidelity

@dataclass
class FidelityRecord:
    """One quantised graph's check on one CPU: the probe set's cosines with the fp32 graph and the verdict."""

    cpu_key: str
    cpu: str
    flags: list[str]
    onnxruntime: str
    texts: int
    mean: float
    min: float
    passed: bool
    checked_at: str
    seconds: float
    min_mean: float = FIDELITY_MIN_MEAN
    min_each: float = FIDELITY_MIN
    # per-text query latency of the fp32 and the quantised graph on this CPU (ms, median), measured with the
    # check: which graph embeds queries faster here (``faster_for_queries``)
    query_ms: dict[str, float] = field(default_factory=dict)
    # per-text time of the fp32 and the quantised graph embedding the probe set length-sorted in the document
    # embedder's batches on this CPU (ms, the fastest of alternating rounds), measured by the document embedder's
    # check: documents run in batches, where the kernels that win are not always the ones that win for one short
    # query (``faster_for_documents``)
    batch_ms: dict[str, float] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (f"fidelity {verdict} on {self.cpu}: cosine to fp32 mean {self.mean:.4f} (needs {self.min_mean}), "
                f"min {self.min:.4f} (needs {self.min_each}) over {self.texts} probe texts")

    def faster_for_queries(self) -> str | None:
        """``fp32`` or ``quantised``: which graph embedded the probe queries faster on this CPU (None: not timed)."""
        return _faster(self.query_ms)

    def faster_for_documents(self) -> str | None:
        """``fp32`` or ``quantised``: which graph embedded the probe set in batches faster here (None: not timed)."""
        return _faster(self.batch_ms)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _faster(ms: dict[str, float]) -> str | None:
    fp32, quantised = ms.get("fp32"), ms.get("quantised")
    if fp32 is None or quantised is None:
        return None
    return "quantised" if quantised < fp32 else "fp32"


def judge(cosines: list[float]) -> tuple[float, float, bool]:
    """(mean, min, passed) of the probe cosines under the gate's thresholds."""
    mean, low = sum(cosines) / len(cosines), min(cosines)
    return mean, low, bool(mean >= FIDELITY_MIN_MEAN and low >= FIDELITY_MIN)


# -------------------------------------------------------------------------------------- the graphs

def weights_sha256(model_path: Path, cache_dir: Path) -> str:
    """The SHA-256 of the model's weights (and configuration), remembered per (file, size, mtime) in
    ``<cache>/fingerprints.json``: hashing mpnet's 438 MB takes about a second, once per installed copy."""
    model_path = Path(model_path).resolve()
    files = [model_path / n for n in ("config.json", "modules.json", "sentence_bert_config.json", "tokenizer.json",
                                      "model.safetensors", "pytorch_model.bin") if (model_path / n).is_file()]
    if not files:
        raise ModelArtifactError(f"{model_path}: no model files to fingerprint")
    stamp = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    book = Path(cache_dir) / "fingerprints.json"
    try:
        known = json.loads(book.read_text())
    except (OSError, ValueError):
        known = {}
    entry = known.get(str(model_path)) if isinstance(known, dict) else None
    if isinstance(entry, dict) and entry.get("stamp") == stamp:
        return entry["sha256"]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    value = digest.hexdigest()
    if not isinstance(known, dict):
        known = {}
    known[str(model_path)] = {"stamp": stamp, "sha256": value}
    try:
        write_json_atomic(book, known)
    except OSError as error:  # a read-only cache still serves; the hash is recomputed next time
        log.warning("cannot remember the model fingerprint in %s (%s)", book, error)
    return value


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _cache_folder_name(model_path: Path, weights_digest: str) -> str:
    """``<name>-<weights hash>``: the name is the model's folder (its parent's when the folder is ``model``)."""
    name = model_path.name if model_path.name != "model" else model_path.parent.name
    return f"{name}-{weights_digest[:16]}"


def model_cache_folder(model_path: Path, cache_dir: Path) -> Path:
    """The cache folder of one model's graphs, every ONNX Runtime version's: ``<cache>/<name>-<weights hash>``."""
    model_path = Path(model_path)
    return Path(cache_dir) / _cache_folder_name(model_path, weights_sha256(model_path, cache_dir))


def _remove_folder(folder: Path) -> int:
    """Remove ``folder`` (when it is one) and return the bytes its files held."""
    if not folder.is_dir():
        return 0
    freed = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    shutil.rmtree(folder, ignore_errors=True)
    return freed


def forget_model(model_path: Path, cache_dir: Path) -> int:
    """Remove a model that will never serve (a fine-tuning candidate the decision declined) from the cache: its
    graphs (every ONNX Runtime version's) and its fingerprint.  Returns the bytes freed.  A graph is hundreds of
    megabytes (mpnet's fp32 and int8 graphs: about 590 MB), and every declined run would otherwise leave one."""
    model_path = Path(model_path)
    if not model_path.is_dir():
        return 0
    freed = _remove_folder(model_cache_folder(model_path, cache_dir))
    book = Path(cache_dir) / "fingerprints.json"
    try:
        known = json.loads(book.read_text())
    except (OSError, ValueError):
        known = None
    if isinstance(known, dict) and known.pop(str(model_path.resolve()), None) is not None:
        try:
            write_json_atomic(book, known)
        except OSError as error:
            log.warning("cannot forget the model fingerprint in %s (%s)", book, error)
    return freed


ORPHAN_AGE_S = 86_400.0  # a graph folder this old whose model is gone is removed (a younger one may be mid-build)


def forget_orphans(cache_dir: Path, older_than_s: float = ORPHAN_AGE_S) -> int:
    """Remove the graphs of fine-tuned models whose folder no longer exists (a data dir deleted, a candidate
    removed by an older version): nothing can load them again.  Only fine-tuned models' folders (``-ft-`` in
    the name; a base model's graphs stay for a switch back) untouched for ``older_than_s``.  Returns the bytes
    freed."""
    cache_dir = Path(cache_dir)
    try:
        known = json.loads((cache_dir / "fingerprints.json").read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(known, dict):
        return 0
    alive = {_cache_folder_name(Path(path), str(entry.get("sha256", ""))) for path, entry in known.items()
             if isinstance(entry, dict) and Path(path).is_dir()}
    now = time.time()
    return sum(_remove_folder(folder) for folder in cache_dir.glob("*-ft-*")
               if folder.is_dir() and folder.name not in alive and now - folder.stat().st_mtime > older_than_s)


def _thread_lock(folder: Path) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(str(folder), threading.Lock())


# What a quantisation recipe is, by its tag (``config.embedding_models.QUANTIZATION_RECIPES`` maps the setting's
# values to tags).
@dataclass(frozen=True)
class QuantisationRecipe:
    tag: str
    description: str
    method: str  # "blockwise": MatMulNBits weight blocks; "dynamic": per-tensor dynamic int8 (quantize_dynamic);
    # "mixed": dynamic int8 except the MatMuls ``blockwise_nodes`` names, which become MatMulNBits blocks
    bits: int = 8
    block_size: int = 128  # blockwise: weights and activations quantised in blocks of this many inputs
    accuracy_level: int = 4  # blockwise: 4 = activations in int8 per block (integer kernels), 0 = fp32 activations
    weight_type: str = "QInt8"  # dynamic: "QInt8" | "QUInt8"
    per_channel: bool = True  # dynamic
    reduce_range: bool = False  # dynamic: 7-bit weights
    keep_fp32: str = ""  # dynamic: regular expression over MatMul node names left in fp32
    blockwise_nodes: str = ""  # mixed: regular expression over MatMul node names quantised in blocks instead
    smooth_nodes: str = ""  # dynamic, mixed: MatMuls whose input is smoothed first (``smooth_activations``)
    smooth_alpha: float = 0.5  # how much of an input channel's range moves into the weights (SmoothQuant's alpha)


# The int8 recipe: every weight MatMul as ONNX Runtime's MatMulNBits with 8-bit symmetric weights in blocks of 128
# inputs, and its activations quantised to int8 per block of 128 (accuracy level 4), so the kernels run on integers.
# Scales per block, not one per tensor, keep outliers local: cosine to fp32 0.999-1.000 on the probe set, one at a
# time or batched alike (a row's vector does not depend on the rows batched with it), on CPUs with VNNI and without
# (an emulated AMD EPYC without VNNI included), where per-tensor dynamic int8 reaches 0.986-0.995 with 7-bit weights
# and saturates with 8-bit ones on AVX2 without VNNI (cosine -0.01 to 0.13).  Measured in docs/EVALUATION.md.
RECIPES: dict[str, QuantisationRecipe] = {
    "onnx-int8-nbits8-b128": QuantisationRecipe(
        tag="onnx-int8-nbits8-b128",
        description="MatMulNBits: 8-bit weights and int8 activations in blocks of 128 inputs (accuracy level 4)",
        method="blockwise", bits=8, block_size=128, accuracy_level=4),
    # The query recipe: one short text per request, where MatMulNBits' 8-bit kernels are slower than ONNX Runtime's
    # dynamic int8 ones (which use VNNI, and AMX where the CPU has it).  Dynamic int8 quantises a MatMul's input
    # with one scale for the whole tensor, which the feed-forward layers' inputs (outlier dimensions after the
    # layer norm, and after GELU) do not survive: with them dynamic, real questions fail the fidelity gate.  So the
    # attention projections (q, k, v and the output) run as dynamic int8 with 7-bit per-channel weights (7 bits:
    # no saturation on AVX2 without VNNI) and the feed-forward layers as 8-bit blocks of 128, which keeps the
    # blockwise recipe's fidelity margin and embeds a question faster (docs/BENCHMARKS.md, query graphs).
    "onnx-int8-dynattn-nbits8-b128": QuantisationRecipe(
        tag="onnx-int8-dynattn-nbits8-b128",
        description="attention projections as dynamic int8 with 7-bit per-channel weights, feed-forward layers "
                    "as MatMulNBits 8-bit blocks of 128 inputs (accuracy level 4)",
        method="mixed", weight_type="QInt8", per_channel=True, reduce_range=True, bits=8, block_size=128,
        accuracy_level=4, blockwise_nodes=r"/layer\.\d+/(intermediate|output)/dense/MatMul$"),
    # The mixed recipe with the feed-forward input projections dynamic as well, their inputs smoothed first
    # (``smooth_activations``): a feed-forward input's outlier channels come from the layer norm's scale and are
    # the same for every text, so dividing them out and multiplying the weights' rows back in leaves one scale per
    # tensor enough.  The feed-forward outputs (GELU's outliers, which smoothing does not tame) stay in blocks.
    "onnx-int8-dynsq-nbits8-b128": QuantisationRecipe(
        tag="onnx-int8-dynsq-nbits8-b128",
        description="attention and feed-forward input projections as dynamic int8 with 7-bit per-channel weights "
                    "(feed-forward inputs smoothed, alpha 0.5), feed-forward outputs as MatMulNBits 8-bit blocks of "
                    "128 inputs (accuracy level 4)",
        method="mixed", weight_type="QInt8", per_channel=True, reduce_range=True, bits=8, block_size=128,
        accuracy_level=4, blockwise_nodes=r"/layer\.\d+/output/dense/MatMul$",
        smooth_nodes=r"/layer\.\d+/intermediate/dense/MatMul$", smooth_alpha=0.5),
}


class ModelArtifacts:
    """The graphs of one model in the per-user cache: where they are, building them once, and their checks."""

    def __init__(self, model_path: Path, cache_dir: Path) -> None:
        import onnxruntime  # noqa: PLC0415 - ONNX Runtime, ~0.2 s to import

        self.model_path = Path(model_path)
        self.cache_dir = Path(cache_dir)
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ModelArtifactError(f"the model cache {self.cache_dir} cannot be created ({error}); set "
                                     "GROUNDWORK_MODELS_CACHE_DIR to a writable folder") from error
        self.folder = model_cache_folder(self.model_path, self.cache_dir) / f"onnxruntime-{onnxruntime.__version__}"
        self.state = "idle"  # what ``ensure`` is doing: idle | waiting (for another process building the graphs) |
        # exporting | quantising (read by progress reports)

    @property
    def fp32_path(self) -> Path:
        return self.folder / f"fp32.{ONNX_EXPORT_REVISION}.onnx"

    def graph_path(self, tag: str) -> Path:
        """The graph of recipe ``tag`` ("" = the fp32 export)."""
        return self.fp32_path if not tag else self.folder / f"{tag}.{ONNX_EXPORT_REVISION}.onnx"

    def fidelity_path(self, tag: str) -> Path:
        return self.folder / f"{tag}.{ONNX_EXPORT_REVISION}.fidelity.json"

    def _lock(self, on_wait: Callable[[], None] | None = None):
        return exclusive_lock(self.folder / ".lock", _thread_lock(self.folder), on_wait)

    def ensure(self, tag: str = "", on_state: Callable[[str], None] | None = None) -> Path:
        """The graph of recipe ``tag`` ("" = fp32), exported and quantised first if missing (one process at a
        time; another waiting process finds the files made)."""
        target = self.graph_path(tag)
        if target.is_file() and self.fp32_path.is_file():
            return target
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._lock(on_wait=lambda: self._set_state("waiting", on_state)):  # another process builds them
            remove_abandoned_builds(self.folder)
            if not self.fp32_path.is_file():
                self._set_state("exporting", on_state)
                export_fp32(self.model_path, self.fp32_path)
            if tag and not target.is_file():
                self._set_state("quantising", on_state)
                quantise(self.fp32_path, target, RECIPES[tag], self.model_path / "tokenizer.json")
                self.fidelity_path(tag).unlink(missing_ok=True)  # a new graph has not been checked anywhere
            self._set_state("idle", on_state)
        return target

    def _set_state(self, state: str, on_state: Callable[[str], None] | None) -> None:
        self.state = state
        if on_state is not None:
            on_state(state)
        if state != "idle":
            log.info("%s: %s %s", self.model_path.name, state, self.folder)

    def fidelity(self, tag: str, cpu: CpuIdentity | None = None) -> FidelityRecord | None:
        """The recorded check of recipe ``tag``'s graph on ``cpu`` (default this one), None if never checked there."""
        cpu = cpu or cpu_identity()
        try:
            records = json.loads(self.fidelity_path(tag).read_text())
            found = records.get(cpu.key)
            return FidelityRecord(**found) if isinstance(found, dict) else None
        except (OSError, ValueError, TypeError):
            return None

    def record_fidelity(self, tag: str, record: FidelityRecord) -> None:
        path = self.fidelity_path(tag)
        with self._lock():
            try:
                records = json.loads(path.read_text())
                if not isinstance(records, dict):
                    records = {}
            except (OSError, ValueError):
                records = {}
            records[record.cpu_key] = record.to_dict()
            write_json_atomic(path, records)

    def describe(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "fp32": self.fp32_path.is_file(),
                "quantised": {tag: self.graph_path(tag).is_file() for tag in RECIPES}}


# what a build writes before its rename: ``.<graph>.<pid>.tmp`` and the files named after it (``.smoothed``,
# ``.dynamic``, ``.calibration``, each with its ``.data`` weights)
_BUILD_TEMPORARY = re.compile(r"^\..+\.\d+\.tmp(\..*)?$")


def remove_abandoned_builds(folder: Path) -> int:
    """Remove the temporary files of builds that never finished (a process killed while exporting or quantising:
    no ``finally`` ran) from a graph folder; returns the bytes freed.  Called with the folder's lock held: every
    build runs under it, so a temporary file seen then belongs to no running build.  An mpnet build leaves up to
    about 1 GB (the export, a smoothed copy and its calibration graph)."""
    freed = 0
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return 0
    for entry in entries:
        if entry.is_file() and _BUILD_TEMPORARY.match(entry.name):
            try:
                size = entry.stat().st_size
                entry.unlink()
            except OSError as error:
                log.warning("cannot remove %s, left by a build that did not finish (%s)", entry, error)
                continue
            freed += size
    if freed:
        log.info("%s: removed %.0f MB left by builds that did not finish", folder, freed / 1e6)
    return freed


def export_fp32(model_path: Path, target: Path) -> None:
    """Export the transformer of a sentence-transformers folder to ONNX (its last hidden state; pooling and
    normalisation stay in numpy), written to a temporary file and renamed to ``target``."""
    import torch  # noqa: PLC0415 - torch, ~1.5 s to import
    from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415 - transformers, ~0.7 s to import

    tokenizer = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    model = AutoModel.from_pretrained(str(model_path), local_files_only=True, attn_implementation="eager").eval()
    sample = tokenizer(["export sample"], return_tensors="pt")
    # BERT-like models (MiniLM) take token type ids, MPNet does not: the graph takes what the tokenizer gives
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in sample]

    class LastHiddenState(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *tensors):
            return self.inner(**dict(zip(names, tensors))).last_hidden_state

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    axes = {0: "batch", 1: "tokens"}
    try:
        with torch.no_grad():
            torch.onnx.export(
                LastHiddenState(model), tuple(sample[n] for n in names), str(tmp),
                input_names=names, output_names=["last_hidden_state"],
                dynamic_axes={**{n: axes for n in names}, "last_hidden_state": axes},
                opset_version=17, dynamo=False,
            )
        os.replace(tmp, target)
    except Exception as error:
        tmp.unlink(missing_ok=True)
        raise ModelArtifactError(f"{model_path}: ONNX export failed ({type(error).__name__}: {error})") from error


NODE_BY_NODE_LOGGER = "onnxruntime.quantization.matmul_nbits_quantizer"


def quantise(fp32_path: Path, target: Path, recipe: QuantisationRecipe, tokenizer_path: Path | None = None) -> None:
    """Quantise the fp32 graph with ``recipe`` into ``target``, atomically (a temporary file, then a rename).
    ``tokenizer_path``: the model's ``tokenizer.json``, which a recipe that smooths its inputs calibrates with."""
    import onnx  # noqa: PLC0415 - ONNX, ~0.2 s to import; only to quantise an export once

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    smoothed = tmp.with_name(f"{tmp.name}.smoothed")
    quiet = _DropPreprocessingAdvice()
    logging.getLogger().addFilter(quiet)  # the quantiser logs "consider pre-processing" on the root logger
    # the weight-only quantiser logs a line per graph node at INFO (some 1,200 for mpnet): its warnings only
    node_log = logging.getLogger(NODE_BY_NODE_LOGGER)
    node_level = node_log.level
    node_log.setLevel(logging.WARNING)
    try:
        if recipe.smooth_nodes:
            if tokenizer_path is None:
                raise ModelArtifactError(f"{fp32_path.name}: recipe {recipe.tag} calibrates on text and needs the "
                                         "model's tokenizer.json")
            smooth_activations(onnx, fp32_path, smoothed, recipe, tokenizer_path)
            fp32_path = smoothed
        if recipe.method == "blockwise":
            _quantise_blockwise(onnx, fp32_path, tmp, recipe)
        elif recipe.method == "mixed":
            dynamic = tmp.with_name(f"{tmp.name}.dynamic")
            try:  # dynamic int8 leaves the named MatMuls in fp32; the weight-only quantiser then takes exactly those
                _quantise_dynamic(onnx, fp32_path, dynamic, recipe, keep_fp32=recipe.blockwise_nodes, side_weights=True)
                _quantise_blockwise(onnx, dynamic, tmp, recipe)
            finally:
                remove_graph(dynamic)
        else:
            _quantise_dynamic(onnx, fp32_path, tmp, recipe)
        os.replace(tmp, target)
    except ModelArtifactError:
        tmp.unlink(missing_ok=True)
        raise
    except Exception as error:
        tmp.unlink(missing_ok=True)
        raise ModelArtifactError(f"{fp32_path.name}: quantisation {recipe.tag} failed ({type(error).__name__}: "
                                 f"{error})") from error
    finally:
        remove_graph(smoothed)
        logging.getLogger().removeFilter(quiet)
        node_log.setLevel(node_level)


# What a smoothing recipe calibrates on: texts of the kinds the product embeds (questions, manual passages, API
# and command-line text, code, a table row, a scientific claim), none of them in the probe set the fidelity gate
# checks with, so the gate judges the smoothed graph on texts it was not fitted to.
CALIBRATION_TEXTS: tuple[str, ...] = (
    "How do I change the filter?",
    "what is the default timeout for a connection",
    "Why does the display show a flashing snowflake?",
    "Can I run two controllers on one bus?",
    "Before you open the housing, switch off the mains supply at the isolator and wait five minutes for the "
    "capacitors to discharge. Remove the four screws on the front panel and lift the cover off its hinges.",
    "The service interval is twelve months or 2,000 operating hours, whichever comes first. Replace the seals "
    "at every second service, and the bearings every five years.",
    "GET /api/v2/devices/{id}/status returns the device's last reported state as JSON: mode, setpoint, the "
    "measured temperature in degrees Celsius and the time of the report in UTC.",
    "Usage: backup [--full | --incremental] [--target DIR] SOURCE...  Copies each SOURCE into DIR, keeping "
    "permissions and timestamps; --full ignores the previous snapshot.",
    "for (my $i = 0; $i < @ARGV; $i++) {\n    print \"$i: $ARGV[$i]\\n\";\n}",
    "SELECT customer_id, sum(amount) FROM orders WHERE created_at >= '2024-01-01' GROUP BY customer_id;",
    "| F12 | Water pressure below 0.8 bar | Top up the system and reset |",
    "Vitamin D supplementation reduces the risk of respiratory infections in adults with low baseline levels.",
    "The kernel module failed to load: modprobe reported 'Exec format error', which usually means it was built "
    "for another kernel version. Rebuild it with the headers of the running kernel and try again.",
    "Overview",
    "Warranty and liability. The manufacturer is not liable for damage caused by installation that does not "
    "follow these instructions, by unauthorised modification, or by the use of spare parts that are not "
    "original. Keep the proof of purchase: it is needed for any claim under the warranty, which lasts two "
    "years from the date of delivery and covers defects of material and workmanship. " * 3,
)


def smooth_activations(onnx, fp32_path: Path, target: Path, recipe: QuantisationRecipe, tokenizer_path: Path) -> None:
    """SmoothQuant (Xiao et al., 2023) for the MatMuls ``recipe.smooth_nodes`` names, written to ``target``: each
    one's input channel j is divided by ``s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)`` (a ``Mul`` before it)
    and its weights' row j multiplied by it, so the product is unchanged in exact arithmetic while the input's
    outlier channels shrink to what one dynamic int8 scale per tensor can carry.  ``max|X_j|``: over every token
    of ``CALIBRATION_TEXTS``, run one at a time through the fp32 graph; ``max|W_j|``: over the row."""
    import numpy as np  # noqa: PLC0415 - only to quantise an export once
    import onnxruntime as ort  # noqa: PLC0415 - ONNX Runtime, ~0.2 s to import
    from onnx import helper, numpy_helper  # noqa: PLC0415
    from tokenizers import Tokenizer  # noqa: PLC0415

    pattern = re.compile(recipe.smooth_nodes)

    def smoothed_matmuls(model) -> list:
        found = [node for node in model.graph.node if node.op_type == "MatMul" and pattern.search(node.name)]
        stored = {init.name for init in model.graph.initializer}
        if not found or any(node.input[1] not in stored for node in found):
            raise ModelArtifactError(f"{fp32_path.name}: no MatMul with stored weights matches "
                                     f"{recipe.smooth_nodes!r} (recipe {recipe.tag} does not fit this export)")
        return found

    # One copy of the graph's weights in memory at a time (each copy is the model's size): graphs are written with
    # their weights in a side file, a tensor at a time, instead of serialised whole in memory; the calibration graph
    # (the export with the MatMuls' inputs as outputs) is dropped before its session loads, and the export is read
    # again for the weights once the session is gone.
    model = onnx.load(str(fp32_path))
    inputs = {node.name: node.input[0] for node in smoothed_matmuls(model)}  # plain strings: no node keeps it alive
    for name in inputs.values():
        model.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    calibration = target.with_name(f"{target.name}.calibration")
    try:
        _save_with_side_weights(onnx, model, calibration)
        del model
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(calibration), options, providers=["CPUExecutionProvider"])
    finally:
        remove_graph(calibration)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.no_padding()
    names = [i.name for i in session.get_inputs()]
    largest = {name: np.zeros(0, dtype=np.float32) for name in inputs}
    for text in CALIBRATION_TEXTS:
        ids = np.array([tokenizer.encode(text).ids], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        outputs = session.run(list(inputs.values()), {name: feed[name] for name in names})
        for node_name, values in zip(inputs, outputs):
            channel = np.abs(values).reshape(-1, values.shape[-1]).max(axis=0)
            largest[node_name] = channel if not len(largest[node_name]) else np.maximum(largest[node_name], channel)
    del session
    model = onnx.load(str(fp32_path))
    targets = smoothed_matmuls(model)
    initializers = {init.name: init for init in model.graph.initializer}
    alpha = recipe.smooth_alpha
    for node in targets:
        weights = numpy_helper.to_array(initializers[node.input[1]])  # (inputs, outputs)
        scale = (np.maximum(largest[node.name], 1e-5) ** alpha
                 / np.maximum(np.abs(weights).max(axis=1), 1e-5) ** (1.0 - alpha)).astype(np.float32)
        initializers[node.input[1]].CopyFrom(numpy_helper.from_array(weights * scale[:, None], node.input[1]))
        divisor = f"{node.name}/smooth_divisor"
        model.graph.initializer.append(numpy_helper.from_array((1.0 / scale).astype(np.float32), divisor))
        smoothed_input = f"{node.name}/smoothed_input"
        smooth = helper.make_node("Mul", [node.input[0], divisor], [smoothed_input], name=f"{node.name}/smooth")
        node.input[0] = smoothed_input
        position = next(i for i, other in enumerate(model.graph.node) if other.name == node.name)
        model.graph.node.insert(position, smooth)  # right before its MatMul: the graph stays in topological order
    _save_with_side_weights(onnx, model, target)


def _save_with_side_weights(onnx, model, path: Path) -> None:
    """``model`` written to ``path`` with its weights in ``<path>.data`` beside it (``remove_graph`` removes
    both), a tensor at a time: serialising a graph whole holds a second copy of its weights in memory.  ONNX Runtime
    and ``onnx.load`` read the side file from the graph's folder."""
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)


def remove_graph(path: Path) -> None:
    """A graph file and the weights file ``_save_with_side_weights`` put beside it, if there."""
    path.unlink(missing_ok=True)
    path.with_name(f"{path.name}.data").unlink(missing_ok=True)


def _quantise_blockwise(onnx, fp32_path: Path, tmp: Path, recipe: QuantisationRecipe) -> None:
    # ONNX Runtime's weight-only quantiser and onnx_ir, ~1 s to import; only to quantise an export once
    from onnxruntime.quantization.matmul_nbits_quantizer import (  # noqa: PLC0415
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(block_size=recipe.block_size, is_symmetric=True,
                                          accuracy_level=recipe.accuracy_level, bits=recipe.bits)
    quantizer = MatMulNBitsQuantizer(onnx.load(str(fp32_path)), bits=recipe.bits, block_size=recipe.block_size,
                                     is_symmetric=True, accuracy_level=recipe.accuracy_level, algo_config=config)
    quantizer.process()
    quantizer.model.save_model_to_file(str(tmp), use_external_data_format=False)


def _quantise_dynamic(onnx, fp32_path: Path, tmp: Path, recipe: QuantisationRecipe, keep_fp32: str | None = None,
                      side_weights: bool = False) -> None:
    """Dynamic int8 of every weight MatMul but those whose name ``keep_fp32`` (default ``recipe.keep_fp32``)
    matches; ``side_weights``: an intermediate graph, written with its weights beside it (``remove_graph``), which
    spares a second in-memory copy of the fp32 weights it keeps."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415 - ONNX Runtime, ~0.4 s

    keep = recipe.keep_fp32 if keep_fp32 is None else keep_fp32
    pattern = re.compile(keep) if keep else None
    kept = [node.name for node in onnx.load(str(fp32_path), load_external_data=False).graph.node
            if pattern is not None and node.op_type == "MatMul" and pattern.search(node.name)]
    if pattern is not None and not kept:  # the recipe names nodes of this export; another export needs another tag
        raise ModelArtifactError(f"{fp32_path.name}: no MatMul matches {keep!r} to keep out of dynamic int8 "
                                 f"(recipe {recipe.tag} does not fit this export)")
    quantize_dynamic(
        str(fp32_path), str(tmp), weight_type=getattr(QuantType, recipe.weight_type), per_channel=recipe.per_channel,
        reduce_range=recipe.reduce_range, op_types_to_quantize=["MatMul"], nodes_to_exclude=kept,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}, use_external_data_format=side_weights,
    )


class _DropPreprocessingAdvice(logging.Filter):
    """Drops ONNX Runtime's quantiser advice to pre-process the model (shape inference for static
    quantisation; a dynamic recipe does not use it), which a user would read as a problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def fastest_alternating_ms(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Each run's fastest wall time in ms over ``repeats`` rounds that call every run once, in alternating order
    (after one untimed call each): a busy moment of a shared machine falls on all of them alike, and the fastest
    round is the least disturbed one."""
    for run in runs.values():
        run()
    best = {name: float("inf") for name in runs}
    items = list(runs.items())
    for round_ in range(repeats):
        for name, run in items if round_ % 2 == 0 else items[::-1]:
            start = time.perf_counter()
            run()
            best[name] = min(best[name], (time.perf_counter() - start) * 1000)
    return best


def timed_median_ms(run: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``run`` in ms over ``repeats`` calls (after one untimed call)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return times[len(times) // 2]
