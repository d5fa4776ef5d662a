"""Reading a step log back: the run's effective history of steps.

The loader appends one JSON line per committed step. A run that crashed after logging a step
but before its checkpoint redoes that step on resume (possibly with another batch shape), so a
log can hold a step more than once. The rule: a line for step s supersedes every earlier line of
step s or later — what remains is exactly what the optimizer applied, in order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tokentape.errors import TokentapeError
from tokentape.train.partition import BatchConfig
from tokentape.train.schedule import Schedule
from tokentape.train.state import BatchChange

_FIELDS = {
    "step": int,
    "consumed": int,
    "global_batch": int,
    "dp": int,
    "micro": int,
    "accum": int,
    "index_hash": str,
    "tokens_hash": str,
}


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


def _record(path: str, line_no: int, line: str) -> StepRecord:
    where = f"{path}:{line_no}"
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TokentapeError(f"{where}: not a JSON line ({exc.msg})") from None
    if not isinstance(data, dict):
        raise TokentapeError(f"{where}: expected a JSON object")
    values = {}
    for name, kind in _FIELDS.items():
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise TokentapeError(f"{where}: field '{name}' missing or not {kind.__name__}")
        values[name] = value
    rec = StepRecord(**values, time=float(data.get("time", 0.0)))
    if rec.global_batch != rec.dp * rec.micro * rec.accum or rec.step < 0 or rec.consumed < 0:
        raise TokentapeError(f"{where}: inconsistent step record (global_batch != dp·micro·accum)")
    return rec


def read_step_log(path: str | os.PathLike[str]) -> list[StepRecord]:
    """The effective steps of a log, in step order, checked to be contiguous from step 0."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TokentapeError(f"{p}: cannot read the step log ({exc.strerror})") from None
    kept: list[StepRecord] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        rec = _record(str(p), i, line)
        while kept and kept[-1].step >= rec.step:
            kept.pop()  # redone after a resume: the later line is what was applied
        if kept and rec.step != kept[-1].step + 1:
            raise TokentapeError(
                f"{p}:{i}: step {rec.step} follows step {kept[-1].step} (steps missing)"
            )
        if kept and rec.consumed != kept[-1].consumed + kept[-1].global_batch:
            raise TokentapeError(
                f"{p}:{i}: step {rec.step} starts at consumed {rec.consumed}, expected "
                f"{kept[-1].consumed + kept[-1].global_batch}"
            )
        kept.append(rec)
    if not kept:
        raise TokentapeError(f"{p}: the step log is empty")
    if kept[0].step != 0 or kept[0].consumed != 0:
        raise TokentapeError(f"{p}: the log does not start at step 0 (first: {kept[0].step})")
    hashes = {r.index_hash for r in kept}
    if len(hashes) > 1:
        raise TokentapeError(f"{p}: the log mixes {len(hashes)} index hashes")
    return kept


def schedule_of(records: list[StepRecord]) -> Schedule:
    """The batch-shape changes of a log's effective steps, bounded by its last step."""
    changes: list[BatchChange] = []
    for r in records:
        if not changes or changes[-1].config != r.config:
            changes.append(BatchChange(r.step, r.consumed, r.dp, r.micro, r.accum))
    return Schedule(tuple(changes), steps=len(records))
