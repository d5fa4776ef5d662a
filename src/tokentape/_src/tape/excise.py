"""Excision: a tape with some of its positions left out, in closed form.

An excision is a set X of positions of the tape as it was (its *base* positions), all at or
after the position C from which it applies. The excised tape is the base tape with those
positions removed, the rest in order: its position q is base position q below C (nothing below
C changes), and from C on the q-th base position not in X. With X sorted as x_0 < x_1 < ...,
the numbers x_i - i do not decrease, and

    base(q) = q + #{i : x_i - i <= q}        new(p) = p - #{i : x_i < p}   (p not in X)

both a binary search, whatever the horizon. Excisions made one after another are one set X in
base positions (each maps its own positions to base ones through the earlier ones), so a tape
carries one ``Excision``.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from dataclasses import dataclass, field

import numpy as np

from tokentape._src.tape.blend import Blend
from tokentape._src.tape.permutation import permute_many
from tokentape._src.tape.resolve import Tape
from tokentape.errors import PlanError

MAX_EXCISED = 10_000_000
"""The most positions a plan may leave out (80 MB of positions in memory); ``excise`` refuses
more in one line."""


@dataclass(frozen=True, eq=False)
class Excision:
    """Base positions left out of a tape (sorted, unique, int64)."""

    positions: np.ndarray
    _shifted: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        x = np.ascontiguousarray(self.positions, dtype=np.int64)
        if x.ndim != 1 or (x.size and (int(x[0]) < 0 or not bool(np.all(np.diff(x) > 0)))):
            raise PlanError("excision: positions must be ascending, unique and >= 0")
        x.setflags(write=False)
        object.__setattr__(self, "positions", x)
        object.__setattr__(self, "_shifted", x - np.arange(x.size, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.positions.size)

    def to_base(self, q: np.ndarray) -> np.ndarray:
        """The base position of each position ``q`` of the excised tape."""
        q = np.asarray(q, dtype=np.int64)
        return q + np.searchsorted(self._shifted, q, side="right").astype(np.int64)

    def to_new(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each base position ``p`` as a position of the excised tape, and whether it is kept
        (an excised one has no position: its entry is then meaningless)."""
        p = np.asarray(p, dtype=np.int64)
        k = np.searchsorted(self.positions, p, side="left").astype(np.int64)
        hit = k < self.positions.size
        excised = np.zeros(p.shape, dtype=bool)
        excised[hit] = self.positions[k[hit]] == p[hit]
        return p - k, ~excised

    def base_limit(self, limit: int) -> int:
        """The base positions below this are exactly those of the excised tape's positions
        below ``limit``, and the excised ones among them."""
        return 0 if limit <= 0 else int(self.to_base(np.asarray([limit - 1]))[0]) + 1


