"""The document model's revision labels, document families and links, from metadata, file names and parsed
documents (the store and the pipeline are in tests/integration/test_document_revisions.py)."""

from __future__ import annotations

from pathlib import Path

import docx
import pymupdf
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError
from knowledge_store.core.revisions import (
    DEFAULT_FAMILY_ID_PATTERN,
    compile_family_pattern,
    family_key,
    normalise_label,
    revision_label,
    revision_order,
)
from knowledge_store.ingest.parsers import parse_file
from knowledge_store.ingest.parsers.html import parse_html
from knowledge_store.ingest.parsers.markdown import parse_markdown
from knowledge_store.ingest.relations import link_targets

# ------------------------------------------------------------------ revision labels (no model)

@pytest.mark.parametrize("front_matter, label, source", [
    ({"rev_label": "Rev C", "revision": "B", "version": "3.4"}, "Rev C", "metadata:rev_label"),
    ({"revision": "B", "version": "3.4"}, "Rev B", "metadata:revision"),
    ({"rev": 3}, "Rev 3", "metadata:rev"),
    ({"version": "2.1"}, "v2.1", "metadata:version"),
    ({"version": 3}, "v3", "metadata:version"),
    ({"Revision": "rev. c"}, "Rev C", "metadata:revision"),
    ({"rev": True, "version": ["1", "2"]}, None, None),  # not scalars: no label from metadata
])
def test_rev_label_comes_from_front_matter_keys_in_order(front_matter, label, source) -> None:
    found = revision_label("Compressor startup", front_matter, "compressor.md")
    assert (found.label, found.source) == (label, source) if label else found is None


def test_rev_label_from_markdown_front_matter_is_stored_by_the_parser_metadata(tmp_path: Path) -> None:
    path = tmp_path / "startup.md"
    path.write_text("---\ntitle: Compressor startup\nrevision: D\n---\n# Startup\n\nOpen the valve.\n")
    parsed = parse_file(path)
    assert revision_label(parsed.title, parsed.metadata, "startup.md").label == "Rev D"


def _docx(path: Path, title: str, version: str | None = None, revision: int | None = None,
          link: tuple[str, str] | None = None) -> None:
    document = docx.Document()
    document.add_heading(title, level=1)
    paragraph = document.add_paragraph("Open the suction valve slowly before starting the compressor. ")
    if link is not None:  # an external hyperlink run, as Word writes it
        target, text = link
        rel = document.part.relate_to(target, docx.opc.constants.RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
        hyperlink = docx.oxml.OxmlElement("w:hyperlink")
        hyperlink.set(docx.oxml.ns.qn("r:id"), rel)
        run = docx.oxml.OxmlElement("w:r")
        text_element = docx.oxml.OxmlElement("w:t")
        text_element.text = text
        run.append(text_element)
        hyperlink.append(run)
        paragraph._p.append(hyperlink)
    document.core_properties.title = title
    if version is not None:
        document.core_properties.version = version
    if revision is not None:
        document.core_properties.revision = revision
    document.save(path)


def test_rev_label_from_docx_version_property_and_never_the_save_counter(tmp_path: Path) -> None:
    labelled, counted = tmp_path / "startup.docx", tmp_path / "shutdown.docx"
    _docx(labelled, "Compressor startup", version="Rev C", revision=37)
    _docx(counted, "Compressor shutdown", revision=37)
    parsed = parse_file(labelled)
    assert revision_label(parsed.title, parsed.metadata, "startup.docx") == \
        revision_label("x", {"version": "Rev C"}, "x.docx")
    assert revision_label(parsed.title, parsed.metadata, "startup.docx").source == "metadata:version"
    # Word's revision counts saves: 37 saves is not "Rev 37"
    parsed = parse_file(counted)
    assert "revision" not in parsed.metadata and revision_label(parsed.title, parsed.metadata, "shutdown.docx") is None


def test_rev_label_from_pdf_info_dictionary(tmp_path: Path) -> None:
    path = tmp_path / "startup.pdf"
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "Open the suction valve slowly before starting the compressor.")
    doc.set_metadata({"title": "Compressor startup"})
    info = int(doc.xref_get_key(-1, "Info")[1].split()[0])
    doc.xref_set_key(info, "Revision", pymupdf.get_pdf_str("C"))
    doc.save(path)
    doc.close()
    parsed = parse_file(path)
    assert parsed.metadata["revision"] == "C"
    found = revision_label(parsed.title, parsed.metadata, "startup.pdf")
    assert (found.label, found.source) == ("Rev C", "metadata:revision")


@pytest.mark.parametrize("name, label", [
    ("SOP-42-RevC.pdf", "Rev C"),
    ("Compressor_startup_RevB.docx", "Rev B"),
    ("manual-v2.1.pdf", "v2.1"),
    ("rev3.md", "Rev 3"),
    ("SOP-42 Rev B.pdf", "Rev B"),
    ("sop-42-rev-c.pdf", "Rev C"),
    ("guide-version-3.md", "v3"),
    ("https://docs.example.org/guide/install-v2.html", "v2"),
    # none: a version inside the name is the product's; "Revisions"/"review" are words, not labels
    ("aurora-v2-notes.md", None),
    ("Revisions.md", None),
    ("review.md", None),
    ("sop-42-revc.pdf", None),  # lower-case letters straight after "rev" are too ambiguous ("revs", "revise")
    ("install.md", None),
])
def test_rev_label_from_file_name_patterns(name: str, label: str | None) -> None:
    found = revision_label(None, {}, name)
    assert (found.label if found else None) == label
    if found:
        assert found.source == "file_name"


