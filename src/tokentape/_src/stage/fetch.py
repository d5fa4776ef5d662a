"""Fetching one store's files into its staging directory, every block verified as it arrives.

``download`` runs one task per group of consecutive ``.bin`` blocks (one GET of at most
``range_bytes``, its body handled as it arrives) and one per whole file (the ``.idx.npy``, the
tokenizer copy) on ``workers`` threads. A block's bytes are written in place in ``.FILE.part``
and hashed as they come; a block that matches the manifest's ``block_sha256`` is made durable
(``fdatasync``) and then its index is appended to ``.FILE.ok`` (fsynced), as soon as it has
arrived: that record is what a resumed stage trusts, and nothing else. A file whose every block
is recorded is renamed to its name. A block or file that does not match is fetched again, up
to the retry budget, then a ``StoreError`` names the object and the block. The first failure
stops the other tasks; what was verified stays for the next run. (``stage.stage`` documents
the cache layout.)
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial

from tokentape._src.objects.client import CHUNK_BYTES, ObjectStore, join
from tokentape._src.objects.ranged import sha256_check
from tokentape._src.store.format import (
    Manifest,
    ShardInfo,
    block_record_problem,
    manifest_files,
    sha256_stream,
)
from tokentape._src.store.remote import idx_check
from tokentape._src.store.safedir import SafeDir
from tokentape._src.store.tokenizers import tokenizer_from_manifest
from tokentape._src.util.faults import crashpoint
from tokentape._src.util.progress import ProgressCallback, Tally, tally
from tokentape.errors import StoreError

_RECORD = struct.Struct("<I")
"""One verified block in a ``.FILE.ok`` record: its index, 4 bytes little-endian."""


def part_name(name: str) -> str:
    """The staging directory's file ``name`` while it is being written, block by block."""
    return f".{name}.part"


def ok_name(name: str) -> str:
    """The record of the blocks of ``part_name(name)`` verified so far."""
    return f".{name}.ok"


def recorded_blocks(data: bytes) -> tuple[list[int], int]:
    """The block indexes in ``data`` (bytes of a ``.FILE.ok`` record), and how many bytes
    they took: a torn last record is left out."""
    whole = len(data) - len(data) % _RECORD.size
    return [i for (i,) in _RECORD.iter_unpack(data[:whole])], whole


_datasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
_LATER = float("inf")


class Counter:
    """Bytes fetched by the worker threads, passed on to the progress tally under a lock."""

    def __init__(self, counting: Tally | None) -> None:
        self.counting = counting
        self.fetched = 0
        self.lock = threading.Lock()

    def add(self, n: int, useful: int) -> None:
        """``n`` bytes fetched, of which ``useful`` count as progress (may be negative)."""
        with self.lock:
            self.fetched += n
            if self.counting is not None:
                self.counting.add(useful)


@dataclass
class Job:
    """One store being staged: where it comes from, where it goes, and the shared state."""

    store: ObjectStore
    url: str
    work: SafeDir
    """The staging directory, every name looked up in it without following a link."""
    attempts: int
    """Downloads of a block (or whole file) before a mismatch is final."""
    backoff: float
    range_bytes: int
    counter: Counter = field(default_factory=lambda: Counter(None))
    stop: threading.Event = field(default_factory=threading.Event)
    """Set when a task failed: the others end early."""
    record: str = "the store's manifest"
    """What the hashes come from, in messages (a Megatron prefix's: its sidecar)."""
    verified: frozenset[str] = frozenset()
    """Files in ``work`` known to match their hashes (linked from a verified staged copy)."""
    versions: Mapping[str, str] = field(default_factory=dict)
    """Each object's version (ETag) when the stage looked: every GET of it is pinned to it."""
    chunk_bytes: int = CHUNK_BYTES
    """The most bytes of a GET's body held at a time (a GET asks for up to ``range_bytes``)."""
    first_use: FirstUse = field(default_factory=dict)
    """When the coming steps first read each block: those blocks are fetched first."""

    def object_url(self, name: str) -> str:
        return join(self.url, name)

    def check(self) -> None:
        if self.stop.is_set():
            raise _Stopped


FirstUse = Mapping[str, Mapping[int, int]]
"""Per ``.bin`` file name, its blocks the coming steps read, each with the rank of its first
read (0 first): a stage fetches the groups of blocks by their earliest rank, then the rest in
file order."""


