"""Approximate nearest-neighbour (HNSW) search over a snapshot's vectors, for large corpora.

Exact search is one matrix-vector product over every row: 13-16 ms at 100k chunks,
~10x that at 1M.  Above ``settings.ann_min_chunks`` rows the serving snapshot gets an
HNSW graph (usearch; the measurements behind the choice are in docs/BENCHMARKS.md,
"1M chunks: approximate vector index") built from the snapshot's stored vectors:

- The graph only *proposes* candidates.  Every candidate is re-scored with the
  snapshot's float32 vectors, so scores, fusion and relevance are exactly those of the
  exact path; only which rows get scored is approximate.  That is also why the graph
  may keep its own copy of the vectors as int8 (a quarter of the memory).
- Candidates are widened to whole sections (a section's first chunk carries the
  ``vector_lead`` evidence of its other chunks) and completed with the rows BM25 puts in
  the candidate pool, so every row fusion looks at has its true cosine.
- Filters: the graph knows nothing of the filter mask.  A mask that allows fewer rows
  than ``ann_min_chunks`` is searched exactly (only its rows); otherwise the graph is
  asked for proportionally more candidates, and if fewer than the pool survive the mask,
  the query falls back to exact search over the masked rows.  A filtered query therefore
  always gets a full pool when the corpus has one.
- Building 1M rows takes minutes, so it never blocks serving: the snapshot is served
  with exact search while the graph is built on a background thread, and switches to it
  when ready (``SnapshotManager`` in snapshot_reader.py).
- The graph may be cached beside the snapshot (``<snapshot>.ann-<params>.usearch`` plus a
  ``.json`` of what it was built from): both written to a temporary name and renamed, and
  on load checked against the snapshot (file size and mtime, version, fingerprint, row
  count, a digest of sampled vectors) and against the index file's own BLAKE2 checksum; any
  mismatch or error means the side file is ignored and the graph rebuilt.  DuckDB's own vss
  HNSW is not used for this: it keeps no crash-recovery log for a persisted index.
- usearch is imported only when a graph is built or checked, never with this module: it loads
  NumKong's symbols into the process's global namespace (``RTLD_GLOBAL``), after which
  ``import onnxruntime`` (the ONNX encoders, sentence scoring, and PyMuPDF, which imports it) crashes the
  process; so ONNX Runtime is imported first wherever usearch is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from knowledge_store.core.files import write_json_atomic

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
BUILD_BATCH = 20_000  # rows added per call while building: the point where a cancelled build stops
SENTINEL = -1.0  # the score of rows that were not scored (below any cosine); never reaches a result


@dataclass(frozen=True)
class AnnConfig:
    """How the graph is built and searched (from ``Settings``: ``ann_*``)."""

    min_chunks: int = 100_000
    connectivity: int = 32
    expansion_add: int = 256
    ef_search: int = 512
    dtype: str = "i8"
    build_threads: int = 1
    cache: bool = True
    variant: str = ""  # a graph of part of a snapshot's rows (a visibility view): its own side files

    @classmethod
    def from_settings(cls, settings) -> "AnnConfig":
        return cls(min_chunks=settings.ann_min_chunks, connectivity=settings.ann_connectivity,
                   expansion_add=settings.ann_expansion_add, ef_search=settings.ann_ef_search,
                   build_threads=settings.ann_build_threads, cache=settings.ann_cache)

    @property
    def tag(self) -> str:
        """What a cached graph must have been built with (search-time knobs are not part of it)."""
        return f"{self.dtype}-m{self.connectivity}-e{self.expansion_add}" + (f"-{self.variant}" if self.variant else "")

    def wanted(self, rows: int) -> bool:
        return rows >= self.min_chunks


class BuildCancelled(Exception):
    pass


@dataclass
class AnnIndex:
    """An HNSW graph over rows ``0..count-1`` of one snapshot's vectors (keys are row numbers)."""

    index: object  # usearch.index.Index
    config: AnnConfig
    count: int
    origin: str  # "built" | "cache"
    seconds: float
    extra: dict = field(default_factory=dict)

    def search(self, query: np.ndarray, count: int) -> np.ndarray:
        """Row numbers of (about) the ``count`` nearest rows, nearest first."""
        count = max(1, min(int(count), self.count))
        # usearch widens the beam to ``count`` when that is larger than expansion_search
        keys = self.index.search(np.asarray(query, dtype=np.float32), count, threads=1).keys
        return np.asarray(keys, dtype=np.int64)

    def describe(self) -> dict:
        return {"library": "usearch", "rows": self.count, "origin": self.origin, "seconds": round(self.seconds, 2),
                "memory_mb": round(self.index.memory_usage / 2**20, 1), **asdict(self.config), **self.extra}


