"""Resolving a rank's coming steps in chunks: one ``Tape.resolve`` call for many steps.

A step's positions are known long before it is trained on: a rank reads ``width`` consecutive
positions from ``consumed + offset``, and the next step the same ``global_batch`` further on.
Resolving a small step alone costs the tape's fixed per-call work (a few hundred numpy calls,
however few the positions); resolving ``CHUNK`` positions of many coming steps at once spreads
it over all of them. The samples are those of resolving each step alone: ``resolve`` is a pure
function of each position.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.tape.resolve import Resolved, Tape

CHUNK = 1 << 18
"""At most this many positions are resolved per call (at least one whole step): 10–25 ms of
work, 6 MiB."""

FIRST_STEPS = 4
"""Steps the first chunk covers; each next chunk covers twice as many as the one before, up to
``CHUNK`` positions or ``MAX_STEPS`` steps: the first step (a start, a resume) stays as quick
as resolving it alone, and a long run soon resolves in large chunks."""

MAX_STEPS = 1024
"""Steps one chunk covers at most (small steps: a chunk's work stays a few ms)."""

_KEEP = 2
"""Chunks kept: the current one and the one before (steps built out of order across them)."""


@dataclass(frozen=True)
class StepShape:
    """Which positions of each step: ``width`` from ``consumed + offset``, steps
    ``global_batch`` apart."""

    global_batch: int
    offset: int
    width: int


@dataclass(frozen=True)
class _Chunk:
    """Steps ``first``, ``first + global_batch``, ... (``steps`` of them), resolved as one."""

    shape: StepShape
    first: int
    steps: int
    resolved: Resolved

    def get(self, consumed: int, shape: StepShape) -> Resolved | None:
        if shape != self.shape:
            return None
        i, rest = divmod(consumed - self.first, shape.global_batch)
        if rest or not 0 <= i < self.steps:
            return None
        lo, hi = i * shape.width, (i + 1) * shape.width
        r = self.resolved
        return Resolved(r.source[lo:hi], r.epoch[lo:hi], r.sample[lo:hi])


class ResolveAhead:
    """The resolution of any step of a rank, from chunks of coming steps resolved together."""

    def __init__(self, tape: Tape, chunk: int = CHUNK) -> None:
        self.tape = tape
        self.chunk = chunk
        self._chunks: list[_Chunk] = []
        self._lock = threading.Lock()
        self._steps = FIRST_STEPS  # steps the next chunk covers

    def resolved(self, consumed: int, shape: StepShape) -> Resolved:
        """The (source, epoch, sample) of the positions of the step starting at ``consumed``."""
        with self._lock:
            for chunk in reversed(self._chunks):
                hit = chunk.get(consumed, shape)
                if hit is not None:
                    return hit
            made = self._resolve_chunk(consumed, shape)
            self._chunks = [*self._chunks[1 - _KEEP :], made]
            hit = made.get(consumed, shape)
            assert hit is not None  # the chunk starts at this step
            return hit

    def _resolve_chunk(self, consumed: int, shape: StepShape) -> _Chunk:
        if not self._chunks or self._chunks[-1].shape != shape:  # a new shape starts small
            self._steps = FIRST_STEPS
        steps = min(self._steps, MAX_STEPS, max(1, self.chunk // max(1, shape.width)))
        self._steps = 2 * steps
        room = (MAX_POSITION - (consumed + shape.offset + shape.width)) // shape.global_batch + 1
        steps = max(1, min(steps, room))
        first = consumed + shape.offset
        if shape.width == shape.global_batch:  # consecutive steps are one run of positions
            r = self.tape.resolve_range(first, steps * shape.width)
        else:
            starts = first + np.arange(steps, dtype=np.int64) * shape.global_batch
            grid = starts[:, None] + np.arange(shape.width, dtype=np.int64)
            r = self.tape.resolve(grid.ravel())
        return _Chunk(shape, consumed, steps, r)


__all__ = ["CHUNK", "MAX_STEPS", "ResolveAhead", "StepShape"]
