"""`groundwork run` (what `make run` starts) stops the console/API, `dagster dev` and everything they started on
SIGTERM or Ctrl-C, within its timeout, with exit status 0 and no error output (knowledge_store.app.launcher).

The first tests drive the launcher with small stand-in commands (a well-behaved one, one that ignores SIGINT,
one that fails); the slow ones start the real pair on a temporary data dir and Dagster instance and stop it the
two ways it is stopped: SIGTERM to the launcher (what make does on SIGTERM) and SIGINT to its process group
(Ctrl-C in a terminal).  Process trees are read from /proc: Linux only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers import REPO_ROOT, free_port

if not sys.platform.startswith("linux"):
    pytest.skip("reads process trees from /proc", allow_module_level=True)

ERROR_MARKERS = ("Traceback", "Aborted!", "Segmentation fault", "make: ***", " - ERROR - ", "ERROR:")

# The launcher with commands from argv[1] (JSON [[name, argv], ...]) and the stop timeout from argv[2]
LAUNCHER = """
import json, sys
from knowledge_store.app.launcher import Command, run_together
sys.exit(run_together([Command(name, argv) for name, argv in json.loads(sys.argv[1])], float(sys.argv[2])))
"""
# A stand-in command (SOURCE is its own text, prepended by _stand_in): starts one grandchild like itself; on SIGINT
# both exit 0 (the parent after its grandchild), unless IGNORE_SIGINT is set, then neither reacts; EXIT_AFTER=N: the
# parent exits with status N after a second
STAND_IN = """
import os, signal, subprocess, sys, time
if os.environ.get("IGNORE_SIGINT"):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if len(sys.argv) == 1:
    grandchild = subprocess.Popen([sys.executable, "-c", SOURCE, "leaf"])
    if not os.environ.get("IGNORE_SIGINT"):
        signal.signal(signal.SIGINT, lambda *_: (grandchild.wait(), sys.exit(0)))
    if os.environ.get("EXIT_AFTER"):
        time.sleep(1)
        sys.exit(int(os.environ["EXIT_AFTER"]))
