"""Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``): parse, validate, write.

``PREFIX.bin`` holds raw little-endian token ids, sequence after sequence. ``PREFIX.idx`` is a
34-byte header (magic, version, dtype code, sequence and document counts) followed by three
arrays: each sequence's length (int32), each sequence's byte offset in ``.bin`` (int64), and
the document index (int64): the first sequence of each document, with the sequence count
appended. ``docs/format.md`` describes the layout and what tokentape requires of it.

Everything here works on memory maps and in chunks: a ``.idx`` of a hundred million sequences
is checked without holding it in memory twice, and ``MegatronWriter`` streams ``.bin``.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tokentape._src.store.atomic import fsync_dir, temp_name
from tokentape._src.store.format import DEFAULT_BLOCK_BYTES
from tokentape._src.store.writer import BlockHasher
from tokentape._src.util.checks import check_int, check_path, shown
from tokentape.errors import ArgumentError, StoreError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")
"""Magic, version, dtype code, sequence count, document-index entries: 34 bytes."""
CONTENT_FORMAT = "tokentape.megatron/1"
"""Domain of a Megatron source's content hash."""
CHUNK = 2**22
"""Index entries checked (or tokens converted) at a time."""

DTYPES: dict[int, np.dtype] = {
    1: np.dtype("u1"),
    2: np.dtype("i1"),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    6: np.dtype("<f8"),
    7: np.dtype("<f4"),
    8: np.dtype("<u2"),
}
"""Megatron's dtype codes. Codes 6 and 7 (floats) cannot hold token ids and are refused."""
DTYPE_NAMES = {code: dt.name for code, dt in DTYPES.items()}
INTEGER_CODES = {code for code, dt in DTYPES.items() if dt.kind in "iu"}


def bin_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.bin")


def idx_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.idx")


def is_prefix(path: str | os.PathLike[str]) -> bool:
    """Whether ``PATH.bin`` and ``PATH.idx`` both exist."""
    return bin_path(path).is_file() and idx_path(path).is_file()


def dtype_code(name: str) -> int:
    """The Megatron code of an integer dtype name (``uint16`` → 8)."""
    for code in INTEGER_CODES:
        if DTYPE_NAMES[code] == name:
            return code
    names = ", ".join(sorted(DTYPE_NAMES[c] for c in INTEGER_CODES))
    raise ArgumentError(f"dtype '{name}' is not a Megatron integer dtype; expected one of {names}")


def choose_dtype(vocab_size: int) -> str:
    """The smallest Megatron dtype for ids below ``vocab_size`` that Megatron's own
    ``DType.optimal_dtype`` would also pick: ``uint16`` up to 65,536 ids, else ``int32``."""
    if vocab_size <= 2**16:
        return "uint16"
    if vocab_size <= 2**31:
        return "int32"
    raise ArgumentError(f"a vocabulary of {vocab_size} ids does not fit Megatron's int32")


def holds(name: str, vocab_size: int) -> bool:
    """Whether integer dtype ``name`` holds every id below ``vocab_size``."""
    return vocab_size - 1 <= int(np.iinfo(np.dtype(name)).max)


def content_hash(dtype: str, n_tokens: int, n_docs: int, bin_sha256: str, idx_sha256: str) -> str:
    """A Megatron source's identity: sha256 over the format, dtype, counts and the sha256 of
    both files. A function of the two files' bytes only."""
    h = hashlib.sha256(f"{CONTENT_FORMAT}/{dtype}".encode())
    h.update(f"\n{n_tokens}:{n_docs}:{bin_sha256}:{idx_sha256}".encode())
    return "sha256:" + h.hexdigest()


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileKey:
    """What stands for a file's bytes without reading them: its size, ``mtime_ns`` and
    ``ctime_ns``. Every write changes the ctime, and nothing but the clock sets it (``utime``
    restores the mtime, not the ctime), so an in-place rewrite with the mtime put back still
    shows. The inode and device numbers are left out: a file system mounted on many machines
    (FUSE, some network file systems) may number one file differently on each."""

    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileKey:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class FileKeys:
    """The keys of a prefix's two files."""

    bin: FileKey
    idx: FileKey


