"""Atomic file writes (temporary file in the same directory, fsync, rename, fsync the
directory) and atomic replacement of a whole directory (``replace_directory``)."""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from tokentape._src.objects.client import is_url, object_store
from tokentape.errors import WriteFailed

RENAME_EXCHANGE = 2
"""``renameat2`` flag (Linux >= 3.15, glibc >= 2.28): swap two names in one step."""
AT_FDCWD = -100
UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}
"""What ``renameat2`` answers where the kernel or the file system cannot exchange names."""


def _failed(exc: OSError, final: Path) -> WriteFailed:
    reason = exc.strerror or str(exc) or type(exc).__name__
    return WriteFailed(exc.errno or errno.EIO, reason, str(final))


def _names(exc: OSError, tmp: Path) -> bool:
    """Whether ``exc`` is about ``tmp`` (or names no file: a write to it)."""
    return exc.filename is None or os.fspath(exc.filename) == os.fspath(tmp)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    """A temporary name beside ``path``, hidden and never mistaken for a result, unique across
    processes and hosts (ranks in identical containers share pids on a shared file system)."""
    unique = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    return path.with_name(f".{path.name}.tmp-{unique}")


@contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary file that appears at ``path`` only once it is complete and durable.

    On an exception the temporary file is removed and ``path`` is left as it was. A file
    system error of the write itself (an ``OSError`` that names no file, or the temporary
    name) is raised as ``WriteFailed`` naming ``path``.
    """
    final = Path(path)
    tmp = temp_name(final)
    try:
        f = open(tmp, "xb")  # noqa: SIM115 - closed below on every path; "x": never someone else's
    except OSError as exc:
        raise _failed(exc, final) from None
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException as exc:
        with suppress(OSError):  # a close flushes what a failed write left: it fails again
            f.close()
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteFailed) and _names(exc, tmp):
            raise _failed(exc, final) from None
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; errors are ``WriteFailed`` naming ``path``."""
    with atomic_writer(path) as f:
        f.write(data)


def write_output(path: str | os.PathLike[str], data: bytes) -> None:
    """A command's output file (a plan, a page): ``write_atomic``, or at an object URL one PUT
    (an object is replaced whole: a reader sees the old or the new one)."""
    if is_url(path):
        url = os.fspath(path)
        object_store(url).put_bytes(url, data)
    else:
        write_atomic(path, data)


# --- replacing a directory ---------------------------------------------------------------------


def _renameat2() -> Callable[..., int] | None:
    """libc's ``renameat2`` (returns 0 or -1, errno set), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return getattr(libc, "renameat2", None)  # glibc >= 2.28; Python's os has no renameat2


def exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Swap the names ``a`` and ``b`` (both must exist) in one atomic step.

    Returns False, having changed nothing, where that is not possible: not Linux, a C library
    without ``renameat2``, or a kernel or file system that refuses ``RENAME_EXCHANGE``.
    Raises ``OSError`` on any other failure.
    """
    return exchange_at(AT_FDCWD, a, AT_FDCWD, b)


def exchange_at(
    a_dir: int, a: str | os.PathLike[str], b_dir: int, b: str | os.PathLike[str]
) -> bool:
    """``exchange`` of ``a`` looked up in the directory descriptor ``a_dir`` and ``b`` in
    ``b_dir`` (``AT_FDCWD``: the working directory)."""
    func = _renameat2()
    if func is None:
        return False
    result = func(a_dir, os.fsencode(a), b_dir, os.fsencode(b), RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), os.fspath(b))


def _remove_tree(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def replace_directory(new: Path, out: Path, discard: Callable[[Path], None] = _remove_tree) -> bool:
    """Put the complete directory ``new`` at ``out`` (same parent directory) and remove what
    was at ``out`` before (with ``discard``: by default the whole tree; a caller that must
    leave foreign files alone passes its own).

    Where ``exchange`` works, a process opening ``out`` at any moment finds the old directory
    or the new one, never neither. Elsewhere (see ``exchange``) the old one is renamed aside
    and the new one renamed in: for that instant ``out`` does not exist. Returns whether the
    replacement was atomic. The old tree is removed last; if this process dies before, it is
    left under ``new``'s (hidden) name.
    """
    if new.parent != out.parent:
        raise ValueError(f"replace_directory: '{new}' is not beside '{out}'")
    fd = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return replace_entry(fd, new.name, out.name, lambda name: discard(out.parent / name))
    finally:
        os.close(fd)


def replace_entry(parent: int, new: str, out: str, discard: Callable[[str], None]) -> bool:
    """``replace_directory`` of the entries ``new`` and ``out`` of the directory open as
    ``parent`` (names looked up in it, never through a link at either name); ``discard``
    gets the name the old entry is left under."""
    try:
        os.stat(out, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(new, out, src_dir_fd=parent, dst_dir_fd=parent)
        os.fsync(parent)
        return True
    if exchange_at(parent, new, parent, out):
        os.fsync(parent)
        discard(new)  # now the old directory
        return True
    aside = f".{out}.old-{socket.gethostname()}-{os.getpid()}"
    os.rename(out, aside, src_dir_fd=parent, dst_dir_fd=parent)
    try:
        os.rename(new, out, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        os.rename(aside, out, src_dir_fd=parent, dst_dir_fd=parent)
        raise
    os.fsync(parent)
    discard(aside)
    return False


__all__ = [
    "atomic_writer",
    "exchange",
    "exchange_at",
    "fsync_dir",
    "replace_directory",
    "replace_entry",
    "temp_name",
    "write_atomic",
    "write_output",
]
