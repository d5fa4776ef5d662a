"""The on-disk format of a token store: names, dtype rule and the manifest schema.

A source is a directory holding ``manifest.json`` and shards ``part-NNNNN.bin`` (raw
little-endian token ids) with ``part-NNNNN.idx.npy`` (int64 ascending document starts, local to
the shard). ``docs/format.md`` describes every field. Every file a manifest names lies in the
store's own directory under its exact name (``store.confine``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tokenize
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tokentape._src.store.confine import (
    check_inside,
    check_shard_names,
    no_store_directory,
    open_inside,
)
from tokentape._src.store.confine import (
    shard_name as shard_name,  # re-exported: the writer names shards
)
from tokentape._src.store.provenance import (
    IDS_SUFFIX,
    INPUTS_NAME,
    KEYS_SUFFIX,
    REC_SUFFIX,
    Provenance,
    ShardProvenance,
    parse_provenance,
)
from tokentape.errors import ArgumentError, StoreError

FORMAT_NAME = "tokentape.store"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
BIN_SUFFIX = ".bin"
"""A shard's tokens: ``part-NNNNN.bin``."""
IDX_SUFFIX = ".idx.npy"
"""A shard's document starts: ``part-NNNNN.idx.npy``."""
DEFAULT_BLOCK_BYTES = 64 * 2**20
UINT16_MAX_VOCAB = 2**16

_DTYPES: dict[str, np.dtype] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def choose_dtype(vocab_size: int) -> str:
    """``uint16`` when every id fits (vocabulary of at most 65,536 ids), else ``uint32``."""
    if vocab_size <= 0:
        raise ArgumentError(f"vocabulary size must be positive, got {vocab_size}")
    if vocab_size <= UINT16_MAX_VOCAB:
        return "uint16"
    if vocab_size <= 2**32:
        return "uint32"
    raise ArgumentError(f"vocabulary of {vocab_size} ids does not fit uint32")


def numpy_dtype(name: str) -> np.dtype:
    """The little-endian numpy dtype of a manifest dtype name."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise StoreError(f"unknown dtype '{name}'; expected uint16 or uint32") from None


@dataclass(frozen=True)
class ShardInfo:
    """One shard: its token and document counts and the hashes of its two files."""

    name: str
    n_tokens: int
    n_docs: int
    bin_sha256: str
    idx_sha256: str
    idx_bytes: int
    block_bytes: int
    block_sha256: tuple[str, ...]

    @property
    def bin_file(self) -> str:
        return self.name + BIN_SUFFIX

    @property
    def idx_file(self) -> str:
        return self.name + IDX_SUFFIX

    @property
    def rec_file(self) -> str:
        """Where each document came from (``store.provenance``), if the store records it."""
        return self.name + REC_SUFFIX

    @property
    def ids_file(self) -> str:
        """The documents' ids (``store.provenance``), if the store records them."""
        return self.name + IDS_SUFFIX

    @property
    def keys_file(self) -> str:
        """The documents' ids, findable (``store.provenance``), if the store records them."""
        return self.name + KEYS_SUFFIX


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to trust a source, written last and atomically."""

    dtype: str
    vocab_size: int
    eod_id: int
    tokenizer: dict[str, Any]
    shards: tuple[ShardInfo, ...]
    n_tokens: int
    n_docs: int
    content_hash: str
    filters: dict[str, Any]
    inputs: dict[str, Any]
    job: str
    created_by: str
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance | None = None
    """Where each document came from (``store.provenance``); None: not recorded (a store made
    before it was)."""

    @property
    def bos_id(self) -> int | None:
        """The id every document starts with (``tokenize --bos``); None: none."""
        value = self.tokenizer.get("bos_id")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def to_dict(self) -> dict[str, Any]:
        """The manifest's fields as JSON-friendly values, in ``manifest.json``'s order."""
        data = asdict(self)
        data["shards"] = [asdict(s) | {"block_sha256": list(s.block_sha256)} for s in self.shards]
        del data["provenance"]
        if self.provenance is not None:
            data["provenance"] = self.provenance.to_json()
        order = ["format", "format_version", "dtype", "vocab_size", "eod_id", "n_tokens", "n_docs"]
        return {k: data.pop(k) for k in order} | data

    def to_json(self) -> str:
        """The text of ``manifest.json``."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"