# ---------------------------------------------------------------------------- build
def _new_index(dim: int, config: AnnConfig):
    import onnxruntime  # noqa: F401, PLC0415 - loaded before usearch (module docstring); ~0.2 s, once
    from usearch.index import Index  # noqa: PLC0415 - usearch must load after ONNX Runtime (module docstring)

    return Index(ndim=dim, metric="cos", dtype=config.dtype, connectivity=config.connectivity,
                 expansion_add=config.expansion_add, expansion_search=config.ef_search)


def build_index(embeddings: np.ndarray, config: AnnConfig, cancelled: threading.Event | None = None) -> AnnIndex:
    """Build the graph over every row of ``embeddings`` (batches of ``BUILD_BATCH``; a set
    ``cancelled`` event stops it between batches with ``BuildCancelled``)."""
    started = time.perf_counter()
    n, dim = embeddings.shape
    index = _new_index(dim, config)
    for start in range(0, n, BUILD_BATCH):
        if cancelled is not None and cancelled.is_set():
            raise BuildCancelled()
        stop = min(n, start + BUILD_BATCH)
        index.add(np.arange(start, stop, dtype=np.uint64), embeddings[start:stop], threads=config.build_threads)
    return AnnIndex(index, config, n, "built", time.perf_counter() - started)


# ---------------------------------------------------------------------------- side-file cache
def side_paths(snapshot_path: Path, config: AnnConfig) -> tuple[Path, Path]:
    base = f"{Path(snapshot_path).name}.ann-{config.tag}"
    folder = Path(snapshot_path).parent
    return folder / f"{base}.usearch", folder / f"{base}.json"


