"""The blend: which source each position of the tape draws from, as a table of period D.

Weights are exact rationals W_d / D (integers W_d >= 1 summing to D). Position n goes to a
source by an exact integer rule, and the first D positions form a table that repeats forever,
so a position maps to (source, draw) and back in O(1) for any p < 2**62.

**The rule (earliest deadline first).** Let c_d be the number of positions 0..n-1 given to
source d. Its next draw, number c_d, has the window of positions
[floor(c_d·D/W_d), ceil((c_d+1)·D/W_d)): it may not come earlier without getting ahead of its
target, nor later without falling behind. Position n goes to the source whose next draw is
*released* (deficit (n+1)·W_d − D·c_d > 0, i.e. floor(c_d·D/W_d) <= n) and *due soonest*
(smallest ceil((c_d+1)·D/W_d)), ties to the lowest index.

Note: the plainer rule "maximise the deficit (n+1)·W_d − D·c_d" (smooth weighted round-robin)
does *not* keep every prefix within one sample: for W = (1, 1, 1, 1, 4, 4) the last source is
12/12 behind after 9 positions. The tests keep that counterexample.

**Every prefix is within one sample.** Each draw lands in its window: in any span of positions
[a, b), source d has at most (b−a)·W_d/D draws whose window lies inside it, so all sources
together need at most b−a slots there; with that (Hall's) condition, earliest-deadline-first on
unit jobs with integer releases meets every deadline (the usual exchange argument). A draw in
its window means, for every n: count_d(n) − n·W_d/D < 1 (draw c−1 happened before n, so it was
released: (c−1)·D/W_d < n) and n·W_d/D − count_d(n) < 1 (draw c is not done by n, so its
deadline is past n: (c+1)·D/W_d > n).

**Exactly periodic.** At n = D the bound says |count_d(D) − W_d| < 1 for integers, so every
count_d(D) = W_d: all deficits are back to zero and every later window is an earlier one
shifted by D. The rule sees the same state shifted by D, so positions n and n + D go to the
same source, and the i-th draw of d in period q is draw q·W_d + i.

**Bounds.** Positions p are int64 in [0, 2**62). Then q = p // D < 2**62 and the draw
q·W_d + rank <= p + D fits in int64; the inverse checks the same range.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import overload

import numpy as np

from tokentape.errors import OutOfRangeError, PlanError

MAX_POSITION = 2**62
"""Positions (and the values of ``n`` in :meth:`Blend.count`) lie in [0, MAX_POSITION)."""

MAX_DENOMINATOR = 2**24
"""The largest period D: the table holds D entries."""

DEFAULT_DENOMINATOR = 2**16
"""The period weights are rounded to when they are not exact (``exact_weights``) or a plan
asks for no other (``weight_denominator``)."""

EXACT_CAP = DEFAULT_DENOMINATOR
"""The largest period ``exact_weights`` uses to make the stated weights exact: 65,536 positions
(a table built in a few tens of ms). Integer weights whose sum over their greatest common
divisor is at most that fit, and so do decimals whose shares need no longer period (weights in
hundredths summing to 1, or whole percentages: a period of at most 100)."""


def stated_value(w: float | int) -> Fraction:
    """The number a weight states: an integer as it is, a float as the shortest decimal that
    reads back as it (``0.55`` is 11/20, not the binary fraction nearest to it)."""
    if isinstance(w, int):
        return Fraction(w)
    return Fraction(repr(float(w)))  # float(): a numpy float's repr names its type


def exact_weights(
    weights: Sequence[float | int], names: Sequence[str], cap: int = EXACT_CAP
) -> tuple[tuple[int, ...], int]:
    """Integer weights ``W_d`` and their period ``D = sum(W)`` with ``W_d / D`` exactly the
    stated share ``w_d / sum(w)`` (``stated_value``), ``D`` the smallest that does it (60/30/10
    → 6/3/1 over 10; 0.55/0.3/0.15 → 11/6/3 over 20). When that period exceeds ``cap``, the
    weights are rounded over ``cap`` instead (``rational_weights``)."""
    _checked(weights, names)
    stated = [stated_value(w) for w in weights]
    total = sum(stated)
    shares = [w / total for w in stated]
    period = math.lcm(*(s.denominator for s in shares))
    if period <= cap:
        return tuple(int(s * period) for s in shares), period
    try:
        return rational_weights(weights, names, cap), cap
    except PlanError as exc:  # a weight too small for the cap: say what the plan can set
        if "rounds to 0" not in str(exc):
            raise
        raise PlanError(
            f"{str(exc).split('; ')[0]} (exactly, the weights need a period of {period:,}, "
            f"more than {cap:,}); raise it, or set weight_denominator (at most "
            f"{MAX_DENOMINATOR:,}) to round over a longer period"
        ) from None


def rational_weights(
    weights: Sequence[float | int], names: Sequence[str], denominator: int = DEFAULT_DENOMINATOR
) -> tuple[int, ...]:
    """Positive weights (any scale) as integers W_d >= 1 summing exactly to ``denominator``.

    Largest-remainder rounding of w_d / sum(w) · D in exact rational arithmetic (the floats'
    exact values), ties to the larger remainder, then the lower index.
    """
    exact = _checked(weights, names)
    if (
        isinstance(denominator, bool)
        or not isinstance(denominator, int)
        or not 1 <= denominator <= MAX_DENOMINATOR
    ):
        raise PlanError(
            f"blend: denominator {denominator!r}: expected an integer in [1, {MAX_DENOMINATOR}]"
        )
    total = sum(exact)
    quotas = [w * denominator / total for w in exact]
    units = [math.floor(q) for q in quotas]
    left = denominator - sum(units)
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - units[i]), i))
    for i in by_remainder[:left]:
        units[i] += 1
    for w, name, u in zip(weights, names, units, strict=True):
        if u == 0:
            raise PlanError(
                f"source '{name}': weight {w!r} rounds to 0/{denominator}; "
                "raise it or raise the denominator"
            )
    return tuple(units)


def _checked(weights: Sequence[float | int], names: Sequence[str]) -> list[Fraction]:
    """The weights' exact values, each a positive finite number, one per name."""
    if len(weights) != len(names):
        raise PlanError(f"blend: {len(weights)} weights for {len(names)} source names")
    if not weights:
        raise PlanError("blend: no sources; expected at least one source with a weight")
    exact = []
    for w, name in zip(weights, names, strict=True):
        if isinstance(w, bool) or not isinstance(w, int | float):
            raise PlanError(f"source '{name}': weight {w!r}: expected a number")
        if not math.isfinite(w):
            raise PlanError(f"source '{name}': weight {w}: expected a finite number")
        if w < 0:
            raise PlanError(f"source '{name}': weight {w} is negative; expected > 0")
        if w == 0:
            raise PlanError(f"source '{name}': weight must be positive; drop the source instead")
        exact.append(Fraction(w))
    return exact


