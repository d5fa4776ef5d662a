"""Input files of the offline tokenizer: which files, in which order, cut into which units.

Supported files: ``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``, ``.parquet``, ``.txt``.

Which files, in which order (``expand_inputs``):

- Inputs are taken in command-line order; the files of one input keep the order below.
- A directory stands for every file below it (recursively) whose name ends in a supported
  suffix, sorted by its POSIX path relative to the directory (plain string order). Other
  files are ignored; symlinked files are read, symlinked directories are not followed.
- A glob (an input containing ``*``, ``?`` or ``[`` that is not itself an existing path)
  stands for its matches, sorted, as Python's ``glob.glob(recursive=True)`` finds them
  (``**`` spans directories). Matches with an unsupported suffix are ignored; a matching
  directory expands as above.
- A file named explicitly must have a supported suffix.
- A file reached twice (same real path, after resolving symlinks) is read once, where it first
  appears.
- It is an error when an input does not exist, a glob matches no supported file, a directory
  holds no supported file, a file cannot be read, or no file is left at all.
- Object URLs (``s3://bucket/key``...) follow the same rules, a prefix standing for a
  directory (``tokenize.remote_inputs``); they are streamed with ranged GETs, never copied to
  disk first, and a store made from them is byte-identical to one made from the same files on
  local disk (same shards, same content hash; the manifest records the URLs as its input paths,
  so its ``job`` hash differs). An object's size and version tag (ETag) stand for a file's size
  and modification time: an object that changed since planning is refused, as a file is.

Units of work (``plan_units``), a pure function of the files (sizes, and for big files the
positions of line breaks or parquet row groups) and ``unit_bytes``:

- Files are taken in order. Consecutive files share a unit while its total size stays at or
  below ``unit_bytes``; a file that does not fit starts a new unit.
- A plain ``.jsonl`` file larger than ``unit_bytes`` is cut into units of about ``unit_bytes``
  each, every cut just after a line break. A compressed jsonl file (``.gz``, ``.zst``) whose
  decompressed text is larger than ``unit_bytes`` is cut the same way in its decompressed
  bytes (found by decompressing it once while planning). A ``.parquet`` file larger than
  ``unit_bytes`` is cut between row groups (consecutive row groups share a unit while their
  compressed size stays at or below ``unit_bytes``), and a bigger row group into about
  ``size / unit_bytes`` units of equal rows. ``.txt`` files (one document) are never cut.
- A piece of a compressed file or of a row group is reached by decoding what comes before it;
  each process keeps the stream it read last open where it stopped (``streams``), so it
  decodes a file about once however many of its pieces it reads, in order.
- Units are numbered from 0. Reading every unit in order yields exactly the documents of
  reading every file whole, in order.

Documents (``read_records``: each with its record number and the user's id, ``records``;
``read_documents``: the texts alone):

- jsonl (plain, gzip, zstandard): one JSON object per line, the document is the string in
  field ``text_key``. Blank lines are skipped; a UTF-8 byte order mark at the start of a file
  is ignored; lines end at ``\\n`` (a ``\\r`` before it is JSON whitespace).
- ``.txt``: the whole file, UTF-8, is one document (a leading byte order mark is dropped).
- ``.parquet``: the string column ``text_key``, one document per row; nulls are errors.
- Errors name the file and the 1-based line (jsonl) or 0-based row (parquet): invalid JSON,
  not an object, a missing field, a field that is not a string, invalid UTF-8 (or a lone
  surrogate escape), a corrupt compressed or parquet file, a file whose size changed since
  it was planned.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import itertools
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from tokentape._src.objects.client import is_url
from tokentape._src.tokenize import remote_inputs, streams
from tokentape._src.tokenize.records import (
    ID_KEY_AUTO,
    ID_KEY_NONE,
    IdPath,
    Record,
    auto_id_key,
    id_path,
    id_text,
)
from tokentape._src.util.text import is_utf8
from tokentape.errors import InputError

SUPPORTED_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".txt")
COMPRESSED_JSONL = ("jsonl.gz", "jsonl.zst")
"""Kinds cut in their decompressed text, which is reached by decompressing what precedes."""

READ_BLOCK = 1 << 20  # bytes read (or decompressed) per step of the jsonl reader
ZSTD_INPUT_BLOCK = 1 << 12  # compressed bytes per zstandard call, at most
ZSTD_FIRST_STEP = 1 << 8  # compressed bytes of the first call (before the ratio is known)
ZSTD_MIN_STEP = 16  # the fewest compressed bytes per call (a ratio of 65,536: 1 MiB out)
SCAN_BLOCK = 1 << 16  # bytes read per step when looking for a line break to cut at
REMOTE_BLOCK = 8 << 20  # an object's largest read-ahead (bytes per ranged GET, at most)
PARQUET_BUFFER = 1 << 16  # an object's read-ahead for parquet (column chunks are read whole)
PARQUET_BATCH = 1024  # rows per batch when a row group is read in pieces
_GLOB_CHARS = frozenset("*?[")
_BOM = b"\xef\xbb\xbf"
_MAX_FIELDS_SHOWN = 12
# A JSON escape of a UTF-16 surrogate; only lines of a block holding one need the (slower)
# check for a lone surrogate, which valid UTF-8 text cannot carry into a tokenizer.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class InputFile:
    """One input file, as expanded from the command line."""

    path: str  # as the user spelled it / as expanded (used in messages and the manifest)
    kind: str  # "jsonl" | "jsonl.gz" | "jsonl.zst" | "parquet" | "txt"
    size: int  # bytes on disk (or in the object)
    mtime_ns: int  # an object: ``remote_inputs.version_number`` of its version tag
    version: str = ""  # an object's version tag (ETag); "" for a local file
    storage_options: Mapping[str, Any] = field(
        default_factory=dict, compare=False, repr=False
    )  # an object's fsspec options (what it was listed with), to read it while planning
    id_key: str = ""  # the field each record's id is read from (dotted); "": no id

    @property
    def id_path(self) -> IdPath:
        """``id_key`` split at its dots (empty: no id)."""
        return id_path(self.id_key) if self.id_key else ()

    @property
    def remote(self) -> bool:
        """Whether the file is an object (read through ``remote_inputs``), not on disk."""
        return is_url(self.path)


@dataclass(frozen=True)
class UnitPart:
    """A contiguous piece of one file: a byte range (jsonl; of the decompressed text for a
    compressed one), a row range (parquet)."""

    file: InputFile
    start: int  # jsonl: byte offset at a line start; parquet: first row; else 0
    stop: int  # exclusive; jsonl: byte offset after a newline or the end; parquet: row
    total: int = 0  # parquet: rows in the file; compressed jsonl: decompressed bytes; else 0

    @property
    def n_bytes(self) -> int:
        """Input bytes covered: the part's share of the file's size (for progress)."""
        if self.file.kind == "parquet" or self.file.kind in COMPRESSED_JSONL:
            if self.total == 0:
                return self.file.size
            return self.file.size * (self.stop - self.start) // self.total
        return self.stop - self.start

    def describe(self) -> dict[str, object]:
        """JSON-ready identity of the part (path, kind, size, range)."""
        return {
            "path": self.file.path,
            "kind": self.file.kind,
            "size": self.file.size,
            "start": self.start,
            "stop": self.stop,
        }


@dataclass(frozen=True)
class Unit:
    """A deterministic piece of tokenization work."""

    index: int
    parts: tuple[UnitPart, ...]

    def key(self) -> str:
        """Stable JSON text of the parts (paths, kinds, sizes, ranges); excludes the index."""
        parts = [p.describe() for p in self.parts]
        return json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def n_bytes(self) -> int:
        """Input bytes covered (for progress)."""
        return sum(p.n_bytes for p in self.parts)


# ---------------------------------------------------------------------------------------------
# expand_inputs


def file_kind(path: str) -> str | None:
    """The kind of a supported file name, or None."""
    for suffix in sorted(SUPPORTED_SUFFIXES, key=len, reverse=True):
        if path.endswith(suffix):
            return suffix[1:]
    return None


def _supported_list() -> str:
    return ", ".join(SUPPORTED_SUFFIXES)


def _walk_error(spec: str) -> Callable[[OSError], None]:
    def raise_error(err: OSError) -> None:
        raise InputError(f"input '{spec}': cannot list '{err.filename}' ({err.strerror})")

    return raise_error


def _files_in_dir(spec: str, directory: str) -> list[str]:
    """Supported files below ``directory``, sorted by POSIX relative path."""
    found: list[tuple[str, str]] = []
    for root, _dirs, names in os.walk(directory, onerror=_walk_error(spec)):
        for name in names:
            full = os.path.join(root, name)
            if file_kind(name) is None or not os.path.isfile(full):
                continue
            rel = os.path.relpath(full, directory).replace(os.sep, "/")
            found.append((rel, full))
    found.sort()
    return [full for _, full in found]


def _expand_glob(spec: str) -> list[str]:
    matches = sorted(glob.glob(spec, recursive=True))
    if not matches:
        raise InputError(f"input '{spec}': glob matched no files")
    paths: list[str] = []
    for match in matches:
        if os.path.isdir(match):
            paths.extend(_files_in_dir(spec, match))
        elif file_kind(match) is not None and os.path.isfile(match):
            paths.append(match)
    if not paths:
        raise InputError(
            f"input '{spec}': glob matched {len(matches)} path(s) but no supported file; "
            f"expected one of {_supported_list()}"
        )
    return paths


def _expand_spec(spec: str) -> list[str]:
    if _GLOB_CHARS.intersection(spec) and not os.path.exists(spec):
        return _expand_glob(spec)
    if os.path.isdir(spec):
        paths = _files_in_dir(spec, spec)
        if not paths:
            raise InputError(
                f"input '{spec}': directory holds no supported file; "
                f"expected one of {_supported_list()}"
            )
        return paths
    if not os.path.lexists(spec):
        raise InputError(f"input '{spec}': no such file or directory")
    if not os.path.exists(spec):
        raise InputError(f"input '{spec}': broken symbolic link")
    if file_kind(spec) is None:
        raise InputError(
            f"input '{spec}': unsupported file type; expected one of {_supported_list()}"
        )
    if not os.path.isfile(spec):
        raise InputError(f"input '{spec}': not a regular file")
    return [spec]


def _input_file(path: str) -> InputFile:
    kind = file_kind(path)
    assert kind is not None
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
    except PermissionError:
        raise InputError(f"input '{path}': permission denied; cannot read the file") from None
    except OSError as err:
        raise InputError(f"input '{path}': cannot open ({err.strerror})") from None
    return InputFile(path=path, kind=kind, size=st.st_size, mtime_ns=st.st_mtime_ns)


def _object_file(path: str, size: int, version: str, options: Mapping[str, Any]) -> InputFile:
    kind = file_kind(path)
    assert kind is not None
    mtime = remote_inputs.version_number(version)
    return InputFile(path, kind, size, mtime, version=version, storage_options=options)


def expand_inputs(
    specs: Sequence[str], storage_options: Mapping[str, Any] | None = None
) -> list[InputFile]:
    """The input files named by ``specs`` (files, directories, globs), in the documented order;
    ``storage_options`` are the fsspec options of object URLs among them."""
    seen: set[str] = set()
    files: list[InputFile] = []
    options = dict(storage_options or {})
    for spec in specs:
        spec = os.fspath(spec)
        if is_url(spec):
            for path, found in remote_inputs.expand_url(
                spec, options, lambda name: file_kind(name) is not None, _supported_list()
            ):
                if found.url not in seen:
                    seen.add(found.url)
                    files.append(_object_file(path, found.size, found.version, options))
            continue
        for path in _expand_spec(spec):
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            files.append(_input_file(path))
    if not files:
        raise InputError("no input files given; pass files, directories or globs")
    return files


def with_id_keys(files: Sequence[InputFile], id_key: str, text_key: str) -> list[InputFile]:
    """``files``, each with the field its records' ids are read from: ``id_key`` itself,
    none (``none``), or (``auto``) the first of ``records.AUTO_ID_FIELDS`` that the file's
    first record has (a ``.txt`` file has none)."""
    if id_key == ID_KEY_NONE:
        return list(files)
    if id_key != ID_KEY_AUTO:
        id_path(id_key)
        return [f if f.kind == "txt" else replace(f, id_key=id_key) for f in files]
    return [replace(f, id_key=_first_record_id_key(f, text_key) or "") for f in files]


def _first_record_id_key(file: InputFile, text_key: str) -> str | None:
    """The id field ``auto`` finds in the file's first record (its columns, in parquet)."""
    if file.kind == "txt":
        return None
    if file.kind == "parquet":
        with _open_parquet(file) as pf:
            return auto_id_key(pf.schema_arrow.names)
    line = _first_line(file)
    try:
        return auto_id_key(json.loads(line.removeprefix(_BOM))) if line else None
    except (ValueError, RecursionError):
        return None  # reading the file says what is wrong with the line


