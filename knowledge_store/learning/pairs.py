"""Training pairs for fine-tuning the embedding model on one corpus, from the corpus itself (no labels).

Every corpus already says what its sections are about.  A pair is (a text a person might search with,
the text the model embeds for the passage that answers it):

* ``heading`` / ``question``: a section heading (an FAQ question) -> the section's first chunk;
* ``title``: a document title -> the document's first chunk;
* ``feedback``: a thumbs-up (the user's query -> the rated chunk's section);
* ``first_sentence``: a section's first sentence -> the rest of its first chunk, the sentence removed;
* ``link``: a link's text (``seeAlso`` relations keep it as their evidence ``phrase``) -> the linked
  document's first chunk.

The first four are self-tuning's pseudo-queries (``tuning.build_pseudo_queries``: book-name segments
and numbering dropped, ambiguous headings skipped) and their targets are built the way self-tuning
ranks them (``tuning.stripped_embed_texts``): the query's own words are removed from the target's
header and text, or the model would learn to match a heading to itself.  Pairs are deduplicated,
each document gives at most three times the average document's share (a long manual must not drown
the rest), and the total is capped by a seeded sample.

A share of the query texts is **held out** by a hash of the normalised text (``held_out``): the
same text is held out in every run and every kind, so a heading held out is never trained under
another kind.  The share is a fifth, more for a corpus with few headings and titles (up to half,
``held_out_share_for``): enough held-out pseudo-queries that the decision's standard error leaves
room for the gains fine-tuning is for.  The held-out pseudo-queries are what the adoption decision ranks
(``learning.finetune``); nothing held out is trained on.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from knowledge_store.core.text import sentences_to_embed
from knowledge_store.ingest.chunking import SECTION_SEPARATOR
from knowledge_store.learning.tuning import PseudoQuery, build_pseudo_queries, stripped_embed_texts, target_rows
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot

PAIR_KINDS = ("heading", "question", "title", "feedback", "first_sentence", "link")
HELD_OUT_SHARE = 0.2
# the held-out share grows along these steps until WANTED_HELD_OUT pseudo-queries are held out: with fewer, the
# standard error of a paired gain hides the gains fine-tuning is for (learning.finetune.detectable_gain)
HELD_OUT_SHARES = (0.2, 0.3, 0.4, 0.5)
WANTED_HELD_OUT = 200
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_'-]*")
_URLISH = re.compile(r"^(?:https?://|www\.|/|\.\./)|\.(?:html?|md|txt|pdf)$", re.IGNORECASE)


@dataclass(frozen=True)
class TrainingPair:
    query: str
    target: str  # what the model embeds for the answering passage (header + text, as ingestion builds it)
    kind: str  # one of PAIR_KINDS
    doc: int  # the target's document (LoadedSnapshot.documents index): the per-document cap
    group: int  # the target's section: never two pairs of one section in a batch (in-batch negatives)
    negatives: tuple[str, ...] = ()  # mined hard negatives' texts, stripped like the target (mine_hard_negatives)
    negative_groups: tuple[int, ...] = ()  # their sections


def normalised(text: str) -> str:
    return " ".join(text.lower().split())


def held_out(query: str, share: float = HELD_OUT_SHARE) -> bool:
    """Whether ``query`` is kept aside: the same answer for the same text in every run (a hash, not a draw)."""
    digest = int(hashlib.sha256(normalised(query).encode()).hexdigest()[:8], 16)
    return digest % 10_000 < share * 10_000


def _words(text: str) -> int:
    return len([w for w in _WORD.findall(text) if len(w) > 2])


def pseudo_query_pairs(snapshot: LoadedSnapshot, queries: Iterable[PseudoQuery]) -> list[TrainingPair]:
    """A pair per pseudo-query: its text -> its first target's lead chunk, the query's words removed."""
    sections = snapshot.sections
    pairs = []
    for pq in queries:
        rows = target_rows(snapshot, pq)
        rows = rows[snapshot.active[rows]] if len(rows) else rows
        if not len(rows):
            continue
        lead = int(rows.min())  # the target's first chunk: rows of a section or document are consecutive
        embed_texts, _ = stripped_embed_texts(snapshot, pq, np.array([lead]))
        if embed_texts[0].strip():
            pairs.append(TrainingPair(pq.query, embed_texts[0], pq.kind, int(snapshot.doc_index[lead]),
                                      int(sections.group[lead])))
    return pairs


def first_sentence_pairs(snapshot: LoadedSnapshot, embed_texts: list[str]) -> list[TrainingPair]:
    """A section's first sentence -> the rest of its first chunk (header kept: the served vector has it)."""
    sections = snapshot.sections
    texts = snapshot.records.column("text").to_pylist()
    pairs = []
    for lead in sections.lead_row.tolist():
        if not snapshot.active[lead]:
            continue
        sentences = sentences_to_embed(texts[lead] or "")
        if len(sentences) < 2:
            continue
        first, rest = sentences[0].strip(), " ".join(s.strip() for s in sentences[1:])
        if not 4 <= _words(first) <= 40 or _words(rest) < 8:
            continue
        header = embed_texts[lead].split("\n\n", 1)[0] if "\n\n" in embed_texts[lead] else ""
        pairs.append(TrainingPair(first, f"{header}\n\n{rest}" if header else rest, "first_sentence",
                                  int(snapshot.doc_index[lead]), int(sections.group[lead])))
    return pairs


