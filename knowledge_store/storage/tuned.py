"""The corpus's ranking defaults on disk: ``<index_dir>/tuned.json``, what self-tuning chose and what was set by hand.

``groundwork tune`` / the ``corpus_tuning`` asset write the tuning run (``save_tuned``); the console's Settings page
(``PUT /api/knowledge/ranking``) writes hand-set values (``save_manual``); every query reads both, re-reading the
file only when it changes.  Writes are atomic (temporary file, fsync, rename) and take turns under an advisory
lock, so the console and a concurrent ``groundwork tune`` never lose each other's values.  Which value wins is
the retrieval layer's rule (``retrieval/ranking_defaults.py``).  ``RankingParams`` - one ranking configuration -
lives here because the file stores it.
"""

from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from knowledge_store.config.settings import REGISTERED_VOCABULARIES
from knowledge_store.core.errors import GroundworkError
from knowledge_store.core.files import exclusive_lock, write_json_atomic

TUNED_FILE = "tuned.json"


@dataclass(frozen=True)
class RankingParams:
    """Everything that decides the fused order of one query (besides the query)."""

    alpha: float
    fusion: str = "weighted"
    section_weight: float = 0.0
    lead_weight: float = 0.0

    def __post_init__(self) -> None:
        for name in ("alpha", "section_weight", "lead_weight"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name}={value!r}: must be between 0 and 1")
        fusion_modes = REGISTERED_VOCABULARIES.get("default_fusion")  # the fusion registry, once retrieval is loaded
        if fusion_modes is not None and self.fusion not in fusion_modes:
            raise ValueError(f"fusion={self.fusion!r}: must be one of {', '.join(fusion_modes)}")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def label(self) -> str:
        return (f"{self.fusion} alpha={self.alpha:g} section={self.section_weight:g} "
                f"lead={self.lead_weight:g}")



# --------------------------------------------------------------------------- stored choice


@dataclass
class TunedConfig:
    """The chosen ranking of one corpus and the evidence for it (``<index_dir>/tuned.json``)."""

    params: RankingParams
    created_at: str
    snapshot_version: int
    pseudo_queries: dict[str, int]
    before: dict[str, Any]  # the built-in default's scores on the pseudo-queries
    after: dict[str, Any]  # the chosen configuration's scores
    table: list[dict[str, Any]]  # every grid point, best first
    seconds: float
    # why the choice was made: the best point's paired nDCG@10 gain over the built-in, its standard error,
    # the gain required and whether it was adopted (``keep_decision``); None in a file that does not record it
    decision: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["params"] = self.params.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TunedConfig":
        return cls(**{**data, "params": RankingParams(**data["params"])})


def tuned_path(index_dir: Path) -> Path:
    return Path(index_dir) / TUNED_FILE


# the ranking values the console may set by hand (tuning chooses alpha and fusion; nothing chooses the reranker)
MANUAL_FIELDS = ("alpha", "fusion", "reranker")
# what ``groundwork tune`` decides: a new tuning run replaces hand-set values of these
TUNED_FIELDS = ("alpha", "fusion", "section_weight", "lead_weight")
_MANUAL_KEY = "manual"


class InvalidRankingError(GroundworkError):
    """A ranking value that cannot be stored as a corpus default; names the field and the value."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field}={value!r}: {reason}")


@dataclass(frozen=True)
class ManualRanking:
    """Ranking defaults set by hand for this corpus (the console's Settings page, ``PUT /api/knowledge/ranking``).

    Kept in ``tuned.json`` under ``manual`` beside the tuning evidence, so every reader of the
    corpus's ranking (engine, CLI, MCP, ``/api/knowledge/config``) sees it without a restart."""

    values: dict[str, Any]  # a subset of MANUAL_FIELDS
    updated_at: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.values, "updated_at": self.updated_at}


def check_manual_value(field_name: str, value: object) -> object:
    """The value as stored, or InvalidRankingError: the vocabulary is the settings' own (fusion modes, rerankers,
    as the retrieval layer registered them)."""
    if field_name == "alpha":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise InvalidRankingError("alpha", value, "must be a number from 0 (pure BM25) to 1 (pure vector)")
        return float(value)
    if field_name in ("fusion", "reranker"):
        vocabulary = REGISTERED_VOCABULARIES.get(f"default_{field_name}")
        if vocabulary is not None and value not in vocabulary:
            raise InvalidRankingError(field_name, value, vocabulary.one_of())
        if not isinstance(value, str):
            raise InvalidRankingError(field_name, value, "must be a name")
        return value
    raise InvalidRankingError(field_name, value, f"not a ranking value the console sets; known: {', '.join(MANUAL_FIELDS)}")


_TUNED_CACHE: dict[str, tuple[tuple[int, int, int], TunedConfig | None, ManualRanking | None]] = {}
_WRITE_LOCK = threading.Lock()


