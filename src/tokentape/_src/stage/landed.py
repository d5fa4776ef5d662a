"""The blocks a stage under way on this node has already landed, read in place.

While a node stages a store (``stage.stage``: one process per node and store downloads it, the
node's other processes wait), a loader streaming the same store (``Loader(stage="background")``)
reads every block that is already on local disk from there instead of fetching it.
``LandedBlocks(cache_dir, url)`` is that view of the store's staging directory
(``DIR/.KEY-NAME.staging``, layout in ``stage.stage``): for each token file, either the
``.FILE.part`` being written, of which the blocks its ``.FILE.ok`` record names were verified
and made durable before they were recorded, or the finished ``FILE``, verified whole.

A file is read there only when the staging manifest (``.manifest.json``) records for it the
block size and block hashes the streaming source checks fetched ranges against: the stage
verified those blocks against the very hashes a fetch would have been checked against. The
view only reads, through the cache directory's descriptor (``store.safedir``: no link is
followed); anything the cache refuses (a link, another user's file) or fails to read turns it
off, and the source goes on fetching (the stage itself reports what it found). It keeps each
file it found open, so a file renamed meanwhile (the ``.part`` finished, the directory put in
place) is read on.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tokentape._src.objects.client import basename
from tokentape._src.objects.ranged import Blocks
from tokentape._src.stage.fetch import ok_name, part_name, recorded_blocks
from tokentape._src.stage.stage import (
    MANIFEST_MAX_BYTES,
    REMEDY,
    STAGING_MANIFEST,
    cache_key,
    staging_name,
)
from tokentape._src.store.format import ShardInfo, parse_manifest
from tokentape._src.store.safedir import SafeDir
from tokentape.errors import OutputError, StoreError


@dataclass
class _File:
    """What was found of one token file in the staging directory."""

    fd: int = -1
    """The ``.part`` (or the finished file) open for reading; -1: not found yet."""
    ok_fd: int = -1
    ok_read: int = 0
    """Bytes of the ``.ok`` record taken in so far (whole records only)."""
    whole: bool = False
    landed: set[int] = field(default_factory=set)

    def holds(self, first: int, last: int) -> bool:
        return self.whole or all(i in self.landed for i in range(first, last + 1))

    def close(self) -> None:
        for fd in (self.fd, self.ok_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.ok_fd = -1


class LandedBlocks:
    """A ``LocalBlocks`` (``objects.ranged``) over one store's stage in ``cache_dir``."""

    def __init__(self, cache_dir: str | os.PathLike[str], url: str) -> None:
        self._cache_dir = Path(cache_dir)
        self._work_name = staging_name(cache_key(url))
        self._work: SafeDir | None = None
        self._shards: dict[str, ShardInfo] = {}
        """The staging manifest's shard records, by ``.bin`` name."""
        self._key: tuple[int, ...] | None = None
        """The staging directory's and its manifest's identity (inodes, mtime)."""
        self._rejected: tuple[int, ...] | None = None
        """The ``_key`` of a stage found for another version (not read again)."""
        self._files: dict[str, _File] = {}
        self._off = False
        self._lock = threading.Lock()

    # --- LocalBlocks ---------------------------------------------------------------------------

    def has(self, url: str, start: int, stop: int, blocks: Blocks) -> bool:
        with self._lock:
            return self._find(url, start, stop, blocks) is not None

    def read(self, url: str, start: int, stop: int, blocks: Blocks) -> bytes | None:
        with self._lock:
            found = self._find(url, start, stop, blocks)
            if found is None:
                return None
            try:
                data = os.pread(found.fd, stop - start, start)
            except OSError:
                self._turn_off()
                return None
        return data if len(data) == stop - start else None

    def close(self) -> None:
        with self._lock:
            self._turn_off()

    # --- looking -------------------------------------------------------------------------------

    def _find(self, url: str, start: int, stop: int, blocks: Blocks) -> _File | None:
        """The file holding every block of ``[start, stop)`` of ``url``, looked for again on
        disk when it does not yet; None when it does not."""
        if self._off or stop <= start or blocks.block_bytes <= 0:
            return None
        name = basename(url)
        first, last = start // blocks.block_bytes, (stop - 1) // blocks.block_bytes
        f = self._files.setdefault(name, _File())
        if not f.holds(first, last):
            try:
                self._look(name, f, blocks)
            except (OSError, OutputError):  # a refused entry, a read error: fetch instead
                self._turn_off()
                return None
        return f if f.fd >= 0 and f.holds(first, last) else None

    def _look(self, name: str, f: _File, blocks: Blocks) -> None:
        """Take in what the stage has landed of the file ``name`` since the last look."""
        work = self._staging()
        if work is None:
            return
        if not self._same_blocks(name, blocks):  # another version's stage: left alone
            self._reject()
            return
        if f.fd < 0:
            if work.check(name, "file") is not None:  # finished before this process looked
                f.fd, f.whole = work.open_file(name, os.O_RDONLY), True
                return
            part = part_name(name)
            if work.check(part, "file") is None:
                return
            f.fd = work.open_file(part, os.O_RDONLY)
        if f.ok_fd < 0 and work.check(ok_name(name), "file") is not None:
            f.ok_fd = work.open_file(ok_name(name), os.O_RDONLY)
        got = os.pread(f.ok_fd, 1 << 16, f.ok_read) if f.ok_fd >= 0 else b""
        recorded, taken = recorded_blocks(got)
        f.landed.update(recorded)
        f.ok_read += taken
        if not got:  # nothing new: finished (the .part renamed to its name) since?
            done = work.check(name, "file")
            mine = os.fstat(f.fd)
            f.whole = done is not None and (done.st_dev, done.st_ino) == (
                mine.st_dev,
                mine.st_ino,
            )

    def _same_blocks(self, name: str, blocks: Blocks) -> bool:
        """Whether the staging manifest records ``blocks``' block size and hashes for the
        file ``name`` (a ``.bin``): what the stage verified its blocks against."""
        shard = self._shards.get(name)
        return (
            shard is not None
            and shard.block_bytes == blocks.block_bytes
            and tuple(shard.block_sha256) == tuple(blocks.sha256)
        )

    def _staging(self) -> SafeDir | None:
        """The staging directory, once it holds a manifest; None before (or when it is for
        another version of the store, which this view then leaves alone)."""
        if self._work is not None:
            return self._work
        if not self._cache_dir.is_dir():
            return None
        with SafeDir.open(self._cache_dir, "stage cache", REMEDY) as cache:
            work = cache.child(self._work_name)
        if work is None:
            return None
        st = work.check(STAGING_MANIFEST, "file")
        key = None if st is None else (os.fstat(work.fd).st_ino, st.st_ino, st.st_mtime_ns)
        if key is None or key == self._rejected:
            work.close()
            return None
        text = work.read(STAGING_MANIFEST, MANIFEST_MAX_BYTES)
        try:
            manifest = parse_manifest((text or b"").decode("utf-8", "replace"), "staging")
        except StoreError:  # not a store's (a Megatron prefix's marker), or damaged
            self._rejected = key
            work.close()
            return None
        self._shards = {s.bin_file: s for s in manifest.shards}
        self._work, self._key = work, key
        return work

    def _reject(self) -> None:
        """Leave the staging directory found alone until it is replaced (files already found
        in an earlier one are still read: they matched)."""
        self._rejected = self._key
        if self._work is not None:
            self._work.close()
            self._work = None

    def _turn_off(self) -> None:
        self._off = True
        for f in self._files.values():
            f.close()
        if self._work is not None:
            self._work.close()
            self._work = None


__all__ = ["LandedBlocks"]
