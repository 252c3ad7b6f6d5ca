"""BEIR datasets: load them, turn the corpus into Markdown files and ingest
those through the normal pipeline, so an evaluation measures exactly what the
product serves.

Folder layout read by ``load_beir`` (the flat layout of ``../shared/datasets``,
with the standard BEIR ``qrels/<split>.tsv`` accepted as a fallback)::

    corpus.jsonl            {"_id": ..., "title": ..., "text": ...} per line
    queries.jsonl           {"_id": ..., "text": ...} per line
    queries_train.jsonl     optional: the train queries (else queries.jsonl)
    qrels.tsv               header line, then query-id <TAB> corpus-id <TAB> score
    qrels_train.tsv         the train qrels

Store layout written by ``ingest_beir``::

    <data_root>/<name>-<sha256(corpus.jsonl)[:12]>/
        corpus/<safe _id>.md    front matter {title, beir_id} + the text
        store/                  Settings.data_dir: store.duckdb, index/ snapshots
        dataset.json            what this store was built from

The directory name changes whenever ``corpus.jsonl`` does, so a store never
mixes two versions of a corpus; re-running on the same corpus costs one hash
per file (the ingestion's SHA-256 re-sync finds every file unchanged).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from knowledge_store.config.settings import PROJECT_ROOT, Settings
from knowledge_store.core.errors import GroundworkError
from knowledge_store.ingest.run import SyncReport, run_sync
from knowledge_store.learning.finetune import finetune_corpus
from knowledge_store.models.embeddings import Embedder
from knowledge_store.storage.index import open_snapshot

DEFAULT_DATA_ROOT = PROJECT_ROOT / "data" / "eval"
BEIR_ID_KEY = "beir_id"

_SAFE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,150}")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


class DatasetError(GroundworkError):
    """A BEIR folder is incomplete or a file in it is malformed.

    ``path`` names the file (or folder) and ``line`` the 1-based line number
    when one line is at fault.
    """

    def __init__(self, path: str | Path, reason: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class BeirDoc:
    doc_id: str
    title: str
    text: str


@dataclass
class BeirDataset:
    """One split of a BEIR dataset.

    ``queries`` and ``qrels`` hold only queries that have text *and* at least
    one judgement with score > 0; ``qrels`` maps query id -> {doc id: grade}.
    """

    name: str
    folder: Path
    split: str
    corpus: dict[str, BeirDoc]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    corpus_sha256: str
    queries_file: Path | None = None
    qrels_file: Path | None = None
    dropped_queries: int = 0  # queries in the queries file without any positive qrel
    qrels_without_query: int = 0  # judged query ids missing from the queries file
    qrels_unknown_docs: int = 0  # judgements naming a doc id absent from the corpus (kept)
    notes: list[str] = field(default_factory=list)
    # query id -> what a correct answer must contain (the sample corpus's example questions; BEIR files have none)
    key_facts: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def store_dir_name(self) -> str:
        return f"{self.name}-{self.corpus_sha256[:12]}"


# --------------------------------------------------------------------------- loading


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    try:
        handle = open(path, encoding="utf-8")
    except FileNotFoundError as error:
        raise DatasetError(path, "file not found") from error
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DatasetError(path, f"not valid JSON ({error.msg})", number) from error
            if not isinstance(row, dict):
                raise DatasetError(path, "expected a JSON object", number)
            if row.get("_id") is None or str(row["_id"]).strip() == "":
                raise DatasetError(path, "missing '_id'", number)
            rows.append((number, row))
    return rows


def _load_corpus(path: Path) -> dict[str, BeirDoc]:
    corpus: dict[str, BeirDoc] = {}
    for number, row in _read_jsonl(path):
        doc_id = str(row["_id"])
        if doc_id in corpus:
            raise DatasetError(path, f"duplicate _id {doc_id!r}", number)
        text = row.get("text")
        if not isinstance(text, str):
            raise DatasetError(path, f"document {doc_id!r} has no string 'text'", number)
        title = row.get("title") or ""
        if not isinstance(title, str):
            raise DatasetError(path, f"document {doc_id!r} has a non-string 'title'", number)
        corpus[doc_id] = BeirDoc(doc_id, title, text)
    if not corpus:
        raise DatasetError(path, "the corpus is empty")
    return corpus


def _load_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for number, row in _read_jsonl(path):
        query_id = str(row["_id"])
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            raise DatasetError(path, f"query {query_id!r} has no 'text'", number)
        if query_id in queries:
            raise DatasetError(path, f"duplicate _id {query_id!r}", number)
        queries[query_id] = text
    return queries


def _parse_score(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        try:
            as_float = float(value)
        except ValueError:
            return None
        return int(as_float) if as_float.is_integer() else None


def _load_qrels(path: Path) -> dict[str, dict[str, int]]:
    """query-id, corpus-id, score per line; the first line is a header when its score column is not a number."""
    qrels: dict[str, dict[str, int]] = {}
    try:
        handle = open(path, encoding="utf-8")
    except FileNotFoundError as error:
        raise DatasetError(path, "file not found") from error
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 3:
                fields = line.split()
            if len(fields) == 4:  # TREC style: query-id, iteration, doc-id, score
                fields = [fields[0], fields[2], fields[3]]
            score = _parse_score(fields[-1].strip()) if len(fields) == 3 else None
            if number == 1 and score is None:
                continue  # header: query-id corpus-id score
            if len(fields) != 3 or score is None:
                raise DatasetError(
                    path, f"expected 'query-id<TAB>corpus-id<TAB>integer score', got {line.rstrip()!r}", number
                )
            query_id, doc_id = fields[0].strip(), fields[1].strip()
            if not query_id or not doc_id:
                raise DatasetError(path, "empty query-id or corpus-id", number)
            if score > 0:
                judged = qrels.setdefault(query_id, {})
                judged[doc_id] = max(score, judged.get(doc_id, 0))
    return qrels


def _split_files(folder: Path, split: str) -> tuple[Path, Path]:
    """The queries and qrels files for ``split``; DatasetError naming what was looked for."""
    queries_candidates = [folder / f"queries_{split}.jsonl", folder / "queries.jsonl"]
    qrels_candidates = [folder / f"qrels_{split}.tsv", folder / "qrels" / f"{split}.tsv"]
    if split == "test":
        queries_candidates = [folder / "queries.jsonl", folder / "queries_test.jsonl"]
        qrels_candidates = [folder / "qrels.tsv", *qrels_candidates]
    queries = next((p for p in queries_candidates if p.is_file()), None)
    qrels = next((p for p in qrels_candidates if p.is_file()), None)
    if queries is None:
        raise DatasetError(folder, f"no queries file for split {split!r}; looked for " + ", ".join(p.name for p in queries_candidates))
    if qrels is None:
        raise DatasetError(
            folder, f"no qrels file for split {split!r}; looked for " + ", ".join(str(p.relative_to(folder)) for p in qrels_candidates)
        )
    return queries, qrels


def load_beir(folder: Path, split: str = "test") -> BeirDataset:
    """Read one split of the BEIR dataset in ``folder``.

    Only queries with at least one qrel of score > 0 are kept (and only qrels
    whose query has text).  Judgements naming documents absent from the corpus
    are kept, as BEIR's evaluation does: they count against recall.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(folder, "not a folder")
    corpus_path = folder / "corpus.jsonl"
    if not corpus_path.is_file():
        raise DatasetError(corpus_path, "file not found")
    queries_path, qrels_path = _split_files(folder, split)
    corpus = _load_corpus(corpus_path)
    all_queries = _load_queries(queries_path)
    all_qrels = _load_qrels(qrels_path)
    queries = {qid: text for qid, text in all_queries.items() if qid in all_qrels}
    qrels = {qid: all_qrels[qid] for qid in queries}
    unknown = sum(1 for judged in qrels.values() for doc_id in judged if doc_id not in corpus)
    ds = BeirDataset(
        name=folder.resolve().name,
        folder=folder.resolve(),
        split=split,
        corpus=corpus,
        queries=queries,
        qrels=qrels,
        corpus_sha256=_sha256(corpus_path),
        queries_file=queries_path,
        qrels_file=qrels_path,
        dropped_queries=len(all_queries) - len(queries),
        qrels_without_query=sum(1 for qid in all_qrels if qid not in all_queries),
        qrels_unknown_docs=unknown,
    )
    if not queries:
        raise DatasetError(qrels_path, f"no query in {queries_path.name} has a positive judgement")
    if ds.qrels_unknown_docs:
        ds.notes.append(f"{ds.qrels_unknown_docs} judgements name documents that are not in the corpus")
    if ds.qrels_without_query:
        ds.notes.append(f"{ds.qrels_without_query} judged query ids have no text in {queries_path.name}")
    return ds


