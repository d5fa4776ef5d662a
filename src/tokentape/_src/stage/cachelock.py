"""A waiting lock in a stage cache: one process per node stages a store, the others wait.

``cache_lock(cache, name, what, timeout_s)`` takes an exclusive ``flock`` on the file
``name`` in the cache directory ``cache`` (created if missing; opened without following a
link, and refused unless it is this user's regular file with one hard link: see
``store.safedir``), waiting for it while another process holds it, and gives up after
``timeout_s`` seconds with a one-line ``CacheLocked`` naming the holder. Unlike the writer
lock of ``store.lock`` (which refuses a second writer at once), waiting is the point here: a
node's other ranks block until the one staging the store is done, then use its result.

The holder writes who it is (host, pid, what, since when) into the file once it holds the
lock; the file is never removed (removing a locked file lets a newcomer lock a second inode
of the same name). The kernel drops a ``flock`` when its holder dies, even by ``kill -9``,
so a killed stager never leaves a lock behind. Locks are per node: a cache on a shared file
system without working ``flock`` is refused with a message (put the cache on local disk).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from tokentape._src.store.safedir import SafeDir
from tokentape.errors import CacheLocked, OutputError

try:
    import fcntl
except ImportError:  # not a POSIX system: no flock
    fcntl = None  # type: ignore[assignment]

POLL_S = 0.05
"""How often a waiting process tries the lock again."""


def _try(fd: int, path: Path) -> bool:
    if fcntl is None:
        raise OutputError(f"'{path}': the stage cache needs flock (Linux, macOS, other POSIX)")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise OutputError(
            f"'{path}': cannot lock the stage cache ({exc.strerror or exc}); put the cache on "
            "a node-local disk"
        ) from None
    return True


def _holder(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode())
    except (OSError, ValueError, RecursionError):
        record = None
    if not isinstance(record, dict):
        return "another process"
    fields = [str(record.get(k, "?"))[:200] for k in ("what", "host", "pid", "since")]
    return "{} on host {}, pid {}, since {}".format(*fields)


@contextmanager
def cache_lock(cache: SafeDir, name: str, what: str, timeout_s: float) -> Iterator[float]:
    """Hold the exclusive lock file ``name`` of ``cache`` for the duration, waiting up to
    ``timeout_s`` seconds for another holder to finish; yields the seconds waited. ``what``
    says what the holder is doing (it is recorded in the file for the waiters' messages)."""
    path = cache.path / name
    fd = cache.open_file(name, os.O_RDWR, create=True)
    start = time.monotonic()
    try:
        while not _try(fd, path):
            waited = time.monotonic() - start
            if waited >= timeout_s:
                raise CacheLocked(
                    f"'{path}': waited {waited:.0f} s for {_holder(fd)} to finish staging; "
                    "still busy (raise the wait, or end that process if it hangs)"
                )
            time.sleep(POLL_S)
        record = {
            "what": what,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        yield time.monotonic() - start
    finally:
        os.close(fd)  # releases the flock


__all__ = ["cache_lock"]
