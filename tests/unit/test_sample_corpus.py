"""The generated sample corpus: complete, idempotent, deterministic, and shaped
the way the parsers' tests expect (outline, two-column page, page chrome)."""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
import zipfile
from fnmatch import fnmatch
from importlib.resources import files
from pathlib import Path

import docx
import pymupdf
import pytest

from knowledge_store.ingest.sample_corpus import (
    API_GUIDE,
    CORPUS_FILES,
    EXAMPLE_QUESTIONS,
    FAQ,
    FIXED_ISSUES_HEADER,
    INSTALLATION_MANUAL,
    PARAMETERS,
    RELEASE_NOTES,
    TEXT_DOCUMENTS,
    TROUBLESHOOTING,
    SampleDocumentMissingError,
    write_sample_corpus,
)
from tests.helpers import REPO_ROOT


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("corpus") / "nested" / "sample"  # created on demand
    write_sample_corpus(target)
    return target


def test_every_file_is_written_and_non_empty(corpus: Path) -> None:
    paths = write_sample_corpus(corpus)
    assert [p.name for p in paths] == list(CORPUS_FILES)
    for path in paths:
        assert path.parent == corpus
        assert path.is_file(), path
        assert path.stat().st_size > 0, path
    # no temp files left behind by the atomic writes
    assert sorted(p.name for p in corpus.iterdir()) == sorted(CORPUS_FILES)


