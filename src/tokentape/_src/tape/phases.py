"""A blend in phases: the mixture changes at given positions, and every source's draws continue.

Phase i starts at position ``starts[i]`` (the first at 0) and runs to the next start (the last
forever), with integer weights ``weights[i]`` (one per source, 0 allowed, one positive at
least). Within a phase, positions counted from its start follow the ``Blend`` of its positive
weights, so every prefix *of the phase* keeps every source within one sample of the phase's
weights. A source's draws are numbered over the whole run: its first draw in phase i is draw
``base[i][d]``, the number it drew in the phases before, so its k-th draw anywhere is draw k
of its pass structure (nothing repeats before a pass is complete, passes count over the run).

``PhasedBlend`` has the interface the tape reads from ``Blend`` (``source_and_draw``,
``position``, ``count``, ``n_sources``), each in closed form: a position's phase is a binary
search over the starts, a draw's phase one over the source's bases.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from tokentape._src.tape.blend import MAX_POSITION, Blend
from tokentape.errors import OutOfRangeError, PlanError


@dataclass(frozen=True, eq=False)
class Phase:
    """One phase: its first position, its blend over its positive sources, which global
    source each of the blend's indices is, and each source's draws before the phase."""

    start: int
    weights: tuple[int, ...]
    blend: Blend
    sources: np.ndarray  # the blend's source i is global source sources[i]
    local: np.ndarray  # global source d is the blend's local[d], or -1 (weight 0 here)
    base: np.ndarray  # int64 per global source: draws in the phases before


@dataclass(frozen=True, eq=False)
class PhasedBlend:
    """Blends in sequence (see the module docstring)."""

    phases: tuple[Phase, ...]
    starts: np.ndarray  # int64, ascending, starts[0] == 0
    bases: np.ndarray  # int64 (phases, sources): each phase's ``base``

    @classmethod
    def build(cls, starts: Sequence[int], weights: Sequence[Sequence[int]]) -> PhasedBlend:
        """Phases starting at ``starts`` (the first 0, then strictly increasing, below
        2**62) with integer ``weights`` per phase (one per source, >= 0, one positive)."""
        if not starts or len(starts) != len(weights):
            raise PlanError("phases: one start per phase, and at least one phase")
        n_sources = len(weights[0])
        if int(starts[0]) != 0:
            raise PlanError(f"phases: the first phase starts at position 0, not {starts[0]}")
        for a, b in itertools.pairwise(starts):
            if not int(a) < int(b) < MAX_POSITION:
                raise PlanError(f"phases: starts must increase below 2**62, got {a} then {b}")
        phases: list[Phase] = []
        base = np.zeros(n_sources, dtype=np.int64)
        for i, (start, w) in enumerate(zip(starts, weights, strict=True)):
            w = tuple(int(x) for x in w)
            if len(w) != n_sources or any(x < 0 for x in w) or not any(w):
                raise PlanError(
                    f"phases: phase {i} weights {list(w)}: expected {n_sources} integers >= 0, "
                    "one positive at least"
                )
            positive = np.flatnonzero(np.asarray(w) > 0)
            local = np.full(n_sources, -1, dtype=np.int64)
            local[positive] = np.arange(positive.size)
            blend = Blend.build([w[d] for d in positive.tolist()])
            if phases:  # the draws of the phase before, over its whole length
                before = phases[-1]
                length = int(start) - before.start
                base = base + _counts(before, length, n_sources)
            phases.append(Phase(int(start), w, blend, positive, local, base.copy()))
        starts_arr = np.asarray([p.start for p in phases], dtype=np.int64)
        bases = np.stack([p.base for p in phases])
        return cls(tuple(phases), starts_arr, bases)

    @property
    def n_sources(self) -> int:
        return len(self.phases[0].weights)

    def phase_of(self, positions: np.ndarray) -> np.ndarray:
        """The phase index of each position."""
        return np.searchsorted(self.starts, positions, side="right") - 1

    def source_and_draw(self, positions: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised: the source of each position and which of its draws (over the run)."""
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (int(p.min()) < 0 or int(p.max()) >= MAX_POSITION):
            raise OutOfRangeError(
                f"phases: positions in [{int(p.min())}, {int(p.max())}]: expected [0, 2**62)"
            )
        source = np.empty(p.shape, dtype=np.int64)
        draw = np.empty(p.shape, dtype=np.int64)
        which = self.phase_of(p)
        for i in np.unique(which).tolist():
            at = which == i
            phase = self.phases[i]
            local, j = phase.blend.source_and_draw(p[at] - phase.start)
            d = phase.sources[local]
            source[at], draw[at] = d, phase.base[d] + j
        return source, draw

    def position(self, source: np.ndarray | int, draw: np.ndarray | int) -> np.ndarray:
        """Vectorised inverse of ``source_and_draw``; a draw the run never makes (a source
        with weight 0 from some phase on, past its last draw) is refused."""
        d = np.asarray(source, dtype=np.int64)
        if d.size and (int(d.min()) < 0 or int(d.max()) >= self.n_sources):
            raise OutOfRangeError(f"phases: source index out of [0, {self.n_sources})")
        j = np.asarray(draw, dtype=np.int64)
        if j.size and int(j.min()) < 0:
            raise OutOfRangeError(f"phases: draw {int(j.min())}: expected a draw index >= 0")
        d, j = np.broadcast_arrays(d, j)
        out = np.empty(d.shape, dtype=np.int64)
        for s in np.unique(d).tolist():
            at = d == s
            out[at] = self._positions_of(s, j[at])
        return out

    def _positions_of(self, source: int, draws: np.ndarray) -> np.ndarray:
        bases = self.bases[:, source]
        # The phase of draw k: the last phase where the source draws whose base is <= k.
        drawing = np.asarray([p.local[source] >= 0 for p in self.phases])
        candidates = np.flatnonzero(drawing)
        if not candidates.size:
            raise OutOfRangeError(f"phases: source {source} is never drawn")
        at = np.searchsorted(bases[candidates], draws, side="right") - 1
        if draws.size and int(at.min()) < 0:
            raise OutOfRangeError(
                f"phases: draw {int(draws.min())} of source {source} is never made"
            )
        phase_idx = candidates[at]
        out = np.empty(draws.shape, dtype=np.int64)
        for i in np.unique(phase_idx).tolist():
            here = phase_idx == i
            phase = self.phases[i]
            j = draws[here] - phase.base[source]
            if i + 1 < len(self.phases):
                made = int(self.bases[i + 1, source] - phase.base[source])
                if int(j.max()) >= made:
                    raise OutOfRangeError(
                        f"phases: draw {int(draws[here].max())} of source {source} is never made"
                    )
            local = int(phase.local[source])
            out[here] = phase.start + phase.blend.position(local, j)
        if out.size and int(out.max()) >= MAX_POSITION:
            raise OutOfRangeError("phases: a draw lies beyond position 2**62")
        return out

    @overload
    def count(self, source: int, n: int) -> int: ...
    @overload
    def count(self, source: np.ndarray | int, n: np.ndarray | int) -> np.ndarray | int: ...
    def count(self, source: np.ndarray | int, n: np.ndarray | int) -> np.ndarray | int:
        """Draws of ``source`` among positions [0, n), in O(log phases)."""
        d = np.asarray(source, dtype=np.int64)
        nn = np.asarray(n, dtype=np.int64)
        if nn.size and (int(nn.min()) < 0 or int(nn.max()) > MAX_POSITION):
            raise OutOfRangeError("phases: prefix lengths must lie in [0, 2**62]")
        if d.size and (int(d.min()) < 0 or int(d.max()) >= self.n_sources):
            raise OutOfRangeError(f"phases: source index out of [0, {self.n_sources})")
        d, nn = np.broadcast_arrays(d, nn)
        which = np.maximum(self.phase_of(nn - 1), 0)  # the phase of the last position counted
        out = np.empty(d.shape, dtype=np.int64)
        for i in np.unique(which).tolist():
            at = which == i
            phase = self.phases[i]
            local = phase.local[d[at]]
            inside = np.clip(nn[at] - phase.start, 0, None)
            counted = np.zeros(local.shape, dtype=np.int64)
            drawn = local >= 0
            if drawn.any():
                counted[drawn] = phase.blend.count(local[drawn], inside[drawn])
            out[at] = phase.base[d[at]] + counted
        return int(out) if out.ndim == 0 else out


def _counts(phase: Phase, length: int, n_sources: int) -> np.ndarray:
    """Each global source's draws in the first ``length`` positions of ``phase``."""
    out = np.zeros(n_sources, dtype=np.int64)
    for i, d in enumerate(phase.sources.tolist()):
        out[d] = phase.blend.count(i, length)
    return out


__all__ = ["Phase", "PhasedBlend"]
