"""A store reads only its own files: exact names, inside its directory, no symbolic links.

A store directory may be anywhere (``/shared/stores/web``, or a symbolic link to it); what is
confined is the files *inside* it that its manifest names. Each is a plain name the format
defines (``manifest.json``, ``part-NNNNN.bin``, ``part-NNNNN.idx.npy``, ``tokenizer.json`` or
``tokenizer.tiktoken``), so nothing can climb out with ``..`` or an absolute path, and each
must be a regular file in the directory itself, not a symbolic link (to anywhere: a link
inside the store is refused too) nor a FIFO, device or directory. Shards are named
``part-00000``, ``part-00001``, ... in manifest order, as the writer names them.

``open_inside`` opens such a file without following a link at its name (``O_NOFOLLOW``), so a
link put there between a check and the open is still refused; ``check_inside`` checks by
``lstat`` without opening (``tokentape plan``, which reads no shard); ``inside_problem`` says
what is wrong for ``tokentape verify``, which reports instead of refusing. Each takes an
optional ``dir_fd`` (from ``open_directory``) so that a reader takes every file from one
directory even while another is swapped in at its name.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from tokentape.errors import StoreError

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
"""No link followed at the name; a FIFO opens without blocking (and is then refused)."""


def shard_name(index: int) -> str:
    """The name of shard ``index``: ``part-00000`` for shard 0."""
    return f"part-{index:05d}"


def shard_name_problem(index: int, name: object) -> str | None:
    """What is wrong with ``name`` as the name of shard ``index`` (None when it is right)."""
    expected = shard_name(index)
    if name == expected:
        return None
    if isinstance(name, str) and ("/" in name or "\\" in name or name in ("", ".", "..")):
        why = "a path, not a plain file name inside the store"
    else:
        why = "not the writer's name for that shard"
    return f"shards[{index}].name is {name!r}, {why}; expected {expected!r}"


def check_shard_names(names: Sequence[object], where: str) -> None:
    """Refuse any shard not named ``part-NNNNN`` after its place in the manifest."""
    for i, name in enumerate(names):
        problem = shard_name_problem(i, name)
        if problem is not None:
            raise StoreError(f"{where}: {problem}")


def is_plain_name(name: str) -> bool:
    """Whether ``name`` names a file inside a directory (no separator, not ``.``/``..``)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _refusal(path: Path, what: str, why: str) -> StoreError:
    return StoreError(
        f"{path}: {what} {why}; a store reads only regular files inside its own directory"
    )


def _link_text(path: Path) -> str:
    try:
        return f"is a symbolic link (to '{os.readlink(path)}')"
    except OSError:
        return "is a symbolic link"


def _kind_problem(path: Path, mode: int) -> str | None:
    if stat.S_ISLNK(mode):
        return _link_text(path)
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    return None


def no_store_directory(directory: Path) -> str:
    """The message for a store path that names no directory: a file, or nothing."""
    if os.path.lexists(directory):
        return f"store '{directory}': not a directory (a store is a directory with manifest.json)"
    return f"store '{directory}': no such directory"


def open_directory(directory: Path) -> int:
    """A descriptor of the store directory itself (a link at its name is followed: a store
    directory may be one). Files opened relative to it with ``dir_fd`` all come from the same
    directory, even if another is swapped in at its name meanwhile."""
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise StoreError(no_store_directory(directory)) from None
    except OSError as exc:
        raise StoreError(f"store '{directory}': cannot open ({exc.strerror})") from None


def replaced(directory: Path, dir_fd: int) -> bool:
    """True when ``directory`` no longer names the directory open as ``dir_fd`` (another was
    swapped in at its name, or it was removed)."""
    try:
        now = os.stat(directory)
    except OSError:
        return True
    held = os.fstat(dir_fd)
    return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)


def open_inside(directory: Path, name: str, what: str, dir_fd: int | None = None) -> int:
    """A read-only descriptor of the regular file ``name`` in ``directory`` (``what`` says
    what it is in errors), looked up in ``dir_fd`` when given (``directory`` then only names
    it in messages). Refused, naming the file: a name that is not a plain file name, a
    missing file, a symbolic link, anything but a regular file."""
    if not is_plain_name(name):
        raise _refusal(directory / name, what, "is not a plain file name")
    path = directory / name
    try:
        fd = os.open(path if dir_fd is None else name, _FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise StoreError(f"{path}: {what} is missing") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a link (EMLINK: BSD)
            raise _refusal(path, what, _link_text(path)) from None
        raise StoreError(f"{path}: cannot read {what} ({exc.strerror})") from None
    problem = _kind_problem(path, os.fstat(fd).st_mode)
    if problem is not None:
        os.close(fd)
        raise _refusal(path, what, problem)
    return fd


def inside_problem(directory: Path, name: str, dir_fd: int | None = None) -> str | None:
    """What stops ``name`` being read as a file of the store in ``directory`` (or ``dir_fd``)
    (a link, not a regular file, not a plain name), or None; a missing file is None (the
    caller says so)."""
    if not is_plain_name(name):
        return "is not a plain file name"
    try:
        mode = os.lstat(directory / name if dir_fd is None else name, dir_fd=dir_fd).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    return _kind_problem(directory / name, mode)


def check_inside(directory: Path, name: str, what: str, dir_fd: int | None = None) -> None:
    """Refuse ``name`` in ``directory`` (or ``dir_fd``) unless it is missing or a regular file
    (checked with ``lstat``, without opening it)."""
    problem = inside_problem(directory, name, dir_fd)
    if problem is not None:
        raise _refusal(directory / name, what, problem)


__all__ = [
    "check_inside",
    "check_shard_names",
    "inside_problem",
    "is_plain_name",
    "no_store_directory",
    "open_directory",
    "open_inside",
    "replaced",
    "shard_name",
]
