"""The documentation dev sets (Debian FAQ, Perl FAQ): built at run time from Debian packages, BEIR format,
honest counts; each skips with the reason when apt cannot fetch its packages."""

from __future__ import annotations

import json

import pytest

from evals.experiments import debian_docs, perl_docs
from evals.experiments.devset_files import split_of
from tests.helpers import read_jsonl, read_qrels

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[debian_docs, perl_docs], ids=["debian", "perl"])
def devset(request, tmp_path_factory):
    module = request.param
    ok, reason = module.apt_available()
    if not ok:
        pytest.skip(f"{module.BUILDER.what} needs apt-get download: {reason}")
    out = tmp_path_factory.mktemp(module.BUILDER.default_out.name)
    module.build(out)
    return module, out


def test_counts_in_the_manifest_match_the_files(devset):
    module, folder = devset
    manifest = json.loads((folder / "manifest.json").read_text())
    corpus = read_jsonl(folder / "corpus.jsonl")
    queries = read_jsonl(folder / "queries_all.jsonl")
    stats = manifest["stats"]
    assert len(corpus) == stats["documents"] and len(queries) == stats["queries"] >= 100
    assert len({d["_id"] for d in corpus}) == len(corpus), "document ids are unique"
    assert stats["train_queries"] + stats["test_queries"] == stats["queries"]
    assert 0.01 <= stats["relevant_share_of_corpus"] <= 0.10, "answers are a few percent of the corpus"
    assert manifest["builder_version"] == module.BUILDER_VERSION and module.PACKAGES[0] in manifest["packages"]
    if module is perl_docs:  # the manual pages and the core modules' documentation both give distractors
        assert stats["module_pages"] > 100 and stats["manual_pages"] > 50
        assert any(p.startswith("perl-modules-5.") for p in manifest["packages"])
    readme = (folder / "README.md").read_text()
    assert str(stats["documents"]) in readme and "sha256" in readme.lower()


def test_every_query_has_an_answer_that_does_not_contain_the_question(devset):
    module, folder = devset
    corpus = {d["_id"]: d for d in read_jsonl(folder / "corpus.jsonl")}
    queries = {q["_id"]: q["text"] for q in read_jsonl(folder / "queries_all.jsonl")}
    qrels = read_qrels(folder / "qrels_all.tsv")
    assert {q for q, _, _ in qrels} == set(queries)
    for query_id, doc_id, score in qrels:
        assert score > 0 and doc_id in corpus and corpus[doc_id]["metadata"]["kind"] == "faq_answer"
        assert queries[query_id].strip() not in corpus[doc_id]["text"]
        assert queries[query_id].strip() not in corpus[doc_id]["title"]
    if module is perl_docs:
        assert not any(d["metadata"]["page"] in ("perltoc", "perlfaq") for d in corpus.values()), "indexes repeat questions"


def test_splits_partition_the_queries_by_a_stable_hash(devset):
    _, folder = devset
    train = {q["_id"] for q in read_jsonl(folder / "queries_train.jsonl")}
    test = {q["_id"] for q in read_jsonl(folder / "queries.jsonl")}  # BEIR's default split is test
    assert train and test and not train & test
    assert all(split_of(q) == "test" for q in test) and all(split_of(q) == "train" for q in train)
    assert {q for q, _, _ in read_qrels(folder / "qrels.tsv")} == test
