"""Appending to the step log so that a crash never leaves it unreadable.

One ``write`` per line on a file opened for appending (looping on short writes). A torn last
line — the writer died mid-line — is cut off when the log is opened again, before anything is
appended after it. ``sync()`` makes the lines written so far durable; the loader calls it when
its state is checkpointed, so a checkpoint never runs ahead of its log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any, BinaryIO

from tokentape.errors import ArgumentError, PlanError


class StepLogWriter:
    """Appends a run's step records to ``path``; refuses a log an earlier run of another plan
    wrote (its records would make the log unreadable for either plan)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._dirty = False
        if not self.path.parent.is_dir():
            raise ArgumentError(f"step_log '{path}': its directory does not exist")
        if self.path.exists() and not self.path.is_file():
            raise ArgumentError(f"step_log '{path}': not a regular file")
        self._trim_torn_tail()

    def check_plan(self, index_hash: str, earlier: Collection[str] = (), step: int = 0) -> None:
        """Refuse a log whose last record names another plan's index hash than this one or one
        of the ``earlier`` plans the run went on from (its data state's plan changes). A run
        resuming at ``step`` > 0 rewrites the log's lines of that step and later (a reader
        keeps only the newest line of a step): the last line before ``step`` is checked."""
        try:
            last = _last_record(self.path, step)
        except (OSError, ValueError, RecursionError):
            return  # no log yet, or a damaged one: the reader reports the damage
        found = last.get("index_hash") if isinstance(last, dict) else None
        if isinstance(found, str) and found != index_hash and found not in earlier:
            raise PlanError(
                f"step_log '{self.path}': written for another plan (index hash {found[:19]}…, "
                f"this plan's is {index_hash[:19]}…); give this run its own step log"
            )

    def _trim_torn_tail(self) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size == 0:
            return
        with open(self.path, "rb+") as f:
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            keep = _line_start(f, size)  # cut after the last complete line
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())

    def append(self, record: dict[str, Any]) -> None:
        """One JSON line, appended whole (or an ``OSError``, with nothing counted as written)."""
        line = memoryview((json.dumps(record, sort_keys=True) + "\n").encode())
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while line:
                written = os.write(fd, line)
                line = line[written:]
        finally:
            os.close(fd)
        self._dirty = True

    def sync(self) -> None:
        """Make every line appended so far durable."""
        if not self._dirty:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._dirty = False


def _line_start(f: BinaryIO, end: int, block: int = 1 << 16) -> int:
    """The offset just after the last newline before ``end`` (0 if none), read back in
    blocks."""
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        cut = f.read(end - start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        end = start
    return 0


def _last_record(path: Path, before: int) -> Any:
    """The last line of ``path`` as JSON (a log whose torn tail was cut: it ends with a
    newline); with ``before`` > 0, the last line whose step is below it (ValueError: none
    is, so every line will be rewritten)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END) - 1  # the last line's newline
        while end >= 0:
            start = _line_start(f, end)
            f.seek(start)
            record = json.loads(f.read(end - start))
            step = record.get("step") if isinstance(record, dict) else None
            if before <= 0 or not isinstance(step, int) or step < before:
                return record
            end = start - 1
    raise ValueError("no line before the step")


__all__ = ["StepLogWriter"]
