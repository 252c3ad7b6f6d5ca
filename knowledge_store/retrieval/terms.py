"""Terms of queries and passages, normalised the way the BM25 index sees text.

``query_terms`` lower-cases, strips accents, splits on anything that is not
``[a-z0-9_]``, drops English stopwords and applies a small suffix-stripping
stemmer, so "resetting" matches "reset" and "codes" matches "code";
``term_spans`` runs the same analysis over a passage and keeps each token's
exact character offsets.  Snippets, extractive answers, the ask endpoint's
term checks and the grounding eval all match words through these two
functions, so they agree on what counts as the same word.  No nltk:
dependency-free.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

STOPWORDS: frozenset[str] = frozenset(
    """
    a about above after again against all also am an and any are as at be because been before being
    below between both but by can could did do does doing don down during each either else few for
    from further had has have having he her here hers herself him himself his how i if in into is it
    its itself just let me more most my myself no nor not of off on once only or other our ours
    ourselves out over own please s same shall she should so some such t than that the their theirs
    them themselves then there these they this those through to too under until up upon us very was
    we were what when where which while who whom whose why will with within without would you your
    yours yourself yourselves
    """.split()
)

_SPLIT = re.compile(r"[^a-z0-9_]+")
_WORD = re.compile(r"\w+")
_VOWELS = set("aeiouy")
# suffix -> minimum length of what remains; tried longest first, only one is stripped
_SUFFIXES: tuple[tuple[str, int], ...] = (
    ("ingly", 3), ("edly", 3), ("ation", 3), ("ment", 3), ("ness", 3), ("ing", 3), ("ed", 3), ("ly", 4),
)
_UNDOUBLE_AFTER = ("ing", "ed", "ingly", "edly")


# a term of letters and digits together (e47, ext4, x86_64, ipv6): a code, a model or a version.  It names
# something rather than says something, and an embedding model reads it as a few word-pieces much like its
# neighbours' (E47 ~ E42) while the index matches it exactly.  Terms here and in the fts index are [a-z0-9_]+.
_LETTERS_AND_DIGITS = re.compile(r"[a-z].*\d|\d.*[a-z]")


def mixes_letters_and_digits(term: str) -> bool:
    """Whether ``term`` (a normalised, stemmed term) holds letters and digits together: e47, ext4, sha256."""
    return _LETTERS_AND_DIGITS.search(term) is not None


@lru_cache(maxsize=65536)
def normalize(text: str) -> str:
    """Lower case with accents stripped ("Café" -> "cafe"), as the fts index does."""
    if text.isascii():
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light, Porter-flavoured suffix stripper.  Only consistency matters: the
    same function runs on the query and on the passage, so "resetting", "resets"
    and "reset" all become "reset", "codes"/"coded"/"coding" become "cod".
    Identifiers (digits, underscores) and words of 3 letters or fewer are kept."""
    if len(word) <= 3 or not word.isalpha():
        return word
    # plurals
    if word.endswith("sses"):
        word = word[:-2]
    elif word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("ss", "us", "is")):
        pass
    elif word.endswith("s"):
        word = word[:-1]
    # derivational / inflectional endings
    for suffix, min_stem in _SUFFIXES:
        if not word.endswith(suffix):
            continue
        base = word[: -len(suffix)]
        if len(base) < min_stem or not (_VOWELS & set(base)):
            continue
        if suffix == "ly" and base.endswith("pp"):  # apply, supply
            continue
        word = base
        if suffix in _UNDOUBLE_AFTER and len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz" + "aeiou":
            word = word[:-1]
        break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    if len(word) > 3 and word.endswith("i"):
        word = word[:-1] + "y"
    return word


def query_terms(query: str) -> list[str]:
    """Distinct stemmed, non-stopword terms of ``query``, in order of appearance."""
    terms: list[str] = []
    for token in _SPLIT.split(normalize(query)):
        if not token or token in STOPWORDS:
            continue
        term = stem(token)
        if term not in terms:
            terms.append(term)
    return terms


def term_spans(text: str) -> list[tuple[str, int, int]]:
    """(stemmed term, start, end) for every token of ``text``; offsets are exact
    positions in ``text`` (a word like ``hvac.min`` gives two tokens).

    Cached per text: the same passages come back for many queries."""
    return list(_term_spans(text))


# an ASCII text's tokens: there ``\w+`` matches exactly these runs, and lower-casing keeps every offset
_ASCII_TOKEN = re.compile(r"[A-Za-z0-9_]+")


@lru_cache(maxsize=8192)
def _term_spans(text: str) -> tuple[tuple[str, int, int], ...]:
    if text.isascii():  # the same tokens as below, stemmed in one pass over the lower-cased text
        matches = list(_ASCII_TOKEN.finditer(text))
        return tuple(zip(map(stem, _ASCII_TOKEN.findall(text.lower())),
                         [m.start() for m in matches], [m.end() for m in matches]))
    spans: list[tuple[str, int, int]] = []
    for match in _WORD.finditer(text):
        word = match.group()
        if word.isascii() and word.isalnum() and word.islower():
            spans.append((stem(word), match.start(), match.end()))  # fast path
            continue
        for token in _SPLIT.split(normalize(word)):
            if token:
                spans.append((stem(token), match.start(), match.end()))
    return tuple(spans)