def link_pairs(snapshot: LoadedSnapshot, embed_texts: list[str]) -> list[TrainingPair]:
    """A link's text -> the first chunk of the document it links to (``seeAlso`` relations)."""
    first_row: dict[str, int] = {}
    doc_ids = snapshot.records.column("doc_id").to_pylist()
    for row in np.flatnonzero(snapshot.active).tolist():
        first_row.setdefault(doc_ids[row], row)
    pairs = []
    for relation in snapshot.relations:
        if relation.get("rel_type") != "seeAlso":
            continue
        phrase = ((relation.get("evidence") or {}).get("phrase") or "").strip()
        row = first_row.get(relation.get("dst_id"))
        if row is None or _words(phrase) < 2 or _URLISH.search(phrase):
            continue
        pairs.append(TrainingPair(phrase, embed_texts[row], "link", int(snapshot.doc_index[row]),
                                  int(snapshot.sections.group[row])))
    return pairs


def chunk_embed_texts(snapshot: LoadedSnapshot) -> list[str]:
    """Every row's text as the model embedded it (``title\\nsection path\\n\\ntext``, as the chunker builds it)."""
    records = snapshot.records
    out = []
    for title, path, text in zip(records.column("title").to_pylist(), records.column("section_path").to_pylist(),
                                 records.column("text").to_pylist()):
        parts = [title.strip()] if title and title.strip() else []
        section = SECTION_SEPARATOR.join(s for s in (path or []) if s and s != title)
        if section:
            parts.append(section)
        header = "\n".join(parts)
        out.append(f"{header}\n\n{text or ''}" if header else (text or ""))
    return out


@dataclass
class PairSet:
    """The training pairs of one corpus, the held-out pseudo-queries and their counts."""

    train: list[TrainingPair]
    held_out: list[PseudoQuery]
    counts: dict[str, int]  # training pairs per kind
    candidates: int  # pairs before deduplication, the cap and the sample
    held_out_feedback: int  # held-out pseudo-queries from thumbs-up
    held_out_share: float = HELD_OUT_SHARE  # the share of the query texts held out (held_out_share_for)

    def digest(self) -> str:
        """A hash of the training pairs (order included): part of the fine-tuned model's id."""
        h = hashlib.sha256()
        for pair in self.train:
            negatives = "\x1d".join(pair.negatives)
            h.update(f"{pair.kind}\x1f{pair.query}\x1f{pair.target}\x1f{negatives}\x1e".encode())
        return h.hexdigest()


def held_out_share_for(queries: list[PseudoQuery], wanted: int = WANTED_HELD_OUT) -> float:
    """The smallest of ``HELD_OUT_SHARES`` that holds out ``wanted`` of ``queries`` (the largest when none does):
    a large corpus keeps a fifth aside, a small one up to half, so its held-out set can still show a gain.  The
    shares are nested (``held_out``): a text held out at 0.2 is held out at 0.5 too."""
    for share in HELD_OUT_SHARES:
        if sum(held_out(q.query, share) for q in queries) >= wanted:
            return share
    return HELD_OUT_SHARES[-1]


def build_pairs(snapshot: LoadedSnapshot, feedback: Iterable[dict] = (), max_pairs: int = 6000,
                held_out_share: float | None = None, max_held_out: int = 400, seed: int = 13) -> PairSet:
    """The corpus's training pairs (deduplicated, capped per document and in total) and held-out pseudo-queries
    (``held_out_share``: None sizes it with ``held_out_share_for``)."""
    queries = build_pseudo_queries(snapshot, feedback, limit=10**9, seed=seed)
    if held_out_share is None:
        held_out_share = held_out_share_for(queries)
    kept = [q for q in queries if not held_out(q.query, held_out_share)]
    evaluation = [q for q in queries if held_out(q.query, held_out_share)]
    embed_texts = chunk_embed_texts(snapshot)
    candidates = (pseudo_query_pairs(snapshot, kept) + first_sentence_pairs(snapshot, embed_texts)
                  + link_pairs(snapshot, embed_texts))
    seen: set[tuple[str, str]] = set()
    unique = []
    for pair in candidates:
        key = (normalised(pair.query), pair.target)
        if key in seen or held_out(pair.query, held_out_share) or normalised(pair.query) in normalised(pair.target):
            continue
        seen.add(key)
        unique.append(pair)
    rng = random.Random(seed)
    rng.shuffle(unique)
    # feedback first (people's own words), then the rest, each document up to 3x the average document's share
    unique.sort(key=lambda p: p.kind != "feedback")
    documents = max(1, len({p.doc for p in unique}))
    cap = max(8, math.ceil(3 * min(len(unique), max_pairs) / documents))
    per_doc: Counter = Counter()
    train = []
    for pair in unique:
        if per_doc[pair.doc] >= cap:
            continue
        per_doc[pair.doc] += 1
        train.append(pair)
        if len(train) >= max_pairs:
            break
    rng.shuffle(evaluation)
    gold = [q for q in evaluation if q.kind == "feedback"]
    evaluation = (gold + [q for q in evaluation if q.kind != "feedback"])[:max_held_out]
    return PairSet(train=train, held_out=evaluation, counts=dict(Counter(p.kind for p in train)),
                   candidates=len(candidates), held_out_feedback=sum(q.kind == "feedback" for q in evaluation),
                   held_out_share=held_out_share)


