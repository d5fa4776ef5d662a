"""The files tokentape writes in an output directory, and removing those (and nothing else).

A store's names are few and fixed (``is_store_file``), but a name is not proof: another tool
may leave a ``part-00000.bin`` too. ``survey`` sorts what a directory holds by whose it is:

- Tokentape's by name alone: the work directory ``.tokentape-work``; the manifest
  ``manifest.json`` (a store's, even when it cannot be read: ``--overwrite`` replaces such a
  store); the hidden temporary name of a store file (``.NAME.tmp-...``, which only tokentape's
  atomic writes make).
- A shard file (``part-NNNNN.bin``, ``part-NNNNN.idx.npy``, and the provenance files
  ``part-NNNNN.rec.npy``, ``part-NNNNN.ids``, ``part-NNNNN.idkeys.npy``), a tokenizer copy
  (``tokenizer.json``, ``tokenizer.tiktoken``) or the inputs table (``inputs.json``) is
  tokentape's only when
  (a) the ``manifest.json`` there parses as a tokentape manifest and names it, or
  (b) the directory holds an unfinished run: ``.tokentape-work/job.json``, a regular file in a
  real directory (not a link), or
  (c) it is one of a shard's two files as the writer leaves them: ``part-NNNNN.bin`` and
  ``part-NNNNN.idx.npy`` both regular files, the index a ``.npy`` file holding one dimension
  of little-endian int64, exactly as long as its header says; a shard's provenance files, when
  its pair is such; a tokenizer copy or the inputs table, when such a pair is beside it. (c)
  is what lets ``--overwrite`` replace a store whose manifest was damaged; a lone
  ``part-00000.bin`` is never ours by (c).
- Anything else at a store name, and a directory at any store name but the work directory's,
  is "unclaimed"; any other name is "foreign". Neither is ever removed.

Those who remove (``clear_out``, ``discard_store``) remove what is tokentape's and nothing
else, what marks the rest as tokentape's last; those who decide to (``tokenize``, ``convert``)
first refuse a directory that holds anything else, with or without ``--overwrite``.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokentape._src.store.confine import open_inside
from tokentape._src.store.format import (
    BIN_SUFFIX,
    IDX_SUFFIX,
    MANIFEST_NAME,
    NPY_ERRORS,
    parse_manifest,
    read_npy_header,
    store_files,
)
from tokentape._src.store.provenance import INPUTS_NAME, SHARD_SUFFIXES
from tokentape._src.store.tokenizers import STORED_NAMES
from tokentape.errors import OutputError, TokentapeError

WORK_DIR = ".tokentape-work"
JOB_FILE = "job.json"
"""The record of an unfinished run, in ``WORK_DIR``: what marks a directory a run builds in."""


_SHARD_FILES = "|".join(map(re.escape, (BIN_SUFFIX, IDX_SUFFIX, *SHARD_SUFFIXES)))
_BESIDE = (*STORED_NAMES, INPUTS_NAME)
"""A store's files that belong to no shard."""
_OTHER_FILES = "|".join(map(re.escape, (MANIFEST_NAME, *_BESIDE)))
_OURS = re.compile(rf"part-\d{{5,}}(?:{_SHARD_FILES})|{_OTHER_FILES}")
_INDEX_DTYPE = np.dtype("<i8")


def is_store_file(name: str) -> bool:
    """Whether a name in a store directory is one tokentape writes: a shard's files, the
    manifest, the tokenizer copy, the inputs table, the temporary name of one of those, or the
    work directory.
    Exact names only: a ``part-00000-x.snappy.parquet`` or ``tokenizer_config.json`` is not
    ours and is never removed. A name is not proof that the file is ours: see ``survey``."""
    if name == WORK_DIR:
        return True
    if _temporary(name):
        name = name[1 : name.index(".tmp-")]
    return _OURS.fullmatch(name) is not None


def _temporary(name: str) -> bool:
    return name.startswith(".") and ".tmp-" in name


@dataclass(frozen=True)
class Contents:
    """What a directory tokentape writes in holds, by whose it is (see the module docstring);
    each tuple sorted."""

    ours: tuple[str, ...]
    """Tokentape's: what ``clear_out`` removes."""
    unclaimed: tuple[str, ...]
    """Store names whose files tokentape cannot tell are its own: never removed."""
    foreign: tuple[str, ...]
    """Names tokentape never writes: never removed."""


def survey(directory: Path) -> Contents:
    """Sort the names in ``directory`` by whose they are (rules: the module docstring)."""
    names = sorted(os.listdir(directory))
    stored = [n for n in names if is_store_file(n)]
    claimed = _claimed(directory, stored)
    return Contents(
        ours=tuple(n for n in stored if n in claimed),
        unclaimed=tuple(n for n in stored if n not in claimed),
        foreign=tuple(n for n in names if not is_store_file(n)),
    )


