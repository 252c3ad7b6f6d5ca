"""``groundwork run``: the console/API (``groundwork serve``) and the Dagster UI (``dagster dev``) as one command
that starts both and stops both, with everything they started.

Each command starts in a process group of its own, so its group holds everything it starts (``dagster dev``'s
webserver, daemon, code servers and the runs they launch) and one ``killpg`` reaches all of it.  A stop - SIGINT
(Ctrl-C), SIGTERM or SIGHUP to the launcher - sends each command exactly one SIGINT, the graceful stop both commands
handle: to ``groundwork serve``'s whole group (uvicorn finishes its requests), to ``dagster dev``'s own process
alone (it shuts its webserver and daemon down, then its code server - see ``Command``).  Exactly
one: a terminal's Ctrl-C reaches only the launcher's own group, never the children's, because a second SIGINT
interrupts ``dagster dev``'s shutdown half way ("Aborted!") and makes uvicorn skip its graceful one.  The launcher
then waits until no process of any group is left, up to ``stop_timeout_s``; what is left then is killed (SIGKILL)
and a warning names it.  A stop signal that comes a second or more into the stop kills at once (a second Ctrl-C);
one that comes sooner is the same stop sent twice (SIGTERM to make's process group reaches the launcher directly
and through make).

A stop that was asked for ends with exit status 0: it is no failure, and ``make run`` prints no ``make: ***``
line for it (make reports a recipe command that exits non-zero or dies from a signal; on SIGINT or SIGTERM make
itself ends by that signal after its command, as a stopped program should).  When one command exits by itself
(a port in use, a bad setting), the other is stopped the same way and its status is the launcher's.

On Linux the launcher is also a child subreaper, so processes a command's exit orphans are reparented to it and
reaped here instead of lingering, and each command gets SIGTERM should the launcher itself die
(``PR_SET_PDEATHSIG``; both commands stop on SIGTERM as on SIGINT).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from knowledge_store.core.errors import ConfigError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
DEFAULT_STOP_TIMEOUT_S = 150.0  # dagster dev itself waits up to 60 s for its webserver, then 60 s for its daemon
POLL_S = 0.2
AGAIN_AFTER_S = 1.0  # a stop signal this long into the stop asks to kill at once
KILL_WAIT_S = 10.0  # after SIGKILL: until the kernel has taken every process of the groups down

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Command:
    """One long-running command: ``name`` is how messages call it, ``argv`` what runs.

    ``stops_its_own_children``: the stop's SIGINT goes to the command's own process only, which then stops what
    it started in its own order.  ``dagster dev`` is such a command: it tells its webserver and daemon to stop,
    waits for them, and only then stops its code server - a SIGINT to its whole group stops the code server at
    once, while the daemon may still be evaluating a sensor against it (a "could not reach user code server"
    traceback at every stop).  Otherwise the whole group gets the SIGINT."""

    name: str
    argv: Sequence[str]
    stops_its_own_children: bool = False


def workbench_commands(workspace: Path, dagster_host: str, dagster_port: int) -> list[Command]:
    """What ``make run`` serves: the console + API, and ``dagster dev`` on ``workspace`` (``workspace.yaml``).
    Both run on this interpreter and inherit the environment, so they read the same ``GROUNDWORK_*`` settings."""
    if not workspace.is_file():
        raise ConfigError("--workspace", str(workspace), "no such file: dagster dev loads the Dagster project from "
                                                          "it (run from the repository root, where workspace.yaml is)")
    return [
        Command("groundwork serve", [sys.executable, "-m", "knowledge_store.cli", "serve"]),
        Command("dagster dev", [sys.executable, "-m", "dagster", "dev", "-w", str(workspace), "-h", dagster_host,
                                "-p", str(dagster_port)], stops_its_own_children=True),
    ]


def _say(line: str) -> None:
    try:
        print(f"groundwork run: {line}", file=sys.stderr, flush=True)
    except OSError:  # the terminal is gone (SIGHUP): stopping matters more than saying so
        pass


def _libc_prctl() -> Callable[[int, int], bool] | None:
    """``prctl(2)`` on Linux as ``prctl(option, value) -> succeeded`` (subreaper, parent-death signal); None
    elsewhere.  The arguments go as C unsigned longs: prctl is variadic and the kernel reads whole registers."""
    if not sys.platform.startswith("linux"):
        return None
    function = ctypes.CDLL(None, use_errno=True).prctl
    zero = ctypes.c_ulong(0)
    return lambda option, value: function(ctypes.c_int(option), ctypes.c_ulong(value), zero, zero, zero) == 0


def _group_alive(pgid: int) -> bool:
    """Whether any process (a zombie not yet reaped included) is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member exists but is not ours to signal
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group ended meanwhile