NEAR_DUPLICATE_COSINE = 0.95  # a row this close to the target's lead row is the same passage (a copy, a revision)
POSITIVE_MARGIN = 0.95  # a negative scoring above this share of the target's score may well answer the query too
MINED_FROM = 20  # candidates from each ranking (BM25 and the served model's vectors)


def mine_hard_negatives(snapshot: LoadedSnapshot, pairs: list[TrainingPair], query_vectors: np.ndarray,
                        count: int = 1) -> list[TrainingPair]:
    """``pairs`` with ``count`` hard negatives each: the passages BM25 and the served model (``query_vectors``:
    its vectors of the pairs' queries) rank highest for the query (reciprocal-rank fusion of the top
    ``MINED_FROM`` of each), leaving out the target's own section, every section holding a near-duplicate of the
    target's lead row (``NEAR_DUPLICATE_COSINE``, or the same text: a copy of the target elsewhere answers too)
    and passages the served model scores nearly as high as the target (``POSITIVE_MARGIN``: more likely an
    unlabelled answer than a wrong one); for a document's title, every section of the document (each answers
    it).  A negative is stripped of the query's words as the target is.  A pair without enough negatives is
    returned without any."""
    sections = snapshot.sections
    active = snapshot.active
    # the chunk's own text, not its content hash: the hash covers the heading path it is embedded under, so the
    # same paragraph in two sections has two hashes
    chunk_texts = snapshot.records.column("text").to_pylist()
    out = []
    for pair, qv in zip(pairs, query_vectors, strict=True):
        lead = int(sections.lead_row[pair.group])
        lead_vector, lead_text = snapshot.embeddings[lead], chunk_texts[lead]
        holds: dict[int, bool] = {}

        def holds_copy(group: int) -> bool:
            """Whether a row of section ``group`` is the target's text or a near-duplicate of its vector (checked
            for the candidates' sections only, once each)."""
            if group not in holds:
                rows = sections.rows(group)
                holds[group] = any(chunk_texts[r] == lead_text for r in rows.tolist()) or \
                    float((snapshot.embeddings[rows] @ lead_vector).max()) >= NEAR_DUPLICATE_COSINE
            return holds[group]

        vector = snapshot.embeddings @ qv
        bm25, _ = snapshot.bm25_scores(snapshot.query_terms(pair.query))
        fused: dict[int, float] = {}
        for scores in (vector, bm25):
            top = np.argsort(-np.where(active, scores, -np.inf))[:MINED_FROM]
            for rank, row in enumerate(top.tolist()):
                if scores[row] > 0 or scores is vector:
                    fused[row] = fused.get(row, 0.0) + 1.0 / (60 + rank)
        positive = float(vector[lead])
        chosen: list[int] = []
        seen_sections = {pair.group}
        whole_document = pair.kind == "title"  # a title asks for its document: any of its sections answers it
        for row in sorted(fused, key=lambda r: -fused[r]):
            group = int(sections.group[row])
            if group in seen_sections or float(vector[row]) >= POSITIVE_MARGIN * positive or holds_copy(group):
                continue
            if whole_document and int(snapshot.doc_index[row]) == pair.doc:
                continue
            chosen.append(row)
            seen_sections.add(group)
            if len(chosen) == count:
                break
        if len(chosen) < count:
            out.append(pair)
            continue
        field = "title" if whole_document else "section"  # stripped from where the target's query was
        strip = PseudoQuery(pair.query, pair.kind, "section", frozenset(), pair.query, field)
        texts, _ = stripped_embed_texts(snapshot, strip, np.array(chosen))
        out.append(replace(pair, negatives=tuple(texts),
                           negative_groups=tuple(int(sections.group[r]) for r in chosen)))
    return out