class PrefixFiles:
    """``PREFIX.bin`` and ``PREFIX.idx`` opened for reading, their keys taken from the open
    descriptors (``fstat``) at ``taken_ns``: what is then read through them is what the keys
    describe, even if another file is renamed onto the path meanwhile."""

    def __init__(self, prefix: str | os.PathLike[str]) -> None:
        self.prefix = Path(prefix)
        self._open: list[io.BufferedReader] = []
        try:
            self.idx = self._file(idx_path(prefix))
            self.bin = self._file(bin_path(prefix))
        except BaseException:
            self.close()
            raise
        self.taken_ns = time.time_ns()  # no later than the fstat: see megatron_identity.racy
        self.keys = FileKeys(FileKey.of(os.fstat(self.bin.fileno())), self.idx_key())

    def _file(self, path: Path) -> io.BufferedReader:
        f = open_for_reading(path)
        self._open.append(f)
        return f

    def idx_key(self) -> FileKey:
        return FileKey.of(os.fstat(self.idx.fileno()))

    def now(self) -> FileKeys:
        """The keys of the open files as they are now (``fstat`` again)."""
        return FileKeys(FileKey.of(os.fstat(self.bin.fileno())), self.idx_key())

    def header(self) -> tuple[int, int, int, int]:
        """(idx file size, dtype code, sequence count, document-index entries), each checked."""
        head = os.pread(self.idx.fileno(), HEADER.size, 0)
        return parse_header(idx_path(self.prefix), self.keys.idx.size, head)

    def close(self) -> None:
        for f in self._open:
            f.close()

    def __enter__(self) -> PrefixFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class MegatronIndex:
    """A validated ``.idx``: its arrays are read-only memory-mapped views of the file; ``keys``
    are the two files' keys when they were opened (at ``taken_ns``)."""

    prefix: Path
    code: int
    sequence_lengths: np.ndarray  # int32, one per sequence
    sequence_pointers: np.ndarray  # int64: byte offset of each sequence in .bin
    document_indices: np.ndarray  # int64: first sequence of each document, then the count
    n_tokens: int
    idx_bytes: int
    keys: FileKeys | None = None
    taken_ns: int = 0

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.code]

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES[self.code]

    @property
    def n_sequences(self) -> int:
        return len(self.sequence_lengths)

    @property
    def n_docs(self) -> int:
        return len(self.document_indices) - 1

    def doc_starts(self) -> np.ndarray:
        """Token offset of each document's first token (int64, in memory; a document with no
        sequence at the very end starts at ``n_tokens``)."""
        first = np.asarray(self.document_indices[:-1])
        if not self.n_sequences:
            return np.zeros(len(first), dtype=np.int64)
        inside = first < self.n_sequences
        starts = self.sequence_pointers[np.minimum(first, self.n_sequences - 1)]
        starts = starts // self.dtype.itemsize
        return np.where(inside, starts, self.n_tokens).astype(np.int64)


def _view(file: BinaryIO, dtype: str, offset: int, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=(count,))


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def open_for_reading(path: Path) -> io.BufferedReader:
    """One of a prefix's two files, opened; a missing or unreadable one is one clear line."""
    try:
        return open(path, "rb")  # the caller closes it
    except FileNotFoundError:
        raise StoreError(f"{path}: no such file (a Megatron prefix needs .bin and .idx)") from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc.strerror})") from None


def parse_header(path: str | Path, size: int, head: bytes) -> tuple[int, int, int, int]:
    """The checked header of the ``.idx`` at ``path`` (``size`` bytes, starting with ``head``)."""
    if len(head) >= len(MAGIC) and head[: len(MAGIC)] != MAGIC:
        raise StoreError(
            f"{path}: not a Megatron index: starts with {head[: len(MAGIC)]!r}, expected {MAGIC!r}"
        )
    if size < HEADER.size or len(head) < HEADER.size:
        raise StoreError(
            f"{path}: truncated: {size} bytes, shorter than the {HEADER.size}-byte header"
        )
    _, version, code, n_seq, n_doc_entries = HEADER.unpack(head)
    if version != VERSION:
        raise StoreError(f"{path}: index version {version} is not supported; expected 1")
    if code not in DTYPES:
        raise StoreError(
            f"{path}: dtype code {code} is unknown; expected 1-8 "
            "(uint8, int8, int16, int32, int64, float64, float32, uint16)"
        )
    if code not in INTEGER_CODES:
        raise StoreError(
            f"{path}: dtype code {code} ({DTYPE_NAMES[code]}) holds floats; token ids must be "
            "integers"
        )
    if n_doc_entries == 0:
        raise StoreError(
            f"{path}: the document index has no entries; it needs at least its leading 0"
        )
    return size, code, n_seq, n_doc_entries


