"""Reading a step log back: the run's effective history of steps.

The loader appends one JSON line per committed step. A run that crashed after logging a step
but before its checkpoint redoes that step on resume (possibly with another batch shape), so a
log can hold a step more than once. The rule: a line for step s supersedes every earlier line of
step s or later — what remains is exactly what the optimizer applied, in order.

A writer that died mid-append leaves a torn last line: no newline, and not JSON (an object is
whole only once its closing brace is written). It is ignored — the writer cuts it off before
it appends again; a last line that lacks only its newline is a whole record and counts. Any
other line that is not a valid step record is an error naming ``file:line`` and the field.

The log is read in one streaming pass, each line parsed once. The rule is applied as lines
arrive: the effective steps are always a contiguous run ``first..last``, held as its batch-shape
changes (the start of each run of equal shape), so a line for step s drops the changes from
step s on and continues from the change before. ``scan_step_log`` keeps only those changes and
the records of the steps asked for; ``read_step_log`` keeps every effective record.
"""

from __future__ import annotations

import json
import math
import os
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.state import BatchChange
from tokentape._src.util.files import open_regular
from tokentape._src.util.jsonline import loads_line
from tokentape.errors import PlanError

_COUNTS = ("step", "consumed")  # integers >= 0
_SIZES = ("dp", "micro", "accum", "global_batch")  # integers >= 1
_HASHES = ("index_hash", "tokens_hash")  # strings


@dataclass(frozen=True)
class StepRecord:
    step: int
    consumed: int
    global_batch: int
    dp: int
    micro: int
    accum: int
    index_hash: str
    tokens_hash: str
    time: float

    @property
    def config(self) -> BatchConfig:
        return BatchConfig(self.dp, self.micro, self.accum)


@dataclass(frozen=True)
class LineTrace:
    """Every step line of a log in file order, the superseded ones too (a step lower than the
    line before it is a resume from an earlier checkpoint): arrays of one length."""

    line: np.ndarray  # int64: the line number in the file
    step: np.ndarray  # int64
    time: np.ndarray  # float64: the line's ``time`` (0.0 where the line has none)


@dataclass(frozen=True)
class StepLog:
    """What the audit tools need of a step log, from one pass that keeps no per-step state:
    its batch schedule (bounded by its last step), its index hash, and the effective records of
    the steps asked for."""

    path: str
    index_hash: str
    """The index hash of the plan the log's last step ran under (every earlier step ran under
    a plan that agrees with it there: the loader moves to a new plan only then)."""
    plans: tuple[tuple[int, str], ...]
    """(first step, index hash) of each stretch of steps under one plan, in order."""
    schedule: Schedule
    records: dict[int, StepRecord]
    """step → its effective record, for each step asked for that the log has."""
    trace: LineTrace | None = None
    """Every step line (when asked for: ``scan_step_log(..., trace=True)``)."""

    @property
    def steps(self) -> int:
        """The number of effective steps: the log has steps 0..steps-1."""
        assert self.schedule.steps is not None
        return self.schedule.steps

    @property
    def end(self) -> int:
        """Samples applied after the log's last step."""
        assert self.schedule.end is not None
        return self.schedule.end


def short_hash(value: str) -> str:
    """The first 19 characters of a hash from a log line, for a message (on one line)."""
    head = value[:19]
    return head if head.isprintable() else repr(head)


