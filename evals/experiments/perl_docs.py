"""Build the Perl documentation dev set: programming FAQ questions vs. Perl's own reference pages.

A second documentation-style set (issue 10 asks for more than one kind of corpus), closer to the
programming-documentation set of the issue than the Debian one: questions a programmer asks,
answers that are short FAQ sections, hidden among the reference and tutorial pages of the same
language.  Built at run time from the Debian package ``perl-doc`` (POD sources); nothing of it is
committed, only this builder.

- **queries** are the question headings of ``perlfaq1`` … ``perlfaq9`` (the ``=head2`` lines that
  end in "?"), e.g. "How do I sort a hash (optionally by value instead of key)?";
- the **relevant document** of a question is its answer, *without its heading*; the answer's title
  names the FAQ page and chapter ("perlfaq4 - Data Manipulation: Data: Hashes"), never the question;
- **distractors** are the sections of Perl's other manual pages (``perlfunc``, ``perlop``,
  ``perlre``, ``perlvar``, ``perlsyn``, ``perldata``, ``perlsub``, the tutorials, ``perldiag`` …)
  and of the core modules' documentation (``File::Find``, ``Getopt::Long``, ``Data::Dumper`` …,
  package ``perl-modules-5.x``), the pages FAQ answers point to:
  one document per heading; in the pages that list their entries as ``=item`` (functions,
  variables, operators, command-line switches) one document per entry.  Change logs
  (``perl5*delta``), platform notes, licences, the generated Unicode property table and the table
  of contents (``perltoc``, which repeats every FAQ question) are left out.

Queries are split into ``train`` and ``test`` by a hash of the question id, as for the Debian set.

    .venv/bin/python -m evals.experiments.perl_docs            # builds data/datasets/perl-docs/
    .venv/bin/python -m evals.experiments.perl_docs --out DIR  # elsewhere
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from evals.experiments import devset_files
from evals.experiments.devset_files import DatasetBuildError, DevSet, DevSetBuilder, median, readme_tail, split_of
from knowledge_store.config.settings import PROJECT_ROOT

PACKAGES = ("perl-doc",)  # plus the perl-modules-5.x package of this release (modules_package())
PERL_LIB_GLOB = "usr/share/perl/5.*"
DEFAULT_OUT = PROJECT_ROOT / "data" / "datasets" / "perl-docs"
BUILDER_VERSION = "1"
MIN_ANSWER_CHARS = 40  # an answer shorter than this is a pointer ("See perlfunc."), not an answer
MIN_SECTION_CHARS = 80  # distractor sections shorter than this are a heading with a line
FAQ_PAGE = re.compile(r"^perlfaq[1-9]$")
# pages that are not documentation of the language: change logs, platform notes, translations' indexes,
# licences, the table of contents (it repeats every FAQ heading), the FAQ's own index page and perluniprops
# (a generated table of Unicode properties, 400k characters in one section)
_EXCLUDED = re.compile(r"^perl(5\d+delta|\d+delta|toc|faq|artistic|gpl|aix|amiga|android|bs2000|cn|cygwin|freebsd|haiku"
                       r"|hpux|hurd|irix|jp|ko|linux|macos|macosx|openbsd|os2|os390|os400|plan9|qnx|riscos|solaris"
                       r"|synology|tru64|tw|vms|vos|win32|history|uniprops)$")
# pages whose =item entries are the units a reader looks up (functions, variables, messages, API calls)
# (perlapi and perlintern, the C API, keep one document per heading: long reference sections)
ITEM_PAGES = frozenset({"perlfunc", "perlvar", "perldiag", "perlrun", "perlop"})
_FORMAT_CODE = re.compile(r"([A-Z])<(?:<+\s(.*?)\s>+|([^<>]*))>", re.DOTALL)
_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&", "apos": "'", "nbsp": " "}
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")


@dataclass(frozen=True)
class PodSection:
    """One section of a POD page: its heading (or ``=item`` entry) and its own text up to the next one."""

    page: str  # "perlfaq4"
    page_title: str  # "perlfaq4 - Data Manipulation" (the NAME line)
    chapter: str  # the =head1 it is under
    heading: str
    level: str  # "head1" .. "head4" or "item"
    ordinal: int  # position among the page's sections (ids stay unique when headings repeat)
    text: str

    @property
    def doc_id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")[:60] or "section"
        return f"{self.page}-{self.ordinal:04d}-{slug}"

    @property
    def is_question(self) -> bool:
        return self.heading.rstrip().endswith("?")


def _escape(name: str) -> str:
    if name.isdigit():
        return chr(int(name))
    if name.lower().startswith("0x"):
        return chr(int(name, 16))
    return _ESCAPES.get(name, "")


def pod_text(text: str) -> str:
    """POD formatting codes resolved to plain text: C<x> / C<< x >> -> x, L<text|target> -> text, E<gt> -> >."""

    def code(match: re.Match) -> str:
        letter, content = match.group(1), match.group(2) if match.group(2) is not None else match.group(3)
        if letter in ("X", "Z"):
            return ""
        if letter == "E":
            return _escape(content.strip())
        if letter == "L":
            label, bar, target = content.partition("|")
            if bar:
                return label
            page, slash, section = content.partition("/")
            section = section.strip('"')
            return f"{section} in {page}" if slash and page else (section or page)
        return content

    previous = None
    while previous != text:  # nested codes (B<C<x>>) resolve from the inside out
        previous, text = text, _FORMAT_CODE.sub(code, text)
    return text


def _paragraphs(source: str) -> list[str]:
    """Blank-line separated paragraphs; runs of blank lines leave no newline in front of the next one."""
    return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", source.replace("\r\n", "\n")) if p.strip()]


def pod_sections(path: Path, page: str | None = None) -> list[PodSection]:
    """Every section of one POD page, in order: headings always start one, ``=item`` entries do on ITEM_PAGES.

    ``page`` names it (default: the file's stem).  In a module (``.pm``) only what lies between a POD
    command and ``=cut`` is documentation; the code around it is skipped.
    """
    page = page or path.stem
    split_items = page in ITEM_PAGES
    in_pod = path.suffix == ".pod"
    sections: list[PodSection] = []
    page_title, chapter, heading, level = page, "", "", ""
    body: list[str] = []
    depth = 0  # =over nesting
    skipping = None  # inside =begin FORMAT ... =end FORMAT
    in_name = False
    pending_bullet = ""

    def close() -> None:
        if heading:
            text = "\n\n".join(p for p in body if p.strip()).strip()
            sections.append(PodSection(page, page_title, chapter, heading, level, len(sections), text))

    for paragraph in _paragraphs(path.read_text(encoding="utf-8", errors="replace")):
        if skipping:
            if paragraph.startswith(f"=end {skipping}"):
                skipping = None
            continue
        if paragraph.startswith("=") and re.match(r"=[a-z]", paragraph):
            command, _, rest = paragraph.partition(" ")
            command = command.strip().split("\n")[0]
            in_pod = command != "=cut"
            rest = _SPACES.sub(" ", pod_text(rest.replace("\n", " "))).strip()
            if command in ("=head1", "=head2", "=head3", "=head4"):
                close()
                heading, level, body, depth = rest, command[1:], [], 0
                in_name = command == "=head1" and rest.upper() == "NAME"
                if command == "=head1":
                    chapter = rest
            elif command == "=over":
                depth += 1
            elif command == "=back":
                depth = max(0, depth - 1)
            elif command == "=item":
                if split_items and depth == 1 and rest not in ("*", "") and not re.fullmatch(r"\d+\.?", rest):
                    if level == "item" and not any(p.strip() for p in body):
                        continue  # "=item chomp VARIABLE" / "=item chomp": one entry under its first form
                    close()
                    heading, level, body = rest, "item", []
                else:
                    pending_bullet = "- " if rest in ("*", "") or re.fullmatch(r"\d+\.?", rest) else f"{rest}: "
            elif command == "=begin":
                skipping = rest.split(" ")[0] or "unknown"
            # =for, =encoding, =pod, =cut and unknown commands carry no prose
            continue
        if not in_pod:
            continue
        if paragraph[0] in " \t":  # verbatim: code, kept as written (dedented)
            lines = paragraph.split("\n")
            indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
            body.append("\n".join(line[indent:].rstrip() for line in lines))
            continue
        text = _SPACES.sub(" ", pod_text(paragraph.replace("\n", " "))).strip()
        if in_name and not sections and text:
            page_title = text
        body.append(pending_bullet + text)
        pending_bullet = ""
    close()
    return sections


def pages(root: Path) -> list[tuple[str, Path]]:
    """(page name, file) of every manual page (``pod/perl*.pod``) and documented core module (``File::Find``)."""
    libs = sorted(root.glob(PERL_LIB_GLOB))
    if not libs or not sorted((libs[-1] / "pod").glob("perlfaq[1-9].pod")):
        raise DatasetBuildError(f"no perlfaq pages under {root}/{PERL_LIB_GLOB}/pod: is perl-doc unpacked there?")
    lib = libs[-1]
    found = [(p.stem, p) for p in sorted((lib / "pod").glob("*.pod")) if not _EXCLUDED.match(p.stem)]
    for path in sorted(lib.rglob("*")):
        if path.suffix not in (".pm", ".pod") or path.parent == lib / "pod" or not path.is_file():
            continue
        if "\n=head1" not in path.read_text(encoding="utf-8", errors="replace"):
            continue  # a module without documentation
        found.append(("::".join(path.relative_to(lib).with_suffix("").parts), path))
    return found


def modules_package() -> str:
    """The perl-modules-5.x package this release's ``perl`` depends on (it holds the core modules' POD)."""
    run = subprocess.run(["apt-cache", "depends", "perl"], capture_output=True, text=True)
    names = re.findall(r"Depends:\s+(perl-modules-5\.\d+)", run.stdout)
    if run.returncode != 0 or not names:
        raise DatasetBuildError(f"apt-cache depends perl names no perl-modules-5.x package: {run.stderr.strip()[-300:]}")
    return names[0]


def build_devset(root: Path) -> DevSet:
    """Sections -> BEIR rows.  ``root`` holds the unpacked package."""
    corpus: list[dict] = []
    seen_texts: set[str] = set()
    queries: list[dict] = []
    qrels: list[tuple[str, str, int]] = []
    per_page: dict[str, int] = {}
    found = pages(root)
    manual_pages = {name for name, path in found if path.parent.name == "pod" and not FAQ_PAGE.match(name)}
    for name, path in found:
        faq = bool(FAQ_PAGE.match(name))
        for section in pod_sections(path, name):
            if section.chapter.upper() == "NAME" or section.heading.upper() in ("NAME", "VERSION", "AUTHOR",
                                                                                 "AUTHOR AND COPYRIGHT"):
                continue
            floor = MIN_ANSWER_CHARS if faq else MIN_SECTION_CHARS
            digest = hashlib.sha256(section.text.encode()).hexdigest()
            if len(section.text) < floor or digest in seen_texts:
                continue
            seen_texts.add(digest)
            if faq:
                # an answer's title names its FAQ page and chapter, never the question (that would leak the query)
                title = f"{section.page_title}: {section.chapter}"
            else:
                title = f"{section.page_title}: {section.heading}"
            corpus.append({"_id": section.doc_id, "title": title, "text": section.text,
                           "metadata": {"page": section.page, "heading_level": section.level,
                                        "kind": "faq_answer" if faq else "manual"}})
            per_page[section.page] = per_page.get(section.page, 0) + 1
            if faq and section.is_question and section.level == "head2":
                query_id = f"q-{section.doc_id}"
                queries.append({"_id": query_id, "text": section.heading})
                qrels.append((query_id, section.doc_id, 1))
    if not queries:
        raise DatasetBuildError(f"no perlfaq question headings found under {root}")
    splits = {q["_id"]: split_of(q["_id"]) for q in queries}
    relevant = {doc_id for _, doc_id, _ in qrels}
    manual = [len(d["text"]) for d in corpus if d["metadata"]["kind"] == "manual"]
    stats = {
        "documents": len(corpus), "faq_answer_sections": sum(1 for d in corpus if d["metadata"]["kind"] == "faq_answer"),
        "manual_sections": len(manual), "manual_pages": sum(1 for p in per_page if p in manual_pages),
        "module_pages": sum(1 for p in per_page if not FAQ_PAGE.match(p) and p not in manual_pages),
        "queries": len(queries),
        "train_queries": sum(1 for v in splits.values() if v == "train"),
        "test_queries": sum(1 for v in splits.values() if v == "test"),
        "relevant_share_of_corpus": round(len(relevant) / len(corpus), 4),
        "chars_median_all": median([len(d["text"]) for d in corpus]),
        "chars_median_relevant": median([len(d["text"]) for d in corpus if d["_id"] in relevant]),
        "chars_median_manual": median(manual), "chars_max_manual": max(manual, default=0),
    }
    return DevSet(corpus, queries, qrels, splits, stats)


def _readme(devset: DevSet, packages: dict[str, str], checksums: dict[str, str]) -> str:
    return "\n".join([
        "# Perl documentation dev set (built, not committed)",
        "",
        "Built by `python -m evals.experiments.perl_docs` from the Debian packages `perl-doc` and `perl-modules-5.x`; see",
        "that module for the rules. Queries: the question headings of perlfaq1-9 (those ending in '?').",
        "Relevant document: that question's answer without its heading. Distractors: every other section of",
        "Perl's manual pages (one document per heading; per =item entry in " + ", ".join(sorted(ITEM_PAGES)) + ")",
        "and of the core modules' documentation.",
        "",
        *readme_tail(devset, packages, checksums),
    ])


def apt_available() -> tuple[bool, str]:
    return devset_files.apt_available(PACKAGES[0], "the Perl docs dev set")


BUILDER = DevSetBuilder("the Perl docs dev set", lambda: (*PACKAGES, modules_package()), build_devset, _readme,
                        BUILDER_VERSION, DEFAULT_OUT)
build, ensure_built = BUILDER.build, BUILDER.ensure_built


def main(argv: list[str] | None = None) -> int:
    return BUILDER.main(argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