def read_index(
    prefix: str | os.PathLike[str], files: PrefixFiles | None = None, n_tokens: int | None = None
) -> MegatronIndex:
    """Parse and validate ``PREFIX.idx`` against ``PREFIX.bin`` (header, sizes, counts, the
    document index, and that the sequences lie back to back in ``.bin``), read through
    ``files`` (opened here when None).

    ``n_tokens``: the token count of a current identity, whose sha256 of the ``.idx`` covers
    an index that was checked in full when it was recorded. The header, the sizes and the ends
    of the document index are checked as ever, but the O(sequences) scan of the arrays is
    skipped."""
    if files is None:
        with PrefixFiles(prefix) as opened:
            return read_index(prefix, opened, n_tokens)
    idx = files.idx

    def view(dtype: str, offset: int, count: int) -> np.ndarray:
        return _view(idx, dtype, offset, count)

    code, arrays, n_tokens = parse_index(
        str(idx_path(prefix)),
        str(bin_path(prefix)),
        files.header(),
        view,
        files.keys.bin.size,
        n_tokens,
    )
    size = files.keys.idx.size
    return MegatronIndex(Path(prefix), code, *arrays, n_tokens, size, files.keys, files.taken_ns)


def index_from_bytes(
    prefix: str, data: bytes, bin_size: int, n_tokens: int | None = None
) -> MegatronIndex:
    """``read_index`` for a ``.idx`` held in memory (fetched from object storage): ``prefix``
    names it in messages; ``bin_size`` is the size of its ``.bin``."""
    header = parse_header(f"{prefix}.idx", len(data), data[: HEADER.size])

    def view(dtype: str, offset: int, count: int) -> np.ndarray:
        return np.frombuffer(data, dtype=dtype, count=count, offset=offset)

    code, arrays, n_tokens = parse_index(
        f"{prefix}.idx", f"{prefix}.bin", header, view, bin_size, n_tokens
    )
    return MegatronIndex(Path(prefix), code, *arrays, n_tokens, len(data))


def parse_index(
    where_idx: str,
    where_bin: str,
    header: tuple[int, int, int, int],
    view: Callable[[str, int, int], np.ndarray],
    bin_size: int,
    n_tokens: int | None,
) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray], int]:
    """The dtype code, the three arrays (sequence lengths, pointers, document index: from
    ``view(dtype, offset, count)``) and the token count of a ``.idx`` with ``header``, checked
    against its ``.bin`` of ``bin_size`` bytes (``read_index`` says what is checked)."""
    path, data = where_idx, where_bin
    size, code, n_seq, n_entries = header
    expected = HEADER.size + 12 * n_seq + 8 * n_entries
    counts = f"{n_seq} sequences and {n_entries - 1} documents"
    if size < expected:
        raise StoreError(
            f"{path}: truncated, or its header's counts are wrong: {size} bytes, {counts} "
            f"need {expected}"
        )
    if size == expected + n_seq and n_seq:
        raise StoreError(
            f"{path}: {size} bytes, {n_seq} more than {counts} need: per-sequence modes of a "
            "multimodal dataset? tokentape reads token datasets only"
        )
    if size != expected:
        raise StoreError(
            f"{path}: {size} bytes, {counts} need {expected}; the counts in the header do not "
            "match the file"
        )
    lengths = view("<i4", HEADER.size, n_seq)
    pointers = view("<i8", HEADER.size + 4 * n_seq, n_seq)
    docs = view("<i8", HEADER.size + 12 * n_seq, n_entries)
    itemsize = DTYPES[code].itemsize
    _check_document_ends(path, docs, n_seq)
    if n_tokens is None:
        _check_documents(path, docs, n_seq)
        n_tokens = _check_sequences(path, lengths, pointers, itemsize)
    if bin_size != n_tokens * itemsize:
        what = "truncated" if bin_size < n_tokens * itemsize else "longer than its index says"
        raise StoreError(
            f"{data}: {what}: {bin_size} bytes, the index says {n_tokens} tokens of "
            f"{DTYPE_NAMES[code]} = {n_tokens * itemsize} bytes"
        )
    return code, (lengths, pointers, docs), n_tokens


