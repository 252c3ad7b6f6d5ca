"""Run the parameterised notebooks in ``notebooks/`` with papermill.

Executed notebooks (with their outputs and plots) are kept under
``<data_dir>/notebooks/<name>-<UTC timestamp>/``; the result says where.
Used by the Dagster notebook assets and by ``groundwork notebook NAME -p KEY VALUE``.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from knowledge_store.config.settings import PROJECT_ROOT, Settings
from knowledge_store.core.errors import GroundworkError

NOTEBOOK_DIR = PROJECT_ROOT / "notebooks"


class NotebookError(GroundworkError):
    """A notebook is unknown, or failed while running (names the notebook and the cell error)."""


@dataclass
class NotebookRun:
    name: str
    output_notebook: Path
    output_dir: Path
    parameters: dict[str, Any]
    seconds: float
    plots: list[Path]
    tables: list[Path]
    summary: dict[str, Any]


def available() -> list[str]:
    return sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb"))


def parse_value(text: str) -> Any:
    """``-p alphas '[0, 0.5, 1]'`` -> a list; ``-p k 5`` -> 5; anything else stays a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def run_notebook(name: str, parameters: dict[str, Any] | None = None, settings: Settings | None = None,
                 timeout_s: int = 3600) -> NotebookRun:
    import papermill  # noqa: PLC0415 - papermill, ~0.5 s to import

    source = NOTEBOOK_DIR / f"{name}.ipynb"
    if not source.is_file():
        raise NotebookError(f"unknown notebook '{name}'; available: {', '.join(available())}")
    settings = settings or Settings()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = (settings.data_dir / "notebooks" / f"{name}-{stamp}").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    params = {**(parameters or {}), "output_dir": str(out_dir)}
    target = out_dir / f"{name}.ipynb"
    started = time.perf_counter()
    env_before = os.environ.get("RAGAS_DO_NOT_TRACK")
    os.environ["RAGAS_DO_NOT_TRACK"] = "true"
    try:
        papermill.execute_notebook(
            str(source), str(target), parameters=params, kernel_name="python3", cwd=str(PROJECT_ROOT),
            progress_bar=False, execution_timeout=timeout_s,
        )
    except papermill.PapermillExecutionError as error:
        raise NotebookError(f"notebook '{name}' failed in cell {error.exec_count}: {error.ename}: {error.evalue} "
                            f"(partial output kept at {target})") from error
    finally:
        if env_before is None:
            os.environ.pop("RAGAS_DO_NOT_TRACK", None)
    summary: dict[str, Any] = {}
    notebook = json.loads(target.read_text())
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", [])) if output.get("output_type") == "stream" else ""
            for line in text.splitlines():
                if re.match(r"^\{.*\}$", line.strip()):
                    try:
                        summary.update(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    return NotebookRun(name=name, output_notebook=target, output_dir=out_dir, parameters=params,
                       seconds=time.perf_counter() - started, plots=sorted(out_dir.glob("*.png")),
                       tables=sorted(out_dir.glob("*.csv")), summary=summary)
