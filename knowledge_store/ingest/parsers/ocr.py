"""OCR for PDF pages that have no text layer: Tesseract through PyMuPDF.

Why it is built this way:

* **Text from PyMuPDF.**  ``Page.get_textpage_ocr(full=True)`` renders the page
  and runs the Tesseract engine that MuPDF links in (it only needs the
  ``tessdata`` folder).  The result is an ordinary PyMuPDF ``TextPage``, so an
  OCR'd page goes through exactly the same line/block extraction, running
  header removal, reading order and heading detection as a digital page.
* **Confidence from the tesseract CLI.**  MuPDF turns Tesseract's output into
  an invisible text layer and drops the word confidences; nothing in PyMuPDF
  exposes them.  So the same page is rendered at the same dpi and given to the
  ``tesseract`` command with TSV output; the page confidence is the mean of its
  word ``conf`` values / 100.  Its words are grouped into text lines; a line whose
  mean confidence is under ``OcrOptions.low_confidence`` is a low-confidence region
  (box in PDF points, confidence, text), kept with the page for a person to check.
  The command runs as a child process *while*
  MuPDF's in-process OCR runs, so on two or more cores it costs little wall
  time (docs/BENCHMARKS.md).  Without the command, or with the pass switched
  off, the confidence is ``None``: unknown, never a made-up number.
* **A time budget per document.**  ``OcrOptions.timeout_s`` bounds the OCR time
  spent on one document.  It is checked before every page's OCR: with pages
  left and the budget spent, ``OcrTimeoutError`` fails that document version
  (the previous version stays indexed) instead of blocking the sync.  The
  confidence child is killed when it would overrun the budget (that page keeps
  its text, with confidence unknown).  MuPDF's in-process OCR of one page cannot
  be interrupted, so the budget can be overrun by at most one page (seconds).
* **Availability is checked, not assumed.**  No tessdata folder or no
  ``<lang>.traineddata`` means OCR is unavailable: the pages keep the
  ``no_text_layer`` failure row, whose reason says why and how to install it.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from knowledge_store.core.errors import OcrTimeoutError
from knowledge_store.ingest.documents import OcrRegion

if TYPE_CHECKING:  # imported lazily: building OcrOptions must not load PyMuPDF (see parsers/__init__)
    import pymupdf

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install Tesseract to OCR them (Debian/Ubuntu: `sudo apt-get install tesseract-ocr tesseract-ocr-eng`; "
    "`make run`/`make test` do it when run as root) or point GROUNDWORK_TESSDATA_DIR at a folder with the "
    "language data; a document parsed without OCR is OCR'd when its file next changes, or at once with "
    "`groundwork failures retry FAILURE_ID` on its no_text_layer row"
)
# Where Debian/Ubuntu, Fedora and source builds put the language data; checked before
# asking the tesseract binary (a subprocess) where its data lives.
TESSDATA_GLOBS: tuple[str, ...] = (
    "/usr/share/tesseract-ocr/*/tessdata",
    "/usr/share/tessdata",
    "/usr/local/share/tessdata",
    "/opt/homebrew/share/tessdata",
)


@dataclass(frozen=True)
class OcrOptions:
    """What the parser needs to know about OCR, decoupled from ``Settings``."""

    enabled: bool = True
    language: str = "eng"  # Tesseract language(s): "eng", "eng+deu"
    dpi: int = 300
    timeout_s: float = 300.0  # OCR time per document
    tessdata_dir: Path | None = None  # None: TESSDATA_PREFIX, then the system's folder
    confidence_pass: bool = True  # run the tesseract CLI for word confidences
    low_confidence: float = 0.5  # a text line whose mean word confidence is under this is a low-confidence region

    @property
    def languages(self) -> list[str]:
        return [part for part in self.language.split("+") if part]


@dataclass(frozen=True)
class OcrEngine:
    """OCR that can run here: the tessdata folder MuPDF reads, and the CLI used for confidences."""

    tessdata: Path
    cli: str | None  # path of the tesseract command, None when absent or the pass is off


@dataclass(frozen=True)
class PageOcr:
    """One page's OCR: the text page to extract lines from, and its confidence."""

    textpage: pymupdf.TextPage
    confidence: float | None  # mean word confidence 0..1, None when unknown
    words: int  # words behind ``confidence``
    seconds: float
    lines: int | None = None  # text lines the confidence pass read (None: unknown)
    low_regions: tuple[OcrRegion, ...] = ()  # lines under ``OcrOptions.low_confidence``


