"""What ``tokentape info`` says of a resolved plan and of a run (its step log), as data.

A run is read from its step log with the step-log reader (``scan_step_log``: the effective
steps, their batch-shape changes and the plans they ran under), plus one lenient pass over the
lines for what the reader drops: lines superseded by a redone step, steps missing (which the
reader refuses), a torn last line, and the times of the first and last lines.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokentape._src.objects.client import is_url, join
from tokentape._src.objects.whole import local_copy, object_info
from tokentape._src.plan.open import MEGATRON
from tokentape._src.plan.plan import Plan
from tokentape._src.store.format import MANIFEST_NAME
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import BatchChange
from tokentape._src.train.steplog import StepLog, StepRecord, scan_step_log
from tokentape._src.util.files import open_regular
from tokentape.errors import PlanError

STEP_LOG_NAME = "steps.jsonl"
"""The step log's name in a run directory (``tokentape info RUN_DIR``)."""


@dataclass(frozen=True)
class Redo:
    """A line that re-logged steps already logged: the run resumed from an earlier
    checkpoint and redid them."""

    line: int
    step: int
    superseded: int  # effective steps it dropped (step .. the step before it)


@dataclass(frozen=True)
class Gap:
    """A line whose step skips ahead of the one after the last effective step."""

    line: int
    step: int
    expected: int


@dataclass
class LineScan:
    """What the lenient pass over a step log's lines found."""

    lines: int = 0
    redos: list[Redo] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    torn_tail: bool = False
    first_time: float | None = None
    last_time: float | None = None
    last_step: int | None = None  # the step of the last line: the last effective step


def scan_lines(path: str | os.PathLike[str]) -> LineScan:
    """One pass over the log's lines, tolerant of what the reader refuses (lines that are not
    step records are skipped: the reader names them)."""
    out = LineScan()
    try:
        f = open_regular(Path(path))
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the step log ({exc.strerror})") from None
    expected = None  # the step after the last effective one
    with f:
        for line_no, raw in enumerate(f, 1):
            try:
                data = json.loads(raw.decode())
            except (ValueError, RecursionError):
                out.torn_tail = not raw.endswith(b"\n") and bool(raw.strip())
                continue
            step = data.get("step") if isinstance(data, dict) else None
            if type(step) is not int:
                continue
            out.lines += 1
            t = data.get("time")
            if _finite(t):
                out.first_time = t if out.first_time is None else out.first_time
                out.last_time = t
            if expected is not None and step < expected:
                out.redos.append(Redo(line_no, step, expected - step))
            elif expected is not None and step > expected:
                out.gaps.append(Gap(line_no, step, expected))
            expected = step + 1
            out.last_step = step
    return out


def _finite(t: object) -> bool:
    """``t`` is a number a float holds, not NaN or infinite (a line's time, else ignored)."""
    if type(t) not in (int, float):
        return False
    try:
        return math.isfinite(float(t))  # type: ignore[arg-type]
    except OverflowError:  # an int beyond any float
        return False


@dataclass(frozen=True)
class RunInfo:
    """A run, from its step log."""

    path: str
    lines: LineScan
    log: StepLog | None  # None when the reader refuses the log (steps missing)
    last: StepRecord | None
    refused: str | None  # the reader's message when it refuses the log

    @property
    def shape_changes(self) -> list[BatchChange]:
        """The batch shape of step 0 and every later change of it (a change of plan alone is
        not one)."""
        if self.log is None:
            return []
        out: list[BatchChange] = []
        for c in self.log.schedule.changes:
            if not out or out[-1].config != c.config:
                out.append(c)
        return out


def step_log_path(path: str | os.PathLike[str]) -> Path:
    """The step log itself, or ``DIR/steps.jsonl`` of a run directory; at an object URL (the
    log, or the run's "directory"), a local copy of it fetched for this process."""
    if is_url(path):
        return _fetched_step_log(os.fspath(path))
    p = Path(path)
    if p.is_dir():
        log = p / STEP_LOG_NAME
        if not log.exists():
            raise PlanError(f"{p}: a directory without {STEP_LOG_NAME} (not a run directory)")
        return log
    if not p.exists():
        raise PlanError(f"{p}: no such step log or run directory")
    return p


def _fetched_step_log(url: str) -> Path:
    return local_copy(step_log_url(url))


def step_log_url(url: str) -> str:
    """The step log at ``url``: the object itself, or ``steps.jsonl`` under the run's URL
    "directory"."""
    candidates = [join(url, STEP_LOG_NAME)]
    if not url.endswith("/"):  # a "directory" given so is never the log itself
        candidates.insert(0, url)
    for candidate in candidates:
        try:
            object_info(candidate)
        except FileNotFoundError:
            continue
        return candidate
    raise PlanError(f"{url}: no such step log, nor a run directory holding {STEP_LOG_NAME}")


