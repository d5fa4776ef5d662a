"""Resolve: global position → (source, epoch, sample), and back, in closed form.

position p ─blend→ (source d, draw j) ─divmod(j, n_d)→ (epoch e, offset o) ─perm(seed, d, e)→ k

Every step is a bijection (the blend between positions and (source, draw) pairs, divmod between
draws and (epoch, offset), the keyed permutation on [0, n_d)), so each sample of each pass has
exactly one position, and ``position_of`` finds it without scanning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from tokentape._src.tape import permutation
from tokentape._src.tape.blend import MAX_POSITION, Blend
from tokentape._src.tape.permutation import (
    MERGE_BELOW,
    cached_permutation,
    permute_epochs,
    permute_many,
    unique_inverse,
)
from tokentape._src.tape.phases import PhasedBlend
from tokentape.errors import ArgumentError, OutOfRangeError

if TYPE_CHECKING:
    from tokentape._src.tape.excise import Excision

DENSE_DOMAINS = 256
"""With the compiled kernel, a scattered batch whose (source, pass) pairs number at most this
many (for each source, every pass from the first to the last it meets) walks in one call."""


def as_positions(positions: np.ndarray | Sequence[int] | int) -> np.ndarray:
    """``positions`` as int64 (no copy when they already are): integers only (a float is
    refused, never truncated), unsigned ones below 2**62 (they would wrap)."""
    given = np.asarray(positions)
    if given.size and given.dtype.kind not in "iu":
        raise ArgumentError(f"positions must be integers, got dtype {given.dtype}")
    if given.dtype.kind == "u" and given.size and int(given.max()) >= MAX_POSITION:
        raise OutOfRangeError(f"position {given.max()}: expected positions in [0, 2**62)")
    return given.astype(np.int64, copy=False)


@dataclass(frozen=True)
class Resolved:
    """Where a batch of positions lands: one entry per position."""

    source: np.ndarray  # int64 source index, in plan order
    epoch: np.ndarray  # int64 pass over that source (0 = first)
    sample: np.ndarray  # int64 sample index within the source


@dataclass(frozen=True)
class Tape:
    """The pure map of a plan: names, sample counts, seed and the blend (one, or blends in
    phases whose draws continue: ``tape.phases``), and the positions a plan excised from it
    (``tape.excise``): positions are then those of the excised tape, and ``base``
    positions those of the blend."""

    names: tuple[str, ...]
    n_samples: tuple[int, ...]
    seed: int
    blend: Blend | PhasedBlend
    excision: Excision | None = None

    def with_excision(self, excision: Excision | None) -> Tape:
        """This tape with the base positions of ``excision`` left out (none: the base)."""
        return replace(self, excision=excision if excision is not None and len(excision) else None)

    @property
    def base(self) -> Tape:
        """The tape without its excision."""
        return self if self.excision is None else replace(self, excision=None)

    @classmethod
    def build(
        cls, names: Sequence[str], n_samples: Sequence[int], weights: Sequence[int], seed: int
    ) -> Tape:
        """``weights`` are the exact integers W_d of the blend (summing to its denominator)."""
        _check_sizes(names, n_samples, weights)
        return cls(tuple(names), tuple(int(n) for n in n_samples), int(seed), Blend.build(weights))

    @classmethod
    def build_phased(
        cls,
        names: Sequence[str],
        n_samples: Sequence[int],
        starts: Sequence[int],
        weights: Sequence[Sequence[int]],
        seed: int,
    ) -> Tape:
        """A tape whose mixture changes at the positions ``starts`` (the first 0): phase i
        has the integer weights ``weights[i]`` (0 allowed); every source's draws continue
        across phases (``tape.phases``)."""
        for w in weights:
            if len(w) != len(names):
                raise ArgumentError("tape: every phase needs one weight per source")
        _check_sizes(names, n_samples, weights[0] if weights else [])
        blend = PhasedBlend.build(starts, weights)
        return cls(tuple(names), tuple(int(n) for n in n_samples), int(seed), blend)

    def resolve(self, positions: np.ndarray | Sequence[int]) -> Resolved:
        """Vectorised: the (source, epoch, sample) of each position."""
        p = as_positions(positions)
        if p.ndim != 1:
            raise ArgumentError(f"tape: positions must be one-dimensional, got shape {p.shape}")
        if self.excision is not None:
            if p.size and int(p.min()) < 0:
                raise OutOfRangeError(f"position {p.min()}: expected positions in [0, 2**62)")
            if p.size > 1 and int(p[-1]) - int(p[0]) == p.size - 1 and np.all(np.diff(p) == 1):
                return self.resolve_range(int(p[0]), p.size)
            return self._resolve_base(self.excision.to_base(p))
        return self._resolve_base(p)

    def _resolve_base(self, p: np.ndarray) -> Resolved:
        """``resolve`` of base positions."""
        consecutive = p.size > 1 and int(p[-1]) - int(p[0]) == p.size - 1
        if consecutive and np.all(np.diff(p) == 1):  # a run of positions: the fast path
            return self._resolve_base_range(int(p[0]), p.size)
        kernel = permutation._kernel
        if kernel is not None and p.size and isinstance(self.blend, Blend):
            resolved = self._resolve_compiled(kernel, self.blend, p)
            if resolved is not None:
                return resolved
        return self._samples(*self.blend.source_and_draw(p))

    def _resolve_compiled(self, kernel: ModuleType, blend: Blend, p: np.ndarray) -> Resolved | None:
        """``resolve`` of scattered positions with the compiled loops: the blend and the split
        into passes in one loop, then every value's walk in one call (the kernel sorts them by
        domain itself: each value's (source, pass) is numbered densely here, nothing sorted).
        None when the passes met span too many domains for that."""
        p = np.ascontiguousarray(p)
        source, epoch, offset = np.empty_like(p), np.empty_like(p), np.empty_like(p)
        n = np.asarray(self.n_samples, dtype=np.int64)
        first, last = np.empty_like(n), np.empty_like(n)
        try:
            kernel.split(p, blend.table, blend.rank, blend.weight_array, n,
                         source, epoch, offset, first, last)  # fmt: skip
        except ValueError:
            blend.source_and_draw(p)  # the blend's own error names a bad position
            raise
        met = last >= 0
        spans = np.where(met, last - first + 1, 0)  # each source's passes, first to last
        if int(spans.sum()) > DENSE_DOMAINS:
            return None
        base = np.cumsum(spans) - spans  # where each source's domains start
        group = epoch + (base - np.where(met, first, 0))[source]
        domains = [
            (self.n_samples[d], self.names[d], e)
            for d in np.flatnonzero(met).tolist()
            for e in range(int(first[d]), int(last[d]) + 1)
        ]
        return Resolved(source, epoch, permute_many(self.seed, domains, group, offset))

    def _samples(self, source: np.ndarray, draw: np.ndarray) -> Resolved:
        """The (source, epoch, sample) of each (source, draw over the run)."""
        epoch = np.empty_like(draw)
        sample = np.empty_like(draw)
        walk = _Walk(sample)
        # Group positions by source (a stable radix sort of a small-integer array), then
        # split each source's draws into (pass, offset) with scalar n.
        small = source.astype(np.int16 if len(self.names) > 127 else np.int8)
        order = np.argsort(small, kind="stable")
        bounds = np.searchsorted(small[order], np.arange(len(self.names) + 1))
        for d in range(len(self.names)):
            idx = order[bounds[d] : bounds[d + 1]]
            if idx.size:
                e, offset = np.divmod(draw[idx], self.n_samples[d])
                epoch[idx] = e
                walk.add(self, d, idx, e, offset)
        walk.run(self.seed)
        return Resolved(source.astype(np.int64), epoch, sample)

    def resolve_range(self, start: int, count: int) -> Resolved:
        """``resolve(range(start, start + count))`` without sorting or searching (of an
        excised tape: each run of base positions between excised ones so)."""
        if self.excision is None or count <= 0:
            return self._resolve_base_range(start, count)
        if start < 0:
            raise OutOfRangeError(f"tape: position {start}: expected positions in [0, 2**62)")
        x = self.excision
        first, last = (int(b) for b in x.to_base(np.array([start, start + count - 1])))
        within = x.positions[
            np.searchsorted(x.positions, first) : np.searchsorted(x.positions, last)
        ]
        whole = self._resolve_base_range(first, last - first + 1)
        if not within.size:
            return whole
        keep = np.ones(last - first + 1, dtype=bool)
        keep[within - first] = False  # the base range, less the excised positions inside it
        return Resolved(whole.source[keep], whole.epoch[keep], whole.sample[keep])

    def _resolve_base_range(self, start: int, count: int) -> Resolved:
        """``resolve_range`` of base positions.

        Within a run of consecutive positions, source d sits where the period's table has d
        (a tiling of its occurrences), and its draws there are consecutive integers from
        ``blend.count(d, start)``. A tape in phases tiles each phase's stretch of the range
        with that phase's blend, its draws continuing from the phase's base.
        """
        blend = self.blend
        start, count = int(start), int(count)
        if count <= 0:
            empty = np.zeros(0, dtype=np.int64)
            return Resolved(empty, empty, empty)
        if start < 0 or start + count > MAX_POSITION:
            raise OutOfRangeError(
                f"tape: positions [{start}, {start + count}): expected positions in [0, 2**62)"
            )
        source = np.empty(count, dtype=np.int64)
        epoch = np.empty(count, dtype=np.int64)
        sample = np.empty(count, dtype=np.int64)
        walk = _Walk(sample)  # every source's draws, permuted in one walk at the end
        if isinstance(blend, PhasedBlend):  # each phase's stretch of the run, tiled alike
            end = start + count
            first = int(blend.phase_of(np.asarray(start)))
            last = int(blend.phase_of(np.asarray(end - 1)))
            for i in range(first, last + 1):
                phase = blend.phases[i]
                a = max(start, phase.start)
                b = end if i == last else min(end, blend.phases[i + 1].start)
                global_of = phase.sources.tolist()
                base = [int(phase.base[d]) for d in global_of]
                self._tile(phase.blend, a - phase.start, b - a, a - start, (source, epoch),
                           walk, global_of, base)  # fmt: skip
        else:
            self._tile(blend, start, count, 0, (source, epoch), walk,
                       list(range(len(self.names))), [0] * len(self.names))  # fmt: skip
        walk.run(self.seed)
        return Resolved(source, epoch, sample)

    def _tile(
        self,
        blend: Blend,
        start: int,
        count: int,
        at: int,
        out: tuple[np.ndarray, np.ndarray],
        walk: _Walk,
        global_of: list[int],
        base: list[int],
    ) -> None:
        """Fill ``out`` (source, epoch) from index ``at`` for positions [start, start + count)
        of ``blend``, whose source i is the tape's source ``global_of[i]`` with ``base[i]``
        draws before the blend's position 0; their samples go to ``walk``."""
        source, epoch = out
        period = blend.denominator
        first, last = start // period, (start + count - 1) // period
        offsets = (np.arange(first, last + 1, dtype=np.int64) * period - start)[:, None]
        for i, d in enumerate(global_of):
            occurrences = blend.occurrences[blend.offsets[i] : blend.offsets[i + 1]]
            idx = (offsets + occurrences[None, :]).ravel()
            idx = idx[(idx >= 0) & (idx < count)]
            if not idx.size:
                continue
            idx += at
            first_draw = base[i] + int(blend.count(i, start))
            e, offset = np.divmod(np.arange(first_draw, first_draw + idx.size), self.n_samples[d])
            source[idx] = d
            epoch[idx] = e
            walk.add(self, d, idx, e, offset)

    def position_of(
        self, source: int, sample: np.ndarray | int, epoch: np.ndarray | int
    ) -> np.ndarray:
        """The inverse: the position at which ``sample`` of ``source`` is drawn in ``epoch``;
        -1 where an excision left that draw out."""
        base = self.base_position_of(source, sample, epoch)
        if self.excision is None:
            return base
        position, kept = self.excision.to_new(base)
        position[~kept] = -1
        return position

    def base_position_of(
        self, source: int, sample: np.ndarray | int, epoch: np.ndarray | int
    ) -> np.ndarray:
        """The base position at which ``sample`` of ``source`` is drawn in ``epoch``."""
        if not 0 <= source < len(self.names):
            raise OutOfRangeError(
                f"tape: source index {source}: expected 0 <= index < {len(self.names)}"
            )
        samples = np.atleast_1d(np.asarray(sample, dtype=np.int64))
        epochs = np.broadcast_to(np.asarray(epoch, dtype=np.int64), samples.shape)
        n, name = self.n_samples[source], self.names[source]
        if samples.size and (int(samples.min()) < 0 or int(samples.max()) >= n):
            bad = int(samples.min()) if int(samples.min()) < 0 else int(samples.max())
            raise OutOfRangeError(f"tape: sample {bad}: expected samples in [0, {n})")
        if epochs.size and int(epochs.min()) < 0:
            raise OutOfRangeError(f"tape: epoch {epochs.min()}: expected epochs >= 0")
        if epochs.size and int(epochs.max()) > MAX_POSITION // n:  # its draws overflow int64
            raise OutOfRangeError(
                f"tape: epoch {epochs.max()} of source '{name}': its positions lie beyond 2**62"
            )
        offsets = permute_epochs(n, self.seed, name, epochs, samples, forward=False)
        draws = epochs * self.n_samples[source] + offsets
        return np.asarray(self.blend.position(source, draws), dtype=np.int64)