def _candidate_dirs(configured: Path | None) -> list[Path]:
    """Tessdata folders to try, in the order a user would expect to win."""
    if configured is not None:
        return [Path(configured).expanduser()]
    found: list[Path] = []
    env = os.environ.get("TESSDATA_PREFIX")
    if env:
        found.append(Path(env))
    for pattern in TESSDATA_GLOBS:
        found.extend(Path(p) for p in sorted(glob.glob(pattern), reverse=True))  # newest version first
    return found


def locate_tessdata(options: OcrOptions) -> tuple[Path | None, str]:
    """(tessdata folder holding every wanted language, "") or (None, why not).

    A configured folder is the only one tried: silently using another would hide a typo.
    """
    wanted = options.languages
    if not wanted:
        return None, f"no OCR language configured (GROUNDWORK_OCR_LANGUAGE={options.language!r})"
    candidates = _candidate_dirs(options.tessdata_dir)
    if options.tessdata_dir is None and not candidates and shutil.which("tesseract"):
        import pymupdf  # noqa: PLC0415 - PyMuPDF, ~1 s to import

        try:  # ask the installed tesseract where its data is (spawns `tesseract --list-langs`)
            candidates.append(Path(pymupdf.get_tessdata()))
        except RuntimeError:
            pass
    for folder in candidates:
        if all((folder / f"{lang}.traineddata").is_file() for lang in wanted):
            return folder, ""
    files = ", ".join(f"{lang}.traineddata" for lang in wanted)
    if options.tessdata_dir is not None:
        return None, f"{files} not found in GROUNDWORK_TESSDATA_DIR={options.tessdata_dir}"
    if candidates:
        return None, f"{files} not found in {', '.join(str(c) for c in candidates)}"
    return None, "Tesseract is not installed (no tessdata folder found)"


def ocr_engine(options: OcrOptions) -> tuple[OcrEngine | None, str]:
    """The engine when OCR can run with these options, else (None, the reason in plain words)."""
    if not options.enabled:
        return None, "OCR is switched off (GROUNDWORK_OCR_ENABLED=false)"
    tessdata, why = locate_tessdata(options)
    if tessdata is None:
        return None, f"OCR is unavailable: {why}"
    cli = shutil.which("tesseract") if options.confidence_pass else None
    return OcrEngine(tessdata=tessdata, cli=cli), ""


def _word_rows(tsv: str) -> Iterator[tuple[list[str], float]]:
    """(columns, confidence) of each recognised word row of tesseract TSV output: level 5, with text and a
    confidence of 0 or more (tesseract writes -1 for rows that are not recognised words)."""
    for line in tsv.splitlines()[1:]:
        cols = line.split("\t")
        if len(cols) < 12 or cols[0] != "5" or not cols[11].strip():
            continue
        try:
            conf = float(cols[10])
        except ValueError:
            continue
        if conf >= 0:
            yield cols, conf


def mean_word_confidence(tsv: str) -> tuple[float | None, int]:
    """(mean word confidence in 0..1, word count) from tesseract TSV output.

    Word rows are level 5 with text; Tesseract writes conf -1 for rows that are
    not recognised words, and those are left out.
    """
    confidences = [min(conf, 100.0) for _, conf in _word_rows(tsv)]
    return (sum(confidences) / len(confidences) / 100.0, len(confidences)) if confidences else (None, 0)


@dataclass(frozen=True)
class TsvReading:
    """What the confidence pass read from tesseract's TSV: the page's mean word confidence and its text lines."""

    confidence: float | None
    words: int
    lines: tuple[OcrRegion, ...] = ()

    def low(self, threshold: float) -> tuple[OcrRegion, ...]:
        """The lines whose mean word confidence is under ``threshold``: the regions a person should check."""
        return tuple(line for line in self.lines if line.confidence < threshold)


