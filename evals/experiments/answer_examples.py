"""The sample corpus's example questions, answered as a user gets them: the table of docs/EVALUATION.md, "Answers".

For each question, on the index in DATA_DIR: the rank (among the first ten passages) of the first passage in its
answering section, whether the answer of `groundwork query` (k=5, as the console's Search asks) and of
`POST /api/ask` (the first 3 of 10) holds every key fact, how many quoted pieces of each are defects (a heading,
a raw table row, markup, an intro ending in ":", or a sentence cut after a function word), and the coverage.

It imports only what every version of the engine has (``Settings``, ``RetrievalEngine``, ``server.ask.ask``), so
an older checkout can be measured too: write the questions with this version (``--write-questions q.json``), then
run it by path with ``PYTHONPATH`` on the older tree and ``--questions q.json``.  Key facts are matched as
normalised words (case and punctuation aside; markup characters are not words), the rule of
``core.text.contains_words``.

    .venv/bin/python evals/experiments/answer_examples.py /tmp/gw-data [--questions q.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import unicodedata
from pathlib import Path

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.ask import ask

CUT_WORDS = {"a", "an", "the", "and", "or", "it", "not", "to", "of", "with", "for", "in", "on", "at", "by", "is",
             "are", "be", "that", "which"}


def _words(text: str) -> list[str]:
    return re.findall(r"\w+(?:[.,]\d+)*", unicodedata.normalize("NFKC", text).casefold())


def holds(answer: str, facts: list[str]) -> bool:
    haystack = f" {' '.join(_words(answer))} "
    return all(f" {' '.join(_words(fact))} " in haystack for fact in facts)


def defects(answer: str) -> int:
    """Quoted pieces that are a heading, a raw table row, markup, an intro ending in ':' or a cut sentence."""
    bad = 0
    for piece in re.split(r"\s*\[\d+\]\s*", answer):
        piece = piece.strip()
        if piece and ("|" in piece or "**" in piece or "`" in piece or "](" in piece or piece.startswith("#")
                      or piece.endswith((":", "\\")) or piece.split()[-1] in CUT_WORDS):
            bad += 1
    return bad


def current_questions() -> list[list]:
    from knowledge_store.ingest.sample_corpus import EXAMPLE_QUESTIONS  # noqa: PLC0415 - only this version has them all

    return [[q.question, q.file, list(q.section), list(q.key_facts)] for q in EXAMPLE_QUESTIONS]


def measure(data_dir: Path, questions: list[list]) -> list[dict]:
    engine = RetrievalEngine(Settings(data_dir=data_dir))
    engine.warm_up()
    rows = []
    for question, file, section, facts in questions:
        ranked = engine.search(question, k=10, log=False, answer="none", min_relevance=0.0)
        rank = next((i for i, h in enumerate(ranked.hits, 1) if Path(h.source_path).name == file
                     and tuple(h.section_path[:len(section)]) == tuple(section)), None)
        queried = engine.search(question, log=False)
        query_answer = queried.answer.text if queried.answer else ""
        asked = ask(engine, "http://127.0.0.1:8080", question, client="research")["answer"]
        rows.append({"question": question, "rank": rank, "coverage": queried.coverage,
                     "query_key_facts": holds(query_answer, facts), "query_defects": defects(query_answer),
                     "ask_key_facts": holds(asked, facts), "ask_defects": defects(asked),
                     "query_answer": query_answer, "ask_answer": asked})
    engine.query_log.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, nargs="?")
    parser.add_argument("--questions", type=Path, help="questions written by --write-questions (older checkouts)")
    parser.add_argument("--write-questions", type=Path, help="write this version's example questions and stop")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.write_questions:
        args.write_questions.write_text(json.dumps(current_questions(), ensure_ascii=False, indent=1))
        return 0
    if args.data_dir is None:
        parser.error("give DATA_DIR")
    questions = json.loads(args.questions.read_text()) if args.questions else current_questions()
    rows = measure(args.data_dir, questions)
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=1))
        return 0
    print("| question | rank | query answer (k=5): key facts / bad pieces | /api/ask: key facts / bad pieces | coverage |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['question']} | {r['rank'] or '>10'} | {'yes' if r['query_key_facts'] else 'no'} / "
              f"{r['query_defects']} | {'yes' if r['ask_key_facts'] else 'no'} / {r['ask_defects']} | {r['coverage']} |")
    print(f"key facts held: query {sum(r['query_key_facts'] for r in rows)}/{len(rows)}, ask "
          f"{sum(r['ask_key_facts'] for r in rows)}/{len(rows)}; bad pieces: query "
          f"{sum(r['query_defects'] for r in rows)}, ask {sum(r['ask_defects'] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
