"""Ranged reads of objects: the one way tokentape reads byte ranges of an object.

``RangedFiles`` is the byte reader of a source in object storage: its token files as sliceable
sequences of token ids, read through one ``RangeCache``. That runs ranged GETs
(``ObjectStore.read_checked``) of the files on a bounded pool, merges ranges that touch
(``merge_ranges``, up to ``MAX_RANGE_BYTES``), keeps what it fetched up to ``cache_bytes``
(least recently used go first), and checks every whole hash block a range covers against its
recorded sha256 (``Blocks``) before the bytes are used; each GET carries the object's version
(``If-Match``). A tokentape store and a Megatron prefix at an object URL read their token files
through it (on disk, a source reads memory maps: ``store.reader.MappedFiles``);
``sha256_check`` is the check a whole-object read (a document index, a sidecar) uses.
``FetchConfig`` is how many requests and bytes a loader allows it; ``FetchStats`` what it did.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from tokentape._src.objects.client import ObjectStore
from tokentape._src.util.checks import check_count
from tokentape.errors import ArgumentError

DEFAULT_CONCURRENCY = 32
DEFAULT_CACHE_BYTES = 512 * 2**20
MAX_RANGE_BYTES = 16 * 2**20
"""Merged ranges stop growing here, so that one request never holds up many windows."""


@dataclass(frozen=True)
class FetchConfig:
    """How a loader reads a plan whose stores are in object storage without staging them.

    Attributes:
        concurrency: Ranged GETs in flight at most, per store.
        cache_mb: MiB of fetched ranges kept per store (least recently used go first); at
            least the windows of the steps prefetched must fit.
    """

    concurrency: int = DEFAULT_CONCURRENCY
    cache_mb: float = DEFAULT_CACHE_BYTES / 2**20

    def __post_init__(self) -> None:
        check_count("concurrency", self.concurrency, 1, 4096)
        if isinstance(self.cache_mb, bool) or not isinstance(self.cache_mb, int | float):
            raise ArgumentError(f"cache_mb must be a number of MiB, got {self.cache_mb!r}")
        if not 0 < self.cache_mb < 2**40:
            raise ArgumentError(f"cache_mb must be positive, got {self.cache_mb!r}")

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_mb * 2**20)


@dataclass
class FetchStats:
    """What a source in object storage fetched: requests, bytes, and block hashes checked (all
    0 for a source on disk), and the bytes it read from blocks its node's stage had already
    verified on local disk instead (``LocalBlocks``)."""

    requests: int = 0
    bytes: int = 0
    blocks_checked: int = 0
    staged_bytes: int = 0

    def __add__(self, other: FetchStats) -> FetchStats:
        return FetchStats(
            self.requests + other.requests,
            self.bytes + other.bytes,
            self.blocks_checked + other.blocks_checked,
            self.staged_bytes + other.staged_bytes,
        )


@dataclass(frozen=True)
class Blocks:
    """What a file read in ranges is checked against: the sha256 of each ``block_bytes`` block
    of its ``size`` bytes (the last block may be shorter), and the object's version (ETag)
    every ranged GET of it carries as ``If-Match`` ("": none known yet)."""

    block_bytes: int
    sha256: tuple[str, ...]
    size: int
    etag: str = ""


class LocalBlocks(Protocol):
    """Blocks of a source's token files that are already on local disk (a stage under way on
    this node, ``stage.landed``): read there instead of fetched. ``blocks`` is what the source
    checks the file against; a local block is used only where it was verified against the
    same block hashes."""

    def has(self, url: str, start: int, stop: int, blocks: Blocks) -> bool:
        """Whether bytes ``[start, stop)`` of ``url`` are local now (``read`` may still return
        None, should the disk fail it)."""
        ...

    def read(self, url: str, start: int, stop: int, blocks: Blocks) -> bytes | None:
        """Bytes ``[start, stop)`` of ``url`` from local disk when every block they touch is
        there, verified against ``blocks``' hashes; else None (fetch them)."""
        ...

    def close(self) -> None: ...