def _first_line(file: InputFile) -> bytes:
    """The first line of a jsonl file that is not blank (b"" when none), read a block at a
    time up to it (the text of a compressed one)."""
    blocks = _decompressed(file) if file.kind in COMPRESSED_JSONL else _blocks_from(file)
    pending = b""
    try:
        for block in blocks:
            pending += block
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    return line
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:  # a generator: its file is closed now, not when collected
            close()
    return pending if pending.strip() else b""


def _blocks_from(file: InputFile) -> Iterator[bytes]:
    """A plain file's bytes in ``READ_BLOCK`` steps from its start (an object: ranged GETs of
    a block each)."""
    with _open_input(file, 0, READ_BLOCK) as f:
        while block := f.read(READ_BLOCK):
            yield block


# ---------------------------------------------------------------------------------------------
# plan_units


def _line_cuts(file: InputFile, unit_bytes: int) -> list[int]:
    """Byte offsets that cut a plain jsonl file into pieces of about ``unit_bytes``.

    Each cut is the first line start at or after the previous cut plus ``unit_bytes``; the
    list starts with 0 and ends with the file size. Only the bytes near each cut are read.
    """
    cuts = [0]
    with _open_input(file, reading=SCAN_BLOCK) as f:
        while True:
            target = cuts[-1] + unit_bytes
            if target >= file.size:
                break
            cut = _next_line_start(f, target, file.size)
            if cut >= file.size:
                break
            cuts.append(cut)
    cuts.append(file.size)
    return cuts