class _Stopped(Exception):
    """Another task failed: this one ends early."""


def _retry_wait(job: Job, attempt: int) -> None:
    time.sleep(min(5.0, job.backoff * 2 ** (attempt - 1)))


class _BinFile:
    """A shard's ``.bin`` downloaded into ``.NAME.part`` block by block, each block verified
    and recorded in ``.NAME.ok`` before it counts."""

    def __init__(self, job: Job, shard: ShardInfo, size: int, name: str | None = None) -> None:
        self.job, self.shard, self.size = job, shard, size
        self.name = shard.bin_file if name is None else name
        self.block = shard.block_bytes
        problem = block_record_problem(shard, size)
        if problem is not None:
            raise StoreError(f"{job.object_url(self.name)}: {job.record}: {problem}")
        self.n_blocks = len(shard.block_sha256)
        self.part = part_name(self.name)
        self.ok = ok_name(self.name)
        self.done = self._recorded()
        self.lock = threading.Lock()
        self.finished = False
        fd = job.work.open_file(self.part, os.O_WRONLY, create=True)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def _recorded(self) -> set[int]:
        """The blocks an earlier run verified (a torn last record is ignored)."""
        work = self.job.work
        if not work.exists(self.part, "file") or work.check(self.ok, "file", single=True) is None:
            work.unlink(self.ok)
            return set()
        data = work.read(self.ok, 8 * self.n_blocks * _RECORD.size) or b""  # a block once each
        found = {i for i in recorded_blocks(data)[0] if i < self.n_blocks}
        return found

    def span(self, block: int) -> tuple[int, int]:
        return block * self.block, min((block + 1) * self.block, self.size)

    def kept_bytes(self) -> int:
        return sum(b - a for a, b in map(self.span, self.done))

    def groups(self) -> list[list[int]]:
        """The blocks still to fetch, in runs of consecutive blocks of at most ``range_bytes``
        (at least one block each)."""
        runs: list[list[int]] = []
        for i in range(self.n_blocks):
            if i in self.done:
                continue
            run = runs[-1] if runs else None
            if run and run[-1] == i - 1 and (i + 1 - run[0]) * self.block <= self.job.range_bytes:
                run.append(i)
            else:
                runs.append([i])
        return runs

    def fetch(self, blocks: list[int]) -> None:
        """Fetch, verify and record ``blocks``, fetching mismatched ones again up to the retry
        budget; the task that records the file's last block finishes it (while the other
        files are still downloading)."""
        pending = blocks
        for attempt in range(1, self.job.attempts + 1):
            bad: list[int] = []
            for run in _runs(pending):
                bad += self._fetch_run(run[0], run[-1] + 1)
            if not bad:
                self.finish()
                return
            if attempt < self.job.attempts:
                _retry_wait(self.job, attempt)
            pending = bad
        first = pending[0]
        start, stop = self.span(first)
        raise StoreError(
            f"{self.job.object_url(self.name)}: block {first} (bytes {start}-{stop}) does not "
            f"match the sha256 {self.job.record} records after {self.job.attempts} downloads; "
            "the object was changed or damaged after it was recorded"
        )

    def _fetch_run(self, first: int, end: int) -> list[int]:
        """Fetch blocks ``[first, end)`` in one GET; record each good one as soon as it has
        arrived (a GET of a gigabyte killed midway keeps what it verified), return the bad
        ones."""
        job = self.job
        start, stop = self.span(first)[0], self.span(end - 1)[1]
        bad: list[int] = []
        block, (_, block_end) = first, self.span(first)
        hasher = hashlib.sha256()
        pos = start
        fd = job.work.open_file(self.part, os.O_WRONLY)  # one per task: few open at a time

        def sink(piece: bytes) -> None:
            """Write and hash the next bytes of the run as they arrive."""
            nonlocal pos, block, block_end, hasher
            job.check()
            data = memoryview(piece)
            os.pwrite(fd, data, pos)
            job.counter.add(len(data), len(data))
            off = 0
            while off < len(data):
                take = min(len(data) - off, block_end - (pos + off))
                hasher.update(data[off : off + take])
                off += take
                if pos + off == block_end:
                    if hasher.hexdigest() == self.shard.block_sha256[block]:
                        crashpoint(f"stage.written.{self.name}")
                        _datasync(fd)  # the bytes first, then the record that vouches for them
                        self._record([block])
                        crashpoint(f"stage.verified.{self.name}")
                    else:
                        bad.append(block)
                    block += 1
                    block_end = self.span(block)[1] if block < self.n_blocks else stop
                    hasher = hashlib.sha256()
            pos += len(data)

        try:
            job.check()
            etag = job.versions.get(self.name, "")
            job.store.read_into(job.object_url(self.name), start, stop, sink, etag, job.chunk_bytes)
            if bad:
                job.counter.add(0, -sum(b - a for a, b in map(self.span, bad)))
        finally:
            os.close(fd)
        return bad

    def _record(self, blocks: list[int]) -> None:
        with self.lock:
            fd = self.job.work.open_file(self.ok, os.O_WRONLY | os.O_APPEND, create=True)
            try:
                os.write(fd, b"".join(_RECORD.pack(i) for i in blocks))
                os.fsync(fd)
            finally:
                os.close(fd)
            self.done.update(blocks)

    def finish(self) -> None:
        """Put the file at its name once every block is verified, and drop the record; a
        file still incomplete (a failure, a stop) is kept for the next run. Once only: the
        first call after the last block is recorded does it."""
        with self.lock:
            if self.finished or len(self.done) != self.n_blocks:
                return
            self.finished = True
        # The block hashes are not part of the store's content hash (its bin_sha256 is): a
        # manifest whose block hashes were rewritten with the bytes must not pass for verified.
        work = self.job.work
        with open(work.open_file(self.part, os.O_RDONLY), "rb") as f:
            digest = sha256_stream(f)
        if digest != self.shard.bin_sha256:
            work.unlink(self.part)
            work.unlink(self.ok)
            raise StoreError(
                f"{self.job.object_url(self.name)}: every block matches the block hashes "
                f"{self.job.record} records but the file's sha256 is {digest}, not "
                f"{self.shard.bin_sha256}; {self.job.record} was altered (run `tokentape "
                "verify` on it)"
            )
        work.rename(self.part, self.name)
        work.unlink(self.ok)


