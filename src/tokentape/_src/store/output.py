"""The files tokentape writes in an output directory, and removing those (and nothing else)."""

from __future__ import annotations

import os
import re
import shutil
from contextlib import suppress
from pathlib import Path

from tokentape._src.store.format import BIN_SUFFIX, IDX_SUFFIX, MANIFEST_NAME
from tokentape._src.store.tokenizers import STORED_NAMES

WORK_DIR = ".tokentape-work"


_SHARD_FILES = "|".join(map(re.escape, (BIN_SUFFIX, IDX_SUFFIX)))
_OTHER_FILES = "|".join(map(re.escape, (MANIFEST_NAME, *STORED_NAMES)))
_OURS = re.compile(rf"part-\d{{5,}}(?:{_SHARD_FILES})|{_OTHER_FILES}")


def is_store_file(name: str) -> bool:
    """Whether a name in a store directory is one tokentape writes: a shard's two files, the
    manifest, the tokenizer copy, the temporary name of one of those, or the work directory.
    Exact names only: a ``part-00000-x.snappy.parquet`` or ``tokenizer_config.json`` is not
    ours and is never removed."""
    if name == WORK_DIR:
        return True
    if name.startswith(".") and ".tmp-" in name:
        name = name[1 : name.index(".tmp-")]
    return _OURS.fullmatch(name) is not None


def discard_store(directory: Path) -> None:
    """Remove a store directory that is no longer wanted (a staging directory left by an
    earlier run, or the old store after a replacement): our files only (store names), then
    the directory if that left it empty; anything else in it is left alone."""
    if directory.is_dir() and not directory.is_symlink():
        clear_out(directory)
        with suppress(OSError):  # not empty: someone else's files, left alone
            directory.rmdir()


def clear_out(out: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove everything tokentape writes in ``out`` (and nothing else), but for ``keep``."""
    for name in os.listdir(out):
        if is_store_file(name) and name not in keep:
            path = out / name
            if path.is_dir() and not path.is_symlink():  # a link is removed, never followed
                shutil.rmtree(path)
            else:
                path.unlink()
