"""Reading a trainer's loss log back: the loss of each step, and per source where logged.

The loss log is the trainer's own (``examples/train_tiny.py`` writes one, docs/train.md gives
the format): one JSON object a line, ``{"step": 12, "loss": 5.41, "loss_by_source": {"prose":
5.38, ...}, "tokens_by_source": {"prose": 4096, ...}, ...}``; only ``step`` and ``loss`` are
required, other fields are ignored. As in the step log, a line for step s supersedes every
earlier line of step s or later (a resume from an earlier checkpoint redoes them), and a torn
last line (no newline, not JSON) is ignored. A loss may be NaN or infinite (Python's ``json``
writes them so): it is kept and said. Steps past ``steps`` (those the step log has) are counted
and left out, so a crafted step number cannot make the reader allocate.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.util.files import open_regular
from tokentape._src.util.jsonline import loads_line
from tokentape.errors import InputError


@dataclass(frozen=True)
class LossLog:
    """The effective loss of each step of [0, steps): NaN where the log has no line."""

    path: str
    loss: np.ndarray
    """float64 (steps,): the step's loss."""
    by_source: np.ndarray | None
    """float64 (steps, sources): the mean token loss of the step's rows of each source; NaN
    where that source had no row (None: no line gives ``loss_by_source``)."""
    tokens: np.ndarray | None
    """float64 (steps, sources): tokens of each source in the step (None: not logged)."""
    lines: int
    """Lines read as loss records."""
    beyond: int
    """Lines for steps the step log does not have (left out)."""

    has: np.ndarray
    """bool (steps,): a line gives the step's loss (NaN included)."""


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


_FIELDS = ("loss_by_source", "tokens_by_source")


def _problem(data: Any, names: dict[str, int]) -> str | None:
    """Why a parsed line is not a loss record (None: it is one)."""
    if not isinstance(data, dict):
        return f"expected a JSON object, found {_shown(data)}"
    step, value = data.get("step"), data.get("loss")
    if type(step) is not int or step < 0:
        return f"field 'step': expected an integer >= 0, found {_shown(step)}"
    if type(value) not in (int, float) or (type(value) is int and abs(value) >= 2**1023):
        return f"field 'loss': expected a number, found {_shown(value)}"
    for field in _FIELDS:
        given = data.get(field)
        if given is None:
            continue
        if not isinstance(given, dict):
            return f"field '{field}': expected an object of source names, found {_shown(given)}"
        for name, v in given.items():
            if name not in names:
                return (
                    f"field '{field}': {_shown(name)} is not a source of the plan (it has: "
                    f"{', '.join(names)})"
                )
            if field == "loss_by_source":
                if type(v) not in (int, float) or (type(v) is int and abs(v) >= 2**1023):
                    return f"field '{field}': {name}: expected a number, found {_shown(v)}"
            elif type(v) is not int or not 0 <= v < 2**63:
                return f"field '{field}': {name}: expected an integer >= 0, found {_shown(v)}"
    return None


class _Lines:
    """Every record line's values in file order, collected with as little work a line as can
    be; ``read_loss_log`` then tests them in bulk, and finds the first bad line only on
    failure (``_first_bad``, a second pass)."""

    def __init__(self) -> None:
        self.step: list[Any] = []
        self.loss: list[Any] = []
        # per field: how many sources each line gives, their names and values, in order
        self.count: dict[str, list[int]] = {f: [] for f in _FIELDS}
        self.keys: dict[str, list[Any]] = {f: [] for f in _FIELDS}
        self.values: dict[str, list[Any]] = {f: [] for f in _FIELDS}


