"""What kind of query this is: a question someone asks, or words someone types or pastes.

Two parts of the ranking depend on it:

- **fusion weight** (``question_alpha``): a question is a paraphrase of its answer by someone who does
  not know the answer's words ("How do I keep a hash in insertion order?" vs a section on
  ``Tie::IxHash``), so the vector side deserves more weight than for keywords, claims or pasted text,
  whose words are the document's own.  Measured on the documentation dev sets' FAQ questions, alpha
  0.8 ranks them best, where SciFact's claims want 0.6-0.7 (docs/EVALUATION.md, "Questions,
  statements and a third dev set");
- **phrase evidence** (``phrase.py``) is for pasted passages, never questions: questions are
  repeated verbatim in tables of contents and other FAQs.

A question ends in "?" or opens with a wh-word.  Auxiliaries ("is", "can", "does") are not enough:
they open too many ordinary sentences a user pastes.  A query that names an entity the corpus
mentions ("what does API 510 require") is not ranked as a question, whatever its form: the asker
knows the documents' own word for it, which MiniLM does not understand and BM25 and the entity boost
do (at alpha 0.8 the sample corpus's SOP naming API 510 fell from first to second behind the REST
*API* guide).
"""

from __future__ import annotations

import re

QUESTION_WORDS = frozenset("how what why when where which who whom whose".split())
_FIRST_WORD = re.compile(r"[0-9a-z_]+")

QUESTION = "question"
NAMED_ENTITY = "named_entity"
OTHER = "other"


def is_question(query: str) -> bool:
    """True for "How do I ...", "why does x fail" and anything ending in "?"."""
    if query.rstrip().endswith("?"):
        return True
    first = _FIRST_WORD.search(query.lower())
    return first is not None and first.group(0) in QUESTION_WORDS


def query_form(query: str, snapshot=None) -> str:
    """``"named_entity"`` (names an entity ``snapshot``'s chunks mention), ``"question"`` or ``"other"``:
    what responses and the query log report as ``params.query_form``."""
    if snapshot is not None and snapshot.query_entity_rows(query):
        return NAMED_ENTITY
    return QUESTION if is_question(query) else OTHER


def alpha_for(query: str, default_alpha: float, question_alpha: float | None, snapshot=None) -> float:
    """The alpha ``query`` gets when it does not set one: ``question_alpha`` for a question (unless None) that
    names no entity of ``snapshot``; ``default_alpha`` for everything else."""
    return alpha_for_form(query_form(query, snapshot), default_alpha, question_alpha)


def alpha_for_form(form: str, default_alpha: float, question_alpha: float | None) -> float:
    """``alpha_for`` when the query's form is known already."""
    return question_alpha if form == QUESTION and question_alpha is not None else default_alpha