def run_info(path: str | os.PathLike[str]) -> RunInfo:
    """Read a run's step log (or the ``steps.jsonl`` of a run directory)."""
    log_path = step_log_path(path)
    lines = scan_lines(log_path)
    wanted = () if lines.last_step is None else (lines.last_step,)
    try:
        log = scan_step_log(log_path, wanted)
    except PlanError as exc:
        if not lines.gaps:
            raise
        return RunInfo(_shown(path, log_path), lines, None, None, str(exc))
    # Every line supersedes the steps from its own on, so the last line is the last step.
    last = log.records.get(log.steps - 1)
    if last is None:  # the lenient pass and the reader disagree on the last line
        last = scan_step_log(log_path, (log.steps - 1,)).records[log.steps - 1]
    return RunInfo(_shown(path, log_path), lines, log, last, None)


def _shown(given: str | os.PathLike[str], log_path: Path) -> str:
    """The log's name as the user knows it: its URL, not the local copy's path."""
    return os.fspath(given) if is_url(given) else str(log_path)


def run_json(info: RunInfo) -> dict[str, Any]:
    """``tokentape info --log ... --json``."""
    log, last, lines = info.log, info.last, info.lines
    return {
        "kind": "run",
        "step_log": info.path,
        "readable": info.refused is None,
        "refused": info.refused,
        "steps": log.steps if log else None,
        "consumed": log.end if log else None,
        "lines": lines.lines,
        "torn_last_line": lines.torn_tail,
        "first_time": lines.first_time,
        "last_time": lines.last_time,
        "batch_shapes": [_change(c) for c in info.shape_changes],
        "plans": [{"first_step": s, "index_hash": h} for s, h in log.plans] if log else [],
        "last_step": None if last is None else _record(last),
        "redone": {
            "lines": len(lines.redos),
            "superseded_steps": sum(r.superseded for r in lines.redos),
            "at": [
                {"line": r.line, "step": r.step, "superseded": r.superseded} for r in lines.redos
            ],
        },
        "gaps": [{"line": g.line, "step": g.step, "expected": g.expected} for g in lines.gaps],
    }


def _change(c: BatchChange) -> dict[str, int]:
    config = BatchConfig(c.dp_size, c.micro, c.accum)
    return {
        "step": c.step,
        "consumed": c.consumed,
        "dp": c.dp_size,
        "micro": c.micro,
        "accum": c.accum,
        "global_batch": config.global_batch,
    }


def _record(r: StepRecord) -> dict[str, Any]:
    return {
        "step": r.step,
        "consumed": r.consumed,
        "global_batch": r.global_batch,
        "dp": r.dp,
        "micro": r.micro,
        "accum": r.accum,
        "index_hash": r.index_hash,
        "tokens_hash": r.tokens_hash,
        "time": r.time,
    }


# --- a resolved plan ---------------------------------------------------------------------------


def store_location(path: str, fmt: str) -> tuple[str, bool | None]:
    """Where a plan source's store lives: ``("object", None)`` for an object URL (not looked
    up), else ``("local", whether its files are there)``."""
    if is_url(path):
        return "object", None
    if fmt == MEGATRON:
        return "local", Path(path + ".bin").is_file() and Path(path + ".idx").is_file()
    return "local", (Path(path) / MANIFEST_NAME).is_file()


def plan_json(path: str, plan: Plan) -> dict[str, Any]:
    """``tokentape info PLAN.json --json``."""
    names = [s.name for s in plan.sources]
    ends = [*plan.phase_starts[1:], plan.horizon_samples]
    dens = [plan.denominator, *(p.denominator for p in plan.phases)]
    stated = [[s.weight for s in plan.sources], *(list(p.weights) for p in plan.phases)]
    phases = [
        {
            "start_samples": start,
            "end_samples": end,
            "denominator": den,
            "weights": dict(zip(names, weights, strict=True)),
            "shares": {n: u / den for n, u in zip(names, units, strict=True)},
        }
        for start, end, den, weights, units in zip(
            plan.phase_starts, ends, dens, stated, plan.phase_units, strict=True
        )
    ]
    sources = []
    for s in plan.sources:
        where, present = store_location(s.path, s.format)
        sources.append(
            {
                "name": s.name,
                "format": s.format,
                "path": s.path,
                "location": where,
                "present": present,
                "weight": s.weight,
                "share": s.weight_units / plan.denominator,
                "n_tokens": s.n_tokens,
                "n_samples": s.n_samples,
                "draws": s.draws,
                "passes": s.passes,
                "max_repeats": s.max_repeats,
                "dtype": s.dtype,
                "content_hash": s.content_hash,
                "tokenizer_fingerprint": s.tokenizer_fingerprint,
            }
        )
    return {
        "kind": "plan",
        "plan": path,
        "algorithm_version": plan.algorithm_version,
        "seq_len": plan.seq_len,
        "seed": plan.seed,
        "horizon_samples": plan.horizon_samples,
        "horizon_tokens": plan.horizon_samples * plan.seq_len,
        "vocab_size": plan.vocab_size,
        "eod_id": plan.eod_id,
        "index_hash": plan.index_hash,
        "storage_options": plan.storage_options,
        "sources": sources,
        "phases": phases,
        "excisions": [e.summary() for e in plan.excisions],
    }


__all__ = [
    "STEP_LOG_NAME",
    "Gap",
    "LineScan",
    "Redo",
    "RunInfo",
    "plan_json",
    "run_info",
    "run_json",
    "scan_lines",
    "step_log_path",
    "step_log_url",
    "store_location",
]