def test_second_call_changes_nothing(tmp_path: Path) -> None:
    write_sample_corpus(tmp_path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    paths = write_sample_corpus(tmp_path)
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert after == before
    assert {p.name for p in paths} == set(before)


def test_only_missing_files_are_written(tmp_path: Path) -> None:
    write_sample_corpus(tmp_path)
    edited = tmp_path / FAQ
    edited.write_text("locally edited\n", encoding="utf-8")
    (tmp_path / API_GUIDE).unlink()
    write_sample_corpus(tmp_path)
    assert edited.read_text(encoding="utf-8") == "locally edited\n"
    assert (tmp_path / API_GUIDE).stat().st_size > 0


def test_output_is_deterministic_across_folders(tmp_path: Path) -> None:
    first = write_sample_corpus(tmp_path / "a")
    second = write_sample_corpus(tmp_path / "b")
    for a, b in zip(first, second):
        assert _sha256(a) == _sha256(b), a.name


def test_markdown_front_matter_and_code_fences(corpus: Path) -> None:
    api = (corpus / API_GUIDE).read_text(encoding="utf-8")
    assert api.startswith("---\ntitle: Aurora Hub REST API Guide\nproduct: aurora-hub\n")
    assert "\n# Aurora Hub REST API Guide\n" in api
    assert "\n## Authentication\n" in api and "\n### Requesting an access token\n" in api
    assert "```bash" in api and "```json" in api and "```python" in api
    # a '#' comment line inside the python fence must not look like a heading to a naive parser
    python_block = api.split("```python", 1)[1].split("```", 1)[0]
    assert re.search(r"^# ", python_block, flags=re.M)
    assert "| Method | Path | Scope | Description |" in api

    params = (corpus / PARAMETERS).read_text(encoding="utf-8")
    assert "product: aurora-thermostat" in params.split("---", 2)[1]
    table_rows = [line for line in params.splitlines() if line.startswith("| `")]
    assert len(table_rows) >= 25
    assert params.count("\n### ") == len(table_rows)


def test_html_has_chrome_to_strip(corpus: Path) -> None:
    html = (corpus / TROUBLESHOOTING).read_text(encoding="utf-8")
    for tag in ("<title>", "<nav", "<header>", "<footer>", "<script>", "<style>", "<main>",
                "<table", "<pre><code>", "<ol>", "<ul>"):
        assert tag in html, tag
    assert '<h1 id="troubleshooting">' in html
    assert '<h2 id="error-codes">' in html
    assert '<h3 id="e42">' in html


def test_pdf_pages_outline_columns_and_footer(corpus: Path) -> None:
    with pymupdf.open(corpus / INSTALLATION_MANUAL) as doc:
        assert doc.page_count >= 6
        assert doc.metadata["title"] == "Aurora Smart Thermostat — Installation Manual"
        toc = doc.get_toc()
        assert [1, "Installation", 2] in toc
        assert [2, "Restoring factory settings", 4] in toc
        assert all(1 <= page <= doc.page_count for _level, _title, page in toc)
        for page in doc:
            text = page.get_text()
            assert text.strip(), f"page {page.number + 1} has no text"
            assert f"Aurora Installation Manual — page {page.number + 1}" in text

        page5 = doc[4]
        text5 = _collapse(page5.get_text())
        assert "The Aurora is a Class III device for 24 V AC only." in text5  # left column
        assert "Its backup supercapacitor keeps the clock running for 48 hours" in text5  # right
        # the two columns really are side by side
        left = page5.search_for("Electrical safety")
        right = page5.search_for("Environment and disposal")
        assert left and right
        assert right[0].x0 > page5.rect.width / 2 > left[0].x1
        assert abs(right[0].y0 - left[0].y0) < 1


def test_docx_headings_lists_and_table(corpus: Path) -> None:
    document = docx.Document(str(corpus / RELEASE_NOTES))
    assert document.core_properties.title == "Aurora Firmware Release Notes"
    styles = [p.style.name for p in document.paragraphs]
    assert styles[0] == "Title"
    heading1 = [p.text for p in document.paragraphs if p.style.name == "Heading 1"]
    assert [f"Version 3.{n}" for n in (4, 3, 2, 1, 0)] == heading1[:5]
    assert "Heading 2" in styles and "List Bullet" in styles
    # every release lists its own fixed issues, so one section holds everything it changed
    assert len(document.tables) == len(heading1) == 5
    for table in document.tables:
        assert tuple(c.text for c in table.rows[0].cells) == FIXED_ISSUES_HEADER
        assert len(table.rows) >= 2
    assert "Fixed issues" in [p.text for p in document.paragraphs if p.style.name == "Heading 2"]
    with zipfile.ZipFile(corpus / RELEASE_NOTES) as archive:
        assert {info.date_time for info in archive.infolist()} == {(2024, 9, 10, 9, 0, 0)}


@pytest.mark.parametrize("question", EXAMPLE_QUESTIONS, ids=lambda q: q.file)
def test_example_answers_live_in_exactly_one_file(corpus: Path, question) -> None:
    texts: dict[tuple[str, int], str] = {}
    for name in CORPUS_FILES:
        path = corpus / name
        if path.suffix == ".pdf":
            with pymupdf.open(path) as doc:
                for page in doc:
                    texts[(name, page.number + 1)] = page.get_text()
        elif path.suffix == ".docx":
            document = docx.Document(str(path))
            cells = [c.text for t in document.tables for r in t.rows for c in r.cells]
            texts[(name, 1)] = "\n".join([p.text for p in document.paragraphs] + cells)
        else:
            texts[(name, 1)] = path.read_text(encoding="utf-8")
    hits = [key for key, text in texts.items() if _collapse(question.answer) in _collapse(text)]
    assert hits == [(question.file, question.page)]
    # the section's own heading is on the same page
    assert question.section[-1] in texts[(question.file, question.page)].replace("&mdash;", "—")


def test_cli_writes_corpus(tmp_path: Path) -> None:
    from knowledge_store.ingest.sample_corpus import main

    assert main([str(tmp_path / "cli")]) == 0
    assert sorted(os.listdir(tmp_path / "cli")) == sorted(CORPUS_FILES)


def test_text_documents_are_copied_verbatim_from_package_data(corpus: Path) -> None:
    packaged = files("knowledge_store.ingest") / "sample_docs"
    # only the DOCX and the PDF are built by code; every other document is a data file
    assert set(CORPUS_FILES) - set(TEXT_DOCUMENTS) == {RELEASE_NOTES, INSTALLATION_MANUAL}
    assert sorted(entry.name for entry in packaged.iterdir()) == sorted(TEXT_DOCUMENTS)
    for name in TEXT_DOCUMENTS:
        assert (corpus / name).read_bytes() == (packaged / name).read_bytes(), name


def test_missing_package_document_raises_typed_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import knowledge_store.ingest.sample_corpus as sample_corpus

    empty_data = tmp_path / "no-package-data"
    empty_data.mkdir()
    monkeypatch.setattr(sample_corpus, "_SAMPLE_DOCS", empty_data)
    target = tmp_path / "corpus"
    with pytest.raises(SampleDocumentMissingError) as raised:
        write_sample_corpus(target)
    assert raised.value.name == CORPUS_FILES[0]
    assert raised.value.location == str(empty_data / CORPUS_FILES[0])
    assert CORPUS_FILES[0] in str(raised.value)
    assert list(target.iterdir()) == []  # nothing half-written


def test_package_data_patterns_cover_every_sample_document() -> None:
    """A non-editable install (wheel) carries only files the package-data globs match."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["knowledge_store.ingest.sample_docs"]
    for name in TEXT_DOCUMENTS:
        assert any(fnmatch(name, pattern) for pattern in patterns), name


def test_console_and_widget_files_are_package_data() -> None:
    """A non-editable install must carry what `groundwork serve` serves: every file in
    knowledge_store/server/static matches a package-data pattern of pyproject.toml."""
    import fnmatch

    root = REPO_ROOT
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "knowledge_store.server.static"]
    files = [f.name for f in (root / "knowledge_store" / "server" / "static").iterdir() if f.is_file()]
    assert files and all(any(fnmatch.fnmatch(name, p) for p in patterns) for name in files), files


@pytest.fixture(scope="module")
def parsed(corpus: Path) -> dict[str, object]:
    from knowledge_store.ingest.parsers import parse_file

    return {name: parse_file(corpus / name) for name in CORPUS_FILES}


@pytest.mark.parametrize("question", EXAMPLE_QUESTIONS, ids=lambda q: q.question)
def test_each_question_is_answered_in_its_section_and_nowhere_else(parsed, question) -> None:
    """The ground truth as the parsers see it: the answering section's heading path, page and anchor, its text
    holding the snippet and every key fact, and no block outside it holding them all."""
    from knowledge_store.core.text import contains_words, normalised_words

    assert question.key_facts and all(normalised_words(fact) for fact in question.key_facts)
    depth = len(question.section)
    inside = [b for b in parsed[question.file].blocks if b.section_path[:depth] == question.section]
    assert inside, (question.question, sorted({b.section_path for b in parsed[question.file].blocks}))
    section_text = "\n".join(b.text for b in inside)
    assert contains_words(section_text, question.answer)
    for fact in question.key_facts:
        assert contains_words(section_text, fact), fact
    holder = next(b for b in inside if any(contains_words(b.text, fact) for fact in question.key_facts))
    assert holder.page_number == question.page
    assert holder.anchor == question.anchor
    elsewhere = [(name, b.section_path) for name, doc in parsed.items() for b in doc.blocks
                 if not (name == question.file and b.section_path[:depth] == question.section)
                 and any(contains_words(b.text, fact) for fact in question.key_facts)]
    assert elsewhere == []


def test_the_example_questions_cover_every_document_and_format() -> None:
    assert len({q.question for q in EXAMPLE_QUESTIONS}) == len(EXAMPLE_QUESTIONS) >= 10
    assert {q.file for q in EXAMPLE_QUESTIONS} == set(CORPUS_FILES) - {"README.md"}