def _collect(path: Path, names: dict[str, int]) -> _Lines:
    try:
        f = open_regular(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the loss log ({exc.strerror})") from None
    out = _Lines()
    loads = loads_line
    step_add, loss_add = out.step.append, out.loss.append
    (count_l, keys_l, values_l), (count_t, keys_t, values_t) = (
        (out.count[f].append, out.keys[f].extend, out.values[f].extend) for f in _FIELDS
    )
    field_l, field_t = _FIELDS
    with f:
        for raw in f:
            try:
                data = loads(raw.decode())
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                if not raw.endswith(b"\n"):
                    break  # a torn last line: the writer died mid-append
                if not raw.strip():
                    continue
                raise _first_bad(path, names) from None
            try:  # the two fields by hand: this loop is the reader's cost
                step_add(data.get("step"))
                loss_add(data.get("loss"))
                given = data.get(field_l)
                if given:
                    count_l(len(given))
                    keys_l(given)
                    values_l(given.values())
                else:
                    count_l(0)
                given = data.get(field_t)
                if given:
                    count_t(len(given))
                    keys_t(given)
                    values_t(given.values())
                else:
                    count_t(0)
            except (AttributeError, TypeError):  # not an object, or a field not one
                raise _first_bad(path, names) from None
    return out


def _first_bad(path: Path, names: dict[str, int]) -> InputError:
    """The error naming the first line that is not a loss record (a second, slow pass)."""
    with open_regular(path) as f:
        for line_no, raw in enumerate(f, 1):
            try:
                data = json.loads(raw.decode())
            except (ValueError, RecursionError):
                if raw.endswith(b"\n") and raw.strip():
                    return InputError(f"{path}:{line_no}: not a JSON line")
                continue  # blank, or the torn last line
            why = _problem(data, names)
            if why is not None:
                return InputError(f"{path}:{line_no}: {why}")
    return InputError(f"{path}: not a loss log")  # unreachable when the checks agree


def _numbers(values: list[Any]) -> np.ndarray | None:
    """``values`` as float64 when every one is an int or float a float holds, else None."""
    if not set(map(type, values)) <= {int, float}:
        return None
    try:
        return np.array(values, dtype=np.float64)
    except OverflowError:
        return None


@dataclass(frozen=True)
class LossLines:
    """A loss log's lines that survive the redo rule, in step order (steps ascending), each
    with its loss and the losses and tokens per source it gives (NaN where it gives none)."""

    step: np.ndarray  # int64 (n,)
    loss: np.ndarray  # float64 (n,)
    by_source: np.ndarray | None  # float64 (n, sources); None when no line has the field
    tokens: np.ndarray | None  # float64 (n, sources)
    lines: int  # every record line read

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"step": self.step, "loss": self.loss, "lines": np.asarray([self.lines])}
        for name, table in (("by_source", self.by_source), ("tokens", self.tokens)):
            if table is not None:
                out[name] = table
        return out

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> LossLines:
        return cls(a["step"], a["loss"], a.get("by_source"), a.get("tokens"), int(a["lines"][0]))


def read_loss_lines(path: str | os.PathLike[str], names: list[str]) -> LossLines:
    """The effective lines of the loss log at ``path`` whose plan's sources are ``names`` (a
    source name that is not one of them is refused, naming it)."""
    p = Path(path)
    index = {n: i for i, n in enumerate(names)}
    lines = _collect(p, index)
    step_list = lines.step
    if not set(map(type, step_list)) <= {int}:
        raise _first_bad(p, index)
    if step_list and (min(step_list) < 0 or max(step_list) >= 2**62):
        raise _first_bad(p, index)
    step = np.array(step_list, dtype=np.int64)
    loss = _numbers(lines.loss)
    if loss is None:
        raise _first_bad(p, index)
    # A line survives when every later line has a higher step (a later line for step s
    # supersedes the lines of step s and after): the survivors' steps ascend.
    later_min = np.minimum.accumulate(step[::-1])[::-1]
    survives = np.ones(step.size, dtype=bool)
    survives[:-1] = step[:-1] < later_min[1:]
    tables: dict[str, np.ndarray | None] = {}
    for field in _FIELDS:
        keys, values = lines.keys[field], lines.values[field]
        if not keys:
            tables[field] = None
            continue
        try:
            d = np.array([index[k] for k in keys], dtype=np.int64)
        except (KeyError, TypeError):  # a name not in the plan (or not a string)
            raise _first_bad(p, index) from None
        v = _numbers(values)
        if v is None or (field == "tokens_by_source" and (
            not set(map(type, values)) <= {int} or float(v.min()) < 0 or float(v.max()) >= 2**63
        )):  # fmt: skip
            raise _first_bad(p, index)
        owner = np.repeat(np.arange(step.size), np.array(lines.count[field], dtype=np.int64))
        keep = survives[owner]
        row = np.cumsum(survives) - 1  # each surviving line's row
        table = np.full((int(survives.sum()), len(names)), np.nan)
        table[row[owner[keep]], d[keep]] = v[keep]
        tables[field] = table
    return LossLines(step[survives], loss[survives], tables["loss_by_source"],
                     tables["tokens_by_source"], int(step.size))  # fmt: skip


def place_lines(path: str, lines: LossLines, steps: int) -> LossLog:
    """The lines of steps [0, steps) at their steps (the others counted as beyond)."""
    inside = lines.step < steps
    at = lines.step[inside]
    loss = np.full(steps, np.nan)
    has = np.zeros(steps, dtype=bool)
    loss[at] = lines.loss[inside]
    has[at] = True
    placed: list[np.ndarray | None] = []
    for table in (lines.by_source, lines.tokens):
        if table is None:
            placed.append(None)
            continue
        out = np.full((steps, table.shape[1]), np.nan)
        out[at] = table[inside]
        placed.append(out)
    beyond = int(lines.step.size - at.size)
    return LossLog(str(path), loss, placed[0], placed[1], lines.lines, beyond, has)


def read_loss_log(path: str | os.PathLike[str], names: list[str], steps: int) -> LossLog:
    """The loss log at ``path`` for a run of ``steps`` steps whose plan's sources are ``names``
    (``read_loss_lines``, placed at their steps)."""
    return place_lines(str(path), read_loss_lines(path, names), steps)


__all__ = ["LossLines", "LossLog", "place_lines", "read_loss_lines", "read_loss_log"]