def _parse_file(path: Path, data: object) -> tuple[TunedConfig | None, ManualRanking | None]:
    """The tuning part and the hand-set part of ``tuned.json``; either may be absent, a damaged part is ignored."""
    if not isinstance(data, dict):
        logging.getLogger(__name__).warning("ignoring %s: not a JSON object", path)
        return None, None
    tuned = manual = None
    if "params" in data:
        try:
            tuned = TunedConfig.from_dict({k: v for k, v in data.items() if k != _MANUAL_KEY})
        except (ValueError, TypeError, KeyError) as error:
            logging.getLogger(__name__).warning("ignoring the tuning in %s: %s", path, error)
    block = data.get(_MANUAL_KEY)
    if block is not None:
        try:
            if not isinstance(block, dict):
                raise TypeError("manual is not an object")
            values = {k: check_manual_value(k, v) for k, v in block.items() if k != "updated_at"}
            manual = ManualRanking(values, str(block.get("updated_at") or "")) if values else None
        except (InvalidRankingError, TypeError) as error:
            logging.getLogger(__name__).warning("ignoring the hand-set ranking in %s: %s", path, error)
    return tuned, manual


def load_both(index_dir: Path) -> tuple[TunedConfig | None, ManualRanking | None]:
    """Both parts of the file, re-read only when it changes (mtime, size or inode: every save is a new file)."""
    path = tuned_path(index_dir)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None, None
    stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    cached = _TUNED_CACHE.get(str(path))
    if cached is not None and cached[0] == stamp:
        return cached[1], cached[2]
    try:
        tuned, manual = _parse_file(path, json.loads(path.read_text()))
    except (OSError, ValueError) as error:
        logging.getLogger(__name__).warning("ignoring %s: %s", path, error)
        tuned, manual = None, None
    _TUNED_CACHE[str(path)] = (stamp, tuned, manual)
    return tuned, manual


def _write(path: Path, data: dict[str, Any] | None) -> None:
    """Replace the file atomically (``None`` removes it); readers see the old or the new file, never half."""
    if data is None:
        path.unlink(missing_ok=True)
    else:
        write_json_atomic(path, data)
    _TUNED_CACHE.pop(str(path), None)


@contextmanager
def _file_lock(index_dir: Path):
    """One read-modify-write of ``tuned.json`` at a time: threads of this process and other processes
    (a ``groundwork tune`` while the console saves) take turns on ``.tuned.lock``."""

    with exclusive_lock(Path(index_dir) / f".{TUNED_FILE}.lock", _WRITE_LOCK):
        yield


def _raw(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_tuned(index_dir: Path, tuned: TunedConfig) -> Path:
    """Store a tuning run's choice.  Hand-set values of what tuning chooses give way to it; a hand-set
    reranker (which tuning does not choose) is kept."""
    path = tuned_path(index_dir)
    with _file_lock(index_dir):
        _, manual = _parse_file(path, _raw(path)) if path.exists() else (None, None)
        data = tuned.to_dict()
        kept = {k: v for k, v in (manual.values if manual else {}).items() if k not in TUNED_FIELDS}
        if kept:
            data[_MANUAL_KEY] = {**kept, "updated_at": manual.updated_at}
        _write(path, data)
    return path


def save_manual(index_dir: Path, changes: dict[str, Any]) -> ManualRanking | None:
    """Set (a value) or forget (``None``) hand-set ranking defaults; the tuning evidence stays as it was.

    Returns what is stored now (None when nothing is hand-set any more)."""
    checked = {k: (None if v is None else check_manual_value(k, v)) for k, v in changes.items()}
    path = tuned_path(index_dir)
    with _file_lock(index_dir):
        data = _raw(path)
        _, manual = _parse_file(path, data) if data else (None, None)
        values = dict(manual.values) if manual else {}
        for key, value in checked.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        stored = ManualRanking(values, datetime.now(timezone.utc).isoformat(timespec="seconds")) if values else None
        data.pop(_MANUAL_KEY, None)
        if stored is not None:
            data[_MANUAL_KEY] = stored.to_dict()
        _write(path, data or None)
    return stored


def reset_ranking(index_dir: Path) -> bool:
    """Forget the tuned and the hand-set ranking (``groundwork tune --reset``); True when there was a file."""
    path = tuned_path(index_dir)
    with _file_lock(index_dir):
        existed = path.exists()
        _write(path, None)
    return existed


def load_tuned(index_dir: Path) -> TunedConfig | None:
    """The stored tuning run, or None; re-read only when the file changes. A damaged file is ignored (and says so)."""
    return load_both(index_dir)[0]


def load_manual(index_dir: Path) -> ManualRanking | None:
    """The hand-set ranking defaults, or None."""
    return load_both(index_dir)[1]