def _check_document_ends(path: str, docs: np.ndarray, n_seq: int) -> None:
    if int(docs[0]) != 0:
        raise StoreError(f"{path}: the document index starts at {int(docs[0])}, expected 0")
    if int(docs[-1]) != n_seq:
        raise StoreError(
            f"{path}: the document index ends at sequence {int(docs[-1])}, but the header "
            f"counts {n_seq} sequences"
        )


def _check_documents(path: str, docs: np.ndarray, n_seq: int) -> None:
    """Every entry in ``[0, n_seq]`` (so no difference overflows), never decreasing."""
    for lo in range(0, len(docs) - 1, CHUNK):
        chunk = np.asarray(docs[lo : lo + CHUNK + 1])
        outside = (chunk < 0) | (chunk > n_seq)
        if outside.any():
            i = lo + _first(outside)
            raise StoreError(
                f"{path}: document {i} starts at sequence {int(docs[i])}, outside the "
                f"{n_seq} sequences"
            )
        down = np.diff(chunk) < 0
        if down.any():
            i = lo + _first(down)
            raise StoreError(
                f"{path}: the document index decreases at document {i} "
                f"(sequence {int(docs[i + 1])} after {int(docs[i])})"
            )


def _check_sequences(path: str, lengths: np.ndarray, pointers: np.ndarray, itemsize: int) -> int:
    """Lengths non-negative and every sequence right after the previous one; the token total."""
    offset = 0  # bytes
    for lo in range(0, len(lengths), CHUNK):
        n = np.asarray(lengths[lo : lo + CHUNK], dtype=np.int64)
        if n.size and int(n.min()) < 0:
            i = lo + _first(n < 0)
            raise StoreError(f"{path}: sequence {i} has a negative length {int(lengths[i])}")
        ends = np.cumsum(n) * itemsize + offset
        expected = ends - n * itemsize
        found = np.asarray(pointers[lo : lo + CHUNK])
        moved = found != expected
        if moved.any():
            i = _first(moved)
            raise StoreError(
                f"{path}: sequence {lo + i} starts at byte {int(found[i])} of .bin, expected "
                f"{int(expected[i])}: tokentape needs the sequences back to back, in order"
            )
        if n.size:
            offset = int(ends[-1])
    return offset // itemsize


# --- writing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MegatronIdentity:
    """What identifies a Megatron prefix's bytes: sizes, sha256 of both files, the sha256 of
    each ``block_bytes`` block of ``.bin`` (spot checks), the smallest and largest token id
    (``None`` without tokens) and the content hash over them.

    ``end_id`` is derived data, not covered by the content hash: the id every document ends
    with when they all end with one id and none is empty, else ``None`` (also without
    documents, and in sidecars written before it was recorded). Opening checks the EOD with it
    instead of reading every document's last token."""

    dtype: str
    n_tokens: int
    n_docs: int
    n_sequences: int
    bin_bytes: int
    idx_bytes: int
    bin_sha256: str
    idx_sha256: str
    block_bytes: int
    block_sha256: tuple[str, ...]
    min_id: int | None
    max_id: int | None
    content_hash: str
    end_id: int | None = None


class IdRange:
    """Smallest and largest id of a stream of token arrays."""

    def __init__(self) -> None:
        self.min: int | None = None
        self.max: int | None = None

    def update(self, tokens: np.ndarray) -> None:
        if tokens.size:
            lo, hi = int(tokens.min()), int(tokens.max())
            self.min = lo if self.min is None else min(self.min, lo)
            self.max = hi if self.max is None else max(self.max, hi)


