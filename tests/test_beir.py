"""BEIR loading, corpus materialisation and ingestion into an evaluation store."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from evals.beir import (
    DatasetError,
    chunk_to_beir_id,
    beir_ids_by_doc_id,
    ingest_beir,
    load_beir,
    materialise_corpus,
    safe_file_stem,
)
from knowledge_store.errors import GroundworkError
from knowledge_store.index import open_snapshot
from knowledge_store.parsers.markdown import parse_markdown
from knowledge_store.store import store_connection

DOCS = [
    {"_id": "101", "title": "Aspirin and platelets", "text": "Aspirin irreversibly inhibits cyclooxygenase in platelets. The effect lasts for the platelet lifetime."},
    {"_id": "102", "title": "Yes: a title with a colon", "text": "Statins lower LDL cholesterol by inhibiting HMG-CoA reductase in the liver."},
    {"_id": "doc/3", "title": "Vitamin D", "text": "Vitamin D deficiency is associated with bone loss.\nSupplementation restores serum levels."},
    {"_id": "104", "title": "Sleep", "text": "Sleep deprivation impairs memory consolidation in young adults."},
    {"_id": "105", "title": "007", "text": "Exercise improves insulin sensitivity in skeletal muscle."},
]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture()
def tiny_beir(tmp_path: Path) -> Path:
    folder = tmp_path / "tinybeir"
    folder.mkdir()
    write_jsonl(folder / "corpus.jsonl", DOCS)
    write_jsonl(
        folder / "queries.jsonl",
        [
            {"_id": "q1", "text": "does aspirin affect platelets"},
            {"_id": "q2", "text": "statins and cholesterol"},
            {"_id": "q3", "text": "vitamin d and bones"},
            {"_id": "q4", "text": "a query nobody judged"},
        ],
    )
    (folder / "qrels.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\t101\t1\nq2\t102\t2\nq2\t104\t0\nq3\tdoc/3\t1\nq3\t105\t1\n"
    )
    write_jsonl(folder / "queries_train.jsonl", [{"_id": "t1", "text": "sleep and memory"}, {"_id": "t2", "text": "exercise"}])
    (folder / "qrels_train.tsv").write_text("query-id\tcorpus-id\tscore\nt1\t104\t1\nt2\t105\t0\n")
    return folder


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


@pytest.mark.slow
def test_ingest_beir_end_to_end(tiny_beir: Path, tmp_path: Path, embedder) -> None:
    data_root = tmp_path / "eval"
    settings, report = ingest_beir(tiny_beir, data_root, embedder=embedder)
    ds = load_beir(tiny_beir)
    root = data_root / ds.store_dir_name
    assert settings.data_dir == root / "store" and settings.source_dirs == [(root / "corpus").resolve()]
    assert report.raw.added == 5 and report.parse.failed == 0
    with store_connection(settings.store_path, read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM documents WHERE status = 'active'").fetchone()[0] == 5
    conn, info = open_snapshot(settings.index_dir)
    try:
        rows = conn.execute("SELECT doc_id, title, section, text, metadata FROM chunks").fetchall()
    finally:
        conn.close()
    assert info.document_count == 5
    by_beir: dict[str, list[str]] = {}
    for _doc_id, title, section, text, metadata in rows:
        beir_id = chunk_to_beir_id(metadata)
        assert title == ds.corpus[beir_id].title
        assert not section  # no headings: the title is only in the front matter
        by_beir.setdefault(beir_id, []).append(text)
    assert set(by_beir) == set(ds.corpus)
    for beir_id, texts in by_beir.items():
        assert " ".join(ds.corpus[beir_id].text.split()) in " ".join(" ".join(texts).split())
    assert set(beir_ids_by_doc_id(settings).values()) == set(ds.corpus)

    # a second run costs only hashes: nothing re-parsed, re-embedded or re-published
    _, again = ingest_beir(tiny_beir, data_root, embedder=embedder)
    assert again.raw.unchanged == 5 and again.raw.added == again.raw.updated == 0
    assert again.embed.computed == 0 and not again.publish.snapshot_built