class _Ranges:
    """Fetched (or in-flight) ranges of one object, sorted by start, for lookup by offset."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.entries: list[tuple[int, int, Future[bytes]]] = []

    def find(self, start: int, stop: int) -> tuple[int, int, Future[bytes]] | None:
        """An entry covering ``[start, stop)`` that has not failed."""
        i = bisect.bisect_right(self.starts, start) - 1
        while i >= 0:
            a, b, fut = self.entries[i]
            if a <= start and stop <= b and not _failed(fut):
                return a, b, fut
            if b <= start and a < start - MAX_RANGE_BYTES:
                return None
            i -= 1
        return None

    def add(self, start: int, stop: int, fut: Future[bytes]) -> None:
        i = bisect.bisect_right(self.starts, start)
        self.starts.insert(i, start)
        self.entries.insert(i, (start, stop, fut))

    def remove(self, start: int, stop: int, fut: Future[bytes]) -> None:
        i = self.entries.index((start, stop, fut))
        del self.starts[i], self.entries[i]


def _failed(fut: Future[bytes]) -> bool:
    """A fetch that ended in an error: never served (a later read fetches afresh)."""
    return fut.done() and not fut.cancelled() and fut.exception() is not None


class RangeCache:
    """Ranged GETs of a store's shard files on a bounded pool, kept up to ``cache_bytes``."""

    def __init__(
        self,
        objects: ObjectStore,
        shards: dict[str, Blocks],
        concurrency: int,
        cache_bytes: int,
    ) -> None:
        self.objects = objects
        self.shards = dict(shards)  # URL -> its block hashes and version: whole blocks checked
        self.cache_bytes = cache_bytes
        self.concurrency = concurrency
        self.stats = FetchStats()
        self.local: LocalBlocks | None = None
        """Where blocks already on local disk are read instead of fetched (none: every range
        is fetched)."""
        self._start()

    def _start(self) -> None:
        """A fresh pool, lock and cache (at construction, and in a forked child, which has
        none of the parent's threads)."""
        self._pid = os.getpid()
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="tokentape-fetch")
        self._lock = threading.Lock()
        self._ranges: dict[str, _Ranges] = {}
        self._lru: OrderedDict[tuple[str, int, int], Future[bytes]] = OrderedDict()
        self._held = 0

    def _forked(self) -> None:
        if self._pid != os.getpid():  # a forked DataLoader worker: the threads stayed behind
            self._start()

    def pin(self, url: str, etag: str) -> None:
        """Pin every later GET of ``url`` to the object version ``etag`` (``If-Match``)."""
        if url in self.shards and etag:
            self.shards[url] = replace(self.shards[url], etag=etag)

    def prefetch(self, url: str, ranges: list[tuple[int, int]]) -> None:
        """Start fetching every range of ``url`` not cached yet, merged where they touch."""
        self._forked()
        with self._lock:
            held = self._ranges.setdefault(url, _Ranges())
            missing = sorted(r for r in ranges if held.find(*r) is None)
        if self.local is not None:  # outside the lock: it may look at the disk
            missing = [r for r in missing if not self._local_has(url, *r)]
        with self._lock:
            for start, stop in merge_ranges(missing):
                if held.find(start, stop) is None:
                    self._submit(url, held, start, stop)

    def read(self, url: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``url``, from the cache or fetched now."""
        self._forked()
        if self.local is not None and not self._cached(url, start, stop):
            data = self._read_local(url, start, stop)
            if data is not None:
                return data
        with self._lock:
            held = self._ranges.setdefault(url, _Ranges())
            found = held.find(start, stop)
            if found is None:
                found = (start, stop, self._submit(url, held, start, stop))
            a, b, fut = found
            if (url, a, b) in self._lru:
                self._lru.move_to_end((url, a, b))
        try:
            data = fut.result()
        except BaseException:
            with self._lock:  # a failed fetch is not kept: a retry fetches afresh
                if self._lru.get((url, a, b)) is fut:  # not a newer fetch of the same range
                    del self._lru[(url, a, b)]
                    held.remove(a, b, fut)
                    self._held -= b - a
            raise
        return data[start - a : stop - a]

    def _cached(self, url: str, start: int, stop: int) -> bool:
        """Whether the range is fetched or in flight."""
        with self._lock:
            held = self._ranges.get(url)
            return held is not None and held.find(start, stop) is not None

    def _local_has(self, url: str, start: int, stop: int) -> bool:
        blocks = self.shards.get(url)
        return (
            self.local is not None
            and blocks is not None
            and self.local.has(url, start, stop, blocks)
        )

    def _read_local(self, url: str, start: int, stop: int) -> bytes | None:
        """The range from local disk (``local``), counted, or None: fetch it."""
        blocks = self.shards.get(url)
        if self.local is None or blocks is None:
            return None
        data = self.local.read(url, start, stop, blocks)
        if data is not None:
            with self._lock:
                self.stats.staged_bytes += len(data)
        return data

    def _submit(self, url: str, held: _Ranges, start: int, stop: int) -> Future[bytes]:
        fut = self._pool.submit(self._fetch, url, start, stop)
        held.add(start, stop, fut)
        self._lru[(url, start, stop)] = fut
        self._held += stop - start
        self._evict()
        return fut

    def _evict(self) -> None:
        while self._held > self.cache_bytes and len(self._lru) > 1:
            (url, a, b), fut = next(iter(self._lru.items()))
            if not fut.done():  # the oldest is still in flight: the cache is as small as it gets
                return
            del self._lru[(url, a, b)]
            self._ranges[url].remove(a, b, fut)
            self._held -= b - a

    def _fetch(self, url: str, start: int, stop: int) -> bytes:
        """The range, its whole blocks checked (fetched again while one does not match)."""
        blocks = self.shards.get(url)
        data = self.objects.read_checked(
            url,
            start,
            stop,
            lambda got: self._block_problem(url, start, got),
            etag="" if blocks is None else blocks.etag,
        )
        with self._lock:
            self.stats.requests += 1
            self.stats.bytes += len(data)
            self.stats.blocks_checked += len(self._whole_blocks(url, start, len(data)))
        return data

    def _whole_blocks(self, url: str, start: int, length: int) -> range:
        """The hash blocks of ``url`` wholly inside ``[start, start + length)``."""
        if url not in self.shards:
            return range(0)
        blocks = self.shards[url]
        block, end, size = blocks.block_bytes, start + length, blocks.size  # block > 0: checked
        first = stop = -(-start // block)
        while stop < len(blocks.sha256) and min((stop + 1) * block, size) <= end:
            stop += 1  # block ``stop`` (the last one may be short) lies inside
        return range(first, stop)

    def _block_problem(self, url: str, start: int, data: bytes) -> str | None:
        """Which whole block inside ``data`` (which starts at ``start``) does not match its
        hash, or None."""
        for i in self._whole_blocks(url, start, len(data)):
            blocks = self.shards[url]
            lo, hi = i * blocks.block_bytes, min((i + 1) * blocks.block_bytes, blocks.size)
            if hashlib.sha256(data[lo - start : hi - start]).hexdigest() != blocks.sha256[i]:
                return f"block {i} (bytes {lo}-{hi}) does not match its recorded hash"
        return None

    def close(self) -> None:
        """Stop the fetch threads and let go of every cached range (and of ``local``)."""
        if self.local is not None:
            self.local.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._lru.clear()
            self._ranges.clear()
            self._held = 0


class RangedPiece:
    """One token file of ``RangedFiles`` as a sliceable sequence of ids: ``piece[a:b]`` reads
    tokens ``[a, b)`` through the cache."""

    def __init__(self, files: RangedFiles, index: int, url: str, n_tokens: int) -> None:
        self.files, self.index, self.url, self.n_tokens = files, index, url, n_tokens

    def __len__(self) -> int:
        return self.n_tokens

    def __getitem__(self, key: slice, /) -> np.ndarray:
        start, stop, _ = key.indices(self.n_tokens)
        dtype = self.files.dtype
        if stop <= start:
            return np.zeros(0, dtype=dtype)
        self.files.ready(self.index)
        data = self.files.cache.read(self.url, start * dtype.itemsize, stop * dtype.itemsize)
        return np.frombuffer(data, dtype=dtype)


FirstLook = Callable[[int], str]
"""What a source checks before the first read of its token file ``index`` (its size and
version, say), returning the version every read of the file is then pinned to ("": the one
its ``Blocks`` record, if any)."""


class RangedFiles:
    """The token files of one source in object storage, read in byte ranges: the byte reader
    under a source at an object URL (its counterpart on disk is ``store.reader.MappedFiles``).

    Args:
        objects: The object store holding the files.
        dtype: The token ids' dtype.
        files: Each token file in stream order: its URL, token count and block hashes.
        fetch: Requests in flight and bytes cached.
        first_look: Run once per file before its first range is read (see ``FirstLook``);
            None: nothing to check (the source checked every file when it was opened).
    """

    fetches_ahead = True
    """The windows a loader is about to read are worth fetching ahead (``prefetch``)."""

    def __init__(
        self,
        objects: ObjectStore,
        dtype: np.dtype,
        files: list[tuple[str, int, Blocks]],
        fetch: FetchConfig,
        first_look: FirstLook | None = None,
    ) -> None:
        self.objects, self.dtype = objects, dtype
        blocks = {url: b for url, _, b in files}
        self.cache = RangeCache(objects, blocks, fetch.concurrency, fetch.cache_bytes)
        self.pieces = [RangedPiece(self, i, url, n) for i, (url, n, _) in enumerate(files)]
        self._first_look = first_look
        self._looked: set[int] = set()
        self._look_lock = threading.Lock()

    @property
    def stats(self) -> FetchStats:
        """Requests and bytes fetched so far."""
        return self.cache.stats

    def ready(self, index: int) -> None:
        """File ``index`` looked at (``first_look``, once) and its reads pinned to its version."""
        if self._first_look is None or index in self._looked:
            return
        url = self.pieces[index].url
        self.cache.pin(url, self._first_look(index))
        with self._look_lock:
            self._looked.add(index)

    def prefetch(self, ranges: Mapping[int, list[tuple[int, int]]]) -> None:
        """Start fetching byte ranges of the files (by file index); returns at once, but for a
        first look at each file they touch."""
        for index, wanted in ranges.items():
            self.ready(index)
            self.cache.prefetch(self.pieces[index].url, wanted)

    def blocks(self, index: int) -> Blocks | None:
        """What file ``index`` is checked against (None: nothing recorded)."""
        return self.cache.shards.get(self.pieces[index].url)

    def use_local(self, local: LocalBlocks) -> None:
        """Read the blocks ``local`` holds from local disk instead of fetching them (from the
        next read on; ``close`` closes it)."""
        self.cache.local = local

    def advise_random(self) -> None:
        """Nothing to advise: no memory maps."""

    def close(self) -> None:
        """Stop the fetch threads and let go of the cached ranges."""
        self.cache.close()


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ``[start, stop)`` ranges merged where they overlap or touch (up to
    ``MAX_RANGE_BYTES`` each)."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if merged and start <= merged[-1][1] and stop - merged[-1][0] <= MAX_RANGE_BYTES:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def sha256_check(expected: str, recorded: str) -> Callable[[bytes], str | None]:
    """A check (for ``ObjectStore.read_checked``) that bytes have the sha256 ``expected``;
    ``recorded`` names where it is recorded, in what the check says otherwise."""

    def check(data: bytes) -> str | None:
        if hashlib.sha256(data).hexdigest() == expected:
            return None
        return f"does not match {recorded}"

    return check


__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_CONCURRENCY",
    "MAX_RANGE_BYTES",
    "Blocks",
    "FetchConfig",
    "FetchStats",
    "FirstLook",
    "LocalBlocks",
    "RangeCache",
    "RangedFiles",
    "RangedPiece",
    "merge_ranges",
    "sha256_check",
]
