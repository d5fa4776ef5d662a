"""Small files read whole, from local disk or a bucket alike: a resolved plan, a plan file, a
run's step log. A reader given ``s3://bucket/runs/r1/steps.jsonl`` reads the object; a local
path is read as a regular file (``util.files``: no FIFO is waited on)."""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import tempfile
import threading
from pathlib import Path

from tokentape._src.objects.client import ObjectInfo, StorageOptions, is_url, object_store
from tokentape._src.util.files import read_regular

WHOLE_LIMIT = 2**31
"""The largest object read whole (a step log of 10^6 steps is about 300 MB)."""


def object_info(url: str, options: StorageOptions | None = None) -> ObjectInfo:
    """The object at ``url``; ``FileNotFoundError`` when there is none."""
    found = object_store(url, options).info(url)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "no such object", url)
    return found


def read_whole(path: str | os.PathLike[str], options: StorageOptions | None = None) -> bytes:
    """The bytes of the local file or object ``path``. A missing one raises
    ``FileNotFoundError``, one over ``WHOLE_LIMIT`` (or not a regular file) ``OSError``."""
    if not is_url(path):
        return read_regular(path)
    url = os.fspath(path)
    return _read(object_info(url, options), options)


def _read(found: ObjectInfo, options: StorageOptions | None) -> bytes:
    """The bytes of the object ``found`` (as its HEAD described it)."""
    if found.size > WHOLE_LIMIT:
        raise OSError(errno.EFBIG, f"larger than {WHOLE_LIMIT >> 20} MiB", found.url)
    return object_store(found.url, options).read_whole(found.url, found.size)


_copies: dict[tuple[str, int, str], Path] = {}
_lock = threading.Lock()
_root: list[Path] = []


def _copies_dir() -> Path:
    """This process's directory of fetched copies, removed when it exits."""
    if not _root:
        made = Path(tempfile.mkdtemp(prefix="tokentape-fetched-"))
        atexit.register(shutil.rmtree, made, True)
        _root.append(made)
    return _root[0]


def local_copy(url: str, options: StorageOptions | None = None) -> Path:
    """A local file holding the object at ``url`` (for readers that scan a file: a step log),
    fetched once per version in this process into a temporary directory removed at exit."""
    found = object_info(url, options)
    key = (url, found.size, found.version)
    with _lock:
        copy = _copies.get(key)
        if copy is not None and copy.is_file():
            return copy
        data = _read(found, options)
        copy = _copies_dir() / f"{len(_copies)}-{Path(url).name or 'object'}"
        copy.write_bytes(data)
        _copies[key] = copy
        return copy


__all__ = ["WHOLE_LIMIT", "local_copy", "object_info", "read_whole"]