def _runs(blocks: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for b in sorted(blocks):
        if runs and runs[-1][-1] == b - 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


def _fetch_whole(job: Job, name: str, size: int, check: Callable[[bytes], str | None]) -> None:
    """Fetch the object ``name`` whole, ``check`` it (None: it matches, else what differs),
    fetching it again up to the retry budget (``ObjectStore.read_checked``), and write it into
    the staging directory."""
    job.check()
    data = job.store.read_checked(job.object_url(name), 0, size, check, job.versions.get(name, ""))
    job.counter.add(len(data), len(data))
    job.work.write_atomic(name, data)


def _tokenizer_check(manifest: Manifest, work: SafeDir) -> Callable[[bytes], str | None]:
    def check(data: bytes) -> str | None:
        try:
            tokenizer_from_manifest(manifest.tokenizer, work.path, data=data)
        except StoreError:
            return "does not match the manifest's tokenizer fingerprint"
        return None

    return check


def _run(tasks: list[Callable[[], None]], workers: int, stop: threading.Event) -> None:
    """Run ``tasks`` on ``workers`` threads; the first failure stops the others and is
    raised once they have ended."""
    if not tasks:
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        futures = [pool.submit(task) for task in tasks]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for f in done:
                exc = f.exception()
                if exc is not None:
                    raise exc
        except BaseException:
            stop.set()
            for f in futures:
                f.cancel()
            raise


def _whole_checks(manifest: Manifest, work: SafeDir) -> dict[str, Callable[[bytes], str | None]]:
    """The check of each file of ``manifest`` that is checked whole: the document indexes, the
    provenance files and the tokenizer copy."""
    checks = {s.idx_file: idx_check(s) for s in manifest.shards}
    for f in manifest_files(manifest):
        if f.sha256 is not None and f.what != "shard file" and f.name not in checks:
            checks[f.name] = sha256_check(f.sha256, "the manifest's sha256")
    name = manifest.tokenizer.get("file")
    if isinstance(name, str):
        checks[name] = _tokenizer_check(manifest, work)
    return checks


def download(
    job: Job,
    manifest: Manifest,
    sizes: dict[str, int],
    workers: int,
    label: str,
    progress: ProgressCallback | None,
) -> tuple[int, int]:
    """Fetch every file of ``manifest`` not yet in ``job.work``; returns (fetched, reused)."""
    shards = {s.bin_file: s for s in manifest.shards}
    checks = _whole_checks(manifest, job.work)
    blocked: list[tuple[str, ShardInfo, int]] = []
    whole: list[tuple[str, int, Callable[[bytes], str | None]]] = []
    for name, size in sizes.items():
        if name in shards:
            blocked.append((name, shards[name], size))
        else:
            whole.append((name, size, checks[name]))
    return fetch_files(job, blocked, whole, workers, label, progress)


def _stream_problem(directory: SafeDir, name: str, expected: str) -> str | None:
    """What is wrong with the file ``name``'s sha256 (read a chunk at a time), or None."""
    with open(directory.open_file(name, os.O_RDONLY), "rb") as f:
        digest = sha256_stream(f)
    return None if digest == expected else f"its sha256 is {digest}, expected {expected}"


def _read_problem(
    directory: SafeDir, name: str, check: Callable[[bytes], str | None]
) -> str | None:
    """What ``check`` says of the whole file ``name``, or None."""
    with open(directory.open_file(name, os.O_RDONLY), "rb") as f:
        return check(f.read())


def file_problem(directory: SafeDir, name: str, manifest: Manifest) -> str | None:
    """What is wrong with the file ``name`` in ``directory`` (a staged copy) against the hashes
    ``manifest`` records: a shard file's sha256 (streamed), a document index's sha256, the
    tokenizer copy's fingerprint; None when it matches."""
    shards = {s.bin_file: s for s in manifest.shards}
    if name in shards:
        return _stream_problem(directory, name, shards[name].bin_sha256)
    return _read_problem(directory, name, _whole_checks(manifest, directory)[name])


def fetch_files(
    job: Job,
    blocked: list[tuple[str, ShardInfo, int]],
    whole: list[tuple[str, int, Callable[[bytes], str | None]]],
    workers: int,
    label: str,
    progress: ProgressCallback | None,
) -> tuple[int, int]:
    """Fetch each file not yet in ``job.work`` (at its full size): ``blocked`` ones (name,
    the record of their block hashes and sha256, size) block by block, ``whole`` ones (name,
    size, their check) in one piece; returns (bytes fetched, bytes reused)."""
    bins: list[_BinFile] = []
    tasks: list[Callable[[], None]] = []
    ordered: list[tuple[float, int, Callable[[], None]]] = []
    reused = todo = 0
    try:
        for name, shard, size in blocked:
            if _kept(job, name, size, partial(_stream_problem, job.work, name, shard.bin_sha256)):
                reused += size
                continue
            f = _BinFile(job, shard, size, name)
            bins.append(f)
            reused += f.kept_bytes()
            todo += size - f.kept_bytes()
            first = job.first_use.get(name, {})
            for g in f.groups():
                soonest = min((first[i] for i in g if i in first), default=_LATER)
                ordered.append((soonest, len(ordered), partial(f.fetch, g)))
        tasks += [task for _, _, task in sorted(ordered, key=lambda t: t[:2])]
        for name, size, check in whole:
            if _kept(job, name, size, partial(_read_problem, job.work, name, check)):
                reused += size
                continue
            todo += size
            tasks.append(partial(_fetch_whole, job, name, size, check))
        with tally(todo, f"stage {label}", progress) as counting:
            job.counter.counting = counting
            _run(tasks, workers, job.stop)
    finally:
        for f in bins:
            f.finish()
    return job.counter.fetched, reused


def _kept(job: Job, name: str, size: int, problem: Callable[[], str | None]) -> bool:
    """Whether the staging directory holds the whole file ``name`` (left by an earlier run, or
    linked from a staged copy) and it still matches its hash, checked unless ``job.verified``
    names it; one that does not is removed, to be fetched again. A link, a FIFO or another
    user's file there is refused, never followed."""
    found = job.work.check(name, "file")
    if found is None:
        return False
    if found.st_size == size and (name in job.verified or problem() is None):
        return True
    job.work.unlink(name)
    return False


__all__ = [
    "Counter",
    "FirstUse",
    "Job",
    "download",
    "fetch_files",
    "file_problem",
    "ok_name",
    "part_name",
    "recorded_blocks",
]
