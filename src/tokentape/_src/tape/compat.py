"""Where two tapes first differ below a position, decided from their blends with bounded work.

A tape's source at position p is its phase's blend table read at (p - phase start) mod the
phase's period. Below a position ``below``, cut [0, below) at every phase start of either
tape: on each piece, both sequences of source names are periodic (periods P and P'). Two
periodic sequences that agree on P + P' positions agree everywhere (Fine and Wilf: the
common stretch has both periods, hence their gcd, which determines both sequences), so each
piece is settled by comparing at most P + P' positions, and not at all when both tapes read
the same table at the same offset there. The work is bounded by the phases and the periods,
never by ``below``.

Equal names below ``below`` mean equal draws too: a source's draws continue across phases,
so the draw at p is the number of earlier positions with the same source. What else makes a
sample (the seed, each source's size and content) is compared by the caller.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import numpy as np

from tokentape._src.tape.blend import Blend
from tokentape._src.tape.resolve import Tape
from tokentape.errors import OutOfRangeError

_CHUNK = 1 << 20
"""Positions compared at once (bounds the memory of a comparison over long periods)."""


@dataclass(frozen=True)
class _Piece:
    start: int
    blend: Blend
    names: tuple[str, ...]  # the name of each of the blend's sources


def _pieces(tape: Tape) -> list[_Piece]:
    blend = tape.blend
    if isinstance(blend, Blend):
        return [_Piece(0, blend, tape.names)]
    return [
        _Piece(p.start, p.blend, tuple(tape.names[d] for d in p.sources.tolist()))
        for p in blend.phases
    ]


def _at(pieces: list[_Piece], starts: list[int], position: int) -> _Piece:
    """The piece (phase) that holds ``position`` (``starts``: the pieces' starts)."""
    return pieces[bisect.bisect_right(starts, position) - 1]


def first_difference(old: Tape, new: Tape, below: int) -> int | None:
    """The first position below ``below`` whose source (by name) differs between the two
    tapes, or None when they draw the same names at every position below it."""
    old_pieces, new_pieces = _pieces(old), _pieces(new)
    old_starts, new_starts = [p.start for p in old_pieces], [p.start for p in new_pieces]
    cuts = {*old_starts, *new_starts}
    bounds = [*sorted(c for c in cuts if c < below), below]
    ids: dict[str, int] = {}
    for a, b in itertools.pairwise(bounds):
        x, y = _at(old_pieces, old_starts, a), _at(new_pieces, new_starts, a)
        same_table = x.names == y.names and x.blend.weights == y.blend.weights
        if (
            same_table
            and (a - x.start) % x.blend.denominator == (a - y.start) % y.blend.denominator
        ):
            continue  # the same table read at the same offset over the whole piece
        end = min(b, a + x.blend.denominator + y.blend.denominator)
        for lo in range(a, end, _CHUNK):
            positions = np.arange(lo, min(lo + _CHUNK, end), dtype=np.int64)
            differ = np.flatnonzero(_names(x, positions, ids) != _names(y, positions, ids))
            if differ.size:
                return int(positions[differ[0]])
    return None


def _names(piece: _Piece, positions: np.ndarray, ids: dict[str, int]) -> np.ndarray:
    """The source of each position, as an integer id shared by both tapes' names."""
    codes = np.asarray([ids.setdefault(n, len(ids)) for n in piece.names], dtype=np.int64)
    at: np.ndarray = codes[piece.blend.table[(positions - piece.start) % piece.blend.denominator]]
    return at


def first_draw(tape: Tape, source: int) -> int | None:
    """The position of ``source``'s first draw, or None if the tape never draws it."""
    try:
        return int(tape.blend.position(source, 0))
    except OutOfRangeError:
        return None


__all__ = ["first_difference", "first_draw"]