def _next_line_start(f: BinaryIO, target: int, size: int) -> int:
    """The smallest line start >= ``target`` (``size`` when none)."""
    pos = target - 1  # a newline at target-1 makes target itself a line start
    f.seek(pos)
    while pos < size:
        block = f.read(SCAN_BLOCK)
        if not block:
            break
        nl = block.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(block)
    return size


@contextlib.contextmanager
def _open_input(
    file: InputFile, buffering: int = -1, reading: int | None = None
) -> Iterator[BinaryIO]:
    """The file (``buffering`` as Python's, 0 for none), or the object streamed with ranged
    GETs that read ahead ``reading`` bytes (what the caller is about to read; default: the
    whole object), up to ``REMOTE_BLOCK``."""
    if file.remote:
        ahead = max(1, min(REMOTE_BLOCK, file.size if reading is None else reading))
        f = remote_inputs.open_object(file.path, file.size, file.storage_options, ahead)
    else:
        try:
            f = open(file.path, "rb", buffering=buffering)  # noqa: SIM115 - closed below
        except OSError as err:
            raise InputError(f"{file.path}: cannot open ({err.strerror})") from None
    with f:
        yield f


def _parquet_metadata(file: InputFile) -> pq.FileMetaData:
    with _open_parquet(file) as pf:
        return pf.metadata