def _as_json(value: Any) -> str:
    """A field's value as the JSON it was read from, cut to 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _time_ok(t: Any) -> bool:
    """A Unix time a float holds: an int of float range, or a finite float."""
    return (type(t) is int and abs(t) < 2**1023) or (type(t) is float and math.isfinite(t))


def _problem(data: Any) -> str:
    """Why ``data`` is not a step record: the first bad field (the slow path, for errors)."""
    if not isinstance(data, dict):
        return f"expected a JSON object, found {_as_json(data)}"
    for name in (*_COUNTS, *_SIZES, *_HASHES):
        if name not in data:
            return f"field '{name}' missing"
        value = data[name]
        if name in _HASHES:
            if not isinstance(value, str):
                return f"field '{name}': expected a string, found {_as_json(value)}"
            continue
        low = 0 if name in _COUNTS else 1
        if type(value) is not int or value < low:
            return f"field '{name}': expected an integer >= {low}, found {_as_json(value)}"
    t = data.get("time", 0.0)
    if not _time_ok(t):
        return f"field 'time': expected a number (Unix time), found {_as_json(t)}"
    dp, micro, accum, b = data["dp"], data["micro"], data["accum"], data["global_batch"]
    if b != dp * micro * accum:
        return (
            f"field 'global_batch': {b} is not dp·micro·accum = {dp}·{micro}·{accum} = "
            f"{dp * micro * accum}"
        )
    if data["consumed"] + b > MAX_POSITION:
        return f"field 'consumed': the step ends at {data['consumed'] + b}, beyond position 2**62"
    return "not a step record"  # unreachable when the fast path agrees


class _Scan:
    """The effective steps of a log, applied line by line (see the module's docstring)."""

    def __init__(
        self, path: str | os.PathLike[str], keep: Iterable[int] | None, trace: bool = False
    ) -> None:
        self.path = Path(path)
        self.trace = trace
        self.lines, self.steps, self.times = array("q"), array("q"), array("d")
        self.keep_all = keep is None
        self.wanted = frozenset(keep) if keep is not None else frozenset()
        # Runs of equal shape and index hash among the effective steps: where each starts.
        # Each is (step, consumed, global_batch, dp, micro, accum, index_hash, line number).
        self.runs: list[tuple[int, int, int, int, int, int, str, int]] = []
        self.first = -1  # the first effective step (-1: none yet)
        self.next = 0  # the step after the last effective one
        self.end = 0  # consumed after the last effective step
        self.all: list[StepRecord] = []  # every effective record (keep_all), step first + i
        self.some: dict[int, StepRecord] = {}  # the wanted ones

    def read(self) -> None:
        p = self.path
        try:
            f = open_regular(p)  # closed below; the error names the log
        except OSError as exc:
            raise PlanError(f"{p}: cannot read the step log ({exc.strerror})") from None
        loads, keep_all, wanted, isfinite = loads_line, self.keep_all, self.wanted, math.isfinite
        with f:
            for line_no, raw in enumerate(f, 1):
                try:
                    data = loads(raw.decode())
                except (ValueError, RecursionError) as exc:
                    if not raw.endswith(b"\n"):
                        break  # a torn last line: the writer died mid-append
                    if not raw.strip():
                        continue
                    why = (
                        exc.msg
                        if isinstance(exc, json.JSONDecodeError)
                        else "invalid UTF-8"
                        if isinstance(exc, UnicodeDecodeError)
                        else "nested too deeply"
                        if isinstance(exc, RecursionError)
                        else str(exc).split(":")[0][:80]  # e.g. an integer of 5,000 digits
                    )
                    raise PlanError(f"{p}:{line_no}: not a JSON line ({why})") from None
                # The fast path: every field of the expected type and range, in one expression.
                try:
                    step, consumed, b = data["step"], data["consumed"], data["global_batch"]
                    dp, micro, accum = data["dp"], data["micro"], data["accum"]
                    index_hash, tokens_hash = data["index_hash"], data["tokens_hash"]
                    t = data.get("time", 0.0)
                except (KeyError, TypeError):
                    raise PlanError(f"{p}:{line_no}: {_problem(data)}") from None
                if not (
                    type(step) is int
                    and type(consumed) is int
                    and type(dp) is int
                    and type(micro) is int
                    and type(accum) is int
                    and type(index_hash) is str
                    and type(tokens_hash) is str
                    and step >= 0
                    and consumed >= 0
                    and dp >= 1
                    and micro >= 1
                    and accum >= 1
                    and type(b) is int
                    and b == dp * micro * accum
                    and consumed + b <= MAX_POSITION
                    and ((type(t) is float and isfinite(t)) or _time_ok(t))  # float: the usual
                ):
                    raise PlanError(f"{p}:{line_no}: {_problem(data)}")
                if self.trace:
                    self.lines.append(line_no)
                    self.steps.append(step)
                    self.times.append(float(t))
                if step == self.next and consumed == self.end and self.first >= 0:
                    run = self.runs[-1]  # the common case: the next step
                    if (dp, micro, accum, index_hash) != (run[3], run[4], run[5], run[6]):
                        self.runs.append((step, consumed, b, dp, micro, accum, index_hash, line_no))
                else:
                    self._supersede(step, consumed, b, dp, micro, accum, index_hash, line_no)
                self.next, self.end = step + 1, consumed + b
                if keep_all or step in wanted:
                    rec = StepRecord(
                        step, consumed, b, dp, micro, accum, index_hash, tokens_hash, float(t)
                    )
                    if keep_all:
                        self.all.append(rec)
                    else:
                        self.some[step] = rec

    def _supersede(
        self,
        step: int,
        consumed: int,
        b: int,
        dp: int,
        micro: int,
        accum: int,
        index_hash: str,
        line_no: int,
    ) -> None:
        """A line for ``step`` other than the plain next one: it supersedes every effective
        step from ``step`` on, then must follow on from the step before it."""
        where = f"{self.path}:{line_no}"
        new_run = (step, consumed, b, dp, micro, accum, index_hash, line_no)
        if self.first < 0 or step <= self.first:  # supersedes everything kept
            self.runs = [new_run]
            self.first = step
            self.all.clear()
            self.some.clear()
            return
        if step > self.next:
            raise PlanError(f"{where}: step {step} follows step {self.next - 1} (steps missing)")
        while self.runs[-1][0] >= step:  # runs[0] starts at first < step: never emptied
            self.runs.pop()
        run = self.runs[-1]
        expected = run[1] + (step - run[0]) * run[2]
        if consumed != expected:
            raise PlanError(
                f"{where}: step {step} starts at consumed {consumed}, expected {expected}"
            )
        del self.all[step - self.first :]
        for s in [s for s in self.some if s >= step]:
            del self.some[s]
        if (dp, micro, accum, index_hash) != (run[3], run[4], run[5], run[6]):
            self.runs.append(new_run)

    def check(self) -> None:
        p = self.path
        if self.first < 0:
            raise PlanError(f"{p}: the step log is empty")
        start = self.runs[0]
        if start[0] != 0 or start[1] != 0:
            raise PlanError(
                f"{p}:{start[7]}: the log does not start at step 0 with consumed 0 "
                f"(first: step {start[0]}, consumed {start[1]})"
            )

    def plans(self) -> tuple[tuple[int, str], ...]:
        out: list[tuple[int, str]] = []
        for r in self.runs:
            if not out or out[-1][1] != r[6]:
                out.append((r[0], r[6]))
        return tuple(out)

    def schedule(self) -> Schedule:
        changes = tuple(BatchChange(r[0], r[1], r[3], r[4], r[5]) for r in self.runs)
        return Schedule(changes, steps=self.next)

    def line_trace(self) -> LineTrace | None:
        if not self.trace:
            return None
        return LineTrace(
            np.frombuffer(self.lines, dtype=np.int64).copy(),
            np.frombuffer(self.steps, dtype=np.int64).copy(),
            np.frombuffer(self.times, dtype=np.float64).copy(),
        )


def scan_step_log(
    path: str | os.PathLike[str], steps: Iterable[int] = (), *, trace: bool = False
) -> StepLog:
    """A step log's schedule and index hash, and the effective records of ``steps``, in one
    streaming pass (memory: the shape changes and the records asked for, not the steps; with
    ``trace``, also 24 bytes a line: ``StepLog.trace``)."""
    scan = _Scan(path, steps, trace)
    scan.read()
    scan.check()
    return StepLog(
        str(scan.path), scan.runs[-1][6], scan.plans(), scan.schedule(), scan.some,
        scan.line_trace(),
    )  # fmt: skip


def read_step_log(path: str | os.PathLike[str]) -> list[StepRecord]:
    """The effective steps of a log, in step order, checked to be contiguous from step 0."""
    scan = _Scan(path, None)
    scan.read()
    scan.check()
    return scan.all


def schedule_of(records: list[StepRecord]) -> Schedule:
    """The batch-shape changes of a log's effective steps, bounded by its last step."""
    changes: list[BatchChange] = []
    for r in records:
        if not changes or changes[-1].config != r.config:
            changes.append(BatchChange(r.step, r.consumed, r.dp, r.micro, r.accum))
    return Schedule(tuple(changes), steps=len(records))


__all__ = [
    "LineTrace",
    "StepLog",
    "StepRecord",
    "read_step_log",
    "scan_step_log",
    "schedule_of",
    "short_hash",
]