def samples_overlapping(span: tuple[int, int], seq_len: int, n_samples: int) -> range:
    """Samples k in [0, n_samples) whose window [kL, kL + L] meets tokens [start, end)."""
    start, end = span
    first = max(0, -(-start // seq_len) - 1)  # smallest k with start <= kL + L
    stop = min(n_samples, (end - 1) // seq_len + 1)  # largest k with kL < end, plus one
    return range(first, max(first, stop))


def draws_of_samples(
    tape: Tape, source: int, samples: range | np.ndarray, limit: int, start: int = 0
) -> int:
    """How many draws of ``samples`` of ``source`` the base tape makes at base positions in
    [start, limit), at most (what ``positions_of_samples`` returns, bounded before it is
    made)."""
    n = tape.n_samples[source]
    first = int(tape.blend.count(source, start)) // n
    last = -(-int(tape.blend.count(source, limit)) // n)  # passes met, the partial ones too
    return max(0, last - first) * len(samples)


def positions_of_samples(
    tape: Tape, source: int, samples: range | np.ndarray, limit: int, start: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base position, epoch, sample) of every draw of ``samples`` of ``source`` at base
    positions in [start, limit), sorted by position (``draws_at`` says how they are found)."""
    position, epoch, sample = draws_at(tape, source, samples, limit, start)
    order = np.argsort(position, kind="stable")
    return position[order], epoch[order], sample[order]


def draws_at(
    tape: Tape, source: int, samples: range | np.ndarray, limit: int, start: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base position, epoch, sample) of every draw of ``samples`` of ``source`` at base
    positions in [start, limit), in no particular order.

    Each pass holds every sample once, so a pass's positions are the inverse of the tape; in a
    pass cut by ``start`` or ``limit`` only the samples drawn inside are kept. One key
    derivation per pass, whatever the number of samples."""
    n = tape.n_samples[source]
    lo, hi = int(tape.blend.count(source, start)), int(tape.blend.count(source, limit))
    ks = np.asarray(samples, dtype=np.int64).reshape(-1)
    empty = np.zeros(0, dtype=np.int64)
    if hi <= lo or not ks.size:
        return empty, empty, empty
    first, last = lo // n, (hi - 1) // n  # the passes met
    passes = last - first + 1
    group = np.repeat(np.arange(passes, dtype=np.intp), ks.size)  # pass i: domain i
    epochs = group.astype(np.int64) + first
    picked = np.tile(ks, passes)
    domains = [(n, tape.names[source], e) for e in range(first, last + 1)]
    offsets = permute_many(tape.seed, domains, group, picked, forward=False)
    draws = epochs * n + offsets
    keep = (draws >= lo) & (draws < hi)
    position = np.asarray(tape.blend.position(source, draws[keep]), dtype=np.int64)
    return position, epochs[keep], picked[keep]


def sources_at(tape: Tape, positions: np.ndarray) -> np.ndarray:
    """The source of each base position (the blend's table, read directly in one phase)."""
    blend = tape.blend
    if isinstance(blend, Blend):
        found: np.ndarray = blend.table[np.remainder(positions, blend.denominator)]
        return found.astype(np.int64)
    return blend.source_and_draw(positions)[0]


def kept_counts(tape: Tape, base_limits: np.ndarray) -> np.ndarray:
    """(sources, len(base_limits)) int64: the draws of each source among base positions
    [0, b) that the tape keeps, for each b of ``base_limits`` (its excised ones not counted;
    ``Excision.base_limit`` turns a limit of the tape's own positions into a base one)."""
    b = np.asarray(base_limits, dtype=np.int64).reshape(-1)
    out = np.stack([np.asarray(tape.blend.count(d, b), dtype=np.int64).reshape(-1)
                    for d in range(len(tape.names))])  # fmt: skip
    if tape.excision is not None:
        x = tape.excision.positions
        source = sources_at(tape, x)
        for d in range(len(tape.names)):
            out[d] -= np.searchsorted(x[source == d], b, side="left")
    return out


def base_limit_of(excised: list[np.ndarray], limit: int) -> int:
    """``Excision(union of excised).base_limit(limit)`` without joining them: the smallest p
    with p = limit + (excised positions below p), found by iterating from ``limit`` (each
    array sorted; together disjoint)."""
    p = max(0, limit)
    while True:
        below = sum(int(np.searchsorted(a, p, side="left")) for a in excised)
        if limit + below == p or limit <= 0:
            return p
        p = limit + below


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of int64 values, by a sort and a mask (many times faster here)."""
    x = np.sort(np.asarray(values, dtype=np.int64))
    if x.size > 1:
        x = x[np.concatenate([[True], x[1:] != x[:-1]])]
    return x


def encode_positions(positions: np.ndarray) -> str:
    """Ascending positions as text for a plan file: zlib-compressed little-endian int64
    differences (the first from 0), base64."""
    x = np.asarray(positions, dtype=np.int64)
    deltas = np.diff(x, prepend=np.int64(0)).astype("<i8")
    return base64.b64encode(zlib.compress(deltas.tobytes(), 6)).decode("ascii")


def decode_positions(text: str, count: int, sha256: str, where: str) -> np.ndarray:
    """The positions ``encode_positions`` wrote, checked: ``count`` of them, ascending, the
    sha256 of their int64 bytes ``sha256``; never more than ``MAX_EXCISED``."""
    if not isinstance(text, str) or not 0 <= count <= MAX_EXCISED:
        raise PlanError(f"{where}: expected encoded positions and a count <= {MAX_EXCISED:,}")
    try:
        packed = base64.b64decode(text.encode("ascii"), validate=True)
        z = zlib.decompressobj()
        raw = z.decompress(packed, 8 * count + 1)
    except (ValueError, UnicodeEncodeError, zlib.error):
        raise PlanError(f"{where}: positions are not readable (base64 of zlib data)") from None
    if len(raw) != 8 * count or z.unconsumed_tail or not z.eof:
        raise PlanError(f"{where}: positions do not hold {count} int64 values")
    x = np.cumsum(np.frombuffer(raw, dtype="<i8"), dtype=np.int64)
    if positions_sha256(x) != sha256:
        raise PlanError(f"{where}: positions do not match their sha256 (edited or damaged)")
    if x.size and (int(x[0]) < 0 or not bool(np.all(np.diff(x) > 0))):
        raise PlanError(f"{where}: positions are not ascending and unique")
    return x


def positions_sha256(positions: np.ndarray) -> str:
    """The hash of excised positions: sha256 of their little-endian int64 bytes."""
    data = np.ascontiguousarray(positions, dtype="<i8").tobytes()
    return "sha256:" + hashlib.sha256(data).hexdigest()


__all__ = [
    "MAX_EXCISED",
    "Excision",
    "base_limit_of",
    "decode_positions",
    "draws_at",
    "draws_of_samples",
    "encode_positions",
    "kept_counts",
    "positions_of_samples",
    "positions_sha256",
    "samples_overlapping",
    "sorted_unique",
    "sources_at",
]
