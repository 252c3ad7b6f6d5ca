"""The Perl documentation dev set: built at run time from Debian packages, BEIR format, honest counts."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from evals.devset_files import split_of
from evals.perl_docs import apt_available, build

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def devset(tmp_path_factory) -> Path:
    ok, reason = apt_available()
    if not ok:
        pytest.skip(f"Perl dev set needs apt-get download: {reason}")
    out = tmp_path_factory.mktemp("perl-docs")
    build(out)
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _qrels(path: Path) -> list[tuple[str, str, int]]:
    with open(path) as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    return [(q, d, int(s)) for q, d, s in rows[1:]]


def test_counts_in_the_manifest_match_the_files(devset: Path):
    manifest = json.loads((devset / "manifest.json").read_text())
    corpus = _jsonl(devset / "corpus.jsonl")
    queries = _jsonl(devset / "queries_all.jsonl")
    stats = manifest["stats"]
    assert len(corpus) == stats["documents"] and len(queries) == stats["queries"] >= 200
    assert len({d["_id"] for d in corpus}) == len(corpus), "document ids are unique"
    assert stats["train_queries"] + stats["test_queries"] == stats["queries"]
    assert 0.01 <= stats["relevant_share_of_corpus"] <= 0.10, "answers are a few percent of the corpus"
    assert stats["module_pages"] > 100 and stats["manual_pages"] > 50
    assert set(manifest["packages"]) >= {"perl-doc"} and any(p.startswith("perl-modules-5.") for p in manifest["packages"])
    readme = (devset / "README.md").read_text()
    assert str(stats["documents"]) in readme and "sha256" in readme.lower()


def test_every_query_has_an_answer_that_does_not_contain_the_question(devset: Path):
    corpus = {d["_id"]: d for d in _jsonl(devset / "corpus.jsonl")}
    queries = {q["_id"]: q["text"] for q in _jsonl(devset / "queries_all.jsonl")}
    qrels = _qrels(devset / "qrels_all.tsv")
    assert {q for q, _, _ in qrels} == set(queries)
    for query_id, doc_id, score in qrels:
        assert score > 0 and doc_id in corpus and corpus[doc_id]["metadata"]["page"].startswith("perlfaq")
        assert queries[query_id].strip() not in corpus[doc_id]["text"]
        assert queries[query_id].strip() not in corpus[doc_id]["title"]
    assert not any(d["metadata"]["page"] in ("perltoc", "perlfaq") for d in corpus.values()), "indexes repeat questions"


def test_splits_partition_the_queries_by_a_stable_hash(devset: Path):
    train = {q["_id"] for q in _jsonl(devset / "queries_train.jsonl")}
    test = {q["_id"] for q in _jsonl(devset / "queries.jsonl")}
    assert train and test and not train & test
    assert all(split_of(q) == "test" for q in test) and all(split_of(q) == "train" for q in train)
    assert {q for q, _, _ in _qrels(devset / "qrels.tsv")} == test
