"""OCR speed of scanned PDF pages: seconds per page, with and without the confidence pass.

    .venv/bin/python bench/ocr_speed.py [--pdf ../shared/datasets/pdfs/R-intro.pdf] [--page 11]
        [--repeats 5] [--out docs/benchmarks/ocr.md]

Two image-only pages are made the way tests/helpers.py (make_pdf) makes them (a page
rendered to a pixmap, placed alone on a new page): the test's short text page
(rendered at 200 dpi) and one page of a real shared manual (rendered at 300 dpi,
like an office scanner).  Each is parsed by ``parse_pdf`` — the pipeline's code
path — at OCR dpi 200 and 300, with the tesseract-CLI confidence pass on and
off.  Reported: median wall seconds of OCR per page (``metadata["ocr_seconds"]``),
CPU seconds of the confidence child, the mean word confidence, and word recall
(share of the real page's text-layer words found in the OCR text).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pymupdf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import publish  # noqa: E402
from knowledge_store.ingest.parsers.ocr import OcrOptions  # noqa: E402
from knowledge_store.ingest.parsers.pdf import parse_pdf  # noqa: E402

TEST_LINES = (
    "Quarterly Maintenance Report",
    "The heat exchanger was inspected on Tuesday morning.",
    "Pressure readings stayed within the safe range.",
    "Replace the gasket before the winter season begins.",
)
_WORD = re.compile(r"[A-Za-z]{3,}")


def machine() -> str:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    tess = subprocess.run(["tesseract", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}, "
        f"PyMuPDF {pymupdf.__version__} (MuPDF {pymupdf.VersionFitz}), {tess} (CLI), "
        f"load average at start {os.getloadavg()[0]:.2f}"
    )


def image_only(source: pymupdf.Page, dpi: int, out: Path) -> Path:
    """``source`` as a picture on an otherwise empty page: no text layer, like a scan."""
    pixmap = source.get_pixmap(dpi=dpi)
    doc = pymupdf.open()
    page = doc.new_page(width=source.rect.width, height=source.rect.height)
    page.insert_image(page.rect, pixmap=pixmap)
    doc.save(out)
    assert pymupdf.open(out)[0].get_text().strip() == ""
    return out


def test_page(folder: Path) -> tuple[Path, str]:
    source = pymupdf.open()
    page = source.new_page()
    page.insert_text((72, 100), TEST_LINES[0], fontsize=20)
    for row, line in enumerate(TEST_LINES[1:]):
        page.insert_text((72, 140 + 20 * row), line, fontsize=12)
    return image_only(page, 200, folder / "test-page.pdf"), page.get_text()


def real_page(pdf: Path, number: int, folder: Path) -> tuple[Path, str]:
    page = pymupdf.open(pdf)[number - 1]
    return image_only(page, 300, folder / "real-page.pdf"), page.get_text()


def word_recall(truth: str, ocr: str) -> float:
    wanted = [w.lower() for w in _WORD.findall(truth)]
    found = {w.lower() for w in _WORD.findall(ocr)}
    return sum(w in found for w in wanted) / len(wanted) if wanted else 0.0


def measure(path: Path, truth: str, dpi: int, confidence: bool, repeats: int) -> dict[str, float | None]:
    seconds: list[float] = []
    child_cpu: list[float] = []
    parsed = None
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        parsed = parse_pdf(path, OcrOptions(dpi=dpi, confidence_pass=confidence))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds.append(float(parsed.metadata["ocr_seconds"]))
        child_cpu.append((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))
    assert parsed is not None and parsed.pages[0].ocr
    return {
        "median": statistics.median(seconds), "min": min(seconds), "max": max(seconds),
        "child_cpu": statistics.median(child_cpu), "confidence": parsed.pages[0].ocr_confidence,
        "recall": word_recall(truth, parsed.pages[0].text),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pdf", type=Path, default=ROOT.parent / "shared/datasets/pdfs/R-intro.pdf")
    parser.add_argument("--page", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/benchmarks/ocr.md")
    args = parser.parse_args()

    lines = [
        "# OCR speed (issue 6)",
        "",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {machine()}. "
        f"Median of {args.repeats} runs per row. Reproduce: `.venv/bin/python bench/ocr_speed.py`.",
        "",
        "| page | OCR dpi | confidence pass | s/page (median) | min–max | confidence-pass CPU s | mean word confidence | word recall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        pages = [("test page (4 lines, scanned at 200 dpi)", *test_page(folder)),
                 (f"{args.pdf.name} p.{args.page} (full page, scanned at 300 dpi)", *real_page(args.pdf, args.page, folder))]
        for label, path, truth in pages:
            for dpi in (200, 300):
                for confidence in (False, True):
                    r = measure(path, truth, dpi, confidence, args.repeats)
                    conf = f"{r['confidence']:.3f}" if r["confidence"] is not None else "None"
                    lines.append(
                        f"| {label} | {dpi} | {'on' if confidence else 'off'} | {r['median']:.2f} | "
                        f"{r['min']:.2f}–{r['max']:.2f} | {r['child_cpu']:.2f} | {conf} | {r['recall']:.3f} |"
                    )
                    print(lines[-1], flush=True)
    publish(lines, args.out)


if __name__ == "__main__":
    main()