def block_record_problem(shard: ShardInfo, size: int) -> str | None:
    """What stops the shard's block hashes from covering its ``size`` bytes of tokens (a block
    size that is not positive, or a count of hashes that does not fit), or None."""
    n_blocks = -(-size // shard.block_bytes) if shard.block_bytes > 0 else 0
    if (shard.block_bytes <= 0 and size) or len(shard.block_sha256) != n_blocks:
        return (
            f"shard {shard.name} records {len(shard.block_sha256)} block hashes of "
            f"{shard.block_bytes} bytes for a {size}-byte file; expected {n_blocks}"
        )
    return None


def content_hash(shards: list[ShardInfo] | tuple[ShardInfo, ...], dtype: str) -> str:
    """One hash over the dtype and every shard's token hash, in order: the source's identity."""
    h = hashlib.sha256(f"{FORMAT_NAME}/{FORMAT_VERSION}/{dtype}".encode())
    for s in shards:
        h.update(f"\n{s.n_tokens}:{s.n_docs}:{s.bin_sha256}:{s.idx_sha256}".encode())
    return "sha256:" + h.hexdigest()


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise StoreError(f"{where}: missing field '{key}'")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise StoreError(f"{where}: field '{key}' is {type(value).__name__}, expected {expected}")
    return value


def _count(data: dict[str, Any], key: str, where: str) -> int:
    value: int = _field(data, key, int, where)
    if value < 0:
        raise StoreError(f"{where}: field '{key}' is {value}, expected a count (>= 0)")
    return value


def _parse_shard(data: Any, where: str) -> ShardInfo:
    if not isinstance(data, dict):
        raise StoreError(f"{where}: expected an object")
    blocks = _field(data, "block_sha256", list, where)
    if not all(isinstance(b, str) for b in blocks):
        raise StoreError(f"{where}: field 'block_sha256' must be a list of strings")
    return ShardInfo(
        name=_field(data, "name", str, where),
        n_tokens=_count(data, "n_tokens", where),
        n_docs=_count(data, "n_docs", where),
        bin_sha256=_field(data, "bin_sha256", str, where),
        idx_sha256=_field(data, "idx_sha256", str, where),
        idx_bytes=_count(data, "idx_bytes", where),
        block_bytes=_count(data, "block_bytes", where),
        block_sha256=tuple(blocks),
    )


def parse_manifest(text: str, where: str, *, strict: bool = True) -> Manifest:
    """Validate and parse manifest JSON; ``where`` names the file in error messages.

    ``strict`` also refuses what ``tokentape verify`` reports as problems instead: shards not
    named ``part-NNNNN`` after their place, an ``eod_id`` not below ``vocab_size``, and a
    ``content_hash`` that does not follow from the shard records (an edited manifest)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:  # nested too deep, an integer of 5,000 digits
        raise StoreError(f"{where}: not valid JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        raise StoreError(f"{where}: not a tokentape store manifest (field 'format')")
    version = _field(data, "format_version", int, where)
    if version != FORMAT_VERSION:
        raise StoreError(
            f"{where}: format_version {version} is not supported; expected {FORMAT_VERSION}"
        )
    dtype = _field(data, "dtype", str, where)
    numpy_dtype(dtype)
    shards_raw = _field(data, "shards", list, where)
    shards = tuple(_parse_shard(s, f"{where}: shards[{i}]") for i, s in enumerate(shards_raw))
    if strict:
        check_shard_names([s.name for s in shards], where)
    extra = data.get("extra", {})
    if not isinstance(extra, dict):
        raise StoreError(f"{where}: field 'extra' is {type(extra).__name__}, expected dict")
    manifest = Manifest(
        dtype=dtype,
        vocab_size=_count(data, "vocab_size", where),
        eod_id=_count(data, "eod_id", where),
        tokenizer=_field(data, "tokenizer", dict, where),
        shards=shards,
        n_tokens=_count(data, "n_tokens", where),
        n_docs=_count(data, "n_docs", where),
        content_hash=_field(data, "content_hash", str, where),
        filters=_field(data, "filters", dict, where),
        inputs=_field(data, "inputs", dict, where),
        job=_field(data, "job", str, where),
        created_by=_field(data, "created_by", str, where),
        extra=extra,
        provenance=(
            None
            if data.get("provenance") is None
            else parse_provenance(data["provenance"], len(shards), where, strict)
        ),
    )
    _check_bos(manifest.tokenizer, where)
    if manifest.n_tokens != sum(s.n_tokens for s in shards):
        raise StoreError(f"{where}: n_tokens does not equal the sum over shards")
    if manifest.n_docs != sum(s.n_docs for s in shards):
        raise StoreError(f"{where}: n_docs does not equal the sum over shards")
    if strict:
        _check_consistent(manifest, where)
    return manifest


def _check_bos(tokenizer: dict[str, Any], where: str) -> None:
    """A recorded beginning of document is an id and its token (both, or neither)."""
    if "bos_id" not in tokenizer and "bos_token" not in tokenizer:
        return
    bos_id, token = tokenizer.get("bos_id"), tokenizer.get("bos_token")
    if not isinstance(bos_id, int) or isinstance(bos_id, bool) or bos_id < 0:
        found = bos_id if isinstance(bos_id, int) and -(2**63) < bos_id < 2**63 else "not one"
        raise StoreError(
            f"{where}: field tokenizer.bos_id is {found}, expected a token id (an integer >= 0)"
        )
    if not isinstance(token, str):
        raise StoreError(
            f"{where}: field tokenizer.bos_token is {type(token).__name__}, expected str"
        )


def _check_consistent(manifest: Manifest, where: str) -> None:
    if manifest.eod_id >= manifest.vocab_size:
        raise StoreError(
            f"{where}: eod_id {manifest.eod_id} is not below vocab_size {manifest.vocab_size}"
        )
    bos = manifest.bos_id
    if bos is not None and bos >= manifest.vocab_size:
        raise StoreError(f"{where}: bos_id {bos} is not below vocab_size {manifest.vocab_size}")
    recomputed = content_hash(manifest.shards, manifest.dtype)
    if manifest.content_hash != recomputed:
        raise StoreError(
            f"{where}: content_hash {manifest.content_hash} does not follow from the shard "
            f"records ({recomputed}); the manifest was edited (run `tokentape verify`)"
        )


NPY_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    SyntaxError,
    OverflowError,
    RecursionError,
    MemoryError,
    tokenize.TokenError,
    EOFError,
)
"""What numpy's ``.npy`` header parser raises on a malformed header."""


def sha256_stream(f: BinaryIO, chunk_bytes: int = 8 * 2**20) -> str:
    """Hex sha256 of what is left to read in the binary file ``f``, a chunk at a time."""
    digest = hashlib.sha256()
    while chunk := f.read(chunk_bytes):
        digest.update(chunk)
    return digest.hexdigest()


def read_npy_header(f: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype from the header of the open ``.npy`` file ``f``, which is
    left at the array's first byte; a malformed header raises one of ``NPY_ERRORS``. Reads no
    array data and never unpickles."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    raise ValueError(f"unsupported .npy version {version[0]}.{version[1]}")


def read_manifest_text(
    directory: str | os.PathLike[str], dir_fd: int | None = None
) -> tuple[str, Path]:
    """The text of ``DIR/manifest.json`` (looked up in ``dir_fd`` when given) and its path; a
    directory without one is not a complete store, and a manifest that is a symbolic link is
    refused."""
    path = Path(directory) / MANIFEST_NAME
    if dir_fd is None and not Path(directory).is_dir():
        raise StoreError(no_store_directory(Path(directory)))
    try:
        os.lstat(path if dir_fd is None else MANIFEST_NAME, dir_fd=dir_fd)
    except FileNotFoundError:
        raise StoreError(
            f"store '{directory}': no {MANIFEST_NAME}; not a complete tokentape store"
        ) from None
    except OSError:
        pass  # open_inside below names what is wrong
    fd = open_inside(Path(directory), MANIFEST_NAME, "the manifest", dir_fd)
    try:
        with open(fd, "rb") as f:
            return f.read().decode("utf-8"), path
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path}: cannot read ({exc})") from None


@dataclass(frozen=True)
class StoreFile:
    """A file a manifest names in its store, and what the manifest records of it."""

    name: str
    what: str
    """What it is, in words (``shard file``, ``document index`` ...)."""
    size: int | None
    """Its size in bytes; None: not recorded (the tokenizer copy)."""
    sha256: str | None
    """Its sha256 (hex); None: not recorded (the tokenizer copy)."""
    shard: str | None = None
    """The shard it belongs to (``part-NNNNN``); None: the store's."""


def provenance_files(shard: ShardInfo, got: ShardProvenance) -> list[StoreFile]:
    """A shard's provenance files (records, ids and, from version 2, id keys) as ``got``
    records them: in the manifest, or from the writer before the manifest is written."""
    name = shard.name
    files = [
        StoreFile(shard.rec_file, "provenance records", got.rec_bytes, got.rec_sha256, name),
        StoreFile(shard.ids_file, "document ids", got.ids_bytes, got.ids_sha256, name),
    ]
    if got.keys_sha256 is not None:
        files.append(StoreFile(shard.keys_file, "id keys", got.keys_bytes, got.keys_sha256, name))
    return files


def manifest_files(manifest: Manifest) -> list[StoreFile]:
    """Every file the manifest names in its store, with its recorded size and hash: each
    shard's two files (five with provenance; four before the id keys), the tokenizer copy
    (when its kind has one) and the inputs table (with provenance)."""
    itemsize = numpy_dtype(manifest.dtype).itemsize
    block = manifest.provenance
    files = []
    for i, shard in enumerate(manifest.shards):
        name = shard.name
        files += [
            StoreFile(
                shard.bin_file, "shard file", shard.n_tokens * itemsize, shard.bin_sha256, name
            ),
            StoreFile(shard.idx_file, "document index", shard.idx_bytes, shard.idx_sha256, name),
        ]
        if block is not None:
            files += provenance_files(shard, block.shards[i])
    copy = manifest.tokenizer.get("file")
    if isinstance(copy, str):
        files.append(StoreFile(copy, "tokenizer copy", None, None))
    if block is not None:
        files.append(
            StoreFile(INPUTS_NAME, "inputs table", block.inputs_bytes, block.inputs_sha256)
        )
    return files


def store_files(manifest: Manifest) -> list[tuple[str, str]]:
    """(name, what it is) of every file the manifest names in its store (``manifest_files``)."""
    return [(f.name, f.what) for f in manifest_files(manifest)]


def read_manifest(directory: str | os.PathLike[str], dir_fd: int | None = None) -> Manifest:
    """Read and validate ``DIR/manifest.json``, and check that every file it names is a regular
    file inside ``DIR`` (or missing: opening the store says so), without reading them; with
    ``dir_fd``, everything is looked up in that open directory."""
    text, path = read_manifest_text(directory, dir_fd)
    manifest = parse_manifest(text, str(path))
    for name, what in store_files(manifest):
        check_inside(Path(directory), name, what, dir_fd)
    return manifest


__all__ = [
    "BIN_SUFFIX",
    "DEFAULT_BLOCK_BYTES",
    "FORMAT_VERSION",
    "IDX_SUFFIX",
    "MANIFEST_NAME",
    "NPY_ERRORS",
    "Manifest",
    "ShardInfo",
    "StoreFile",
    "block_record_problem",
    "choose_dtype",
    "content_hash",
    "manifest_files",
    "numpy_dtype",
    "parse_manifest",
    "provenance_files",
    "read_manifest",
    "read_manifest_text",
    "read_npy_header",
    "sha256_stream",
    "shard_name",
    "store_files",
]
