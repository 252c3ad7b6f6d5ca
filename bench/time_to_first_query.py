"""Time from a fresh clone to the first answered query with `make run` (seed target < 5 min).

Clones this repository (its committed HEAD) into a temporary folder, runs `make run`
there with free ports, and polls the API until `POST /api/knowledge/query` answers
with results. Reports the phases seen in make's output (venv + install, which builds the
default model's graphs, ingest of the default corpus, server up) and the total, with machine,
CPU flags, date, load and whether pip had a cache (`--no-pip-cache` sets PIP_NO_CACHE_DIR=1:
every wheel comes from the package index again, as on a fresh machine). The per-user model
cache is a new empty folder (XDG_CACHE_HOME), as on a fresh machine. Then a second data dir is
ingested in the clone with the same model cache: it must reuse the machine's graphs (no export),
and its time is reported too. `--write` puts it into docs/BENCHMARKS.md.

    .venv/bin/python bench/time_to_first_query.py [--no-pip-cache] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Time to first query from a fresh clone, new machine (empty model cache)"
QUESTION = "how do I reset the Aurora to factory settings"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return ", ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f in flags) or "no AVX2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-pip-cache", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="gw-ttfq-") as tmp:
        clone = Path(tmp) / "groundwork"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        api, dagster = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GROUNDWORK_", "VIRTUAL_ENV", "DAGSTER_HOME"))}
        env.update(API_PORT=str(api), DAGSTER_PORT=str(dagster), PATH=os.environ["PATH"],
                   XDG_CACHE_HOME=str(Path(tmp) / "user-cache"))  # no model graphs built yet, as on a new machine
        if args.no_pip_cache:
            env["PIP_NO_CACHE_DIR"] = "1"
        began = time.monotonic()
        marks: dict[str, float] = {}
        proc = subprocess.Popen(["make", "run", f"API_PORT={api}", f"DAGSTER_PORT={dagster}"], cwd=clone, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: list[str] = []

        def read() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.append(line)
                now = time.monotonic() - began
                if "touch .venv/.installed" in line:
                    marks.setdefault("installed", now)
                if "groundwork ingest" in line:
                    marks.setdefault("ingest_started", now)
                if "Console + API" in line:
                    marks.setdefault("ingested", now)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        answered = None
        try:
            while time.monotonic() - began < args.timeout and proc.poll() is None:
                try:
                    response = httpx.post(f"http://127.0.0.1:{api}/api/knowledge/query", json={"query": QUESTION, "k": 3},
                                          timeout=10)
                    if response.status_code == 200 and response.json()["results"]:
                        answered = time.monotonic() - began
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(1.0)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        if answered is None:
            raise SystemExit("no answered query:\n" + "".join(lines[-60:]))
        # a second data dir on the same machine: the graphs in the per-user cache are reused, nothing is exported
        second_began = time.monotonic()
        second = subprocess.run([str(clone / ".venv" / "bin" / "groundwork"), "ingest", "--json", "--data-dir",
                                 str(Path(tmp) / "second-data")], cwd=clone, env=env, capture_output=True, text=True)
        second_s = time.monotonic() - second_began
        exported_again = "exporting" in second.stderr
        if second.returncode != 0:
            raise SystemExit(f"the second data dir's ingest failed:\n{second.stderr[-3000:]}")
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{cpu_model()}, {os.cpu_count()} cores", "cpu_flags": cpu_flags(), "load_before": load_before,
              "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()), "pip_cache": not args.no_pip_cache,
              "install_s": round(marks.get("installed", float("nan")), 1),
              "ingested_s": round(marks.get("ingested", float("nan")), 1), "first_answer_s": round(answered, 1),
              "second_data_dir_ingest_s": round(second_s, 1), "second_data_dir_exported": exported_again}
    print(json.dumps(result, indent=2))
    if args.write:
        write_section(result)


def write_section(r: dict) -> None:
    cache = "warm pip cache" if r["pip_cache"] else "no pip cache (PIP_NO_CACHE_DIR=1: every wheel fetched from the index)"
    row = (f"| {r['date']} | {cache} | {r['install_s']} s | {r['ingested_s']} s | **{r['first_answer_s']} s "
           f"({r['first_answer_s'] / 60:.1f} min)** | {r['second_data_dir_ingest_s']} s"
           f"{', exported again' if r['second_data_dir_exported'] else ', no export'} | {r['load_before']} / {r['load_after']} "
           f"| {r['cpu_flags']} |")
    path = ROOT / "docs" / "BENCHMARKS.md"
    content = path.read_text()
    header = (f"{SECTION}\n\n`bench/time_to_first_query.py`: `git clone` of HEAD into a temporary folder, `make run`, then a\n"
              f"query every second until `POST /api/knowledge/query` answers with results. Machine: {r['machine']}.\n"
              "Columns are seconds since `make run` started. Seed target: under 5 minutes.\n\n"
              "| date | pip | venv + install done | default corpus ingested | first answered query | second data dir "
              "ingested | load before / after | CPU flags |\n"
              "|---|---|---|---|---|---|---|---|\n")
    if SECTION in content:
        start = content.index(SECTION)
        nxt = content.find("\n## ", start + len(SECTION))
        block = content[start: nxt if nxt != -1 else len(content)].rstrip("\n")
        content = content[:start] + block + "\n" + row + "\n" + (content[nxt:] if nxt != -1 else "")
    else:
        content = content.rstrip("\n") + "\n\n" + header + row + "\n"
    path.write_text(content)


if __name__ == "__main__":
    main()
