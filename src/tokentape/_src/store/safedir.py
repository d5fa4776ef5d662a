"""A directory tokentape writes in, held open by descriptor: no name in it is ever followed
through a symbolic link, and only this user's own entries are reused.

``SafeDir.open(path, what, remedy)`` opens a directory the user named (a symbolic link at
*that* path is followed: the user chose it) and refuses one that another user could change
under us: owned by someone else than this user or root, or writable by its group or by others
without the sticky bit (they could rename our entries away and plant their own). Every name
*inside* it is then looked up relative to its descriptor (``openat``, ``mkdirat``,
``renameat``, ``unlinkat``) and never through a link:

- a directory is opened with ``O_NOFOLLOW | O_DIRECTORY`` (``child``) and must belong to this
  user;
- a file is opened with ``O_NOFOLLOW`` (and ``O_NONBLOCK``, so a FIFO cannot block the open)
  and must be a regular file of this user; a file written in place must also have no other
  hard link (``open_file``); a new temporary file is created with ``O_EXCL``;
- renames move names, never what a link points to; a planted link is never removed by
  following it either.

A link, a FIFO, a device, a socket, a directory where a file belongs (or the reverse), or an
entry of another user at a name tokentape uses is refused with ``OutputError``: one line
naming the path, what it is, and the remedy (``remedy``, e.g. "remove it, or use another
cache directory"). Nothing is removed that tokentape cannot identify as its own.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Self

from tokentape._src.store.atomic import exchange_at
from tokentape.errors import OutputError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _kind(mode: int) -> str:
    """What a file of ``mode`` is, in a few words."""
    for test, words in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return words
    return "not a file or directory"


def _owner_problem(st: os.stat_result) -> str | None:
    me = os.geteuid()
    if st.st_uid != me:
        return f"belongs to uid {st.st_uid}, not to this user (uid {me})"
    return None


def _entry_problem(
    st: os.stat_result, kind: str, single: bool, described: Callable[[], str]
) -> str | None:
    """What stops the entry ``st`` being this user's ``kind`` (``"file"`` or ``"dir"``; with
    ``single``, a file with no other hard link), or None; ``described`` says what it is."""
    wanted = stat.S_ISREG if kind == "file" else stat.S_ISDIR
    if not wanted(st.st_mode):
        return f"{described()}, not {'a regular file' if kind == 'file' else 'a directory'}"
    problem = _owner_problem(st)
    if problem is None and single and st.st_nlink != 1:
        problem = f"has {st.st_nlink} hard links (a file written in place must have one)"
    return problem


def _link_words(target: Callable[[], str]) -> str:
    try:
        return f"is a symbolic link (to '{target()}')"
    except OSError:
        return "is a symbolic link"


class SafeDir:
    """A directory held open by descriptor (see the module docstring).

    Attributes:
        path: The directory's path, for messages only (nothing is looked up through it).
        fd: The open descriptor every name is looked up in.
        remedy: What the user can do about a refused entry, ending the refusal's line.
    """

    def __init__(self, path: Path, fd: int, remedy: str) -> None:
        self.path = path
        self.fd = fd
        self.remedy = remedy

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], what: str, remedy: str) -> SafeDir:
        """The directory ``path`` (created with its parents if missing), refused unless only
        this user (or root) can change its entries; ``what`` names it in messages."""
        where = Path(path)
        try:
            where.mkdir(parents=True, exist_ok=True)
            fd = os.open(where, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        except FileExistsError:
            raise OutputError(f"{what} '{where}': exists and is not a directory") from None
        except OSError as exc:
            raise OutputError(f"{what} '{where}': cannot open ({exc.strerror or exc})") from None
        st = os.fstat(fd)
        problem = None
        if st.st_uid not in (os.geteuid(), 0):
            problem = f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            problem = "is writable by other users (and has no sticky bit)"
        if problem is not None:
            os.close(fd)
            raise OutputError(
                f"{what} '{where}': {problem}: they could swap its entries; use a directory "
                "of your own (e.g. under $HOME or a node-local disk)"
            )
        return cls(where, fd, remedy)

    def child(self, name: str, create: bool = False) -> SafeDir | None:
        """The directory ``name`` in this one (made when ``create`` and missing), or None when
        there is none; refused when it is anything else or not this user's."""
        if create:
            try:
                os.mkdir(name, 0o755, dir_fd=self.fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise self._cannot(name, "create", exc) from None
        try:
            fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.check(name, "dir")  # raises, naming what is there
            raise self._cannot(name, "open", exc) from None
        problem = _owner_problem(os.fstat(fd))
        if problem is not None:
            os.close(fd)
            raise self.refusal(name, problem)
        return SafeDir(self.path / name, fd, self.remedy)

    def make(self, name: str) -> SafeDir:
        """``child(name, create=True)``: the directory ``name``, made if missing."""
        made = self.child(name, create=True)
        if made is None:  # removed between the mkdir and the open
            raise OutputError(f"'{self.path / name}': vanished while being created")
        return made

    def close(self) -> None:
        """Let go of the descriptor (once)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- looking ----------------------------------------------------------------------------

    def refusal(self, name: str, problem: str) -> OutputError:
        """The one-line refusal of the entry ``name``: ``problem`` says what it is."""
        return OutputError(f"'{self.path / name}': {problem}; {self.remedy}")

    def _cannot(self, name: str, doing: str, exc: OSError) -> OutputError:
        return OutputError(f"'{self.path / name}': cannot {doing} ({exc.strerror or exc})")

    def lstat(self, name: str) -> os.stat_result | None:
        """The entry ``name`` itself (a link is not followed), or None when there is none."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._cannot(name, "examine", exc) from None

    def describe(self, name: str, st: os.stat_result) -> str:
        """What the entry ``name`` is, a link with its target."""
        if stat.S_ISLNK(st.st_mode):
            return _link_words(lambda: os.readlink(name, dir_fd=self.fd))
        return f"is {_kind(st.st_mode)}"

    def check(self, name: str, kind: str, single: bool = False) -> os.stat_result | None:
        """The entry ``name`` when it is this user's ``kind`` (``"file"``: a regular file;
        ``"dir"``: a directory), None when there is none; anything else is refused. With
        ``single`` a file must have no other hard link (it is written in place)."""
        st = self.lstat(name)
        if st is None:
            return None
        problem = _entry_problem(st, kind, single, lambda: self.describe(name, st))
        if problem is not None:
            raise self.refusal(name, problem)
        return st

    def exists(self, name: str, kind: str) -> bool:
        """Whether ``name`` is this user's ``kind`` (see ``check``; anything else refused)."""
        return self.check(name, kind) is not None

    def names(self) -> list[str]:
        """The names in the directory."""
        return os.listdir(self.fd)

    # --- files ------------------------------------------------------------------------------

    def open_file(
        self, name: str, flags: int, create: bool = False, exclusive: bool = False
    ) -> int:
        """A descriptor of the regular file ``name`` (``flags``: ``os.O_RDONLY``,
        ``O_WRONLY``, ``O_RDWR``, ``O_APPEND``...), created when ``create`` (``exclusive``:
        it must not exist yet); refused unless it is this user's regular file with no other
        hard link when opened for writing."""
        flags |= _NOFOLLOW | _NONBLOCK | _CLOEXEC
        if create:
            flags |= os.O_CREAT | (os.O_EXCL if exclusive else 0)
        try:
            fd = os.open(name, flags, 0o644, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR, errno.EEXIST):
                self.check(name, "file")  # a link, a FIFO, a directory: named
            raise self._cannot(name, "open", exc) from None
        try:
            st = os.fstat(fd)
            writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
            problem = _entry_problem(st, "file", writing, lambda: self.describe(name, st))
            if problem is not None:
                raise self.refusal(name, problem)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, name: str, limit: int) -> bytes | None:
        """The bytes of the regular file ``name`` (at most ``limit``), None when missing."""
        try:
            fd = self.open_file(name, os.O_RDONLY)
        except OutputError:
            if self.lstat(name) is None:
                return None
            raise
        with open(fd, "rb") as f:
            return f.read(limit)

    def write_atomic(self, name: str, data: bytes) -> None:
        """Put a file holding ``data`` at ``name`` in one step (a temporary file made with
        ``O_EXCL``, fsynced, renamed over ``name``, the directory fsynced): a reader sees the
        old file or the new one. Whatever was at ``name`` is replaced, never written through;
        a directory there is refused."""
        self.check(name, "file")
        unique = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        tmp = f".{name}.tmp-{unique}"
        fd = self.open_file(tmp, os.O_WRONLY, create=True, exclusive=True)
        try:
            with open(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException as exc:
            self.unlink(tmp)
            if isinstance(exc, OSError):
                raise self._cannot(name, "write", exc) from None
            raise
        self.fsync()

    def unlink(self, name: str) -> None:
        """Remove the file (or link, or FIFO) ``name`` if there is one (a link is removed,
        never followed)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._cannot(name, "remove", exc) from None

    def rename(self, old: str, new: str, into: SafeDir | None = None) -> None:
        """Rename the entry ``old`` to ``new`` (in ``into``, default this directory)."""
        target = self if into is None else into
        try:
            os.rename(old, new, src_dir_fd=self.fd, dst_dir_fd=target.fd)
        except OSError as exc:
            raise self._cannot(old, f"rename to '{target.path / new}'", exc) from None

    def exchange(self, a: str, b: str) -> bool:
        """Swap the entries ``a`` and ``b`` in one step; False (nothing done) where the
        kernel or file system cannot (see ``store.atomic.exchange``)."""
        return exchange_at(self.fd, a, self.fd, b)

    def remove_tree(self, name: str) -> None:
        """Remove the directory ``name`` and everything in it, without following a link
        anywhere (a link at ``name`` itself is removed as a link)."""
        st = self.lstat(name)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            self.unlink(name)
            return
        try:
            shutil.rmtree(name, dir_fd=self.fd)
        except OSError as exc:
            raise self._cannot(name, "remove", exc) from None

    def fsync(self) -> None:
        """Make the renames and removals in this directory durable."""
        os.fsync(self.fd)


def made_directory(path: Path, remedy: str) -> Path:
    """``path``, a directory tokentape names inside one that exists: made if missing, and
    refused (``OutputError``: one line naming it, then ``remedy``) unless it is a directory of
    this user, so that a link, a file or another user's directory planted at that name is never
    followed or written into. For directories other processes (tokenize's helpers, Ray tasks)
    write into by path; a stage cache, which one process works in, is a ``SafeDir``."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    except OSError as exc:
        raise OutputError(f"'{path}': cannot create ({exc.strerror or exc})") from None
    check_directory(path, remedy)
    return path


def _path_words(path: Path, st: os.stat_result) -> str:
    """What the entry at ``path`` is (``SafeDir.describe`` for a path)."""
    if stat.S_ISLNK(st.st_mode):
        return _link_words(lambda: os.readlink(path))
    return f"is {_kind(st.st_mode)}"


def check_directory(path: Path, remedy: str) -> None:
    """Refuse ``path`` (see ``made_directory``) when it exists and is anything but a directory
    of this user; nothing is made."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    problem = _entry_problem(st, "dir", False, lambda: _path_words(path, st))
    if problem is not None:
        raise OutputError(f"'{path}': {problem}; {remedy}")


__all__ = ["SafeDir", "check_directory", "made_directory"]