elif not os.environ.get("IGNORE_SIGINT"):
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
time.sleep(600)
"""


def _stand_in(name: str, *settings: str) -> list:
    """[name, argv] of a stand-in command; ``settings`` (``EXIT_AFTER=3``) go into its environment only."""
    source = f"SOURCE = {STAND_IN!r}\n{STAND_IN}"
    return [name, ["/usr/bin/env", *settings, sys.executable, "-c", source]]


def _process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state) for every process in /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def _descendants(pid: int) -> set[int]:
    table = _process_table()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, (parent, _, _) in table.items() if parent in frontier} - found
        found |= frontier
    return found


def _running(pids: set[int]) -> dict[int, str]:
    """The pids still running (zombies are not), with their command lines."""
    table = _process_table()
    running = {}
    for pid in pids:
        if pid in table and table[pid][2] != "Z":
            try:
                running[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            except OSError:
                continue
    return running


def _wait_for(condition, timeout_s: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-4000:] if log else ""
    raise AssertionError(f"{what} not within {timeout_s:g} s\n{tail}")


def _launch(commands: list, stop_timeout_s: float, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-c", LAUNCHER, json.dumps(commands), str(stop_timeout_s)],
                                env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop_and_check(launcher: subprocess.Popen, how: str, log: Path, timeout_s: float) -> tuple[int, str]:
    """Stop the launcher ``how`` (SIGTERM to it, or SIGINT to its process group as a terminal's Ctrl-C does);
    returns its exit status and output once it ended, after checking that nothing it started still runs."""
    started = _descendants(launcher.pid)
    if how == "SIGTERM":
        launcher.send_signal(signal.SIGTERM)
    else:
        os.killpg(launcher.pid, signal.SIGINT)
    try:
        status = launcher.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        raise AssertionError(f"the launcher did not end within {timeout_s:g} s:\n{log.read_text()[-4000:]}") from None
    assert not _running(started), f"left running after the stop: {_running(started)}"
    return status, log.read_text(errors="replace")


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_a_stop_reaches_every_command_and_grandchild_and_exits_0(tmp_path, how):
    log = tmp_path / "launcher.log"
    launcher = _launch([_stand_in("first"), _stand_in("second")], 60, log)
    _wait_for(lambda: len(_descendants(launcher.pid)) >= 4, 30, "two commands with a grandchild each", log)
    status, output = _stop_and_check(launcher, how, log, 60)
    assert status == 0, output
    assert "SIGTERM received" in output if how == "SIGTERM" else "SIGINT received" in output
    assert "killing" not in output and not [m for m in ERROR_MARKERS if m in output], output


def test_what_ignores_the_stop_is_killed_at_the_timeout_and_named(tmp_path):
    log = tmp_path / "launcher.log"
    launcher = _launch([_stand_in("stubborn")], 2, log, env={"IGNORE_SIGINT": "1"})
    _wait_for(lambda: len(_descendants(launcher.pid)) >= 2, 30, "the command and its grandchild", log)
    begun = time.monotonic()
    status, output = _stop_and_check(launcher, "SIGTERM", log, 30)
    assert status == 0, output
    assert "still running 2 s after the stop: killing stubborn with everything they started" in output
    assert 2 <= time.monotonic() - begun < 15


def test_a_second_stop_signal_kills_at_once_but_one_sent_twice_at_once_is_one_stop(tmp_path):
    log = tmp_path / "stubborn.log"
    launcher = _launch([_stand_in("stubborn")], 120, log, env={"IGNORE_SIGINT": "1"})
    _wait_for(lambda: len(_descendants(launcher.pid)) >= 2, 30, "the command and its grandchild", log)
    started = _descendants(launcher.pid)
    launcher.send_signal(signal.SIGTERM)
    time.sleep(2)
    begun = time.monotonic()
    launcher.send_signal(signal.SIGINT)  # a second Ctrl-C
    assert launcher.wait(timeout=30) == 0
    assert time.monotonic() - begun < 15 and not _running(started)
    assert "stop signal received again: killing stubborn with everything they started" in log.read_text()

    log = tmp_path / "twice.log"  # SIGTERM to make's group: the launcher gets it directly and from make
    launcher = _launch([_stand_in("first"), _stand_in("second")], 60, log)
    _wait_for(lambda: len(_descendants(launcher.pid)) >= 4, 30, "two commands with a grandchild each", log)
    started = _descendants(launcher.pid)
    launcher.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=60) == 0
    assert "killing" not in log.read_text() and not _running(started)


def test_a_command_that_exits_stops_the_others_and_gives_its_status(tmp_path):
    log = tmp_path / "launcher.log"
    launcher = _launch([_stand_in("steady"), _stand_in("failing", "EXIT_AFTER=3")], 30, log)
    started = _wait_for(lambda: _descendants(launcher.pid), 30, "the commands", log)
    status = launcher.wait(timeout=60)
    output = log.read_text()
    assert status == 3, output
    assert "failing exited with status 3: stopping the rest" in output
    assert not _running(started | _descendants(launcher.pid)), output


def test_a_missing_workspace_or_a_bad_stop_timeout_is_one_error_line_and_starts_nothing(tmp_path, capsys):
    from knowledge_store.cli import main

    before = _descendants(os.getpid())
    missing = tmp_path / "nowhere.yaml"
    assert main(["run", "--workspace", str(missing)]) == 2
    assert f"error: --workspace='{missing}': no such file: dagster dev loads the Dagster project from it" in \
        capsys.readouterr().err
    assert main(["run", "--stop-timeout", "0"]) == 2
    assert "error: --stop-timeout=0.0: must be more than 0 seconds" in capsys.readouterr().err
    assert _descendants(os.getpid()) == before


# ------------------------------------------------------------------------------------------- the real pair


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _location_loaded(port: int) -> bool:
    query = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"
    try:
        entries = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": query}, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return False
    return [e["loadStatus"] for e in entries["data"]["workspaceOrError"]["locationEntries"]] == ["LOADED"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_groundwork_run_stops_serve_and_dagster_dev_with_all_their_processes(tmp_path, how):
    home = tmp_path / "dagster_home"
    home.mkdir()
    instance = yaml.safe_load((REPO_ROOT / "pipelines" / "dagster.yaml").read_text())
    # the runs the sensors request stay queued: this stops Dagster's services, not an ingest run (a run
    # interrupted in flight is reported by Dagster with its traceback, as it should be)
    instance["concurrency"]["runs"]["max_concurrent_runs"] = 0
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance))
    api_port, dagster_port = free_port(), free_port()
    log = tmp_path / "run.log"
    env = {"DAGSTER_HOME": str(home), "GROUNDWORK_DATA_DIR": str(tmp_path / "data"), "GROUNDWORK_TORCH_THREADS": "1"}
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "knowledge_store.cli", "run", "--port", str(api_port), "--dagster-port",
             str(dagster_port), "--workspace", str(REPO_ROOT / "workspace.yaml")],
            env={**os.environ, **env}, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for(lambda: _port_open(api_port) and _port_open(dagster_port) and _location_loaded(dagster_port),
                  300, "both ports open and the code location loaded", log)
        status, output = _stop_and_check(launcher, how, log, 240)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert status == 0, output[-4000:]
    assert not _port_open(api_port) and not _port_open(dagster_port)
    assert "Dagster services shut down." in output  # dagster dev finished its own shutdown: nothing was killed
    assert "killing" not in output
    assert not [m for m in ERROR_MARKERS if m in output], output[-6000:]