def _schedule(weights: Sequence[int]) -> np.ndarray:
    """The source of each position in one period, by the earliest-deadline rule (module doc)."""
    denom = sum(weights)
    table = np.empty(denom, dtype=np.int32)
    count = [0] * len(weights)

    def deadline(d: int) -> int:
        return -(-(count[d] + 1) * denom // weights[d])  # ceil((c_d + 1)·D / W_d)

    ready = [(deadline(d), d) for d in range(len(weights))]  # every first draw is released at 0
    heapq.heapify(ready)
    waiting: list[tuple[int, int]] = []  # (release, source)
    for n in range(denom):
        while waiting and waiting[0][0] <= n:
            _, d = heapq.heappop(waiting)
            heapq.heappush(ready, (deadline(d), d))
        _, d = heapq.heappop(ready)  # never empty: D draws fill D positions (module doc)
        table[n] = d
        count[d] += 1
        if count[d] < weights[d]:
            release = count[d] * denom // weights[d]
            heapq.heappush(waiting, (release, d))
    return table


@dataclass(frozen=True, eq=False)
class Blend:
    """The blend table of one period and its inverse.

    ``table[r]``: the source of position r of the period. ``rank[r]``: which draw of that
    source (within the period) position r is. ``occurrences[offsets[d] + i]``: the position in
    the period of draw i of source d; ``offsets`` has length S + 1.
    """

    weights: tuple[int, ...]
    denominator: int
    table: np.ndarray
    rank: np.ndarray
    occurrences: np.ndarray
    offsets: np.ndarray

    @classmethod
    def build(cls, weights: Sequence[int]) -> Blend:
        """The blend of integer weights W_d >= 1; the period is D = sum(W)."""
        w = tuple(int(x) for x in weights)
        if not w:
            raise PlanError("blend: no sources; expected at least one weight")
        if any(x < 1 for x in w) or any(x != y for x, y in zip(w, weights, strict=True)):
            raise PlanError(f"blend: weights {list(weights)}: expected integers >= 1")
        denom = sum(w)
        if denom > MAX_DENOMINATOR:
            raise PlanError(
                f"blend: weights sum to {denom}; expected a period of at most {MAX_DENOMINATOR}"
            )
        table = _schedule(w)
        occurrences = np.argsort(table, kind="stable").astype(np.int64)  # by (source, position)
        offsets = np.zeros(len(w) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(w)
        rank = np.empty(denom, dtype=np.int64)
        rank[occurrences] = np.arange(denom, dtype=np.int64) - np.repeat(offsets[:-1], w)
        small = table.astype(np.int16) if len(w) <= np.iinfo(np.int16).max else table
        for a in (small, rank, occurrences, offsets):
            a.setflags(write=False)
        return cls(w, denom, small, rank, occurrences, offsets)

    @cached_property
    def weight_array(self) -> np.ndarray:
        """The weights W_d as a read-only int64 array."""
        w = np.asarray(self.weights, dtype=np.int64)
        w.setflags(write=False)
        return w

    @property
    def n_sources(self) -> int:
        """The number of sources S."""
        return len(self.weights)

    def source_and_draw(self, positions: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised: the source (int64) of each position and which draw of that source it is."""
        p = _positions(positions)
        q, r = np.divmod(p, self.denominator)
        source = self.table[r].astype(np.int64)
        return source, q * self.weight_array[source] + self.rank[r]

    def position(self, source: np.ndarray | int, draw: np.ndarray | int) -> np.ndarray:
        """Vectorised inverse of :meth:`source_and_draw`: the position of each (source, draw)."""
        d = self._sources(source)
        j = np.asarray(draw, dtype=np.int64)
        if j.size and int(j.min()) < 0:
            raise OutOfRangeError(f"blend: draw {int(j.min())}: expected a draw index >= 0")
        d, j = np.broadcast_arrays(d, j)
        w = self.weight_array[d]
        q, r = np.divmod(j, w)
        if q.size and int(q.max()) > MAX_POSITION // self.denominator:
            raise OutOfRangeError(f"blend: draw {int(j.max())} lies beyond position 2**62")
        p: np.ndarray = q * self.denominator + self.occurrences[self.offsets[d] + r]
        if p.size and int(p.max()) >= MAX_POSITION:
            raise OutOfRangeError(f"blend: draw {int(j.max())} lies beyond position 2**62")
        return p

    @overload
    def count(self, source: int, n: int) -> int: ...
    @overload
    def count(self, source: np.ndarray | int, n: np.ndarray | int) -> np.ndarray | int: ...
    def count(self, source: np.ndarray | int, n: np.ndarray | int) -> np.ndarray | int:
        """Draws of ``source`` among positions [0, n), in O(1); an int when both are scalars.

        Within a period the prefix bound leaves two candidates, f = floor(m·W_d/D) and f + 1;
        it is f + 1 exactly when draw f of the period lies before m.
        """
        one = type(source) is int and type(n) is int
        if one and 0 <= source < len(self.weights) and 0 <= n <= MAX_POSITION:
            # One count: in Python integers (no numpy calls).
            w, (q, m) = self.weights[source], divmod(n, self.denominator)
            f = m * w // self.denominator
            return q * w + f + int(self.occurrences[int(self.offsets[source]) + f] < m)
        d = self._sources(source)
        nn = np.asarray(n, dtype=np.int64)
        if nn.size and (int(nn.min()) < 0 or int(nn.max()) > MAX_POSITION):
            bad = int(nn.min()) if int(nn.min()) < 0 else int(nn.max())
            raise OutOfRangeError(f"blend: prefix length {bad}: expected an integer in [0, 2**62]")
        d, nn = np.broadcast_arrays(d, nn)
        w = self.weight_array[d]
        q, m = np.divmod(nn, self.denominator)
        f = m * w // self.denominator  # m < D and W_d <= D: no overflow, and f < W_d
        c = q * w + f + (self.occurrences[self.offsets[d] + f] < m)
        return int(c) if c.ndim == 0 else c

    def _sources(self, source: np.ndarray | int) -> np.ndarray:
        d = np.asarray(source, dtype=np.int64)
        if d.size and (int(d.min()) < 0 or int(d.max()) >= self.n_sources):
            bad = int(d.min()) if int(d.min()) < 0 else int(d.max())
            raise OutOfRangeError(
                f"blend: source index {bad}: expected 0 <= index < {self.n_sources}"
            )
        return d


def _positions(positions: np.ndarray | int) -> np.ndarray:
    p = np.asarray(positions, dtype=np.int64)
    if p.size and (int(p.min()) < 0 or int(p.max()) >= MAX_POSITION):
        raise OutOfRangeError(
            f"blend: positions in [{int(p.min())}, {int(p.max())}]: expected [0, 2**62)"
        )
    return p


__all__ = [
    "DEFAULT_DENOMINATOR",
    "EXACT_CAP",
    "MAX_DENOMINATOR",
    "MAX_POSITION",
    "Blend",
    "exact_weights",
    "rational_weights",
    "stated_value",
]
