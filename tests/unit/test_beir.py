"""BEIR loading and corpus materialisation (no store: the ingestion into an evaluation store is in
tests/integration/test_beir.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from knowledge_store.core.errors import GroundworkError
from knowledge_store.evaluation.beir import (
    DatasetError,
    chunk_to_beir_id,
    load_beir,
    materialise_corpus,
    safe_file_stem,
)
from knowledge_store.ingest.parsers.markdown import parse_markdown
from tests.helpers import BEIR_DOCS as DOCS


def test_load_beir_test_split(tiny_beir: Path) -> None:
    ds = load_beir(tiny_beir)
    assert ds.name == "tinybeir" and ds.split == "test"
    assert list(ds.corpus) == ["101", "102", "doc/3", "104", "105"]
    assert ds.corpus["102"].title == "Yes: a title with a colon"
    assert ds.queries == {"q1": "does aspirin affect platelets", "q2": "statins and cholesterol", "q3": "vitamin d and bones"}
    assert ds.qrels == {"q1": {"101": 1}, "q2": {"102": 2}, "q3": {"doc/3": 1, "105": 1}}  # score 0 dropped
    assert ds.dropped_queries == 1  # q4 has no qrels
    assert len(ds.corpus_sha256) == 64 and ds.store_dir_name == f"tinybeir-{ds.corpus_sha256[:12]}"


def test_load_beir_train_split(tiny_beir: Path) -> None:
    ds = load_beir(tiny_beir, split="train")
    assert ds.queries_file.name == "queries_train.jsonl" and ds.qrels_file.name == "qrels_train.tsv"
    assert ds.queries == {"t1": "sleep and memory"}  # t2's only judgement has score 0
    assert ds.qrels == {"t1": {"104": 1}}


def test_train_split_falls_back_to_queries_jsonl(tiny_beir: Path) -> None:
    (tiny_beir / "queries_train.jsonl").unlink()
    (tiny_beir / "qrels_train.tsv").write_text("query-id\tcorpus-id\tscore\nq4\t104\t1\n")
    ds = load_beir(tiny_beir, split="train")
    assert ds.queries_file.name == "queries.jsonl"
    assert ds.queries == {"q4": "a query nobody judged"}


@pytest.mark.parametrize("missing", ["corpus.jsonl", "queries.jsonl", "qrels.tsv"])
def test_missing_file_is_named(tiny_beir: Path, missing: str) -> None:
    (tiny_beir / missing).unlink()
    with pytest.raises(DatasetError, match=missing.replace(".", r"\.")) as caught:
        load_beir(tiny_beir)
    assert isinstance(caught.value, GroundworkError)


def test_missing_train_qrels_is_named(tiny_beir: Path) -> None:
    (tiny_beir / "qrels_train.tsv").unlink()
    with pytest.raises(DatasetError, match="qrels_train.tsv"):
        load_beir(tiny_beir, split="train")


def test_malformed_qrels_line_names_line_number(tiny_beir: Path) -> None:
    (tiny_beir / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t101\t1\nq2 102\nq3\tdoc/3\t1\n")
    with pytest.raises(DatasetError) as caught:
        load_beir(tiny_beir)
    assert caught.value.line == 3
    assert caught.value.path.endswith("qrels.tsv")
    assert "qrels.tsv:3" in str(caught.value)


def test_non_numeric_score_is_an_error(tiny_beir: Path) -> None:
    (tiny_beir / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t101\tyes\n")
    with pytest.raises(DatasetError, match="qrels.tsv:2"):
        load_beir(tiny_beir)


def test_bad_corpus_json_names_line_number(tiny_beir: Path) -> None:
    with open(tiny_beir / "corpus.jsonl", "a") as handle:
        handle.write('{"_id": "106", "title": "broken"\n')
    with pytest.raises(DatasetError, match=r"corpus\.jsonl:6: not valid JSON"):
        load_beir(tiny_beir)


def test_materialise_writes_front_matter_without_h1(tiny_beir: Path, tmp_path: Path) -> None:
    ds = load_beir(tiny_beir)
    out = tmp_path / "corpus"
    assert materialise_corpus(ds, out) == 5
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(f"{safe_file_stem(d['_id'])}.md" for d in DOCS)
    assert safe_file_stem("doc/3") != "doc/3" and "/" not in safe_file_stem("doc/3")
    for doc in DOCS:
        source = (out / f"{safe_file_stem(doc['_id'])}.md").read_text()
        front = yaml.safe_load(source.split("---\n")[1])
        assert front == {"title": doc["title"], "beir_id": doc["_id"]}
        assert isinstance(front["beir_id"], str)  # "101" must stay a string
        body = source.split("---\n", 2)[2]
        assert body == "\n" + doc["text"] + "\n"  # the text only: no H1 repeating the title
        parsed = parse_markdown(out / f"{safe_file_stem(doc['_id'])}.md")
        assert parsed.title == doc["title"]
        assert parsed.metadata["beir_id"] == doc["_id"]
        assert all(block.section_path == () for block in parsed.blocks)


def test_plain_text_lines_that_look_like_markdown_headings_stay_text(tmp_path: Path) -> None:
    """Code comments and shell prompts in BEIR text ("# apt-get install x") must not become sections."""
    from knowledge_store.evaluation.beir import BeirDoc, document_markdown

    text = ("Install it as root:\n\n# apt-get install mdadm\n## not a heading either\n\nAn underlined line\n---\n\n"
            "#hashtag stays as it is")
    path = tmp_path / "doc.md"
    path.write_text(document_markdown(BeirDoc("d1", "Software RAID", text)))
    parsed = parse_markdown(path)
    assert all(block.section_path == () for block in parsed.blocks), "no heading was made of the text"
    joined = "\n".join(block.text for block in parsed.blocks)
    assert "# apt-get install mdadm" in joined and "#hashtag stays as it is" in joined
    assert document_markdown(BeirDoc("d2", "T", "plain text only")).endswith("---\n\nplain text only\n")


def test_materialise_is_idempotent(tiny_beir: Path, tmp_path: Path) -> None:
    ds = load_beir(tiny_beir)
    out = tmp_path / "corpus"
    materialise_corpus(ds, out)
    old = time.time() - 3600
    for path in out.iterdir():
        os.utime(path, (old, old))
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert materialise_corpus(ds, out) == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    # one changed document: only its file is rewritten; a stray .md is removed
    ds.corpus["104"] = type(ds.corpus["104"])("104", "Sleep", "Changed text about sleep.")
    (out / "stray.md").write_text("not in the corpus")
    assert materialise_corpus(ds, out) == 1
    after = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert set(after) == set(before)
    assert [name for name in after if after[name] != before[name]] == ["104.md"]


def test_chunk_to_beir_id() -> None:
    assert chunk_to_beir_id('{"title": "t", "beir_id": "42"}') == "42"
    assert chunk_to_beir_id({"beir_id": "x"}) == "x"
    with pytest.raises(DatasetError, match="beir_id"):
        chunk_to_beir_id('{"title": "t"}')
    with pytest.raises(DatasetError):
        chunk_to_beir_id(None)