# --------------------------------------------------------------------------- materialising


def safe_file_stem(doc_id: str) -> str:
    """A file name stem for a BEIR ``_id``: the id itself when it is a plain
    name, else a sanitised form plus a hash of the id (so two ids never share a
    file).  Never starts with '.' (the scanner skips hidden files)."""
    if _SAFE_ID.fullmatch(doc_id):
        return doc_id
    cleaned = _UNSAFE_CHARS.sub("_", doc_id).strip("._")[:100] or "doc"
    return f"{cleaned}-{hashlib.sha256(doc_id.encode()).hexdigest()[:10]}"


def document_markdown(doc: BeirDoc) -> str:
    """Front matter (title, beir_id) then the text.  No H1: the title lives
    only in the front matter, because the chunker prefixes every chunk with a
    "title > section" header already.  A document with no text gets its title
    as the body, otherwise it would fail ingestion as empty and vanish from the
    index."""
    front = yaml.safe_dump(
        {"title": doc.title, BEIR_ID_KEY: doc.doc_id},
        sort_keys=False,
        allow_unicode=True,
        width=1_000_000,
        default_flow_style=False,
    )
    body = literal_markdown(doc.text.replace("\r\n", "\n").replace("\r", "\n").strip("\n"))
    if not body.strip():
        body = doc.title.strip()
    return f"---\n{front}---\n\n{body}\n"


