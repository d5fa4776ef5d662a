"""Atomic file writes: temporary file in the same directory, fsync, rename, fsync the directory."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


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

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    final = Path(path)
    tmp = temp_name(final)
    f = open(tmp, "xb")  # noqa: SIM115 - closed below on every path; "x": never someone else's
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        f.close()
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)