def _vectors_digest(embeddings: np.ndarray) -> str:
    """BLAKE2 of ~1,024 rows spread over the matrix plus its shape: cheap, and a different vector set
    under the same snapshot name (which cannot happen for an immutable snapshot) would still show."""
    step = max(1, len(embeddings) // 1024)
    digest = hashlib.blake2b(str(embeddings.shape).encode(), digest_size=16)
    digest.update(np.ascontiguousarray(embeddings[::step]).tobytes())
    return digest.hexdigest()


def _file_digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def identity(snapshot_path: Path, info, embeddings: np.ndarray, config: AnnConfig) -> dict:
    """What a cached graph must match to be used for this snapshot."""
    import onnxruntime  # noqa: F401, PLC0415 - loaded before usearch (module docstring); ~0.2 s, once
    import usearch  # noqa: PLC0415 - usearch must load after ONNX Runtime (module docstring)

    stat = Path(snapshot_path).stat()
    return {
        "format": FORMAT_VERSION, "library": f"usearch {usearch.__version__}", "params": config.tag,
        "snapshot_file": Path(snapshot_path).name, "snapshot_bytes": stat.st_size, "snapshot_mtime_ns": stat.st_mtime_ns,
        "snapshot_version": getattr(info, "snapshot_version", None), "fingerprint": getattr(info, "fingerprint", None),
        "rows": int(embeddings.shape[0]), "dim": int(embeddings.shape[1]), "vectors": _vectors_digest(embeddings),
    }


def load_cached(snapshot_path: Path, info, embeddings: np.ndarray, config: AnnConfig) -> AnnIndex | None:
    """The cached graph when its side files match this snapshot exactly; None (after saying why) otherwise."""
    index_path, meta_path = side_paths(snapshot_path, config)
    if not meta_path.exists() or not index_path.exists():
        return None
    started = time.perf_counter()
    try:
        meta = json.loads(meta_path.read_text())
        want = identity(snapshot_path, info, embeddings, config)
        stale = sorted(k for k, v in want.items() if meta.get(k) != v)
        if stale:
            log.info("ANN side file %s is stale (%s differ); rebuilding", index_path.name, ", ".join(stale))
            return None
        if index_path.stat().st_size != meta.get("index_bytes") or _file_digest(index_path) != meta.get("index_blake2"):
            log.warning("ANN side file %s does not match its checksum; rebuilding", index_path.name)
            return None
        index = _new_index(int(meta["dim"]), config)
        index.load(str(index_path))
        if len(index) != want["rows"]:
            log.warning("ANN side file %s holds %d rows, the snapshot %d; rebuilding", index_path.name, len(index), want["rows"])
            return None
        index.expansion_search = config.ef_search
    except Exception as error:  # noqa: BLE001 - any unreadable side file is rebuilt
        log.warning("ANN side file %s unreadable (%s); rebuilding", index_path.name, error)
        return None
    return AnnIndex(index, config, want["rows"], "cache", time.perf_counter() - started)


def write_cache(ann: AnnIndex, snapshot_path: Path, info, embeddings: np.ndarray) -> bool:
    """Save the graph beside the snapshot: index then metadata, each to a temporary name, fsynced and
    renamed.  A crash leaves either no side file, or an old/new pair that the checksum tells apart."""
    index_path, meta_path = side_paths(snapshot_path, ann.config)
    suffix = f".tmp-{os.getpid()}-{threading.get_ident()}"
    tmp_index = index_path.with_name("." + index_path.name + suffix)
    try:
        ann.index.save(str(tmp_index))
        with open(tmp_index, "rb") as handle:
            os.fsync(handle.fileno())
        meta = {**identity(snapshot_path, info, embeddings, ann.config), "index_bytes": tmp_index.stat().st_size,
                "index_blake2": _file_digest(tmp_index), "build_seconds": round(ann.seconds, 2),
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.replace(tmp_index, index_path)
        write_json_atomic(meta_path, meta, indent=1)
        return True
    except Exception as error:  # noqa: BLE001 - a cache that cannot be written (read-only folder, full disk) is not an error
        log.warning("could not cache the ANN index beside %s: %s", snapshot_path, error)
        tmp_index.unlink(missing_ok=True)  # the metadata's temporary is removed by write_json_atomic
        return False
    finally:
        remove_orphans(Path(snapshot_path).parent)


def remove_orphans(index_dir: Path) -> list[str]:
    """Delete side files whose snapshot file is gone (retired) and temporaries older than a day."""
    removed = []
    for path in Path(index_dir).glob("*.ann-*"):
        snapshot = path.name.lstrip(".").split(".ann-", 1)[0]
        temporary = path.name.startswith(".")
        try:
            old = time.time() - path.stat().st_mtime > 86_400
        except FileNotFoundError:
            continue
        if not (Path(index_dir) / snapshot).exists() or (temporary and old):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def obtain(snapshot_path: Path, info, embeddings: np.ndarray, config: AnnConfig,
           cancelled: threading.Event | None = None) -> AnnIndex:
    """The graph for a snapshot: from the side file when it is valid, else built (and cached)."""
    if config.cache:
        cached = load_cached(snapshot_path, info, embeddings, config)
        if cached is not None:
            return cached
    ann = build_index(embeddings, config, cancelled)
    if config.cache:
        started = time.perf_counter()
        write_cache(ann, snapshot_path, info, embeddings)
        ann.extra["cache_write_seconds"] = round(time.perf_counter() - started, 2)
    return ann


# ---------------------------------------------------------------------------- approximate evidence
class PartialVectors:
    """Chunk and section-lead cosines for the rows scored so far (``SENTINEL`` elsewhere).

    Rows are scored a whole section at a time, so a scored row's ``lead`` is exact.  The graph
    is asked for the ``count`` nearest rows; every row it did not return, and whose section's
    first row it did not return, has chunk and lead cosine at most ``floor`` (the lowest cosine
    it returned) - so any blend of the two is at most ``floor`` too.  ``complete`` uses that:
    once the pool's worst blended score among scored rows is at least ``floor``, no unscored row
    can enter the pool, and the pool is the exact one (as far as the graph found the true
    nearest rows); otherwise it asks the graph for 2x more, twice; then a full pool is kept as
    it is, and a pool the filter left short is filled by exact search over the masked rows.
    """

    WIDEN = 2  # the graph is asked for this many times more candidates when the pool is not certain
    MAX_WIDENINGS = 2  # then exact search over the masked rows

    def __init__(self, embeddings: np.ndarray, query: np.ndarray, sections, ann: AnnIndex | None = None,
                 mask: np.ndarray | None = None) -> None:
        n = len(embeddings)
        self.embeddings = embeddings
        self.query = np.asarray(query, dtype=np.float32)
        self.sections = sections
        self.ann = ann
        self.mask = mask
        self.chunk = np.full(n, SENTINEL, dtype=np.float32)
        self.lead = np.full(n, SENTINEL, dtype=np.float32) if sections is not None else self.chunk
        self.scored = np.zeros(n, dtype=bool)
        self._scored_rows: list[np.ndarray] = []
        self.count = 0  # rows asked of the graph so far
        self.floor = float("inf")  # unscored rows have cosine (and lead cosine) <= floor
        self.exhaustive = False  # every row the mask allows is scored
        self.widenings = 0
        self.mode = "ann"

    @property
    def scored_rows(self) -> np.ndarray:
        if len(self._scored_rows) > 1:
            self._scored_rows = [np.concatenate(self._scored_rows)]
        return self._scored_rows[0] if self._scored_rows else np.zeros(0, dtype=np.int64)

    def blended(self, lead_weight: float) -> np.ndarray:
        """``evidence.blend(chunk, lead, lead_weight)`` computed for the scored rows only (``SENTINEL`` elsewhere)."""
        if lead_weight <= 0.0:
            return self.chunk
        if lead_weight >= 1.0:
            return self.lead
        out = np.full(len(self.chunk), SENTINEL, dtype=np.float32)
        rows = self.scored_rows
        out[rows] = (1.0 - lead_weight) * self.chunk[rows] + lead_weight * self.lead[rows]
        return out

    def section_rows(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` widened to every row of their sections (sections are runs of consecutive rows)."""
        if self.sections is None or not len(rows):
            return np.unique(rows)
        lead_row = self.sections.lead_row
        groups = np.unique(self.sections.group[rows])
        starts = lead_row[groups]
        ends = np.where(groups + 1 < len(lead_row), lead_row[np.minimum(groups + 1, len(lead_row) - 1)], len(self.chunk))
        lengths = ends - starts
        offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        return np.arange(int(lengths.sum()), dtype=np.int64) + offsets

    def score(self, rows: np.ndarray, whole_sections: bool = True) -> np.ndarray:
        """Score ``rows`` (widened to their sections) that are not scored yet; returns the rows widened."""
        rows = np.asarray(rows, dtype=np.int64)
        rows = self.section_rows(rows) if whole_sections else rows
        todo = rows[~self.scored[rows]]
        if len(todo):
            self.chunk[todo] = self.embeddings[todo] @ self.query
            self.scored[todo] = True
            self._scored_rows.append(todo)
            if self.sections is not None:
                self.lead[todo] = self.chunk[self.sections.lead_row[self.sections.group[todo]]]
        return rows

    def score_exact(self, mode: str) -> None:
        """Exact cosines for every row the mask allows (a filter keeps or drops whole documents, so whole
        sections); one matrix-vector product over all rows when the mask allows most of them."""
        n = len(self.chunk)
        rows = np.flatnonzero(self.mask) if self.mask is not None else np.arange(n)
        if 2 * len(rows) > n:
            self.chunk[:] = self.embeddings @ self.query
            if self.sections is not None:
                self.lead[:] = self.chunk[self.sections.lead_row[self.sections.group]]
            self.scored[:] = True
            self._scored_rows = [np.arange(n, dtype=np.int64)]
        else:
            self.score(rows, whole_sections=False)
        self.exhaustive, self.floor, self.mode = True, float("-inf"), mode

    def search(self, count: int) -> None:
        """Ask the graph for the ``count`` nearest rows and score them with their sections."""
        found = self.ann.search(self.query, count)
        self.count = count
        if len(found) >= len(self.chunk):
            self.score(found)
            self.exhaustive, self.floor = True, float("-inf")
            return
        self.score(found)
        if len(found):
            self.floor = min(self.floor, float(self.chunk[found].min()))

    def complete(self, pool: int, lead_weight: float) -> None:
        """Widen the search until the vector pool (best ``pool`` blended scores among masked rows) is certain."""
        while not self.exhaustive:
            rows = self.scored_rows
            if self.mask is not None:
                rows = rows[self.mask[rows]]
            if len(rows) >= pool:
                blended = (1.0 - lead_weight) * self.chunk[rows] + lead_weight * self.lead[rows] if lead_weight > 0 \
                    else self.chunk[rows]
                if float(np.partition(blended, len(blended) - pool)[len(blended) - pool]) >= self.floor:
                    break
            if self.widenings >= self.MAX_WIDENINGS:
                if len(rows) >= pool:
                    self.mode = "ann-uncertain"  # a full pool, the graph's best; not worth a scan of every row
                else:
                    self.score_exact("exact-fallback")  # too few rows pass the filter among the graph's candidates
                break
            self.widenings += 1
            self.mode = "ann-widened"
            self.search(self.count * self.WIDEN)
        STATS[self.mode] += 1


STATS: "Counter[str]" = Counter()  # how vector pools were completed, by mode (for benchmarks and diagnostics)


def approximate_semantic_evidence(snapshot, ann: AnnIndex, query_vector: np.ndarray, mask: np.ndarray | None,
                                  pool: int, config: AnnConfig) -> PartialVectors:
    """Cosines for the rows that can make the vector side of the candidate pool (see the module doc);
    ``ranking.fuse_evidence`` adds the BM25 pool and calls ``complete`` once it knows the lead weight."""
    partial = PartialVectors(snapshot.embeddings, query_vector, snapshot.sections, ann, mask)
    n = snapshot.size
    allowed = int(np.count_nonzero(mask)) if mask is not None else n
    fetch = max(pool, config.ef_search)
    if allowed == 0:
        partial.exhaustive, partial.mode = True, "empty"
    elif allowed < config.min_chunks or allowed <= fetch:
        partial.score_exact("exact-masked")  # few rows pass the filter: exact over them
    else:
        # ask for proportionally more when the mask drops rows (a filter on ~half the corpus asks ~2x)
        partial.search(min(n, int(np.ceil(fetch * n / allowed))))
    return partial
