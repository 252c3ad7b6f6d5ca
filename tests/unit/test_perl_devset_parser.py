"""The Perl docs dev set's POD reader: headings and =item entries become sections, formatting codes plain text."""

from __future__ import annotations

from pathlib import Path

from evals.experiments.perl_docs import build_devset, pod_sections, pod_text

FAQ = """=head1 NAME

perlfaq4 - Data Manipulation

=head1 Data: Hashes

=head2 How do I sort a hash (optionally by value instead of key)?

(contributed by brian d foy)

Use C<< sort { $h{$a} <=> $h{$b} } keys %h >> and see L<perlfunc/sort>.

    my @keys = sort keys %hash;



=head2 Why does my hash lose order?

Hashes keep no insertion order in Perl; see L<the docs|perldata> for why.

=head2 Perl Books

A list of books E<gt> 3 of them, long enough to be a section of its own here.
"""

FUNC = """=head1 NAME

perlfunc - Perl builtin functions

=head2 Alphabetical Listing of Perl Functions

=over

=item chomp VARIABLE
X<chomp>

=item chomp

Removes a trailing newline from the string.

=over

=item *

a bullet inside the entry

=back


=item chop VARIABLE

Removes the last character, whatever it is, of the string in place and returns it.

=back
"""

MODULE = """package File::Find;
use strict;
sub find { 1 }

=head1 NAME

File::Find - Traverse a directory tree.

=head1 SYNOPSIS

    use File::Find;
    find(\\&wanted, @directories);

=cut

sub wanted { return 1 }  # code, not documentation

=head1 DESCRIPTION

Walks a tree of directories and calls your function for every file it finds in it.

=cut
1;
"""


def _write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_formatting_codes_resolve_to_plain_text_inside_out():
    assert pod_text("C<< $h{$a} <=> $h{$b} >>") == "$h{$a} <=> $h{$b}"
    assert pod_text("see L<perlfunc/sort> or L<the docs|perldata>") == "see sort in perlfunc or the docs"
    assert pod_text("B<C<x>> E<gt> 3 X<index>E<lt>") == "x > 3 <"


def test_headings_split_sections_and_runs_of_blank_lines_do_not_hide_a_command(tmp_path):
    sections = pod_sections(_write(tmp_path, "perlfaq4.pod", FAQ))
    by_heading = {s.heading: s for s in sections}
    answer = by_heading["How do I sort a hash (optionally by value instead of key)?"]
    assert answer.page_title == "perlfaq4 - Data Manipulation" and answer.chapter == "Data: Hashes"
    assert "sort { $h{$a} <=> $h{$b} } keys %h" in answer.text and "sort in perlfunc" in answer.text
    assert "my @keys = sort keys %hash;" in answer.text  # verbatim code kept, dedented
    assert "Why does my hash lose order?" in by_heading, "three blank lines before a heading still start a section"


def test_item_pages_give_one_section_per_entry_under_its_first_form(tmp_path):
    sections = [s for s in pod_sections(_write(tmp_path, "perlfunc.pod", FUNC)) if s.level == "item"]
    assert [s.heading for s in sections] == ["chomp VARIABLE", "chop VARIABLE"]
    assert "Removes a trailing newline" in sections[0].text and "- a bullet inside the entry" in sections[0].text
    assert "whatever it is" in sections[1].text


def test_module_code_outside_pod_is_not_documentation(tmp_path):
    sections = pod_sections(_write(tmp_path, "File/Find.pm", MODULE), "File::Find")
    text = "\n".join(s.text for s in sections)
    assert "Walks a tree" in text and "find(\\&wanted, @directories);" in text
    assert "sub wanted" not in text and "package File::Find" not in text
    assert sections[0].page_title == "File::Find - Traverse a directory tree."


def test_questions_become_queries_whose_answer_never_holds_the_question(tmp_path):
    lib = tmp_path / "usr/share/perl/5.36.0"
    _write(lib, "pod/perlfaq4.pod", FAQ)
    _write(lib, "pod/perlfunc.pod", FUNC)
    _write(lib, "pod/perltoc.pod", "=head1 NAME\n\nperltoc - contents\n\n=head2 How do I sort a hash (optionally by value "
                                   "instead of key)?\n\nRepeats every FAQ heading, so it is left out of the corpus.\n")
    _write(lib, "File/Find.pm", MODULE)
    devset = build_devset(tmp_path)
    queries = {q["_id"]: q["text"] for q in devset.queries}
    corpus = {d["_id"]: d for d in devset.corpus}
    assert sorted(queries.values()) == ["How do I sort a hash (optionally by value instead of key)?",
                                        "Why does my hash lose order?"], "headings not ending in '?' are no queries"
    for query_id, doc_id, grade in devset.qrels:
        assert grade == 1 and corpus[doc_id]["metadata"]["kind"] == "faq_answer"
        assert queries[query_id] not in corpus[doc_id]["text"] and queries[query_id] not in corpus[doc_id]["title"]
        assert corpus[doc_id]["title"] == "perlfaq4 - Data Manipulation: Data: Hashes"
    assert not any(d["metadata"]["page"] == "perltoc" for d in corpus.values())
    assert any(d["metadata"]["page"] == "File::Find" for d in corpus.values())
    assert devset.stats["documents"] == len(devset.corpus) and devset.stats["queries"] == 2
