"""Chunking rules, measured with the model's own tokenizer."""

from __future__ import annotations

import pytest

from knowledge_store.config.embedding_models import EMBEDDER_REGISTRY
from knowledge_store.core.text import sentence_spans
from knowledge_store.ingest.chunking import ChunkingConfig, build_header, chunk_document
from knowledge_store.ingest.documents import PageBuilder, ParsedDocument

CONFIG = ChunkingConfig(size_tokens=200, max_tokens=254, overlap_tokens=32, min_tokens=24, header_max_tokens=40)


def prose(n: int, topic: str = "thermostat") -> str:
    return " ".join(
        f"The {topic} sentence number {i} explains how wiring terminal W{i % 4} connects to the furnace relay."
        for i in range(n)
    )


def make_doc(*pages: list[tuple[str, str, tuple[str, ...]]], title: str = "Manual") -> ParsedDocument:
    built_pages, blocks = [], []
    for number, page_blocks in enumerate(pages, start=1):
        builder = PageBuilder(number)
        for kind, text, section in page_blocks:
            builder.add(kind, text, section, heading_level=len(section) if kind == "heading" else None)
        built_pages.append(builder.page())
        blocks.extend(builder.blocks)
    return ParsedDocument(title=title, doc_type="pdf", pages=built_pages, blocks=blocks, paginated=True)


def full_length_with_specials(counter, text: str) -> int:
    return len(counter._tokenizer.encode(text, add_special_tokens=True).ids)


def test_every_chunk_fits_the_model_window_including_special_tokens(token_counter):
    doc = make_doc(
        [("heading", "Wiring", ("Wiring",)), ("paragraph", prose(40), ("Wiring",))],
        [("paragraph", "x" * 3000, ("Wiring",)), ("paragraph", prose(25, "hub"), ("Wiring",))],
    )
    chunks = chunk_document(doc, token_counter, CONFIG)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.token_count <= CONFIG.max_tokens
        assert full_length_with_specials(token_counter, chunk.embed_text) <= EMBEDDER_REGISTRY["minilm"].max_tokens
        assert chunk.token_count == token_counter.count(chunk.embed_text)


def test_chunk_text_is_the_exact_page_slice_its_offsets_name(token_counter):
    doc = make_doc(
        [("heading", "Intro", ("Intro",)), ("paragraph", prose(12), ("Intro",))],
        [("paragraph", prose(15, "gateway"), ("Intro",)), ("list_item", "Check the fuse.", ("Intro",))],
    )
    for chunk in chunk_document(doc, token_counter, CONFIG):
        if chunk.page_start == chunk.page_end:
            assert doc.page(chunk.page_start).text[chunk.char_start:chunk.char_end] == chunk.text
        else:
            assert chunk.text.startswith(doc.page(chunk.page_start).text[chunk.char_start:])
            assert chunk.text.endswith(doc.page(chunk.page_end).text[:chunk.char_end])


def test_chunks_spanning_pages_record_both_page_numbers(token_counter):
    doc = make_doc(
        [("paragraph", prose(3), ("A",))],
        [("paragraph", prose(3, "hub"), ("A",))],
    )
    chunks = chunk_document(doc, token_counter, CONFIG)
    assert [(c.page_start, c.page_end) for c in chunks] == [(1, 2)]


def test_sentences_are_never_cut(token_counter):
    text = prose(60)
    sentences = [text[s:e] for s, e in sentence_spans(text)]
    doc = make_doc([("paragraph", text, ("S",))])
    for chunk in chunk_document(doc, token_counter, CONFIG):
        body = chunk.text
        assert any(body.startswith(s) for s in sentences), body[:60]
        assert any(body.endswith(s) for s in sentences), body[-60:]


def test_a_code_block_that_fits_is_never_split_even_at_a_chunk_boundary(token_counter):
    code = "```python\n" + "\n".join(f"client.set('hvac.param_{i}', {i})  # set {i}" for i in range(7)) + "\n```"
    doc = make_doc([
        ("heading", "Setup", ("Setup",)),
        ("paragraph", prose(7), ("Setup",)),
        ("code", code, ("Setup",)),
        ("paragraph", prose(4, "hub"), ("Setup",)),
    ])
    chunks = chunk_document(doc, token_counter, CONFIG)
    holders = [c for c in chunks if "```python" in c.text]
    assert len(holders) == 1 and code in holders[0].text
    assert sum(c.text.count("client.set('hvac.param_0'") for c in chunks) == 1


