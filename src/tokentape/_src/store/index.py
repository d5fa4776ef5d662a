"""A shard's document index (``.idx.npy``): its header checked, its starts checked and joined.

The same checks whether the file is memory-mapped from disk (``store.reader``) or fetched
whole from object storage (``store.remote``); never unpickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tokentape._src.store.format import NPY_ERRORS, ShardInfo, read_npy_header
from tokentape.errors import StoreError

INDEX_DTYPE = np.dtype("<i8")


def damaged(path: Path | str, what: str) -> StoreError:
    """A store file found damaged: what is wrong, and the command that checks the store."""
    return StoreError(f"{path}: {what}; the store is damaged (run `tokentape verify`)")


def array_offset(f: BinaryIO, dtype: np.dtype, n: int, what: str, path: Path | str) -> int:
    """Where the entries of the ``.npy`` file open as ``f`` start, after checking its header: a
    1-D array of ``n`` entries of ``dtype`` (``what`` they are, in errors); never unpickled.
    ``path`` names the file in errors."""
    try:
        shape, _, found = read_npy_header(f)
    except NPY_ERRORS as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise damaged(path, f"not a readable .npy array ({reason})") from None
    if found != dtype or shape != (n,):
        raise damaged(path, f"expected {n} {what}, found shape {shape} dtype {found}")
    return f.tell()


def index_offset(f: BinaryIO, shard: ShardInfo, path: Path | str) -> int:
    """Where the entries of the ``.idx.npy`` open as ``f`` start, after checking its header: a
    1-D int64 array of the shard's ``n_docs`` entries filling its ``idx_bytes``; never
    unpickled. ``path`` names the file in errors."""
    offset = array_offset(f, INDEX_DTYPE, shard.n_docs, "int64 document starts", path)
    if offset + INDEX_DTYPE.itemsize * shard.n_docs != shard.idx_bytes:
        raise damaged(path, f"{shard.idx_bytes} bytes do not hold its ({shard.n_docs},) array")
    return offset


def check_starts(local: np.ndarray, shard: ShardInfo, path: Path | str) -> None:
    """A shard's document starts: 0 first, strictly ascending, below its token count (so every
    token lies in a document and none is empty)."""
    if not len(local):
        if shard.n_tokens:
            raise damaged(path, f"no document starts for {shard.n_tokens} tokens")
        return
    if int(local[0]) != 0:
        raise damaged(path, f"the first document starts at {int(local[0])}, expected 0")
    outside = np.flatnonzero((local < 0) | (local >= shard.n_tokens))
    if outside.size:  # checked first: with every start in range, no difference overflows
        i = int(outside[0])
        raise damaged(
            path,
            f"document {i} starts at {int(local[i])}, not inside the shard's "
            f"{shard.n_tokens} tokens",
        )
    down = np.flatnonzero(np.diff(local) <= 0)
    if down.size:
        i = int(down[0]) + 1
        raise damaged(
            path,
            f"document {i} starts at {int(local[i])}, not after document {i - 1} "
            f"({int(local[i - 1])}); starts must ascend",
        )


def joined_starts(shards: Sequence[ShardInfo], local: Sequence[np.ndarray]) -> np.ndarray:
    """Every shard's document starts (each checked already), offset into the stream and
    concatenated: int64, ascending."""
    starts, offset = [], 0
    for shard, starts_in_shard in zip(shards, local, strict=True):
        starts.append(starts_in_shard + offset)
        offset += shard.n_tokens
    return np.concatenate(starts or [np.zeros(0, dtype=np.int64)]).astype(np.int64)


__all__ = [
    "INDEX_DTYPE",
    "array_offset",
    "check_starts",
    "damaged",
    "index_offset",
    "joined_starts",
]
