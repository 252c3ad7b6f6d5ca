"""Which embedding model serves a corpus: the settings' base model, or a fine-tuned one adopted for the corpus.

``<index_dir>/embedder.json`` records the adopted model (its folder under ``<data_dir>/models/finetuned``,
its model id, the base model it was trained from) and the last fine-tuning decision, adopted or
declined, with its evidence.  Written atomically by ``learning.finetune`` (adopt, decline, roll back);
read by

* ingestion: ``serving_model_path`` is the model new and changed chunks are embedded with, so every
  vector of a snapshot comes from one model (the snapshot records it: ``SnapshotInfo.model_id`` and
  ``model_path``);
* the console, ``/api/knowledge/config`` and ``groundwork status``: which model serves and why.

Queries do not read this file: they follow the snapshot they search (``RetrievalEngine.embedder_for``),
so a query vector and the vectors it is compared with always come from the same model, also in the
moment between a new snapshot's publication and a server noticing it.

A record whose base is not the configured base model (``GROUNDWORK_MODEL_PATH`` changed since) or
whose folder is gone is ignored: the base model serves.  ``GROUNDWORK_FINETUNE_EMBEDDER=false`` turns
the adopted model off the same way (the next sync publishes with the base model again).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import StoreError
from knowledge_store.core.files import write_json_atomic
from knowledge_store.models.embeddings import document_model_id, model_id_for, recorded_recipe_decision

EMBEDDER_FILE = "embedder.json"
HISTORY_KEPT = 20


@dataclass
class EmbedderRecord:
    """What ``embedder.json`` holds."""

    base_model_id: str
    model_path: str | None = None  # the adopted fine-tuned folder; None = the base model serves
    model_id: str | None = None  # its model id (``embeddings.model_id_for``)
    adopted_at: str | None = None
    decision: dict[str, Any] | None = None  # the last fine-tuning decision (``learning.finetune.Decision``)
    history: list[dict[str, Any]] = field(default_factory=list)  # earlier decisions, newest first

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmbedderRecord:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def record_path(index_dir: Path) -> Path:
    return Path(index_dir) / EMBEDDER_FILE


def load_record(index_dir: Path) -> EmbedderRecord | None:
    """The record, or None when there is none; a damaged file is a ``StoreError`` naming it."""
    path = record_path(index_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as error:
        raise StoreError(f"{path} cannot be read ({error}); delete it to serve the base model") from error
    if not isinstance(data, dict) or "base_model_id" not in data:
        raise StoreError(f"{path} is not an embedder record; delete it to serve the base model")
    return EmbedderRecord.from_dict(data)


def save_record(index_dir: Path, record: EmbedderRecord) -> Path:
    """Replace the record atomically (temporary file, fsync, rename): readers see the old or the new one."""
    return write_json_atomic(record_path(index_dir), record.to_dict())


def adopted_model(settings: Settings) -> Path | None:
    """The adopted fine-tuned model folder that serves, or None (the base model serves): none adopted,
    fine-tuning off, another base model configured, or the folder gone."""
    if not settings.finetune_embedder:
        return None
    try:
        record = load_record(settings.index_dir)
    except StoreError:
        return None
    if record is None or not record.model_path or record.base_model_id != model_id_for(settings.model_path):
        return None
    path = Path(record.model_path)
    return path if (path / "config.json").is_file() else None


def serving_model_path(settings: Settings) -> Path:
    """The model ingestion embeds chunk texts with: the adopted fine-tuned model, else ``settings.model_path``."""
    return adopted_model(settings) or Path(settings.model_path)


def document_quantization_in_effect(settings: Settings, model_path: Path) -> str:
    """The quantisation ``model_path``'s document vectors are made with on this CPU: the configured one, or
    ``none`` where this CPU's recorded check chose fp32 for documents (the quantised graph failed its fidelity check
    or embeds batches slower here, as blockwise int8 does without VNNI).  Read from the record only, never built or
    checked here: before the first check the configured recipe stands, and the check that the first embedding runs
    decides."""
    decision = recorded_recipe_decision(settings, "documents", model_path)
    return decision.in_effect if decision is not None else settings.document_quantization


def serving_model_id(settings: Settings) -> str:
    """The model id of the chunk vectors ingestion makes now and a snapshot published now carries: the serving model
    with the quantisation in effect on this CPU (``document_quantization_in_effect``) and the bare-text blend, as
    the document embedder's own ``model_id``."""
    path = serving_model_path(settings)
    return document_model_id(path, document_quantization_in_effect(settings, path), settings.bare_vector_weight,
                             settings.embedding_passage_prefix, settings.in_context_sentences)


def model_path_for(settings: Settings, model_id: str) -> Path | None:
    """The folder of the model whose vectors carry ``model_id`` (suffixes such as ``+int8`` or ``+bare0.5``
    ignored): the configured base model or a fine-tuned one under ``finetuned_dir``; None when neither is."""
    base = model_id.split("+", 1)[0]
    if base == model_id_for(settings.model_path):
        return Path(settings.model_path)
    candidate = finetuned_dir(settings) / base.split(":", 1)[0]
    if (candidate / "config.json").is_file() and model_id_for(candidate) == base:
        return candidate
    return None


def finetuned_dir(settings: Settings) -> Path:
    """Where fine-tuned models live: ``<data_dir>/models/finetuned/<name>``, one folder each."""
    return settings.finetuned_models_dir
