"""What learning from feedback decided last, and when the sensor last looked: ``<index_dir>/feedback_learning.json``.

The query adapter is retrained from thumbs-up (``learning.adapter_training.adapt_corpus``) and adopted only when
its cross-validated paired gain is clear; an adopted adapter is stored in ``query_adapter.npz``, a declined one
leaves nothing there.  This file keeps the decision either way, so the console can say what happened to the
ratings:

* ``last_decision``: ``decision`` (adopted / declined), ``reason``, ``gain``, ``standard_error``, ``required``,
  ``rated_queries``, ``up_votes`` (thumbs-up in the query log when it was made: the sensor counts new ones from
  there), ``trigger`` (sensor, cli, labels, ...), ``decided_at``, ``seconds``, ``snapshot_version``;
* ``history``: earlier decisions, newest first (``HISTORY_KEPT``);
* ``last_check``: the Dagster sensor ``feedback_grew``'s last evaluation: ``at``, ``up_votes``, ``message``.

Written by learning (decisions) and the sensor (checks), each a read-modify-write under a file lock and an
atomic replace; read by ``/api/knowledge/config``, the console's Settings page and ``groundwork status``.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from knowledge_store.core.errors import StoreError
from knowledge_store.core.files import exclusive_lock, write_json_atomic

FEEDBACK_LEARNING_FILE = "feedback_learning.json"
HISTORY_KEPT = 20
DECISIONS = ("adopted", "declined")
_WRITE_LOCK = threading.Lock()


@dataclass
class FeedbackLearning:
    """What ``feedback_learning.json`` holds (empty when there is no file yet)."""

    last_decision: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    last_check: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"last_decision": self.last_decision, "history": self.history, "last_check": self.last_check}


def feedback_learning_path(index_dir: Path) -> Path:
    return Path(index_dir) / FEEDBACK_LEARNING_FILE


def utc_stamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def load_feedback_learning(index_dir: Path) -> FeedbackLearning:
    """The stored state; an empty one when there is no file; ``StoreError`` naming a damaged file."""
    path = feedback_learning_path(index_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return FeedbackLearning()
    except (OSError, ValueError) as error:
        raise StoreError(f"{path} cannot be read ({error}); delete it, the next decision writes it again") from error
    if not isinstance(data, dict):
        raise StoreError(f"{path} holds {type(data).__name__}, not an object; delete it, the next decision writes it again")
    return FeedbackLearning(last_decision=data.get("last_decision"), history=list(data.get("history") or []),
                            last_check=data.get("last_check"))


@contextmanager
def _locked(index_dir: Path):
    with exclusive_lock(Path(index_dir) / f".{FEEDBACK_LEARNING_FILE}.lock", _WRITE_LOCK):
        yield


def _replace(index_dir: Path, state: FeedbackLearning) -> Path:
    return write_json_atomic(feedback_learning_path(index_dir), state.to_dict())


def _current(index_dir: Path) -> FeedbackLearning:
    try:
        return load_feedback_learning(index_dir)
    except StoreError:  # a damaged file is replaced by the next write, not a reason to lose a decision
        return FeedbackLearning()


def record_decision(index_dir: Path, decision: dict[str, Any]) -> Path:
    """Store ``decision`` as the last one (the previous one moves to the history).  It needs ``decision``
    (adopted or declined), a non-empty ``reason`` and the ``up_votes`` count it was made at; ``decided_at`` is
    added when missing.  ``ValueError`` naming the bad field otherwise (nothing is written)."""
    if decision.get("decision") not in DECISIONS:
        raise ValueError(f"decision={decision.get('decision')!r}: must be one of {', '.join(DECISIONS)}")
    if not isinstance(decision.get("reason"), str) or not decision["reason"].strip():
        raise ValueError(f"reason={decision.get('reason')!r}: a decision says why")
    votes = decision.get("up_votes")
    if not isinstance(votes, int) or isinstance(votes, bool) or votes < 0:
        raise ValueError(f"up_votes={votes!r}: must be the non-negative thumbs-up count the decision was made at")
    entry = {**decision, "decided_at": decision.get("decided_at") or utc_stamp()}
    with _locked(index_dir):
        state = _current(index_dir)
        if state.last_decision:
            state.history = [state.last_decision, *state.history][:HISTORY_KEPT]
        state.last_decision = entry
        return _replace(index_dir, state)


def record_check(index_dir: Path, up_votes: int | None, message: str) -> Path:
    """Note the sensor's evaluation: when, the thumbs-up it counted (None: no query log) and what it did."""
    with _locked(index_dir):
        state = _current(index_dir)
        state.last_check = {"at": utc_stamp(), "up_votes": up_votes, "message": message}
        return _replace(index_dir, state)