def read_tsv(tsv: str, dpi: int) -> TsvReading:
    """The page's mean word confidence (``mean_word_confidence``) and each text line (tesseract's block,
    paragraph and line numbers) with the mean confidence of its words and its box, in PDF points (pixels at
    ``dpi`` * 72 / dpi).  Rows that are not recognised words (conf -1, no text) are left out."""
    confidence, words = mean_word_confidence(tsv)
    scale = 72.0 / dpi
    grouped: dict[tuple[str, str, str, str], list[tuple[float, int, int, int, int, str]]] = {}
    for cols, conf in _word_rows(tsv):
        try:
            left, top, width, height = (int(cols[i]) for i in (6, 7, 8, 9))
        except ValueError:
            continue
        grouped.setdefault((cols[1], cols[2], cols[3], cols[4]), []).append(
            (min(conf, 100.0) / 100.0, left, top, left + width, top + height, cols[11].strip()))
    lines = tuple(
        OcrRegion(
            x0=round(min(w[1] for w in group) * scale, 2), y0=round(min(w[2] for w in group) * scale, 2),
            x1=round(max(w[3] for w in group) * scale, 2), y1=round(max(w[4] for w in group) * scale, 2),
            confidence=round(sum(w[0] for w in group) / len(group), 4), words=len(group),
            text=" ".join(w[5] for w in group),
        )
        for group in grouped.values()
    )
    return TsvReading(confidence, words, lines)


