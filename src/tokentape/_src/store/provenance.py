"""Where each document of a store came from: the store's provenance files and their record.

A store made by ``tokentape tokenize`` records, for every document it kept, the input it came
from, its record there and the user's id for it. Per shard ``part-NNNNN``:

- ``part-NNNNN.rec.npy``: one ``RECORD`` per document of the shard, in order: ``input`` (an
  index into ``inputs.json``), ``group`` (the parquet row group; -1 otherwise), ``record``
  (the 1-based line of a jsonl file, of its decompressed text for a compressed one; the
  0-based row of a parquet file; 0 for a ``.txt`` file, which is one record) and ``id_end``
  (where the document's id ends in the ids file; it starts where the previous one ends);
- ``part-NNNNN.ids``: the ids, UTF-8, one after another ("" for a record without one);
- ``part-NNNNN.idkeys.npy``: the shard's ids, findable: a ``(2, m)`` little-endian uint32
  array over the ``m`` documents that have an id; row 0 holds each id's key (``id_key_of``:
  the first 4 bytes of its BLAKE2b digest, little-endian), ascending, and row 1 the document
  (within the shard) it belongs to, ascending among equal keys. A lookup by id searches the
  keys and checks the ids it lands on (keys may collide).

The records ascend by (``input``, ``record``) through the whole store (the job writes its inputs
in order, and each input's records in order), so a lookup by input and record is a binary
search.

``inputs.json`` lists the job's inputs in order (path or object URL, kind, size, the object's
version, the id field read) with what each gave: documents read, kept and dropped.

The manifest's ``provenance`` block names these files by their sizes and sha256, and
``provenance_hash`` covers them all. Provenance is not part of ``content_hash``: the tokens'
identity (and every plan made on it) is the same whether or not it is recorded. A store made
before provenance existed has no block, and reads the same; one made before the id keys existed
(version 1) has no ``.idkeys.npy`` files and cannot be searched by id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokentape.errors import StoreError

PROVENANCE_VERSION = 2
ID_KEYS_SINCE = 2
"""The first provenance version with ``.idkeys.npy`` files."""
INPUTS_NAME = "inputs.json"
INPUTS_FORMAT = "tokentape.inputs"
REC_SUFFIX = ".rec.npy"
IDS_SUFFIX = ".ids"
KEYS_SUFFIX = ".idkeys.npy"
KEY_DTYPE = np.dtype("<u4")
MAX_ID_BYTES = 4096
"""The longest id kept, in UTF-8 bytes (a longer one is cut there, at a character)."""
SHARD_SUFFIXES = (REC_SUFFIX, IDS_SUFFIX, KEYS_SUFFIX)
"""A shard's provenance files: ``part-NNNNN`` and one of these."""
RECORD = np.dtype([("input", "<u4"), ("group", "<i4"), ("record", "<u8"), ("id_end", "<u8")])
"""Where one document came from, as a store records it (see the module docstring)."""
ADDED = np.dtype([("input", "<u4"), ("group", "<i4"), ("record", "<u8"), ("id_len", "<u8")])
"""Where one document came from, as the shard writer is given it: its id's length in bytes
(the writer turns lengths into ends within each shard)."""


@dataclass(frozen=True)
class ShardProvenance:
    """One shard's provenance files: sizes and sha256 (no id keys before version 2)."""

    rec_bytes: int
    rec_sha256: str
    ids_bytes: int
    ids_sha256: str
    keys_bytes: int | None = None
    keys_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "rec_bytes": self.rec_bytes, "rec_sha256": self.rec_sha256,
            "ids_bytes": self.ids_bytes, "ids_sha256": self.ids_sha256,
        }  # fmt: skip
        if self.keys_sha256 is not None:
            data |= {"keys_bytes": self.keys_bytes, "keys_sha256": self.keys_sha256}
        return data


@dataclass(frozen=True)
class Provenance:
    """The manifest's ``provenance`` block."""

    inputs_bytes: int
    inputs_sha256: str
    shards: tuple[ShardProvenance, ...]
    provenance_hash: str
    version: int = PROVENANCE_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "inputs": {"file": INPUTS_NAME, "bytes": self.inputs_bytes,
                       "sha256": self.inputs_sha256},
            "shards": [s.to_json() for s in self.shards],
            "provenance_hash": self.provenance_hash,
        }  # fmt: skip

    @property
    def has_id_keys(self) -> bool:
        """Whether the store can be searched by id (its shards have ``.idkeys.npy`` files)."""
        return self.version >= ID_KEYS_SINCE


def provenance_hash(
    inputs_sha256: str, shards: tuple[ShardProvenance, ...], version: int = PROVENANCE_VERSION
) -> str:
    """One hash over the inputs table and every shard's provenance files."""
    h = hashlib.sha256(f"tokentape.provenance/{version}\n{inputs_sha256}".encode())
    for s in shards:
        h.update(f"\n{s.rec_bytes}:{s.rec_sha256}:{s.ids_bytes}:{s.ids_sha256}".encode())
        if version >= ID_KEYS_SINCE:
            h.update(f":{s.keys_bytes}:{s.keys_sha256}".encode())
    return "sha256:" + h.hexdigest()


def make_provenance(inputs_json: bytes, shards: list[ShardProvenance]) -> Provenance:
    """The block for a store whose ``inputs.json`` holds ``inputs_json``."""
    digest = hashlib.sha256(inputs_json).hexdigest()
    done = tuple(shards)
    return Provenance(len(inputs_json), digest, done, provenance_hash(digest, done))


