"""Where benchmark results go: printed, and written to a markdown file under docs/."""

from __future__ import annotations

from pathlib import Path


def publish(lines: list[str], out: Path) -> str:
    """Join, print and write a benchmark's markdown section; returns the text."""
    text = "\n".join(lines)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text