def test_an_oversized_code_block_is_split_at_line_boundaries(token_counter):
    lines = [f"curl -X POST https://hub.local/api/v2/devices/{i}/setpoint -d '{{\"value\": {i}}}'" for i in range(60)]
    code = "\n".join(lines)
    doc = make_doc([("code", code, ("API",))])
    chunks = chunk_document(doc, token_counter, CONFIG)
    assert len(chunks) > 1
    for chunk in chunks:
        for line in chunk.text.splitlines():
            assert line in lines  # whole lines only


def test_table_rows_are_not_cut(token_counter):
    rows = [f"| param.{i} | {i * 3} | the default value for parameter {i} |" for i in range(80)]
    doc = make_doc([("table", "\n".join(rows), ("Params",))])
    for chunk in chunk_document(doc, token_counter, CONFIG):
        assert all(line in rows for line in chunk.text.splitlines())


def test_tiny_sections_are_merged_not_emitted(token_counter):
    doc = make_doc([
        ("heading", "A", ("A",)), ("paragraph", "Short one.", ("A",)),
        ("heading", "B", ("B",)), ("paragraph", "Short two.", ("B",)),
        ("heading", "C", ("C",)), ("paragraph", prose(6), ("C",)),
        ("heading", "D", ("D",)), ("paragraph", "Tail.", ("D",)),
    ])
    chunks = chunk_document(doc, token_counter, CONFIG)
    assert len(chunks) == 1
    assert "Short one." in chunks[0].text and "Tail." in chunks[0].text


def test_new_sections_start_new_chunks_when_big_enough(token_counter):
    doc = make_doc([
        ("heading", "Install", ("Install",)), ("paragraph", prose(5), ("Install",)),
        ("heading", "Reset", ("Reset",)), ("paragraph", prose(5, "reset"), ("Reset",)),
    ])
    chunks = chunk_document(doc, token_counter, CONFIG)
    assert [c.section_path for c in chunks] == [("Install",), ("Reset",)]
    assert chunks[1].text.startswith("Reset")


def test_consecutive_chunks_of_a_section_overlap_by_whole_sentences(token_counter):
    doc = make_doc([("paragraph", prose(40), ("S",))])
    chunks = chunk_document(doc, token_counter, CONFIG)
    assert len(chunks) >= 3
    for before, after in zip(chunks, chunks[1:]):
        first_sentence = after.text[: after.text.index(".") + 1]
        assert first_sentence in before.text
        assert after.char_start < before.char_end  # the spans overlap in the page text


def test_no_chunk_ends_on_a_dangling_heading(token_counter):
    doc = make_doc([
        ("paragraph", prose(9), ("A",)),
        ("heading", "Next section", ("B",)),
        ("paragraph", prose(9, "hub"), ("B",)),
    ])
    for chunk in chunk_document(doc, token_counter, CONFIG):
        assert not chunk.text.rstrip().endswith("Next section")


def test_header_gives_title_and_section_and_is_bounded(token_counter):
    header = build_header("Aurora Manual", ("Install", "Wiring"), token_counter, 40)
    assert header == "Aurora Manual\nInstall > Wiring"
    long = build_header("T", tuple(f"section {i} with words" for i in range(40)), token_counter, 40)
    assert token_counter.count(long) <= 40


def test_chunking_is_deterministic(token_counter):
    doc = make_doc([("paragraph", prose(30), ("S",))])
    first = [(c.text, c.content_hash) for c in chunk_document(doc, token_counter, CONFIG)]
    second = [(c.text, c.content_hash) for c in chunk_document(doc, token_counter, CONFIG)]
    assert first == second


def test_sentence_splitter_respects_abbreviations():
    text = "Use e.g. the hub. Fig. 3 shows wiring! Is it 24 V? Yes."
    assert [text[s:e] for s, e in sentence_spans(text)] == [
        "Use e.g. the hub.", "Fig. 3 shows wiring!", "Is it 24 V?", "Yes.",
    ]


@pytest.mark.parametrize("size,overlap", [(120, 16), (200, 32), (254, 0)])
def test_window_holds_for_other_chunk_sizes(token_counter, size, overlap):
    config = ChunkingConfig(size_tokens=size, max_tokens=254, overlap_tokens=overlap, min_tokens=24, header_max_tokens=40)
    doc = make_doc([("paragraph", prose(50), ("S",)), ("code", "\n".join(["x = 1"] * 300), ("S",))])
    for chunk in chunk_document(doc, token_counter, config):
        assert chunk.token_count <= 254
