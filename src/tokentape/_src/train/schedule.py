"""Which optimizer step, data-parallel rank and micro-batch a position belongs to, and back.

A run's batch shape may change at step boundaries. A ``Schedule`` is the list of those changes
(``BatchChange``: from step s, with ``consumed`` samples applied before it, steps have shape
(dp, micro, accum)), taken from a checkpoint's data state, a step log, or one fixed shape.
Within a step of shape (dp, micro, accum) starting at ``consumed``, position p sits at offset
o = p − consumed: DP rank o // (micro·accum), micro-batch (o mod micro·accum) // micro.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import BatchChange
from tokentape._src.util.checks import as_index
from tokentape.errors import ArgumentError, OutOfRangeError


@dataclass(frozen=True)
class Placement:
    """Where positions were (or will be) trained: arrays of the same shape as the positions."""

    step: np.ndarray
    dp_rank: np.ndarray
    micro_step: np.ndarray  # index of the micro-batch within the rank's step (0..accum-1)
    row: np.ndarray  # row within that micro-batch


@dataclass(frozen=True)
class Schedule:
    """Batch-shape changes of a run; ``steps`` bounds it when known (a log), else open-ended."""

    changes: tuple[BatchChange, ...]
    steps: int | None = None

    def __post_init__(self) -> None:
        if not self.changes or self.changes[0].step != 0 or self.changes[0].consumed != 0:
            raise ArgumentError("a schedule starts at step 0 with consumed 0")
        for a, b in zip(self.changes, self.changes[1:], strict=False):
            expected = a.consumed + (b.step - a.step) * a.config.global_batch
            if b.step <= a.step or b.consumed != expected:
                raise ArgumentError(
                    f"inconsistent batch history: step {b.step} should start at consumed "
                    f"{expected}, found {b.consumed}"
                )

    @classmethod
    def uniform(cls, config: BatchConfig) -> Schedule:
        """Every step has the same shape."""
        return cls((BatchChange(0, 0, config.dp_size, config.micro, config.accum),))

    @property
    def end(self) -> int | None:
        """Samples applied after the last known step (None when open-ended)."""
        if self.steps is None:
            return None
        return self.start(self.steps)[0] if self.steps > 0 else 0

    def start(self, step: int) -> tuple[int, BatchConfig]:
        """``consumed`` before ``step`` and the shape of that step."""
        step = as_index("step", step)
        if step < 0 or (self.steps is not None and step > self.steps):
            known = "" if self.steps is None else f" (the log has steps 0..{self.steps - 1})"
            raise OutOfRangeError(f"step {step} is outside the run{known}")
        change = next(c for c in reversed(self.changes) if c.step <= step)
        return change.consumed + (step - change.step) * change.config.global_batch, change.config

    def consumed_at(self, steps: np.ndarray) -> np.ndarray:
        """``consumed`` before each of ``steps`` (vectorised ``start``; steps >= 0, and at
        most ``self.steps`` when bounded)."""
        s = np.asarray(steps, dtype=np.int64)
        first = np.array([c.step for c in self.changes], dtype=np.int64)
        k = np.searchsorted(first, s, side="right") - 1
        base = np.array([c.consumed for c in self.changes], dtype=np.int64)[k]
        b = np.array([c.config.global_batch for c in self.changes], dtype=np.int64)[k]
        return base + (s - first[k]) * b

    def place(self, positions: np.ndarray) -> Placement:
        """Step, DP rank, micro-batch and row of each position (vectorised). Positions beyond a
        bounded schedule get step −1 and rank −1."""
        p = np.asarray(positions, dtype=np.int64)
        starts = np.array([c.consumed for c in self.changes], dtype=np.int64)
        k = np.searchsorted(starts, p, side="right") - 1
        first = np.array([c.step for c in self.changes], dtype=np.int64)[k]
        b = np.array([c.config.global_batch for c in self.changes], dtype=np.int64)[k]
        per_rank = np.array([c.config.per_rank for c in self.changes], dtype=np.int64)[k]
        micro = np.array([c.micro for c in self.changes], dtype=np.int64)[k]
        rel = p - starts[k]
        step = first + rel // b
        offset = rel % b
        rank = offset // per_rank
        micro_step = (offset % per_rank) // micro
        row = offset % micro
        if self.steps is not None:
            beyond = step >= self.steps
            step, rank = np.where(beyond, -1, step), np.where(beyond, -1, rank)
            micro_step, row = np.where(beyond, -1, micro_step), np.where(beyond, -1, row)
        return Placement(step, rank, micro_step, row)


__all__ = ["Placement", "Schedule"]