def cut(text: str) -> str:
    """``text`` as a store keeps an id: valid UTF-8 (a lone surrogate becomes ``?``), cut to at most
    ``MAX_ID_BYTES`` bytes at a character boundary."""
    if text.isascii() and len(text) <= MAX_ID_BYTES:  # the common case: nothing to do
        return text
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_ID_BYTES:
        return data.decode("utf-8")
    return data[:MAX_ID_BYTES].decode("utf-8", "ignore")


def id_key_of(id_bytes: bytes | memoryview) -> int:
    """The key an id is found by: the first 4 bytes of its BLAKE2b digest, little-endian."""
    return int.from_bytes(hashlib.blake2b(id_bytes, digest_size=4).digest(), "little")


def id_keys(ids: bytes, id_end: np.ndarray) -> np.ndarray:
    """A shard's ``.idkeys.npy`` array for its ids (``ids``, the document ids one after
    another, document i's ending at ``id_end[i]``): see the module docstring."""
    if len(id_end) > np.iinfo(KEY_DTYPE).max:
        raise StoreError(f"a shard of {len(id_end)} documents is too many to index its ids")
    ends = id_end.astype(np.int64).tolist()
    starts = [0, *ends[:-1]]
    blake = hashlib.blake2b
    keyed = [i for i, (a, b) in enumerate(zip(starts, ends, strict=True)) if b > a]
    digests = b"".join(blake(ids[starts[i] : ends[i]], digest_size=4).digest() for i in keyed)
    keys = np.frombuffer(digests, dtype=KEY_DTYPE)
    docs = np.asarray(keyed, dtype=KEY_DTYPE)
    order = np.lexsort((docs, keys))
    return np.stack([keys[order], docs[order]]).astype(KEY_DTYPE)


def inputs_json(inputs: list[dict[str, Any]]) -> bytes:
    """The bytes of ``inputs.json`` for the job's inputs table."""
    data = {"format": INPUTS_FORMAT, "version": PROVENANCE_VERSION, "inputs": inputs}
    return (json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True) + "\n").encode()


def _sha(value: Any, where: str, key: str) -> str:
    hex_digits = isinstance(value, str) and all(c in "0123456789abcdef" for c in value)
    if not (hex_digits and len(value) == 64):
        raise StoreError(f"{where}: field '{key}' is not a sha256 (64 hex digits)")
    return str(value)


def _size(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StoreError(f"{where}: field '{key}' is not a size in bytes")
    return value


def parse_provenance(data: Any, n_shards: int, where: str, strict: bool = True) -> Provenance:
    """The manifest's ``provenance`` block, checked: one entry per shard, sizes and hashes of
    the right kinds, and (``strict``) ``provenance_hash`` following from them."""
    where = f"{where}: provenance"
    if not isinstance(data, dict):
        raise StoreError(f"{where}: expected an object")
    version = data.get("version")
    if version not in (1, PROVENANCE_VERSION) or isinstance(version, bool):
        raise StoreError(f"{where}: version {version!r} is not supported")
    inputs = data.get("inputs")
    if not isinstance(inputs, dict) or inputs.get("file") != INPUTS_NAME:
        raise StoreError(f"{where}: field 'inputs' must name {INPUTS_NAME}")
    shards = data.get("shards")
    if not isinstance(shards, list) or len(shards) != n_shards:
        raise StoreError(f"{where}: field 'shards' must have one entry per shard ({n_shards})")
    parsed = []
    for i, s in enumerate(shards):
        at = f"{where}: shards[{i}]"
        if not isinstance(s, dict):
            raise StoreError(f"{at}: expected an object")
        sizes = {k: _size(s.get(f"{k}_bytes"), at, f"{k}_bytes") for k in ("rec", "ids")}
        shas = {k: _sha(s.get(f"{k}_sha256"), at, f"{k}_sha256") for k in ("rec", "ids")}
        keys_bytes, keys_sha = None, None
        if version >= ID_KEYS_SINCE:
            keys_bytes = _size(s.get("keys_bytes"), at, "keys_bytes")
            keys_sha = _sha(s.get("keys_sha256"), at, "keys_sha256")
        rec, ids = (sizes["rec"], shas["rec"]), (sizes["ids"], shas["ids"])
        parsed.append(ShardProvenance(*rec, *ids, keys_bytes, keys_sha))
    digest = _sha(inputs.get("sha256"), where, "inputs.sha256")
    done = tuple(parsed)
    recorded = data.get("provenance_hash")
    if not isinstance(recorded, str):
        raise StoreError(f"{where}: field 'provenance_hash' is missing")
    if strict and recorded != provenance_hash(digest, done, version):
        raise StoreError(
            f"{where}: provenance_hash does not follow from the files it names; the manifest "
            "was edited (run `tokentape verify`)"
        )
    size = _size(inputs.get("bytes"), where, "inputs.bytes")
    return Provenance(size, digest, done, recorded, version)


__all__ = [
    "ADDED",
    "IDS_SUFFIX",
    "ID_KEYS_SINCE",
    "INPUTS_FORMAT",
    "INPUTS_NAME",
    "KEYS_SUFFIX",
    "KEY_DTYPE",
    "MAX_ID_BYTES",
    "PROVENANCE_VERSION",
    "RECORD",
    "REC_SUFFIX",
    "SHARD_SUFFIXES",
    "Provenance",
    "ShardProvenance",
    "cut",
    "id_key_of",
    "id_keys",
    "inputs_json",
    "make_provenance",
    "parse_provenance",
    "provenance_hash",
]