def check_ours(directory: Path, where: str, remedy: str) -> Contents:
    """``survey(directory)``, refused when it holds anything tokentape cannot tell is its own:
    a name a store never has, or a store file not identifiably ours (``where`` names the
    directory in the message, ``remedy`` ends the second). ``--overwrite`` never removes such
    a file, so the refusal never suggests it."""
    found = survey(directory)
    if found.foreign:
        raise OutputError(
            f"{where}: not empty and not a tokentape store (found '{found.foreign[0]}'); "
            "choose a new or empty directory"
        )
    if found.unclaimed:
        name = found.unclaimed[0]
        raise OutputError(
            f"{where}: holds '{name}', which tokentape cannot tell is its own (no readable "
            f"{MANIFEST_NAME} there names it, and no unfinished run is there); --overwrite "
            f"never removes such a file: {remedy}"
        )
    return found


def _claimed(directory: Path, stored: list[str]) -> set[str]:
    """Which of the store names ``stored`` in ``directory`` are tokentape's."""
    # Only the work directory is a directory: one at any other name is not ours.
    kept = [n for n in stored if n == WORK_DIR or not _real_dir(directory / n)]
    claimed = {n for n in kept if n in (WORK_DIR, MANIFEST_NAME) or _temporary(n)}
    files = [n for n in kept if n not in claimed]
    if not files or _unfinished_run(directory):
        return claimed | set(files)
    named = _named(directory)
    claimed |= {n for n in files if n in named}
    shards = set(files)
    claimed |= {n for n in files if n not in claimed and _in_a_pair(directory, n, shards)}
    paired = {n.removesuffix(BIN_SUFFIX) for n in claimed if n.endswith(BIN_SUFFIX)}
    claimed |= {n for n in files if _shard_of(n) in paired}  # the provenance of a pair
    copies = {n for n in files if n not in claimed and n in _BESIDE}
    if copies and any(_in_a_pair(directory, n, shards) for n in files if n.endswith(BIN_SUFFIX)):
        claimed |= copies
    return claimed


def _shard_of(name: str) -> str | None:
    """The shard a provenance file belongs to (``part-NNNNN``), or None."""
    for suffix in SHARD_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return None


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _unfinished_run(directory: Path) -> bool:
    """Whether ``directory`` holds a run's job record: ``WORK_DIR/JOB_FILE``, a regular file in
    a real directory (a link at either name is not a run's)."""
    work = directory / WORK_DIR
    try:
        return _real_dir(work) and stat.S_ISREG(os.lstat(work / JOB_FILE).st_mode)
    except OSError:
        return False


def _named(directory: Path) -> set[str]:
    """The files the manifest in ``directory`` names, or none when it cannot be read or is not
    a tokentape manifest (what ``tokentape verify`` would find wrong with it does not matter)."""
    try:
        with open(open_inside(directory, MANIFEST_NAME, "the manifest"), "rb") as f:
            text = f.read().decode("utf-8")
        manifest = parse_manifest(text, str(directory / MANIFEST_NAME), strict=False)
    except (TokentapeError, OSError, ValueError, RecursionError):
        return set()
    return {name for name, _ in store_files(manifest)}


def _in_a_pair(directory: Path, name: str, files: set[str]) -> bool:
    """Whether the shard file ``name`` is one of a shard's two files as the writer leaves them
    (rule (c) of the module docstring)."""
    if name.endswith(BIN_SUFFIX):
        shard = name.removesuffix(BIN_SUFFIX)
    elif name.endswith(IDX_SUFFIX):
        shard = name.removesuffix(IDX_SUFFIX)
    else:
        return False
    bin_file, idx_file = shard + BIN_SUFFIX, shard + IDX_SUFFIX
    if bin_file not in files or idx_file not in files:
        return False
    try:
        if not stat.S_ISREG(os.lstat(directory / bin_file).st_mode):
            return False
        with open(open_inside(directory, idx_file, "document index"), "rb") as f:
            shape, fortran, dtype = read_npy_header(f)
            header = f.tell()
            size = os.fstat(f.fileno()).st_size
    except (TokentapeError, OSError, *NPY_ERRORS):  # a malformed index: not recognised
        return False
    return (
        len(shape) == 1 and not fortran and dtype == _INDEX_DTYPE and size == header + 8 * shape[0]
    )


def discard_store(directory: Path) -> None:
    """Remove a store directory that is no longer wanted (a staging directory left by an
    earlier run, or the old store after a replacement): tokentape's files only (``survey``),
    then the directory if that left it empty; anything else in it is left alone."""
    if directory.is_dir() and not directory.is_symlink():
        clear_out(directory)
        with suppress(OSError):  # not empty: someone else's files, left alone
            directory.rmdir()


def _removal_order(name: str) -> int:
    """The tokenizer copy and temporaries first, then the shard files, the manifest, and the
    work directory (with the job record) last: what marks the rest as tokentape's goes last,
    so that what an interrupted removal leaves is still marked."""
    if name == WORK_DIR:
        return 3
    if name == MANIFEST_NAME:
        return 2
    return 1 if name.startswith("part-") else 0


def clear_out(out: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove what is tokentape's in ``out`` (``survey``), but for ``keep``; nothing else."""
    for name in sorted(survey(out).ours, key=_removal_order):
        if name in keep:
            continue
        path = out / name
        if _real_dir(path):  # the work directory (a link is removed, never followed)
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


__all__ = [
    "JOB_FILE",
    "WORK_DIR",
    "check_ours",
    "clear_out",
    "discard_store",
    "is_store_file",
    "survey",
]
