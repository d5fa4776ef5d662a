"""The identity of a Megatron prefix, computed once and recorded where readers find it.

A Megatron source's content hash covers every byte of ``PREFIX.bin`` and ``PREFIX.idx``.
Hashing a multi-TB ``.bin`` whenever a plan is resolved or a loader starts would be slow (and
a thousand ranks would read it a thousand times), so the identity (``MegatronIdentity``: both
sha256, the ``.bin`` block hashes, the smallest and largest token id, the content hash, and the
id every document ends with) is computed once, by ``tokentape plan``, ``tokentape verify`` or
``tokentape convert``, and recorded with the *keys* of both files (``FileKey``: size,
``mtime_ns``, ``ctime_ns``):

- in a sidecar file, ``PREFIX.tokentape.json``, or where the data's directory is read-only in
  ``$TOKENTAPE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/tokentape``, else
  ``~/.cache/tokentape``), named after a hash of the prefix's resolved path;
- in the plan (``PLAN.json``, ``MegatronRecord``), so a loader on any node needs no sidecar.

A record is used only while both files' keys are what it recorded; the ctime changes with every
write and cannot be set back, so an in-place rewrite that restores the mtime (``rsync
--inplace -t``) is seen (so is a ``chmod`` or a rename: the next identify hashes again). A copy
has new ctimes: a copied dataset is identified anew. The record saves time and nothing else:
the identity is the same function of the bytes either way. Readers that must not hash (the
loader, on every rank) refuse a prefix without a current record instead (``no_identity``).

The keys are taken from the open files (``fstat``) before their bytes are read, and hashing
reads through descriptors whose keys are checked against them before and after, so bytes
renamed onto the path meanwhile are never recorded under the old keys.

File timestamps are coarse (a clock tick of a few milliseconds, a second on some file
systems), so a file written again within the tick its keys were taken in would keep them: an
identity is not recorded while either file was modified or changed less than
``RACY_SECONDS`` before its keys were taken (the next identify hashes again), except by the
writer that has just produced the bytes itself (``tokentape convert``).

The end id lets an open check the end-of-document id without reading a page of ``.bin`` per
document: it is found while hashing (the last token of each document, as the chunks stream
past). A sidecar written before it was recorded lacks it; the open then checks the document
ends itself and adds the id to the sidecar (``record_end_id``).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.megatron.format import (
    CHUNK,
    DTYPE_NAMES,
    DTYPES,
    INTEGER_CODES,
    EndIds,
    FileKey,
    FileKeys,
    IdRange,
    MegatronIdentity,
    MegatronIndex,
    PrefixFiles,
    bin_path,
    content_hash,
    idx_path,
)
from tokentape._src.store.atomic import write_atomic
from tokentape._src.store.format import DEFAULT_BLOCK_BYTES
from tokentape._src.store.writer import BlockHasher
from tokentape._src.util.checks import is_int
from tokentape._src.util.progress import ProgressCallback, tally
from tokentape.errors import StoreError

SIDECAR_SUFFIX = ".tokentape.json"
SIDECAR_FORMAT = "tokentape.megatron-identity"
SIDECAR_VERSION = 2
"""2: files keyed by size, mtime_ns and ctime_ns. A version 1 sidecar (size, mtime_ns, inode:
blind to a rewrite with the mtime restored) is never current; ``verify`` still compares with
it."""
RACY_SECONDS = 2.0
"""Files modified this little before their keys were taken are not recorded (see above)."""
CHUNK_BYTES = 8 * 2**20
"""Bytes read (and hashed) at a time."""
SIDECAR_MAX_BYTES = 256 * 2**20
"""A larger sidecar is not one of ours: the block hashes of a 1 TiB ``.bin`` take about 1.1 MB,
so this holds those of more than 200 TiB."""

Progress = Callable[[int], None]
"""Called with the bytes just read."""


# --- file keys ------------------------------------------------------------------------------


def file_key(path: Path) -> FileKey:
    return FileKey.of(path.stat())


def file_keys(prefix: Path) -> FileKeys:
    """The keys of both files, by path (``PrefixFiles`` takes them from open files)."""
    return FileKeys(file_key(bin_path(prefix)), file_key(idx_path(prefix)))


def keys_from_json(data: Any) -> FileKeys | None:
    """``FileKeys`` from their JSON form (``asdict``), or None when malformed."""
    names = {f.name for f in fields(FileKey)}
    if not isinstance(data, dict) or set(data) != {"bin", "idx"}:
        return None
    keys = []
    for part in (data["bin"], data["idx"]):
        if not isinstance(part, dict) or set(part) != names:
            return None
        if not all(is_int(v) and v >= 0 for v in part.values()):
            return None
        keys.append(FileKey(**part))
    return FileKeys(*keys)


def racy(keys: FileKeys, taken_ns: int) -> bool:
    """Whether a file was modified or changed too shortly before its keys were taken (at
    ``taken_ns``) for its timestamps to show a later write."""
    limit = taken_ns - int(RACY_SECONDS * 1e9)
    return any(max(k.mtime_ns, k.ctime_ns) > limit for k in (keys.bin, keys.idx))


# --- identities as JSON -----------------------------------------------------------------------

_COUNTS = ("n_tokens", "n_docs", "n_sequences", "bin_bytes", "idx_bytes", "block_bytes")
_DIGESTS = ("bin_sha256", "idx_sha256")
_IDS = ("min_id", "max_id", "end_id")


def _is_digest(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def identity_to_json(identity: MegatronIdentity) -> dict[str, Any]:
    return asdict(identity) | {"block_sha256": list(identity.block_sha256)}


def identity_from_json(data: Any) -> MegatronIdentity | None:
    """The identity recorded in a sidecar (or a plan), or None unless every field has its type
    and they agree with each other (sizes, block count, id range, content hash): a malformed
    record counts as absent."""
    names = {f.name for f in fields(MegatronIdentity)}
    if not isinstance(data, dict) or not names - {"end_id"} <= set(data) <= names:
        return None
    if not all(is_int(data[k]) and data[k] >= 0 for k in _COUNTS):
        return None
    if not all(_is_digest(data[k]) for k in _DIGESTS):
        return None
    if not all(data.get(k) is None or is_int(data[k]) for k in _IDS):
        return None
    blocks = data["block_sha256"]
    if not isinstance(blocks, list | tuple) or not all(_is_digest(b) for b in blocks):
        return None
    if not isinstance(data["dtype"], str) or not isinstance(data["content_hash"], str):
        return None
    identity = MegatronIdentity(**data | {"block_sha256": tuple(blocks)})
    if not _consistent(identity):
        return None
    recomputed = content_hash(
        identity.dtype, identity.n_tokens, identity.n_docs, identity.bin_sha256, identity.idx_sha256
    )
    return identity if recomputed == identity.content_hash else None


def _consistent(identity: MegatronIdentity) -> bool:
    code = next((c for c in INTEGER_CODES if DTYPE_NAMES[c] == identity.dtype), None)
    if code is None or identity.bin_bytes != identity.n_tokens * DTYPES[code].itemsize:
        return False
    bb, n_blocks = identity.block_bytes, len(identity.block_sha256)
    if (bb == 0 and n_blocks) or (bb and n_blocks != -(-identity.bin_bytes // bb)):
        return False  # block_bytes 0, no blocks: an identity from a plan
    lo, hi = identity.min_id, identity.max_id
    if (lo is None) != (hi is None) or (lo is None) != (identity.n_tokens == 0):
        return False
    return lo is None or hi is None or lo <= hi


# --- sidecars ---------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where sidecars go when the data's directory is read-only."""
    if os.environ.get("TOKENTAPE_CACHE_DIR"):
        return Path(os.environ["TOKENTAPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tokentape"


def sidecar_paths(prefix: Path) -> list[Path]:
    """Where a prefix's sidecar may be, in the order looked at: beside it, then the cache
    (named after the resolved path: a plan and a loader reaching the data through different
    symbolic links find the same file)."""
    resolved = str(Path(prefix).resolve())
    name = "megatron-" + hashlib.sha256(resolved.encode()).hexdigest()[:24] + ".json"
    return [Path(resolved + SIDECAR_SUFFIX), cache_dir() / name]


def read_sidecars(prefix: Path) -> list[tuple[FileKeys | None, MegatronIdentity]]:
    """Every well-formed sidecar of ``prefix``, in the order looked at: the files' keys it was
    recorded for (None for a version 1 sidecar: never current) and the identity."""
    found = []
    for path in sidecar_paths(prefix):
        record = parse_sidecar(_sidecar_text(path))
        if record is not None:
            found.append(record)
    return found


def parse_sidecar(text: str | None) -> tuple[FileKeys | None, MegatronIdentity] | None:
    """What the sidecar ``text`` records: the files' keys (None for a version 1 sidecar: never
    current) and the identity; None when it is not a well-formed sidecar (or no text)."""
    try:
        data = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
        return None
    version = data.get("version")
    if not is_int(version) or version not in (1, SIDECAR_VERSION):
        return None
    identity = identity_from_json(data.get("identity"))
    if identity is None:
        return None
    keys = None  # version 1: its keys are never current
    if version == SIDECAR_VERSION:
        keys = keys_from_json(data.get("files"))
        if keys is None:
            return None
    return keys, identity


def _sidecar_text(path: Path) -> str | None:
    """The text of the sidecar at ``path``; None unless it is a regular file (a symbolic link,
    a FIFO or a directory counts as absent, and is never followed) of at most
    ``SIDECAR_MAX_BYTES`` in UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > SIDECAR_MAX_BYTES:
            return None
        with open(fd, "rb", closefd=False) as f:
            return f.read(SIDECAR_MAX_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def read_sidecar(prefix: Path, keys: FileKeys | None) -> MegatronIdentity | None:
    """The identity a sidecar records for files with ``keys``; with ``keys`` None, the first
    recorded identity (what ``verify`` checks files without a current record against)."""
    for recorded, identity in read_sidecars(prefix):
        if keys is None or recorded == keys:
            return identity
    return None


def write_sidecar(
    prefix: Path,
    identity: MegatronIdentity,
    keys: FileKeys,
    writer: bool = False,
    taken_ns: int | None = None,
) -> Path | None:
    """Cache ``identity`` for files with ``keys`` (taken at ``taken_ns``; None: now) beside the
    prefix, else in the cache directory; where it went (None when neither place is writable,
    or when the files are too recent to record unless ``writer``, who produced the bytes
    itself: the identity is then recomputed next time)."""
    taken = time.time_ns() if taken_ns is None else taken_ns
    if not writer and racy(keys, taken):
        return None
    text = sidecar_bytes(prefix, identity, keys)
    for path in sidecar_paths(prefix):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text)
        except OSError:
            continue
        return path
    return None


def sidecar_bytes(prefix: Path, identity: MegatronIdentity, keys: FileKeys) -> bytes:
    """The sidecar recording ``identity`` for the files of ``prefix`` with ``keys``."""
    data = {
        "format": SIDECAR_FORMAT,
        "version": SIDECAR_VERSION,
        "prefix": str(Path(prefix).resolve()),
        "files": asdict(keys),
        "identity": identity_to_json(identity),
    }
    return (json.dumps(data, indent=2) + "\n").encode()


# --- plan records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MegatronRecord:
    """What a plan records of a Megatron source (``PLAN.json``, per source): both files' keys
    when the plan identified it and the parts of its identity an open needs (the dtype, token
    count and content hash are the plan source's own fields). A loader whose files still have
    these keys takes the identity from here: no sidecar, no hashing, no scan of the ``.idx``.
    The block hashes (for ``verify --quick``) stay in the sidecar."""

    files: FileKeys
    n_docs: int
    n_sequences: int
    bin_sha256: str
    idx_sha256: str
    min_id: int | None
    max_id: int | None
    end_id: int | None

    @classmethod
    def of(cls, keys: FileKeys, identity: MegatronIdentity) -> MegatronRecord:
        return cls(
            files=keys,
            n_docs=identity.n_docs,
            n_sequences=identity.n_sequences,
            bin_sha256=identity.bin_sha256,
            idx_sha256=identity.idx_sha256,
            min_id=identity.min_id,
            max_id=identity.max_id,
            end_id=identity.end_id,
        )

    @classmethod
    def from_json(cls, data: Any) -> MegatronRecord | None:
        """The record of a ``PLAN.json``, or None when malformed."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            return None
        keys = keys_from_json(data["files"])
        counts_ok = all(is_int(data[k]) and data[k] >= 0 for k in ("n_docs", "n_sequences"))
        ids_ok = all(data[k] is None or is_int(data[k]) for k in _IDS)
        if keys is None or not counts_ok or not ids_ok:
            return None
        if not all(_is_digest(data[k]) for k in _DIGESTS):
            return None
        return cls(**data | {"files": keys})

    def identity(self, dtype: str, n_tokens: int, content: str) -> MegatronIdentity | None:
        """The identity this record and the plan's fields make (no block hashes), or None when
        they disagree (the content hash does not follow from them: edited by hand?)."""
        data = {
            "dtype": dtype,
            "n_tokens": n_tokens,
            "n_docs": self.n_docs,
            "n_sequences": self.n_sequences,
            "bin_bytes": self.files.bin.size,
            "idx_bytes": self.files.idx.size,
            "bin_sha256": self.bin_sha256,
            "idx_sha256": self.idx_sha256,
            "block_bytes": 0,
            "block_sha256": [],
            "min_id": self.min_id,
            "max_id": self.max_id,
            "content_hash": content,
            "end_id": self.end_id,
        }
        return identity_from_json(data)


# --- hashing ----------------------------------------------------------------------------------


def _changed(prefix: Path, when: str) -> StoreError:
    return StoreError(
        f"{prefix}: .bin or .idx changed {when}; try again once the files are complete"
    )


def hash_files(
    index: MegatronIndex, progress: Progress | None = None, block_bytes: int = DEFAULT_BLOCK_BYTES
) -> MegatronIdentity:
    """Read both files once: sha256 of each, ``.bin`` block hashes, the id range and the id
    every document ends with. Read through open files whose keys must be the index's (the
    files it was read from) before and after: bytes that changed meanwhile are refused."""
    with PrefixFiles(index.prefix) as files:
        if index.keys is not None and files.keys != index.keys:
            raise _changed(index.prefix, "since it was opened")
        buf = bytearray(CHUNK_BYTES - CHUNK_BYTES % index.dtype.itemsize)
        view = memoryview(buf)
        bin_chunks = (view[:n] for n in iter(lambda: files.bin.readinto(buf), 0))
        idx_chunks = iter(lambda: files.idx.read(CHUNK_BYTES), b"")
        identity = hash_chunks(index, bin_chunks, idx_chunks, progress, block_bytes)
        if files.now() != files.keys:
            raise _changed(index.prefix, "while it was being hashed")
    return identity


def hash_chunks(
    index: MegatronIndex,
    bin_chunks: Iterable[memoryview | bytes],
    idx_chunks: Iterable[bytes],
    progress: Progress | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> MegatronIdentity:
    """The identity of the ``.bin`` and ``.idx`` bytes given in chunks, in order (each ``.bin``
    chunk a whole number of tokens), with ``index`` parsed from that ``.idx``."""
    hasher, ids, ends = BlockHasher(block_bytes), IdRange(), _DocumentEnds(index)
    first = 0  # token offset of the chunk
    idx = hashlib.sha256()
    for chunk in bin_chunks:
        hasher.update(chunk)
        tokens = np.frombuffer(chunk, dtype=index.dtype, count=len(chunk) // index.dtype.itemsize)
        ids.update(tokens)
        ends.update(first, tokens)
        first += len(tokens)
        if progress is not None:
            progress(len(chunk))
    for piece in idx_chunks:
        idx.update(piece)
    bin_sha, blocks = hasher.finish()
    name = DTYPE_NAMES[index.code]
    return MegatronIdentity(
        dtype=name,
        n_tokens=index.n_tokens,
        n_docs=index.n_docs,
        n_sequences=index.n_sequences,
        bin_bytes=index.n_tokens * index.dtype.itemsize,
        idx_bytes=index.idx_bytes,
        bin_sha256=bin_sha,
        idx_sha256=idx.hexdigest(),
        block_bytes=block_bytes,
        block_sha256=blocks,
        min_id=ids.min,
        max_id=ids.max,
        content_hash=content_hash(name, index.n_tokens, index.n_docs, bin_sha, idx.hexdigest()),
        end_id=ends.value,
    )


def _last_tokens(index: MegatronIndex) -> Iterator[np.ndarray | None]:
    """Where each document's last token is in ``.bin`` (token offsets, ascending), ``CHUNK``
    documents at a time; ``None`` for a chunk holding an empty document."""
    docs, pointers = index.document_indices, index.sequence_pointers
    itemsize, n_seq = index.dtype.itemsize, index.n_sequences
    for lo in range(0, index.n_docs, CHUNK):
        seqs = np.asarray(docs[lo : lo + CHUNK + 1])  # each document's first sequence, and next
        offsets = np.full(len(seqs), index.n_tokens, dtype=np.int64)
        inside = seqs < n_seq
        offsets[inside] = np.asarray(pointers[seqs[inside]]) // itemsize
        if (np.diff(offsets) <= 0).any():
            yield None
            return
        yield offsets[1:] - 1


_DONE = np.zeros(0, dtype=np.int64)
"""``_last_tokens`` has no more chunks."""


class _DocumentEnds:
    """The id every document ends with, from ``.bin`` chunks read in order."""

    def __init__(self, index: MegatronIndex) -> None:
        self.ends = EndIds()
        self._chunks = _last_tokens(index)
        self._pending = np.zeros(0, dtype=np.int64)  # last-token offsets not yet reached

    def update(self, first: int, tokens: np.ndarray) -> None:
        """Take the last tokens of documents ending in ``tokens`` (offsets ``first`` on)."""
        stop = first + len(tokens)
        while not self.ends.mixed:
            if not self._pending.size:
                chunk = next(self._chunks, _DONE)
                if chunk is None:
                    self.ends.empty()
                    return
                if chunk is _DONE:
                    return
                self._pending = chunk
            k = int(np.searchsorted(self._pending, stop))
            self.ends.update(tokens[self._pending[:k] - first])
            self._pending = self._pending[k:]
            if self._pending.size:
                return

    @property
    def value(self) -> int | None:
        """The end id, once every chunk of ``.bin`` has been seen."""
        if self._pending.size or next(self._chunks, _DONE) is not _DONE:
            return None  # documents ending past the tokens seen (or an empty one there)
        return self.ends.value


def fits(identity: MegatronIdentity, header: tuple[int, int, int, int], keys: FileKeys) -> bool:
    """Whether ``identity`` can be that of files with this ``.idx`` header and these keys."""
    size, code, n_seq, n_entries = header
    return (
        identity.dtype == DTYPE_NAMES[code]
        and (identity.n_sequences, identity.n_docs) == (n_seq, n_entries - 1)
        and (identity.idx_bytes, identity.bin_bytes) == (size, keys.bin.size)
    )


PLAN = "plan"
SIDECAR = "sidecar"


def current_identity(
    files: PrefixFiles, planned: tuple[FileKeys, MegatronIdentity] | None = None
) -> tuple[MegatronIdentity | None, str | None]:
    """The identity recorded for the open ``files`` as they are (their keys): the plan's
    (``planned``: the keys and identity a plan recorded) when its keys match, else a current
    sidecar's; and where it came from (``PLAN``, ``SIDECAR``). (None, None) when neither is
    current. Reads no ``.bin`` and hashes nothing."""
    header = files.header()
    if planned is not None and planned[0] == files.keys and fits(planned[1], header, files.keys):
        return planned[1], PLAN
    cached = read_sidecar(files.prefix, files.keys)
    if cached is not None and fits(cached, header, files.keys):
        return cached, SIDECAR
    return None, None


def no_identity(prefix: Path, planned: bool) -> StoreError:
    """Why a reader that must not hash (a training rank) cannot open ``prefix``, and what to
    run once instead."""
    why = (
        "its .bin or .idx changed (written, copied, touched or chmod-ed) since the plan "
        "recorded them, and no sidecar matches them"
        if planned
        else "the plan recorded none, and no sidecar matches its files"
    )
    return StoreError(
        f"Megatron prefix '{prefix}' has no current identity: {why}; hashing it here would "
        f"read all of it on every rank: run `tokentape verify {prefix}` (or `tokentape plan`) "
        "once where it can record one, or set TOKENTAPE_CACHE_DIR to a directory shared by "
        "all nodes"
    )


def record_end_id(index: MegatronIndex, identity: MegatronIdentity, end_id: int) -> None:
    """Add ``end_id`` (every document ends with it: checked by the caller on the files of
    ``index``) to the cached ``identity`` if it lacks it (a sidecar written before the end id
    was recorded) and the files are still unchanged."""
    if (
        identity.end_id != end_id
        and index.keys is not None
        and file_keys(index.prefix) == index.keys
    ):
        write_sidecar(
            index.prefix, replace(identity, end_id=end_id), index.keys, taken_ns=index.taken_ns
        )


def megatron_identity(
    index: MegatronIndex, progress: ProgressCallback | None = None
) -> MegatronIdentity:
    """The identity of ``index.prefix``: from a current sidecar, else hashed (reported to
    ``progress`` as it goes) and cached."""
    prefix = index.prefix
    keys = index.keys if index.keys is not None else file_keys(prefix)
    cached = read_sidecar(prefix, keys)
    if cached is not None and (cached.n_tokens, cached.n_docs) == (index.n_tokens, index.n_docs):
        return cached
    with tally(keys.bin.size, f"hashing {prefix.name}", progress) as counting:
        identity = hash_files(index, None if counting is None else counting.add)
    write_sidecar(prefix, identity, keys, taken_ns=index.taken_ns or None)
    return identity


__all__ = [
    "CHUNK_BYTES",
    "SIDECAR",
    "SIDECAR_FORMAT",
    "SIDECAR_MAX_BYTES",
    "SIDECAR_SUFFIX",
    "SIDECAR_VERSION",
    "MegatronRecord",
    "Progress",
    "current_identity",
    "file_keys",
    "hash_chunks",
    "hash_files",
    "identity_from_json",
    "identity_to_json",
    "megatron_identity",
    "no_identity",
    "parse_sidecar",
    "racy",
    "read_sidecar",
    "record_end_id",
    "sidecar_bytes",
    "sidecar_paths",
    "write_sidecar",
]