def test_rev_label_from_title_when_metadata_and_file_name_have_none() -> None:
    assert revision_label("SOP-42 Rev C", {}, "startup.md").label == "Rev C"
    assert revision_label("Compressor startup (Rev. B)", {}, "x.md").source == "title"
    assert revision_label("Revision history", {}, "x.md") is None
    # a version in a title names the release a text is about, not the document's revision (Debian's policy
    # manual has a section per version: 63 of them would otherwise supersede each other)
    assert revision_label("Debian Policy Manual: Version 2.1.1", {}, "policy-upgrading-checklist-version-2-1-1.md") is None


def test_revision_labels_order_letters_numbers_and_versions() -> None:
    assert sorted(["Rev C", "Rev A", "Rev AA", "Rev B", "Rev Z"], key=lambda label: revision_order(label)[1]) == \
        ["Rev A", "Rev B", "Rev C", "Rev Z", "Rev AA"]
    assert sorted(["v10", "v2.1", "v2.0", "v2.10"], key=lambda label: revision_order(label)[1]) == ["v2.0", "v2.1", "v2.10", "v10"]
    assert revision_order("v2") == revision_order("v2.0")
    assert revision_order("draft 7") is None
    assert revision_order("Rev 3")[0] != revision_order("Rev C")[0]  # different schemes do not compare
    assert normalise_label("c", "revision") == "Rev C" and normalise_label("2.1", "revision") == "v2.1"


def test_family_key_prefers_asset_id_then_id_in_title_or_name_then_labelled_title() -> None:
    pattern = compile_family_pattern(DEFAULT_FAMILY_ID_PATTERN)
    assert family_key("Startup", {"asset_id": "asset-104"}, "x_RevB.md", "Rev B", pattern).value == "ASSET-104"
    key = family_key("SOP-42 Rev C", {}, "startup.md", "Rev C", pattern)
    assert (key.kind, key.value, key.found_in) == ("asset_id", "SOP-42", "title")
    assert family_key("Startup", {}, "sop-42-rev-b.pdf", "Rev B", pattern).found_in == "file_name"
    titled = family_key("Compressor startup, Rev B", {}, "a.docx", "Rev B", pattern)
    assert (titled.kind, titled.value) == ("title", "compressor startup")
    # a title alone, without any revision label, is not evidence: "Installation" exists in many folders
    assert family_key("Installation", {}, "a/install.md", None, pattern) is None


def test_bad_family_id_pattern_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError) as error:
        Settings(family_id_pattern="(SOP-\\d+")
    assert error.value.setting == "family_id_pattern" and error.value.value == "(SOP-\\d+"
    with pytest.raises(ConfigError, match="empty string"):
        Settings(family_id_pattern="(SOP)?")


# ------------------------------------------------------------------ links (no model)

def test_markdown_links_keep_text_page_and_span_outside_code() -> None:
    parsed = parse_markdown("# Start\n\nRead the [wiring guide](sub/wiring.md#terminals) first.\n\n"
                            "```\n[not a link](nowhere.md)\n```\n\nSee [the FAQ][faq].\n\n[faq]: faq.md\n")
    page = parsed.pages[0].text
    assert [(link.href, link.text) for link in parsed.links] == [("sub/wiring.md#terminals", "wiring guide"),
                                                                 ("faq.md", "the FAQ")]
    for link in parsed.links:
        assert page[link.char_start:link.char_end] == link.text and link.page_number == 1


def test_html_links_are_located_in_the_page_text() -> None:
    parsed = parse_html("<html><body><nav><a href='/home'>Home</a></nav><main><h1>Reset</h1>"
                        "<p>Before resetting, read <a href='safety.html'>the safety notes</a>.</p>"
                        "<p><a href='#top'>Back to top</a> <a href='mailto:x@y.z'>Mail</a></p></main></body></html>")
    assert [(link.href, link.text) for link in parsed.links] == [("safety.html", "the safety notes")]
    link = parsed.links[0]
    assert parsed.pages[0].text[link.char_start:link.char_end] == "the safety notes"


def test_docx_hyperlinks_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "linked.docx"
    _docx(path, "Compressor startup", link=("https://docs.example.org/guide/lockout", "lockout procedure"))
    parsed = parse_file(path)
    assert [(link.href, link.text) for link in parsed.links] == [("https://docs.example.org/guide/lockout",
                                                                  "lockout procedure")]
    link = parsed.links[0]
    assert parsed.pages[0].text[link.char_start:link.char_end] == "lockout procedure"


@pytest.mark.parametrize("href, relative_path, url, expected", [
    ("wiring.md", "guide/start.md", "file:///s/guide/start.md", ("guide/wiring.md", None)),
    ("../faq.md#q1", "guide/start.md", "file:///s/guide/start.md", ("faq.md", None)),
    ("/manuals/Install%20Guide.pdf", "guide/start.md", "file:///s/guide/start.md", ("manuals/Install Guide.pdf", None)),
    ("../../outside.md", "guide/start.md", "file:///s/guide/start.md", (None, None)),
    ("HTTPS://Docs.Example.org/guide/?b=2&a=1#x", "start.md", "file:///s/start.md",
     (None, "https://docs.example.org/guide/?a=1&b=2")),
    ("install.html#req", "https://docs.example.org/guide/", "https://docs.example.org/guide/",
     (None, "https://docs.example.org/guide/install.html")),
    ("ftp://files.example.org/x.pdf", "start.md", "file:///s/start.md", (None, None)),
])
def test_link_targets_resolve_within_the_source_or_to_web_pages(href, relative_path, url, expected) -> None:
    assert link_targets(href, relative_path, url) == expected
