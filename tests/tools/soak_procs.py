"""Process handling for the soak: each child starts in a new session (its own process group),
is SIGKILLed as a group (pool workers included), and every wait is bounded."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CLI = "import sys; from tokentape._src.program import main; sys.exit(main())"
"""``python -c CLI ARGS``: the tokentape command of the interpreter (and ``PYTHONPATH``) in use."""

_live: set[int] = set()  # process groups started and not yet reaped: killed on the way out


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: this interpreter's import path, so that it runs the same
    tokentape as the soak (a source snapshot given by ``PYTHONPATH`` included)."""
    env = {k: v for k, v in os.environ.items() if k != "TOKENTAPE_CRASH_AT"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


@dataclass
class Outcome:
    killed: bool  # still running at the deadline: the group was SIGKILLed
    returncode: int | None  # the leader's exit status (negative: killed by that signal)
    strays: int  # processes of the group still alive 10 s after the kill


class Child:
    """A child process in its own session; its output goes to ``log``."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        _live.add(self.proc.pid)

    def run(self, kill_after: float | None) -> Outcome:
        """Wait ``kill_after`` seconds (None: up to 10 minutes), then SIGKILL the whole group if
        the leader still runs; reap the leader and wait (bounded) for the group to be gone."""
        killed = False
        try:
            self.proc.wait(timeout=kill_after if kill_after is not None else 600)
        except subprocess.TimeoutExpired:
            killed = True
        return self._end(killed)

    def _end(self, killed: bool) -> Outcome:
        pgid = self.proc.pid
        kill_group(pgid)  # also any worker the leader left behind when it exited by itself
        self.proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            kill_group(pgid)
            time.sleep(0.05)
        strays = len(group_members(pgid))
        _live.discard(pgid)
        return Outcome(killed, self.proc.returncode, strays)

    def tail(self, n: int = 300) -> str:
        """The end of the child's output, on one line."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return " ".join(text.split())[-n:]


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_all() -> None:
    """SIGKILL every group this soak started that is still around (on interrupt or error)."""
    for pgid in list(_live):
        kill_group(pgid)
        _live.discard(pgid)
