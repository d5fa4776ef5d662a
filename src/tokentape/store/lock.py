"""One writer per output: an exclusive ``flock`` on a lock file beside the output.

``output_lock(out, command)`` guards a store directory or a Megatron prefix ``DIR/NAME`` with
the hidden file ``DIR/.NAME.lock`` (beside the output, never inside it: a directory is swapped
whole on ``--overwrite``). The holder writes who it is into the file (host, pid, command,
since when) once it holds the lock; a second writer is refused at once with a one-line
``OutputLocked`` naming that holder, and has touched nothing.

The kernel releases a ``flock`` when its holder dies (even by ``kill -9``), so a stale lock
file is simply locked again by the next writer, which then records itself. The file is
removed on release, while still locked; a writer that locks a file which was meanwhile
removed or replaced (its inode is no longer at the path) starts over, so two writers never
hold two different inodes of one name.

Helper processes and Ray tasks of the run that holds the lock write only under its work
directory and take no lock. What this guarantees on shared file systems: docs/cluster.md.
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

from tokentape.errors import TokentapeError

try:
    import fcntl
except ImportError:  # not a POSIX system: no flock
    fcntl = None  # type: ignore[assignment]

HOLDER_WAIT_S = 2.0
"""How long a refused writer waits for the holder to record itself before saying it cannot
tell who holds the lock."""


class OutputLocked(TokentapeError):
    """Another process is writing the same output; the message names it."""


def lock_path(out: str | os.PathLike[str]) -> Path:
    """The lock file of the output ``out``: ``.NAME.lock`` in its (resolved) parent."""
    real = Path(os.path.realpath(out))
    if not real.name:
        raise TokentapeError(f"'{out}': an output cannot be the file system's root")
    return real.parent / f".{real.name}.lock"


def _holder_record(command: str, out: str | os.PathLike[str]) -> bytes:
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": command,
        "since": since,
        "out": os.fspath(out),
    }
    return (json.dumps(record) + "\n").encode()


def _alive_here(record: dict) -> bool:
    """False for a record of this host whose process is gone (a stale record that the live
    holder has not overwritten yet); True otherwise (another host cannot be checked)."""
    if record.get("host") != socket.gethostname():
        return True
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _read_holder(fd: int) -> dict | None:
    try:
        data = os.pread(fd, 4096, 0)
        record = json.loads(data.decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and _alive_here(record) else None


def _describe(record: dict | None) -> str:
    if record is None:
        return "another process (it has not recorded itself yet)"
    return (
        f"tokentape {record.get('command', '?')} on host {record.get('host', '?')}, "
        f"pid {record.get('pid', '?')}, since {record.get('since', '?')}"
    )


def _try_lock(fd: int, path: Path) -> bool:
    if fcntl is None:
        raise TokentapeError(f"'{path}': writer locks need flock (Linux, macOS, other POSIX)")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise TokentapeError(
            f"'{path}': cannot lock the output ({exc.strerror or exc}); this file system has no "
            "working locks: write the output on a local disk or a file system mounted with "
            "locking (see docs/cluster.md)"
        ) from None
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _acquire(path: Path, out: str | os.PathLike[str], command: str) -> int:
    """Lock ``path`` (created if missing) and return its descriptor, or raise ``OutputLocked``."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise TokentapeError(
                f"'{path}': cannot create the writer lock of '{out}' ({exc.strerror or exc}); "
                "the output's parent directory must be writable"
            ) from None
        try:
            if _try_lock(fd, path):
                if _same_file(fd, path):
                    return fd
                os.close(fd)  # released and removed by its holder meanwhile: start over
                continue
            holder = _read_holder(fd)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if holder is not None or time.monotonic() >= deadline:
            raise OutputLocked(
                f"'{out}' is being written by {_describe(holder)}; refusing to write it at the "
                f"same time (lock file {path})"
            )
        time.sleep(0.02)


@contextmanager
def output_lock(out: str | os.PathLike[str], command: str) -> Iterator[Path]:
    """Hold the exclusive writer lock of the output ``out`` (a store directory or a Megatron
    prefix) for the duration; yields the lock file's path.

    The parent directory is created if needed (and removed again at the end if this call
    created it and it is still empty). Raises ``OutputLocked`` when another process holds it.
    """
    path = lock_path(out)
    if os.path.lexists(path.parent) and not path.parent.is_dir():
        raise TokentapeError(f"'{out}': '{path.parent}' is not a directory")
    created = _make_parents(path.parent)
    try:
        fd = _acquire(path, out, command)
    except BaseException:
        _remove_empty(created)
        raise
    try:
        record = _holder_record(command, out)
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        yield path
    finally:
        try:
            path.unlink(missing_ok=True)  # while still locked: see the module docstring
        finally:
            os.close(fd)
            _remove_empty(created)


def _make_parents(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents; return those created, deepest first."""
    missing = []
    d = directory
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    directory.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_empty(directories: list[Path]) -> None:
    for d in directories:
        try:
            d.rmdir()
        except OSError:
            return