def _row_group_bytes(meta: pq.FileMetaData, i: int) -> int:
    rg = meta.row_group(i)
    return sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))


def _row_cuts(meta: pq.FileMetaData, unit_bytes: int) -> list[int]:
    """Row offsets grouping consecutive row groups up to ``unit_bytes`` (compressed), and
    cutting a bigger row group into about ``size / unit_bytes`` pieces of equal rows."""
    cuts = [0]
    row = 0  # the first row of row group i
    total = 0  # compressed bytes since the last cut
    for i in range(meta.num_row_groups):
        size, rows = _row_group_bytes(meta, i), meta.row_group(i).num_rows
        if rows == 0:  # no row to cut at (its bytes count for nothing)
            continue
        if size > unit_bytes:  # a unit (or several) of its own
            if row > cuts[-1]:
                cuts.append(row)
            pieces = max(1, min(rows, -(-size // unit_bytes)))
            cuts.extend(row + rows * k // pieces for k in range(1, pieces))
            cuts.append(row + rows)
            total = 0
        else:
            if row > cuts[-1] and total + size > unit_bytes:
                cuts.append(row)
                total = 0
            total += size
        row += rows
    if cuts[-1] != row or len(cuts) == 1:
        cuts.append(row)
    return cuts


def _file_parts(file: InputFile, unit_bytes: int) -> list[UnitPart]:
    """The file as one part, or (big jsonl, compressed or not, or parquet) as several, each a
    unit alone."""
    if file.kind == "parquet":
        meta = _parquet_metadata(file)
        rows = meta.num_rows
        cuts = _row_cuts(meta, unit_bytes) if file.size > unit_bytes else [0, rows]
        return [UnitPart(file, a, b, rows) for a, b in itertools.pairwise(cuts)]
    if file.kind == "jsonl" and file.size > unit_bytes:
        cuts = _line_cuts(file, unit_bytes)
        return [UnitPart(file, a, b) for a, b in itertools.pairwise(cuts)]
    if file.kind in COMPRESSED_JSONL:
        cuts = streams.line_cuts(_decompressed(file), unit_bytes)
        if len(cuts) > 2:
            return [UnitPart(file, a, b, cuts[-1]) for a, b in itertools.pairwise(cuts)]
    return [UnitPart(file, 0, file.size)]


def plan_units(files: Sequence[InputFile], unit_bytes: int) -> list[Unit]:
    """Cut ``files`` into numbered units of about ``unit_bytes`` input bytes each."""
    if unit_bytes < 1:
        raise InputError(f"unit size {unit_bytes}: expected a positive number of bytes")
    groups: list[list[UnitPart]] = []
    current: list[UnitPart] = []
    total = 0
    for file in files:
        parts = _file_parts(file, unit_bytes)
        if len(parts) > 1:
            if current:
                groups.append(current)
            groups.extend([p] for p in parts)
            current, total = [], 0
            continue
        if current and total + file.size > unit_bytes:
            groups.append(current)
            current, total = [], 0
        current.append(parts[0])
        total += file.size
    if current:
        groups.append(current)
    return [Unit(index=i, parts=tuple(g)) for i, g in enumerate(groups)]


# ---------------------------------------------------------------------------------------------
# read_documents


SKIP_HINT = " (--on-bad-record skip counts and skips such records)"
"""What a bad record's error adds: the way past it."""
FIRST_BAD = 10
"""Locations of bad records kept (per unit, and per job: the first in input order)."""


@dataclass
class BadRecords:
    """The records of a part skipped as bad (``--on-bad-record skip``): how many for each
    reason, and where the first ``FIRST_BAD`` were (``file:line: what``)."""

    counts: dict[str, int] = field(default_factory=dict)
    first: list[str] = field(default_factory=list)

    def add(self, reason: str, where: Callable[[], str]) -> None:
        """Count one; ``where()`` (its location, which may cost a scan) only for the first."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.first) < FIRST_BAD:
            self.first.append(where())


@dataclass
class ReadPosition:
    """How far a reader of a part has got: ``done`` of ``extent`` (bytes of its text for jsonl,
    rows for parquet, 1 for a whole ``.txt``; ``extent`` 0: unknown until the end); ``bad``:
    where bad records are counted and skipped (None: the first one is an error)."""

    done: int = 0
    extent: int = 0
    lines: int = 0
    """jsonl: the lines of the part read so far (blank ones too)."""
    bad: BadRecords | None = None

    def share(self, n_bytes: int) -> int:
        """The part's ``n_bytes`` in proportion to the position (all of it once done)."""
        if self.extent <= 0:
            return 0
        return n_bytes * min(self.done, self.extent) // self.extent


def read_documents(
    part: UnitPart,
    text_key: str,
    storage_options: Mapping[str, Any] | None = None,
    position: ReadPosition | None = None,
) -> Iterator[str]:
    """The texts of the documents of ``part`` (``read_records``)."""
    return (record.text for record in read_records(part, text_key, storage_options, position))


def read_records(
    part: UnitPart,
    text_key: str,
    storage_options: Mapping[str, Any] | None = None,
    position: ReadPosition | None = None,
) -> Iterator[Record]:
    """The documents of ``part``, in file order, each with its record number and id (from
    the field ``part.file.id_key``); ``storage_options`` (the job's, for an object URL) replace
    those the file was listed with; ``position`` follows the reading (progress inside a
    unit)."""
    if storage_options is not None and part.file.remote:
        part = replace(part, file=replace(part.file, storage_options=dict(storage_options)))
    _check_unchanged(part.file)
    position = position if position is not None else ReadPosition()
    whole_compressed = part.file.kind in COMPRESSED_JSONL and part.total == 0
    position.extent = 0 if whole_compressed else max(1, part.stop - part.start)
    if part.file.kind == "txt":
        position.extent = 1
    docs = _read_kind(part, text_key, position)
    return _then_unchanged(docs, part.file) if _several_reads(part) else docs


def _read_kind(part: UnitPart, text_key: str, position: ReadPosition) -> Iterator[Record]:
    kind = part.file.kind
    if kind == "txt":
        return _counted_txt(part.file, position)
    if kind == "parquet":
        return _read_parquet(part, text_key, position)
    if kind in ("jsonl", "jsonl.gz", "jsonl.zst"):
        return _read_jsonl(part, text_key, position)
    raise InputError(f"{part.file.path}: unknown input kind '{kind}'")


def _counted_txt(file: InputFile, position: ReadPosition) -> Iterator[Record]:
    for text in _read_txt(file):
        position.done = 1
        yield Record(text, 0, -1, "")


def _several_reads(part: UnitPart) -> bool:
    """Whether reading ``part`` takes more than one GET of its object (each GET may meet
    another version of it): a parquet part, or more bytes than one read-ahead (a ``.txt`` is
    read whole in one)."""
    if not part.file.remote or part.file.kind == "txt":
        return False
    if part.file.kind == "parquet":
        return True
    size = part.stop - part.start if part.file.kind == "jsonl" else part.file.size
    return size > REMOTE_BLOCK


def _then_unchanged(docs: Iterator[Record], file: InputFile) -> Iterator[Record]:
    """``docs``, then the object checked once more: one replaced while its ranges were read
    (each a separate GET) may have given bytes of two versions, and is refused."""
    yield from docs
    _check_unchanged(file)


def _check_unchanged(file: InputFile) -> None:
    if file.remote:
        remote_inputs.check_unchanged(file.path, file.size, file.version, file.storage_options)
        return
    try:
        st = os.stat(file.path)
    except OSError as err:
        raise InputError(f"{file.path}: cannot open ({err.strerror})") from None
    size = st.st_size
    if size == file.size and st.st_mtime_ns != file.mtime_ns:
        raise InputError(
            f"{file.path}: changed since the inputs were planned (the same size, another "
            "modification time); re-run to plan again"
        )
    if size != file.size:
        raise InputError(
            f"{file.path}: size changed since the inputs were planned "
            f"({file.size} -> {size} bytes); re-run to plan again"
        )


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def _json_type(value: object) -> str:
    names = {bool: "bool", int: "int", float: "float", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


# --- txt


def _read_txt(file: InputFile) -> Iterator[str]:
    if file.remote:
        data = remote_inputs.read_object(file.path, file.size, file.storage_options)
    else:
        try:
            with open(file.path, "rb") as f:
                data = f.read()
        except OSError as err:
            raise InputError(f"{file.path}: cannot read ({err.strerror})") from None
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{file.path}: not valid UTF-8 (byte offset {err.start}); expected UTF-8 text"
        ) from None
    yield text


# --- parquet


def _is_string_type(t: pa.DataType) -> bool:
    is_view = getattr(pa.types, "is_string_view", None)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or bool(is_view and is_view(t))


@contextlib.contextmanager
def _open_parquet(file: InputFile) -> Iterator[pq.ParquetFile]:
    """The parquet file (an object: over a buffered ranged-GET reader, closed after)."""
    with contextlib.ExitStack() as stack:
        source: Any = file.path
        if file.remote:
            source = stack.enter_context(_open_input(file, reading=PARQUET_BUFFER))
        try:
            pf = pq.ParquetFile(source)
        except (OSError, pa.ArrowException) as err:
            raise InputError(
                f"{file.path}: not a readable parquet file ({_one_line(err)})"
            ) from None
        with pf:
            yield pf


def _read_parquet(part: UnitPart, text_key: str, position: ReadPosition) -> Iterator[Record]:
    with _open_parquet(part.file) as pf:
        yield from _parquet_records(pf, part, text_key, position)


def _parquet_records(
    pf: pq.ParquetFile, part: UnitPart, text_key: str, position: ReadPosition
) -> Iterator[Record]:
    path = part.file.path
    schema = pf.schema_arrow
    if text_key not in schema.names:
        raise InputError(
            f"{path}: no column '{text_key}' (columns: {', '.join(schema.names)}); "
            "choose the column with --text-key"
        )
    col_type = schema.field(text_key).type
    if not _is_string_type(col_type):
        raise InputError(f"{path}: column '{text_key}' is {col_type}, expected a string")
    columns = [text_key]
    id_at = part.file.id_path
    if id_at and id_at[0] in schema.names:  # a file without the id column: no ids
        columns.append(id_at[0])
    meta = pf.metadata
    first = 0  # the first row of row group i
    for i in range(meta.num_row_groups):
        rows = meta.row_group(i).num_rows
        a, b = max(part.start, first), min(part.stop, first + rows)
        if a < b:
            batches: Iterable[pa.RecordBatch]
            if (a, b) == (first, first + rows):  # the whole row group
                batches = _whole_row_group(pf, part.file, i, columns)
            else:  # a piece of it, read on from where this process stopped
                batches = _row_group_piece(pf, part.file, i, a - first, b - first, columns)
            row = a
            for batch in batches:
                array = batch.column(0)
                if array.null_count and position.bad is None:
                    first_null = row + array.is_null().index(True).as_py()
                    raise InputError(_null_row(path, first_null, text_key) + SKIP_HINT)
                texts = array.to_pylist()
                ids = (
                    [id_text(v, id_at[1:]) for v in batch.column(1).to_pylist()]
                    if len(columns) > 1
                    else [""] * len(texts)
                )
                for k, (text, id_) in enumerate(zip(texts, ids, strict=True)):
                    position.done += 1  # counted as handed out: progress inside a row group
                    if text is None:  # a null text (only when bad records are skipped)
                        assert position.bad is not None
                        where = partial(_null_row, path, row + k, text_key)
                        position.bad.add(f"'{text_key}' is null", where)
                        continue
                    yield Record(text, row + k, i, id_)
                row += len(texts)
        first += rows


def _null_row(path: str, row: int, key: str) -> str:
    return f"{path}: row {row}: field '{key}' is null"


def _unreadable(path: str, i: int, err: BaseException) -> InputError:
    return InputError(f"{path}: row group {i} is not readable ({_one_line(err)})")


def _whole_row_group(
    pf: pq.ParquetFile, file: InputFile, i: int, columns: list[str]
) -> list[pa.RecordBatch]:
    try:
        batches: list[pa.RecordBatch] = pf.read_row_group(i, columns=columns).to_batches()
        return batches
    except (OSError, pa.ArrowException) as err:
        raise _unreadable(file.path, i, err) from None


def _row_group_piece(
    pf: pq.ParquetFile, file: InputFile, i: int, start: int, stop: int, columns: list[str]
) -> Iterator[pa.RecordBatch]:
    """Rows [start, stop) of row group ``i``, its batches read forward (``streams``)."""

    def batches() -> Iterator[pa.RecordBatch]:
        with _open_parquet(file) as own:  # the stream outlives this part's reader
            try:
                yield from own.iter_batches(batch_size=PARQUET_BATCH, row_groups=[i],
                                            columns=columns)  # fmt: skip
            except (OSError, pa.ArrowException) as err:
                raise _unreadable(file.path, i, err) from None

    def short(pos: int) -> InputError:
        return InputError(f"{file.path}: row group {i} ended at row {pos}, expected {stop}")

    key_ = (_stream_key(file), "row group", i, tuple(columns))
    return streams.read_range(key_, start, stop, batches, lambda a, lo, hi: a[lo:hi], short)


# --- jsonl


def _plain_blocks(part: UnitPart) -> Iterator[bytes]:
    path = part.file.path
    with _open_input(part.file, 0, part.stop - part.start) as f:
        f.seek(part.start)
        left = part.stop - part.start
        while left > 0:
            block = f.read(min(READ_BLOCK, left))
            if not block:
                raise InputError(
                    f"{path}: ended at byte {part.stop - left}, expected {part.stop} bytes "
                    "(file changed since planning?)"
                )
            left -= len(block)
            yield block


def _gzip_blocks(file: InputFile) -> Iterator[bytes]:
    path = file.path
    try:
        with _open_input(file) as raw, gzip.open(raw, "rb") as f:
            while block := f.read(READ_BLOCK):
                yield block
    except (OSError, EOFError, zlib.error) as err:
        raise InputError(f"{path}: corrupt or truncated gzip file ({_one_line(err)})") from None


def _zstd_blocks(file: InputFile) -> Iterator[bytes]:
    """Decompressed bytes of every frame; a truncated last frame is an error.

    ``decompressobj`` is used frame by frame (rather than ``stream_reader``) because it tells
    when a frame is complete: ``stream_reader`` silently ends early on a truncated file. Its
    output has no bound, so the compressed bytes fed per call follow the ratio seen: about a
    block (``READ_BLOCK``) of text per call however repetitive the text.
    """
    path = file.path
    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    in_frame = False
    pending: list[bytes] = []
    n_pending = 0
    step = min(ZSTD_FIRST_STEP, ZSTD_INPUT_BLOCK)  # compressed bytes per call (output ~ a block)
    try:
        with _open_input(file) as f:
            while data := f.read(step):
                before = n_pending
                while data:
                    in_frame = True
                    out = dobj.decompress(data)
                    if out:
                        pending.append(out)
                        n_pending += len(out)
                    if not dobj.eof:
                        break
                    data = dobj.unused_data
                    dobj = dctx.decompressobj()
                    in_frame = False
                ratio = max(1, (n_pending - before) // step)  # of this step's bytes
                step = max(ZSTD_MIN_STEP, min(ZSTD_INPUT_BLOCK, READ_BLOCK // ratio))
                if n_pending >= READ_BLOCK:
                    yield b"".join(pending)
                    pending, n_pending = [], 0
    except zstandard.ZstdError as err:
        raise InputError(f"{path}: corrupt zstandard file ({_one_line(err)})") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    if in_frame:
        raise InputError(f"{path}: truncated zstandard file (last frame incomplete)")
    if pending:
        yield b"".join(pending)


def _decompressed(file: InputFile) -> Iterator[bytes]:
    """The whole decompressed text of a compressed jsonl file, in blocks."""
    return _gzip_blocks(file) if file.kind == "jsonl.gz" else _zstd_blocks(file)


def _stream_key(file: InputFile) -> tuple[object, ...]:
    """What a stream kept open stands for: the file as planned and, for a local file, the one
    on disk now (device, inode and change time: a rewrite changes the last, whatever its size
    and modification time), so that a stream of another version is never read on."""
    key: tuple[object, ...] = (file.path, file.size, file.mtime_ns, file.version)
    if not file.remote:
        try:
            st = os.stat(file.path)
        except OSError as err:
            raise InputError(f"{file.path}: cannot open ({err.strerror})") from None
        key += (st.st_dev, st.st_ino, st.st_ctime_ns)
    return key


def _blocks(part: UnitPart) -> Iterator[bytes]:
    kind = part.file.kind
    if kind in COMPRESSED_JSONL:
        if part.total == 0:  # the whole file, read once
            return _decompressed(part.file)

        def short(pos: int) -> InputError:
            return InputError(
                f"{part.file.path}: decompressed text ended at byte {pos}, expected "
                f"{part.total} (file changed since planning?)"
            )

        return streams.read_range(
            _stream_key(part.file), part.start, part.stop, lambda: _decompressed(part.file),
            lambda b, lo, hi: b[lo:hi], short,
        )  # fmt: skip
    return _plain_blocks(part)


def _line_chunks(blocks: Iterable[bytes]) -> Iterator[bytes | memoryview]:
    """Re-cut byte blocks into runs of whole lines; the last run may lack a final newline."""
    pending: list[bytes] = []
    for block in blocks:
        nl = block.rfind(b"\n")
        if nl < 0:
            pending.append(block)
            continue
        view = memoryview(block)
        head = view[: nl + 1]
        yield _joined(pending, head) if pending else head  # ``pending`` emptied first
        pending = [block[nl + 1 :]] if nl + 1 < len(block) else []
    if pending:
        yield _joined(pending, b"")


def _joined(pending: list[bytes], head: bytes | memoryview) -> bytes:
    """``pending`` and ``head`` as one run, ``pending`` emptied: while a run of one huge line
    is read, its blocks are not kept beside it."""
    out = b"".join([*pending, head])
    pending.clear()
    return out


@dataclass(frozen=True)
class _JsonlContext:
    """What the error path needs to name a line: the part and its text key."""

    part: UnitPart
    text_key: str

    def line_number(self, line_in_part: int) -> int:
        """1-based line number in the whole file (counts newlines before the part: slow)."""
        return _newlines_before(self.part) + line_in_part

    def fail(self, line_in_part: int, what: str) -> InputError:
        return InputError(
            f"{self.part.file.path}:{self.line_number(line_in_part)}: {what}{SKIP_HINT}"
        )

    def bad(self, position: ReadPosition, line_in_part: int, problem: tuple[str, str]) -> None:
        """Refuse the record (``problem``: its reason and what is wrong), or count and skip
        it when the job skips bad records."""
        reason, what = problem
        if position.bad is None:
            raise self.fail(line_in_part, what) from None
        path = self.part.file.path
        position.bad.add(reason, lambda: f"{path}:{self.line_number(line_in_part)}: {what}")


def _newlines_before(part: UnitPart) -> int:
    if part.start == 0:
        return 0
    if part.file.kind in COMPRESSED_JSONL:  # in the decompressed text
        count, left = 0, part.start
        for block in _decompressed(part.file):
            count += block[:left].count(b"\n")
            left -= len(block)
            if left <= 0:
                break
        return count
    count = 0
    left = part.start
    with _open_input(part.file, 0, part.start) as f:
        while left > 0:
            block = f.read(min(READ_BLOCK, left))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
    return count


def _diagnose(raw: bytes, text_key: str) -> tuple[str, str] | None:
    """(reason, what is wrong) for a line the fast path rejected, or None when it is blank."""
    if not raw.strip():
        return None
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid UTF-8", "not valid UTF-8"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        return "invalid JSON", f"invalid JSON ({err.msg} at column {err.colno})"
    except (ValueError, RecursionError) as err:
        return "invalid JSON", f"invalid JSON ({_one_line(err)})"
    if not isinstance(obj, dict):
        return "not an object", f"expected a JSON object, got {_json_type(obj)}"
    if text_key not in obj:
        names = list(obj)
        shown = ", ".join(names[:_MAX_FIELDS_SHOWN])
        if len(names) > _MAX_FIELDS_SHOWN:
            shown += f", ... ({len(names)} fields)"
        return (
            f"no field '{text_key}'",
            f"no field '{text_key}' (fields: {shown}); choose the field with --text-key",
        )
    return _field_problem(obj[text_key], text_key)


def _field_problem(value: object, key: str) -> tuple[str, str]:
    if isinstance(value, str):
        what = f"field '{key}' has a lone surrogate escape, expected valid Unicode"
        return "lone surrogate", what
    kind = _json_type(value)
    return f"'{key}' is {kind}", f"field '{key}' is {kind}, expected a string"


def _read_jsonl(part: UnitPart, text_key: str, position: ReadPosition) -> Iterator[Record]:
    """Fast path: split byte blocks into lines, decode and parse each line, take the field.

    Anything unusual (blank line, bad UTF-8 or JSON, missing or non-string field) raises on
    the fast path and is sorted out by ``_diagnose``, so a clean line pays for no checks.
    """
    ctx = _JsonlContext(part, text_key)
    loads = json.loads
    id_at = part.file.id_path
    done = 0  # lines of the part already handled
    first = part.start == 0
    for chunk in _line_chunks(_blocks(part)):
        if first:
            first = False
            if chunk[:3] == _BOM:
                chunk = chunk[3:]
        check_surrogates = _SURROGATE_ESCAPE.search(chunk) is not None
        lines = bytes(chunk).split(b"\n")
        chunk = b""  # the lines are copies: a run of one huge line is not kept twice
        if lines[-1] == b"":
            lines.pop()
        for k in range(len(lines)):
            i = done + 1 + k
            line = lines[k]
            position.done += len(line) + 1
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                problem = _diagnose(line, text_key)
                if problem is not None:
                    ctx.bad(position, i, problem)
                continue
            lines[k] = b""  # decoded: a huge line's bytes are not kept beside its text
            del line
            try:
                obj = loads(text)
                value = obj[text_key]
            except (ValueError, KeyError, TypeError, IndexError, RecursionError):
                problem = _diagnose(text.encode("utf-8", "surrogateescape"), text_key)
                if problem is not None:
                    ctx.bad(position, i, problem)
                continue
            del text  # parsed: only the document's text is kept while it is tokenized
            if type(value) is not str or (check_surrogates and not is_utf8(value)):
                ctx.bad(position, i, _field_problem(value, text_key))
                continue
            yield Record(value, i, -1, id_text(obj, id_at) if id_at else "")
            del obj
        done += len(lines)
        position.lines = done


__all__ = [
    "READ_BLOCK",
    "SCAN_BLOCK",
    "SUPPORTED_SUFFIXES",
    "ZSTD_INPUT_BLOCK",
    "InputFile",
    "ReadPosition",
    "Unit",
    "UnitPart",
    "expand_inputs",
    "file_kind",
    "plan_units",
    "read_documents",
    "read_records",
    "with_id_keys",
]