def _reap_orphans(own: dict[int, subprocess.Popen]) -> None:
    """Reap the exited processes reparented to this (subreaper) process; the commands themselves are left to
    ``Popen.poll``, which keeps their exit status."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in own:
            return
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            return


def _status(code: int) -> int:
    """A command's ``Popen.returncode`` as a process exit status (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


def run_together(commands: Sequence[Command], stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
                 say: Callable[[str], None] = _say) -> int:
    """Start ``commands``, each in a process group of its own, and stop them all when a stop signal arrives or
    one of them exits by itself (the module docstring says how).  Returns 0 after a requested stop, else the
    exit status of the command that ended first (1 if it exited 0: a workbench command that ends is a failure)."""
    if os.name != "posix":
        raise ConfigError("platform", os.name, "groundwork run needs POSIX process groups; start groundwork serve "
                                               "and dagster dev in two terminals instead")
    received: list[tuple[int, float]] = []  # (signal, monotonic time) of every stop signal

    def on_signal(signum: int, _frame: object) -> None:
        received.append((signum, time.monotonic()))

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    prctl = _libc_prctl()
    subreaper = prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1)
    launcher_pid = os.getpid()

    def die_with_launcher() -> None:  # runs in the child between fork and exec
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != launcher_pid:  # the launcher died before the line above
                os.kill(os.getpid(), signal.SIGTERM)

    started: dict[int, tuple[Command, subprocess.Popen]] = {}
    try:
        for command in commands:
            process = subprocess.Popen(list(command.argv), stdin=subprocess.DEVNULL, process_group=0,
                                       preexec_fn=die_with_launcher)
            started[process.pid] = (command, process)
        say(" and ".join(f"{command.name} (pid {pid})" for pid, (command, _) in started.items())
            + " started; Ctrl-C or SIGTERM stops them")
        ended: tuple[Command, int] | None = None
        while not received and ended is None:
            for command, process in started.values():
                if process.poll() is not None:
                    ended = (command, process.returncode)
                    break
            else:
                if subreaper:
                    _reap_orphans({pid: process for pid, (_, process) in started.items()})
                time.sleep(POLL_S)
        status = 0
        if received:
            say(f"{signal.Signals(received[0][0]).name} received: stopping "
                f"{' and '.join(command.name for command, _ in started.values())} (up to {stop_timeout_s:g} s; "
                "a second Ctrl-C or SIGTERM kills them at once)")
        elif ended is not None:
            command, code = ended
            status = _status(code) or 1
            say(f"{command.name} exited with status {_status(code)}: stopping the rest")
        _stop(started, stop_timeout_s, received, subreaper, say)
        return status
    except BaseException:  # a command that cannot start: stop the ones that did, then say why
        _stop(started, stop_timeout_s, received, subreaper, say)
        raise
    finally:
        for sig, handler in previous.items():
            # after a requested stop the process is on its way out: a stop signal that comes now (the same stop
            # sent twice, SIGTERM to make's group) must not end it by signal after it stopped cleanly
            signal.signal(sig, signal.SIG_IGN if received else handler)


def _stop(started: dict[int, tuple[Command, subprocess.Popen]], stop_timeout_s: float,
          received: list[tuple[int, float]], subreaper: bool, say: Callable[[str], None]) -> None:
    """One SIGINT to each group still there (to its leader alone for a command that stops its own children);
    wait until every group is empty, killing what is left at the deadline or when a stop signal comes
    ``AGAIN_AFTER_S`` or more into the stop."""
    own = {pid: process for pid, (_, process) in started.items()}
    for pgid, (command, process) in started.items():  # a command's process group id is its pid (process_group=0)
        if command.stops_its_own_children and process.poll() is None:
            process.send_signal(signal.SIGINT)
        elif _group_alive(pgid):
            _signal_group(pgid, signal.SIGINT)
    began = time.monotonic()
    deadline = began + stop_timeout_s
    killed_at: float | None = None
    while True:
        for process in own.values():
            process.poll()
        if subreaper:
            _reap_orphans(own)
        alive = [pgid for pgid in started if _group_alive(pgid)]
        if not alive:
            return
        now = time.monotonic()
        again = any(at >= began + AGAIN_AFTER_S for _, at in received)
        if killed_at is None and (now >= deadline or again):
            why = "stop signal received again" if again else f"still running {stop_timeout_s:g} s after the stop"
            say(f"{why}: killing {' and '.join(started[pgid][0].name for pgid in alive)} "
                f"with everything they started")
            for pgid in alive:
                _signal_group(pgid, signal.SIGKILL)
            killed_at = now
        elif killed_at is not None and now - killed_at > KILL_WAIT_S:
            say(f"processes of group(s) {alive} are still there {KILL_WAIT_S:g} s after SIGKILL")
            return
        time.sleep(POLL_S / 2)
