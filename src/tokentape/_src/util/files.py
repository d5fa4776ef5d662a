"""Opening a file a user named, refusing what is not a regular file (a FIFO would block the
open or the read forever; a directory or a device is not a plan or a log) before reading."""

from __future__ import annotations

import errno
import io
import os
import stat


def open_regular(path: str | os.PathLike[str]) -> io.BufferedReader:
    """``path`` opened for reading; ``OSError`` (``EINVAL``, "not a regular file") for a FIFO,
    a directory, a socket or a device, without blocking on a FIFO that has no writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file at ``path`` (see ``open_regular``)."""
    with open_regular(path) as f:
        return f.read()


__all__ = ["open_regular", "read_regular"]
