"""Reading a long stream forward in pieces: a compressed file's decompressed bytes, or a parquet
row group's rows, cut into units that are read one after another.

Neither a gzip/zstandard stream nor a parquet row group can be entered in the middle: reaching
the piece at offset ``start`` means decoding everything before it. A worker process claims
units in increasing order, so each process keeps the stream it last read open where it
stopped (``Forward``): the next piece of the same stream continues from there, and a process
decodes each stream about once whatever the number of pieces. A piece before the position
(a resumed run, or another file) opens the stream afresh.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Hashable, Iterator, Sized
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

_T = TypeVar("_T", bound=Sized)
_KEEP = 2
"""Streams a process keeps open at once (the one being read and the one before it)."""


@dataclass
class Forward(Generic[_T]):
    """A stream of items (byte blocks or row batches) positioned at ``pos`` (items counted by
    their length: bytes or rows); ``head`` holds what was read past ``pos``."""

    items: Iterator[_T]
    pos: int = 0
    head: list[_T] = field(default_factory=list)


# Per process. Streams of different item types (bytes, row batches): each key's stream holds
# the items its ``open_stream`` gives, which only ``read_range``'s caller knows.
_OPEN: dict[Hashable, Forward[Any]] = {}


def forget() -> None:
    """Close every stream this process keeps open (at exit: before the modules their readers
    use are torn down)."""
    while _OPEN:
        _close(_OPEN.pop(next(iter(_OPEN))))


atexit.register(forget)


def read_range(
    key: Hashable,
    start: int,
    stop: int,
    open_stream: Callable[[], Iterator[_T]],
    cut: Callable[[_T, int, int], _T],
    short: Callable[[int], Exception],
) -> Iterator[_T]:
    """The items of positions [start, stop) of the stream ``key`` (``open_stream`` opens it at
    position 0; ``cut(item, a, b)`` is ``item[a:b]``; ``short(pos)`` is the error for a stream
    that ends at ``pos`` before ``stop``)."""
    stream = _OPEN.pop(key, None)
    if stream is None or stream.pos > start:
        _close(stream)
        stream = Forward(open_stream())
    finished = False
    try:
        yield from _forward(stream, start, stop, cut, short)
        finished = True
    finally:
        if finished:  # positioned at ``stop``: kept for the next piece
            _OPEN[key] = stream
            while len(_OPEN) > _KEEP:
                _close(_OPEN.pop(next(iter(_OPEN))))
        else:  # abandoned or failed midway: its position is unknown
            _close(stream)


def _forward(
    stream: Forward[_T],
    start: int,
    stop: int,
    cut: Callable[[_T, int, int], _T],
    short: Callable[[int], Exception],
) -> Iterator[_T]:
    while stream.pos < stop:
        item = stream.head.pop(0) if stream.head else next(stream.items, None)
        if item is None:
            raise short(stream.pos)
        n = len(item)
        if n == 0:
            continue
        a, b = stream.pos, stream.pos + n
        if b <= start:  # before the piece: skipped
            stream.pos = b
            continue
        lo, hi = max(start, a) - a, min(stop, b) - a
        if hi < n:  # the rest belongs to a later piece
            stream.head.insert(0, cut(item, hi, n))
        stream.pos = a + hi
        yield item if (lo, hi) == (0, n) else cut(item, lo, hi)


def _close(stream: Forward[_T] | None) -> None:
    if stream is not None:
        close = getattr(stream.items, "close", None)
        if close is not None:
            close()


def line_cuts(blocks: Iterator[bytes], unit_bytes: int) -> list[int]:
    """Offsets that cut a stream of bytes into pieces of about ``unit_bytes``: each cut is the
    first line start at or after the previous cut plus ``unit_bytes``; the list starts with 0
    and ends with the stream's length."""
    cuts = [0]
    offset = 0
    target = unit_bytes
    for block in blocks:
        end = offset + len(block)
        while target <= end:  # a newline at target - 1 or later makes the next line a cut
            i = block.find(b"\n", max(0, target - 1 - offset))
            if i < 0:
                break
            cuts.append(offset + i + 1)
            target = cuts[-1] + unit_bytes
        offset = end
    if cuts[-1] != offset or len(cuts) == 1:
        cuts.append(offset)
    return cuts


__all__ = ["Forward", "forget", "line_cuts", "read_range"]