class EndIds:
    """The id every document ends with, over documents seen in order: ``value`` is that id, or
    ``None`` when they end with different ids, one is empty, or there is none."""

    def __init__(self) -> None:
        self._id: int | None = None
        self.mixed = False  # two documents end with different ids, or one is empty

    def update(self, last: np.ndarray) -> None:
        """Add documents by their last tokens."""
        if self.mixed or not last.size:
            return
        lo, hi = int(last.min()), int(last.max())
        if lo != hi or (self._id is not None and lo != self._id):
            self.mixed = True
        self._id = lo

    def empty(self) -> None:
        """Add an empty document (it ends with no id)."""
        self.mixed = True

    @property
    def value(self) -> int | None:
        return None if self.mixed else self._id


def index_bytes(code: int, lengths: np.ndarray, doc_entries: np.ndarray) -> list[bytes]:
    """A ``.idx`` file for sequences of ``lengths`` (back to back) grouped by ``doc_entries``,
    in pieces of at most ``CHUNK`` entries each."""
    itemsize = DTYPES[code].itemsize
    pieces = [HEADER.pack(MAGIC, VERSION, code, len(lengths), len(doc_entries))]
    for lo in range(0, len(lengths), CHUNK):
        pieces.append(np.ascontiguousarray(lengths[lo : lo + CHUNK], dtype="<i4").tobytes())
    offset = 0
    for lo in range(0, len(lengths), CHUNK):
        n = np.asarray(lengths[lo : lo + CHUNK], dtype=np.int64) * itemsize
        ends = np.cumsum(n) + offset
        pieces.append((ends - n).astype("<i8").tobytes())
        offset = int(ends[-1])
    for lo in range(0, len(doc_entries), CHUNK):
        pieces.append(np.ascontiguousarray(doc_entries[lo : lo + CHUNK], dtype="<i8").tobytes())
    return pieces