def _check_sizes(names: Sequence[str], n_samples: Sequence[int], weights: Sequence[int]) -> None:
    if len(names) != len(n_samples) or len(names) != len(weights):
        raise ArgumentError("tape: names, n_samples and weights must have the same length")
    if any(isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1 for n in n_samples):
        raise ArgumentError(f"tape: n_samples {list(n_samples)}: expected integers >= 1")


@dataclass
class _Walk:
    """Draws of several sources and passes, gathered to go through their permutations in one
    vectorised walk (``permute_many``): a small batch then pays the network's numpy calls once,
    not once per source."""

    sample: np.ndarray
    """Where each draw's sample goes (at its row)."""
    idx: list[np.ndarray] = field(default_factory=list)
    group: list[np.ndarray] = field(default_factory=list)
    offset: list[np.ndarray] = field(default_factory=list)
    domains: list[tuple[int, str, int]] = field(default_factory=list)
    _index: dict[tuple[int, int], int] = field(default_factory=dict)

    def _domain(self, tape: Tape, d: int, epoch: int) -> int:
        key = (d, epoch)
        if key not in self._index:
            self._index[key] = len(self.domains)
            self.domains.append((tape.n_samples[d], tape.names[d], epoch))
        return self._index[key]

    def add(
        self, tape: Tape, d: int, idx: np.ndarray, epochs: np.ndarray, offsets: np.ndarray
    ) -> None:
        """Offsets ``offsets`` of source ``d`` in passes ``epochs``, for output rows ``idx``."""
        lo, hi = int(epochs.min()), int(epochs.max())
        if idx.size >= MERGE_BELOW:  # many draws: walked now, on their own (scalar keys)
            n, name = tape.n_samples[d], tape.names[d]
            if lo == hi:
                self.sample[idx] = cached_permutation(n, tape.seed, name, lo)(offsets)
            else:
                self.sample[idx] = permute_epochs(n, tape.seed, name, epochs, offsets)
            return
        if lo == hi:  # the common case: a batch of positions lies in one pass of the source
            group = np.full(idx.size, self._domain(tape, d, lo), dtype=np.intp)
        else:
            uniq, which = unique_inverse(epochs)
            table = np.array([self._domain(tape, d, e) for e in uniq.tolist()], dtype=np.intp)
            group = table[which.reshape(-1)]
        self.idx.append(idx)
        self.group.append(group)
        self.offset.append(offsets)

    def run(self, seed: int) -> None:
        """Write each gathered draw's sample into ``sample`` at its row."""
        if not self.idx:
            return
        if len(self.idx) == 1:
            idx, group, offset = self.idx[0], self.group[0], self.offset[0]
        else:
            idx = np.concatenate(self.idx)
            group, offset = np.concatenate(self.group), np.concatenate(self.offset)
        self.sample[idx] = permute_many(seed, self.domains, group, offset)


__all__ = ["Resolved", "Tape", "as_positions"]