class _ConfidencePass:
    """The tesseract CLI reading the page image in a child process, beside MuPDF's OCR."""

    def __init__(self, cli: str, page: pymupdf.Page, options: OcrOptions, tessdata: Path) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="groundwork-ocr-")
        image = Path(self._dir.name) / "page.pnm"
        self._out = Path(self._dir.name) / "page"
        env = {**os.environ, "OMP_THREAD_LIMIT": "1"}  # one core for it, one for MuPDF's OCR
        try:
            # the same rendering get_textpage_ocr makes; PNM because it needs no compression
            page.get_pixmap(dpi=options.dpi).save(image)
            self._proc = subprocess.Popen(
                [cli, str(image), str(self._out), "-l", options.language, "--dpi", str(options.dpi),
                 "--tessdata-dir", str(tessdata), "tsv"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
            )
        except BaseException:
            self._dir.cleanup()
            raise

    def result(self, timeout_s: float, dpi: int) -> TsvReading | None:
        """What the TSV says, waiting at most ``timeout_s``; None when the child is killed or fails."""
        try:
            _, stderr = self._proc.communicate(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            log.warning("tesseract confidence pass stopped: the document's OCR time budget is spent")
            self.cancel()
            return None
        try:  # a failed confidence pass costs the confidence, never the page's text
            if self._proc.returncode != 0:
                log.warning("tesseract confidence pass failed (%s): %s", self._proc.returncode,
                            stderr.decode(errors="replace").strip()[:300])
                return None
            tsv = Path(f"{self._out}.tsv").read_text(encoding="utf-8", errors="replace")
            return read_tsv(tsv, dpi)
        except OSError as exc:
            log.warning("tesseract confidence pass output unreadable: %s", exc)
            return None
        finally:
            self._dir.cleanup()

    def cancel(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._dir.cleanup()


@dataclass
class DocumentOcr:
    """OCR of one document: availability, the time budget, and the stats that go into metadata.

    Created lazily by the PDF parser on the first page without a text layer, so a
    digital PDF never pays for the availability check.
    """

    path: Path
    options: OcrOptions
    page_count: int
    engine: OcrEngine | None = None
    unavailable: str = ""  # why OCR cannot run, when it cannot
    seconds: float = 0.0  # OCR time spent so far
    pages_tried: int = 0
    pages_done: list[int] = field(default_factory=list)
    confidences: list[tuple[float, int]] = field(default_factory=list)  # (page mean, words)
    failed_pages: dict[int, str] = field(default_factory=dict)
    low_regions: dict[int, int] = field(default_factory=dict)  # page -> low-confidence lines on it

    @classmethod
    def start(cls, path: Path, options: OcrOptions, page_count: int) -> "DocumentOcr":
        engine, why = ocr_engine(options)
        if engine is None:
            log.info("%s: pages without a text layer are not OCR'd: %s", path, why)
        return cls(path=path, options=options, page_count=page_count, engine=engine, unavailable=why)

    @property
    def available(self) -> bool:
        return self.engine is not None

    def _check_budget(self, page_number: int) -> None:
        if self.seconds >= self.options.timeout_s:
            raise OcrTimeoutError(
                self.path, page_number=page_number, page_count=self.page_count, pages_done=self.pages_tried,
                seconds=self.seconds, limit_s=self.options.timeout_s,
            )

    def ocr_page(self, page: pymupdf.Page, flags: int) -> PageOcr | None:
        """OCR one page, or None when OCR is unavailable or failed on this page (recorded).

        Raises ``OcrTimeoutError`` when the document's OCR budget is used up.
        """
        if self.engine is None:
            return None
        page_number = page.number + 1
        self._check_budget(page_number)
        self.pages_tried += 1
        started = time.monotonic()
        confidence_pass = None
        try:
            if self.engine.cli:
                try:
                    confidence_pass = _ConfidencePass(self.engine.cli, page, self.options, self.engine.tessdata)
                except OSError as exc:  # cannot start the command: text without confidence
                    log.warning("%s page %d: tesseract confidence pass not started: %s", self.path, page_number, exc)
            textpage = page.get_textpage_ocr(
                flags=flags, language=self.options.language, dpi=self.options.dpi, full=True,
                tessdata=str(self.engine.tessdata),
            )
            reading = None
            if confidence_pass is not None:
                remaining = self.options.timeout_s - (self.seconds + time.monotonic() - started)
                reading = confidence_pass.result(remaining, self.options.dpi)
                confidence_pass = None
        except Exception as exc:  # noqa: BLE001 - one page MuPDF cannot OCR must not cost the document
            self.seconds += time.monotonic() - started
            self.failed_pages[page_number] = f"{type(exc).__name__}: {exc}"[:200]
            log.warning("%s page %d: OCR failed: %s", self.path, page_number, exc)
            return None
        finally:
            if confidence_pass is not None:
                confidence_pass.cancel()
        elapsed = time.monotonic() - started
        self.seconds += elapsed
        if reading is None:
            return PageOcr(textpage=textpage, confidence=None, words=0, seconds=elapsed)
        return PageOcr(textpage=textpage, confidence=reading.confidence, words=reading.words, seconds=elapsed,
                       lines=len(reading.lines), low_regions=reading.low(self.options.low_confidence))

    def record(self, page_number: int, result: PageOcr) -> None:
        """Count a page whose OCR produced text."""
        self.pages_done.append(page_number)
        if result.confidence is not None:
            self.confidences.append((result.confidence, result.words))
        if result.low_regions:
            self.low_regions[page_number] = len(result.low_regions)

    @property
    def mean_confidence(self) -> float | None:
        """Word-weighted mean over the OCR'd pages whose confidence is known."""
        words = sum(n for _, n in self.confidences)
        if not words:
            return None
        return sum(conf * n for conf, n in self.confidences) / words

    def metadata(self) -> dict[str, object]:
        """The OCR facts stored with the document (and read back for failure reasons)."""
        status = "done" if self.available else ("disabled" if not self.options.enabled else "unavailable")
        meta: dict[str, object] = {
            "ocr_status": status,
            "pages_ocr": list(self.pages_done),
            "ocr_mean_confidence": round(self.mean_confidence, 4) if self.mean_confidence is not None else None,
            "ocr_seconds": round(self.seconds, 3),
        }
        if self.unavailable:
            meta["ocr_unavailable"] = self.unavailable
        if self.low_regions:  # pages a person should check, threshold with them
            meta["ocr_low_confidence_regions"] = {str(k): v for k, v in self.low_regions.items()}
            meta["ocr_low_confidence_threshold"] = self.options.low_confidence
        if self.failed_pages:
            meta["ocr_failed_pages"] = {str(k): v for k, v in self.failed_pages.items()}
        return meta


def missing_text_reason(missing: list[int], page_count: int, metadata: dict[str, object]) -> str:
    """Why pages without a text layer are still without text, with what to do about it."""
    shown = ", ".join(str(n) for n in missing[:20]) + (" …" if len(missing) > 20 else "")
    head = f"{len(missing)} of {page_count} pages have no text layer (scanned?): pages {shown}"
    status = metadata.get("ocr_status")
    if status == "unavailable":
        return f"{head}; {metadata.get('ocr_unavailable', 'OCR is unavailable')}, so they are not searchable; {INSTALL_HINT}"
    if status == "disabled":
        return f"{head}; not searchable because OCR is switched off (set GROUNDWORK_OCR_ENABLED=true to OCR them)"
    failed = metadata.get("ocr_failed_pages") or {}
    if failed:
        first = next(iter(failed.items()))
        return f"{head}; OCR failed on {len(failed)} of them (page {first[0]}: {first[1]}) and found no text on the rest"
    return f"{head}; OCR found no text on them (blank, photos or unreadable scans)"
