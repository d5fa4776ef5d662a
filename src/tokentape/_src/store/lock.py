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
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tokentape.errors import OutputError, OutputLocked

try:
    import fcntl
except ImportError:  # not a POSIX system: no flock
    # mypy types a name bound by import as that module only: None marks it missing
    fcntl = None  # type: ignore[assignment]

HOLDER_WAIT_S = 2.0
"""How long a refused writer waits for the holder to record itself before saying it cannot
tell who holds the lock."""


def lock_path(out: str | os.PathLike[str]) -> Path:
    """The lock file of the output ``out``: ``.NAME.lock`` in its (resolved) parent."""
    real = Path(os.path.realpath(out))
    if not real.name:
        raise OutputError(f"'{out}': an output cannot be the file system's root")
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


def _alive_here(record: dict[str, Any]) -> bool:
    """False for a record of this host whose process is gone (a stale record that the live
    holder has not overwritten yet); True otherwise (another host cannot be checked)."""
    if record.get("host") != socket.gethostname():
        return True
    pid = record.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _read_holder(fd: int) -> dict[str, Any] | None:
    """The holder's record in the lock file, or None when there is none worth showing. The
    file is anyone's to write: whatever it holds (binary, deep nesting, values of any type)
    gives None or a record, never an exception."""
    try:
        data = os.pread(fd, 4096, 0)
        record = json.loads(data.decode())
    except (OSError, ValueError, RecursionError):  # ValueError: JSON and UTF-8 errors
        return None
    return record if isinstance(record, dict) and _alive_here(record) else None


def _field(record: dict[str, Any], key: str) -> str:
    """A field of a holder record for a one-line message: printable, short, '?' if odd."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, str | int):
        return "?"
    text = str(value)
    if not text.isprintable() or len(text) > 200:
        return repr(text[:200])
    return text


def _describe(record: dict[str, Any] | None) -> str:
    if record is None:
        return "another process (it has not recorded itself yet)"
    return (
        f"tokentape {_field(record, 'command')} on host {_field(record, 'host')}, "
        f"pid {_field(record, 'pid')}, since {_field(record, 'since')}"
    )


def _try_lock(fd: int, path: Path) -> bool:
    if fcntl is None:
        raise OutputError(f"'{path}': writer locks need flock (Linux, macOS, other POSIX)")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise OutputError(
            f"'{path}': cannot lock the output ({exc.strerror or exc}); this file system has no "
            "working locks: write the output on a local disk or a file system mounted with "
            "locking (see docs/cluster.md)"
        ) from None
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


_OPEN_FLAGS = (
    os.O_RDWR
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)  # getattr: the module imports where there is no flock
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
"""Never through a link at the lock's name (it would create or clobber the file it names);
a FIFO planted there opens without blocking and is then refused."""


def _open_lock_file(path: Path, out: str | os.PathLike[str]) -> int:
    """The lock file, created if missing; refused, touching nothing, when something other
    than a regular file is at its name (a symbolic link, a directory, a FIFO)."""
    for _ in range(100):  # the parent can vanish: a writer that created it removes it empty
        try:
            fd = os.open(path, _OPEN_FLAGS, 0o644)
            break
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if os.path.islink(path):
                raise OutputError(
                    f"'{path}': the writer lock file of '{out}' is a symbolic link "
                    f"(to {os.readlink(path)!r}), not tokentape's; remove it"
                ) from None
            if os.path.isdir(path):
                raise OutputError(
                    f"'{path}': the writer lock file of '{out}' is a directory, "
                    "not tokentape's; remove it"
                ) from None
            raise OutputError(
                f"'{path}': cannot create the writer lock of '{out}' ({exc.strerror or exc}); "
                "the output's parent directory must be writable"
            ) from None
    else:
        raise OutputError(f"'{path}': cannot create the writer lock of '{out}'")
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not to this user"
    elif st.st_nlink != 1:  # the holder's record would be written into the other name's file
        problem = f"has {st.st_nlink} hard links"
    if problem is not None:
        os.close(fd)
        raise OutputError(
            f"'{path}': the writer lock file of '{out}' {problem}, not tokentape's; remove it"
        )
    return fd


def _acquire(path: Path, out: str | os.PathLike[str], command: str) -> int:
    """Lock ``path`` (created if missing) and return its descriptor, or raise ``OutputLocked``."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        fd = _open_lock_file(path, out)
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
        raise OutputError(f"'{out}': '{path.parent}' is not a directory")
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
            if _same_file(fd, path):  # while still locked: see the module docstring
                path.unlink(missing_ok=True)
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


__all__ = [
    "lock_path",
    "output_lock",
]
