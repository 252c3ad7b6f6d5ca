"""Helpers that turn stage results into Dagster metadata the UI can show."""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg


def markdown_table(rows: Sequence[dict[str, object]], limit: int = 20) -> dg.MetadataValue:
    """A markdown preview table (first ``limit`` rows); an explicit note when empty."""
    if not rows:
        return dg.MetadataValue.md("_(none)_")
    columns = list(rows[0].keys())

    def cell(value: object) -> str:
        return str(value if value is not None else "").replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"\n_… {len(rows) - limit} more_")
    return dg.MetadataValue.md("\n".join(lines))
