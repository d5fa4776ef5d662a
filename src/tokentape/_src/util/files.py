"""Opening a file a user named, refusing what is not a regular file (a FIFO would block the
open or the read forever; a directory or a device is not a plan or a log) before reading."""

from __future__ import annotations

import errno
import io
import os
import stat


def open_regular(path: str | os.PathLike[str], follow_links: bool = True) -> io.BufferedReader:
    """``path`` opened for reading; ``OSError`` (``EINVAL``, "not a regular file") for a FIFO,
    a directory, a socket or a device, without blocking on a FIFO that has no writer; with
    ``follow_links=False``, ``OSError`` (``ELOOP``) for a symbolic link."""
    nofollow = 0 if follow_links else os.O_NOFOLLOW
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | nofollow)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int = -1, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at ``path``, up to ``limit`` (see ``open_regular``)."""
    with open_regular(path, follow_links) as f:
        return f.read(limit)


__all__ = ["open_regular", "read_regular"]
