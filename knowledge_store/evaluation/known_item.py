"""Known-item lookups: paste a verbatim span from a PDF page, expect that page first.

A user who copies a sentence out of a manual and pastes it into the search box wants the page it
came from, not a page about the same topic.  This evaluation samples random spans of ``words``
consecutive words from the text layer of real PDF manuals (seeded, so reruns are identical),
queries the real engine with each, and counts how often the first result cites the span's page.

The PDFs are ingested through the normal pipeline into their own store under
``<data_dir>/eval/known-item-<checksum>/`` (copied there; nothing is written next to the sources).

    .venv/bin/python -m knowledge_store.evaluation.known_item ../shared/datasets/pdfs --files R-intro.pdf debmake-doc.en.pdf glpk.pdf
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from knowledge_store.config.settings import Settings
from knowledge_store.evaluation.retrieval_eval import NullQueryLog
from knowledge_store.ingest.run import run_sync
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.store import store_connection

DEFAULT_FILES = ("R-intro.pdf", "debmake-doc.en.pdf", "glpk.pdf")


@dataclass
class Span:
    file: str
    page: int
    text: str
    # every (file, page) whose text holds the span verbatim (manuals repeat sentences: any of them is right)
    pages: frozenset = frozenset()


@dataclass
class KnownItemResult:
    spans: int
    first: int  # top result cites the span's page
    top5: int  # the page is cited within the first five results
    misses: list[dict] = field(default_factory=list)

    @property
    def first_rate(self) -> float:
        return self.first / self.spans if self.spans else 0.0


def known_item_store(pdf_dir: Path, files: tuple[str, ...], data_root: Path) -> Settings:
    """Ingest ``files`` from ``pdf_dir`` into their own store (cached by content) and return its settings."""
    digest = hashlib.sha256()
    for name in files:
        path = Path(pdf_dir) / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such PDF")
        digest.update(name.encode() + b"\0" + path.read_bytes())
    root = Path(data_root) / f"known-item-{digest.hexdigest()[:12]}"
    corpus = root / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for name in files:
        target = corpus / name
        if not target.is_file():
            shutil.copyfile(Path(pdf_dir) / name, target)
    settings = Settings(data_dir=root / "store", sources=[corpus])
    run_sync(settings)
    return settings


def _has_letters(token: str) -> bool:
    return any(c.isalpha() for c in token)


def sample_spans(settings: Settings, count: int, words: int = 14, seed: int = 0,
                 min_word_share: float = 0.7) -> list[Span]:
    """``count`` random spans of ``words`` consecutive words, each from a random page with enough text.

    A span must be text a person would paste: at least ``min_word_share`` of its tokens contain a
    letter (no runs of table-of-contents dots or matrix entries).  Each span records every page that
    contains it verbatim, so a sentence a manual repeats on two pages is found on either.
    """
    with store_connection(settings.store_path, read_only=True) as conn:
        rows = conn.execute(
            "SELECT d.relative_path, p.page_number, p.text FROM pages p JOIN documents d "
            "ON d.doc_id = p.doc_id AND d.version = p.version WHERE d.status = 'active' ORDER BY 1, 2"
        ).fetchall()
    normalised = {(f, n): " ".join(t.split()) for f, n, t in rows}
    pages = [(f, n, t.split()) for f, n, t in rows if len(t.split()) >= words * 3]
    rng = random.Random(seed)
    spans: list[Span] = []
    attempts = 0
    while len(spans) < count and attempts < count * 50:
        attempts += 1
        name, number, tokens = pages[rng.randrange(len(pages))]
        start = rng.randrange(len(tokens) - words + 1)
        window = tokens[start:start + words]
        if sum(_has_letters(t) for t in window) < min_word_share * words:
            continue
        text = " ".join(window)
        holders = frozenset(key for key, page_text in normalised.items() if text in page_text)
        spans.append(Span(name, number, text, holders or frozenset({(name, number)})))
    return spans


def _cites(hit, span: Span) -> bool:
    if hit.page_start is None:
        return False
    name = Path(hit.source_path).name
    last = hit.page_end or hit.page_start
    return any(name == Path(f).name and hit.page_start <= n <= last for f, n in (span.pages or {(span.file, span.page)}))


def evaluate_known_items(engine, spans: list[Span], **search: object) -> KnownItemResult:
    """Query each span; count first-result and top-5 page hits."""
    result = KnownItemResult(spans=len(spans), first=0, top5=0)
    for span in spans:
        hits = engine.search(request=engine.request(span.text, k=5, min_relevance=0.0, answer="none", client="eval",
                                                    **search), log=False).hits
        if hits and _cites(hits[0], span):
            result.first += 1
        if any(_cites(h, span) for h in hits):
            result.top5 += 1
        if not (hits and _cites(hits[0], span)):
            top = hits[0] if hits else None
            result.misses.append({"file": span.file, "page": span.page, "span": span.text,
                                  "pages_with_span": sorted(n for _, n in span.pages),
                                  "got": f"{Path(top.source_path).name} p.{top.page_start}" if top else None})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pdf_dir", type=Path)
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES))
    parser.add_argument("--spans", type=int, default=20)
    parser.add_argument("--words", type=int, default=14)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", action="store_true", help="also run without phrase evidence (same spans)")
    args = parser.parse_args(argv)
    settings = known_item_store(args.pdf_dir, tuple(args.files), Settings().data_dir / "eval")
    spans = sample_spans(settings, args.spans, args.words, args.seed)
    for phrase in ([True, False] if args.compare else [True]):
        engine = RetrievalEngine(settings.model_copy(update={"phrase_boost": phrase}), query_log=NullQueryLog())
        result = evaluate_known_items(engine, spans)
        print(json.dumps({"phrase_boost": phrase, "spans": result.spans, "first": result.first, "top5": result.top5,
                          "first_rate": round(result.first_rate, 3)}))
        for miss in result.misses:
            print(json.dumps(miss))
    return 0


if __name__ == "__main__":
    sys.exit(main())