_ATX_LIKE = re.compile(r"^( {0,3})(#{1,6}(?:[ \t]|$))")
_SETEXT_LIKE = re.compile(r"^( {0,3})((?:=+|-+)[ \t]*)$")


def literal_markdown(text: str) -> str:
    """BEIR text is plain text: escape the lines Markdown would read as headings.

    A shell prompt or code comment at the start of a line ("# apt-get install x", "# sort by value")
    is an ATX heading in Markdown, and a line of "===" or "---" under a line of text a setext one; left
    as they are, they would cut ~8% of the documentation dev sets' documents into sections named after
    a code comment.  A backslash makes each a literal line (CommonMark escapes); nothing else changes.
    """
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if _ATX_LIKE.match(line) or (_SETEXT_LIKE.match(line) and i > 0 and lines[i - 1].strip()):
            lines[i] = re.sub(r"^( {0,3})", r"\1\\", line, count=1)
    return "\n".join(lines)


def materialise_corpus(ds: BeirDataset, out_dir: Path) -> int:
    """Write ``out_dir/<safe _id>.md`` for every corpus document; return how many files were written.

    Idempotent: a file whose bytes would not change is not touched (its mtime
    stays put), so the next sync only hashes it.  ``.md`` files in ``out_dir``
    that belong to no document of ``ds`` are deleted, so the folder mirrors the
    corpus exactly.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, BeirDoc] = {}
    for doc in ds.corpus.values():
        name = f"{safe_file_stem(doc.doc_id)}.md"
        if name in wanted:
            raise DatasetError(ds.folder / "corpus.jsonl", f"ids {wanted[name].doc_id!r} and {doc.doc_id!r} map to the same file {name}")
        wanted[name] = doc
    written = 0
    for name, doc in wanted.items():
        path = out_dir / name
        data = document_markdown(doc).encode("utf-8")
        try:
            if path.read_bytes() == data:
                continue
        except FileNotFoundError:
            pass
        tmp = out_dir / f".{name}.tmp"
        tmp.write_bytes(data)
        tmp.replace(path)
        written += 1
    for stale in out_dir.glob("*.md"):
        if stale.name not in wanted:
            stale.unlink()
    return written


# --------------------------------------------------------------------------- ingesting


def store_paths(data_root: Path, ds: BeirDataset) -> tuple[Path, Path, Path]:
    """(root, corpus dir, data_dir) of the store for ``ds``."""
    root = Path(data_root) / ds.store_dir_name
    return root, root / "corpus", root / "store"


def beir_settings(ds: BeirDataset, data_root: Path | None = None, embedding_model: str | None = None) -> Settings:
    """Settings of the store for ``ds`` (without ingesting anything).  Every document of a labelled set is
    indexed, however short (``min_markdown_words=0``): the labels may point at a one-line abstract, and a
    skipped document would count as a miss the engine never had a chance at.  ``embedding_model``: the store's
    model when not the settings' (an evaluation suite's configuration may name one; keep such stores under a
    data_root of their own)."""
    _, corpus_dir, data_dir = store_paths(Path(data_root) if data_root else DEFAULT_DATA_ROOT, ds)
    model = {"embedding_model": embedding_model} if embedding_model else {}
    return Settings(data_dir=data_dir, sources=[corpus_dir], min_markdown_words=0, **model)


def ingest_beir(
    folder: Path, data_root: Path | None = None, embedder: Embedder | None = None, finetune: bool | None = None,
    embedding_model: str | None = None,
) -> tuple[Settings, SyncReport]:
    """Materialise ``folder``'s corpus and ingest it with ``run_sync`` into its own store, then fine-tune the
    embedding model on it as the product does by default (``learning.finetune``; ``finetune``: None follows
    ``GROUNDWORK_FINETUNE_EMBEDDER``; never with a given ``embedder``, which then embeds everything).  The
    decision is taken once per corpus and its pairs (a later call finds it recorded); it uses no labels and
    no feedback, so the dataset's queries stay unseen.

    The store lives in ``data_root/<name>-<sha256(corpus.jsonl)[:12]>``
    (default ``data_root``: ``data/eval`` under the repository).  Returns the
    store's Settings (``settings.index_dir`` holds the published snapshot) and
    the sync report.
    """
    data_root = Path(data_root) if data_root is not None else DEFAULT_DATA_ROOT
    ds = load_beir(folder)
    root, corpus_dir, _ = store_paths(data_root, ds)
    materialise_corpus(ds, corpus_dir)
    manifest = {
        "name": ds.name,
        "source_folder": str(ds.folder),
        "corpus_sha256": ds.corpus_sha256,
        "documents": len(ds.corpus),
        "corpus_dir": "corpus",
        "data_dir": "store",
    }
    manifest_path = root / "dataset.json"
    manifest_text = json.dumps(manifest, indent=2) + "\n"
    if not manifest_path.is_file() or manifest_path.read_text() != manifest_text:
        manifest_path.write_text(manifest_text)
    settings = beir_settings(ds, data_root, embedding_model)
    report = run_sync(settings, embedder=embedder)
    if embedder is None and (settings.finetune_embedder if finetune is None else finetune):
        finetune_corpus(settings, feedback=[])
    return settings, report


# --------------------------------------------------------------------------- mapping results back


def chunk_to_beir_id(metadata_json: str | Mapping[str, Any] | None) -> str:
    """The BEIR ``_id`` stored in a snapshot row's ``metadata`` (the document's front matter)."""
    if metadata_json is None:
        raise DatasetError("metadata", "row has no metadata")
    if isinstance(metadata_json, Mapping):
        metadata = metadata_json
    else:
        try:
            metadata = json.loads(metadata_json)
        except (TypeError, json.JSONDecodeError) as error:
            raise DatasetError("metadata", f"not valid JSON: {str(metadata_json)[:80]!r}") from error
    if not isinstance(metadata, Mapping):
        raise DatasetError("metadata", f"expected a JSON object, got {type(metadata).__name__}")
    value = metadata.get(BEIR_ID_KEY)
    if value is None or str(value) == "":
        raise DatasetError("metadata", f"no '{BEIR_ID_KEY}' key in {str(dict(metadata))[:120]}")
    return str(value)


def beir_ids_by_doc_id(settings: Settings) -> dict[str, str]:
    """Store ``doc_id`` -> BEIR ``_id`` for every document in the published snapshot."""
    conn, _ = open_snapshot(settings.index_dir)
    try:
        rows = conn.execute("SELECT doc_id, metadata FROM documents").fetchall()
    finally:
        conn.close()
    return {doc_id: chunk_to_beir_id(metadata) for doc_id, metadata in rows}