def _integers(name: str, value: object) -> np.ndarray:
    """``value`` as a 1-D integer array (an empty one of any dtype too: ``np.array([])`` is
    float64), else an ``ArgumentError`` naming ``name``."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # a ragged list, say
        array = None
    if array is None or array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ArgumentError(f"{name} must be a 1-D array of integers, got {shown(value)}")
    return array


class MegatronWriter:
    """Streams documents into ``PREFIX.bin`` and writes ``PREFIX.idx`` at the end.

    One Megatron sequence per document, the document index ``0..n``. Both files are written
    under temporary names beside the prefix and appear under their names only when complete
    (``.bin`` renamed first, ``.idx`` last, by ``finish()``), hashed while written; ``abort()``
    removes them.

    Args:
        prefix: The output prefix: ``PREFIX`` of ``PREFIX.bin`` and ``PREFIX.idx``; its
            directory must exist. Existing files there are replaced by ``finish()``.
        dtype: The Megatron integer dtype of the tokens (``uint16``, ``int32``, ...).
        block_bytes: The size of the ``.bin`` blocks whose sha256 the identity records (so
            verification can name a damaged block); 64 MiB by default.

    Raises:
        ArgumentError: ``prefix`` is not a non-empty path, ``dtype`` is not a Megatron integer
            dtype, or ``block_bytes`` is not a positive integer.
        OSError: The temporary ``.bin`` cannot be created.
    """

    def __init__(
        self, prefix: str | os.PathLike[str], dtype: str, block_bytes: int = DEFAULT_BLOCK_BYTES
    ) -> None:
        check_path("prefix", prefix)
        self.prefix = Path(prefix)
        self.code = dtype_code(dtype)
        self.dtype = DTYPES[self.code]
        self.block_bytes = check_int("block_bytes", block_bytes, 1)
        self._bin_tmp = temp_name(bin_path(prefix))
        self._idx_tmp = temp_name(idx_path(prefix))
        self._file = open(self._bin_tmp, "wb")  # noqa: SIM115 - closed in finish()/abort()
        self._hasher = BlockHasher(block_bytes)
        self._ids = IdRange()
        self._ends = EndIds()
        self._lengths: list[np.ndarray] = []
        self.n_tokens = 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents: ``tokens`` is their concatenation, ``lengths`` their sizes.

        Args:
            tokens: The documents' tokens, back to back (a 1-D integer array).
            lengths: Each document's token count, in order; they add up to ``len(tokens)``.

        Raises:
            ArgumentError: ``tokens`` or ``lengths`` is not a 1-D integer array, ``lengths`` do
                not add up to ``len(tokens)``, a document has 2**31 tokens or more, or an id
                does not fit the writer's dtype.
            OSError: The ``.bin`` cannot be written.
        """
        tokens = _integers("tokens", tokens)
        lengths = _integers("lengths", lengths).astype(np.int64, copy=False)
        if int(lengths.sum()) != len(tokens):
            raise ArgumentError(
                f"lengths add up to {int(lengths.sum())} tokens, tokens has {len(tokens)}"
            )
        if lengths.size and int(lengths.max()) >= 2**31:
            raise ArgumentError(
                f"a document of {int(lengths.max())} tokens does not fit Megatron's int32 "
                "sequence lengths"
            )
        self._ids.update(tokens)
        info = np.iinfo(self.dtype)
        lo, hi = self._ids.min, self._ids.max  # both None (no id yet) or both set
        if lo is not None and hi is not None and not info.min <= lo <= hi <= info.max:
            raise ArgumentError(
                f"token ids {self._ids.min}..{self._ids.max} do not fit Megatron's "
                f"{self.dtype.name}; choose a wider dtype"
            )
        data = np.ascontiguousarray(tokens, dtype=self.dtype)
        if lengths.size and int(lengths.min()) == 0:
            self._ends.empty()
        self._ends.update(data[np.cumsum(lengths)[lengths > 0] - 1])
        view = data.data.cast("B")
        self._file.write(view)
        self._hasher.update(view)
        self._lengths.append(lengths.astype(np.int32))
        self.n_tokens += len(tokens)

    def finish(self) -> MegatronIdentity:
        """Write the ``.idx``, rename both files into place; the identity of what was written."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        entries = np.arange(len(lengths) + 1, dtype=np.int64)
        idx_hash, idx_size = hashlib.sha256(), 0
        with open(self._idx_tmp, "wb") as f:
            for piece in index_bytes(self.code, lengths, entries):
                f.write(piece)
                idx_hash.update(piece)
                idx_size += len(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(self._bin_tmp, bin_path(self.prefix))
        os.replace(self._idx_tmp, idx_path(self.prefix))
        fsync_dir(bin_path(self.prefix).parent)
        bin_sha, blocks = self._hasher.finish()
        n_docs = len(lengths)
        return MegatronIdentity(
            dtype=self.dtype.name,
            n_tokens=self.n_tokens,
            n_docs=n_docs,
            n_sequences=n_docs,
            bin_bytes=self.n_tokens * self.dtype.itemsize,
            idx_bytes=idx_size,
            bin_sha256=bin_sha,
            idx_sha256=idx_hash.hexdigest(),
            block_bytes=self.block_bytes,
            block_sha256=blocks,
            min_id=self._ids.min,
            max_id=self._ids.max,
            content_hash=content_hash(
                self.dtype.name, self.n_tokens, n_docs, bin_sha, idx_hash.hexdigest()
            ),
            end_id=self._ends.value,
        )

    def abort(self) -> None:
        """Close and remove the temporary files: nothing appears under the prefix."""
        self._file.close()
        self._bin_tmp.unlink(missing_ok=True)
        self._idx_tmp.unlink(missing_ok=True)


__all__ = [
    "CHUNK",
    "DTYPES",
    "DTYPE_NAMES",
    "INTEGER_CODES",
    "EndIds",
    "FileKey",
    "FileKeys",
    "IdRange",
    "MegatronIdentity",
    "MegatronIndex",
    "MegatronWriter",
    "PrefixFiles",
    "bin_path",
    "content_hash",
    "dtype_code",
    "idx_path",
    "index_bytes",
    "index_from_bytes",
    "is_prefix",
    "parse_header",
    "read_index",
]
