"""Where each document of a store came from: the store's provenance files and their record.

A store made by ``tokentape tokenize`` records, for every document it kept, the input it came
from, its record there and the user's id for it. Per shard ``part-NNNNN``:

- ``part-NNNNN.rec.npy``: one ``RECORD`` per document of the shard, in order: ``input`` (an
  index into ``inputs.json``), ``group`` (the parquet row group; -1 otherwise), ``record``
  (the 1-based line of a jsonl file, of its decompressed text for a compressed one; the
  0-based row of a parquet file; 0 for a ``.txt`` file, which is one record) and ``id_end``
  (where the document's id ends in the ids file; it starts where the previous one ends);
- ``part-NNNNN.ids``: the ids, UTF-8, one after another ("" for a record without one).

``inputs.json`` lists the job's inputs in order (path or object URL, kind, size, the object's
version, the id field read) with what each gave: documents read, kept and dropped.

The manifest's ``provenance`` block names these files by their sizes and sha256, and
``provenance_hash`` covers them all. Provenance is not part of ``content_hash``: the tokens'
identity (and every plan made on it) is the same whether or not it is recorded. A store made
before provenance existed has no block, and reads the same.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokentape.errors import StoreError

PROVENANCE_VERSION = 1
INPUTS_NAME = "inputs.json"
INPUTS_FORMAT = "tokentape.inputs"
REC_SUFFIX = ".rec.npy"
IDS_SUFFIX = ".ids"
RECORD = np.dtype([("input", "<u4"), ("group", "<i4"), ("record", "<u8"), ("id_end", "<u8")])
"""Where one document came from, as a store records it (see the module docstring)."""
ADDED = np.dtype([("input", "<u4"), ("group", "<i4"), ("record", "<u8"), ("id_len", "<u8")])
"""Where one document came from, as the shard writer is given it: its id's length in bytes
(the writer turns lengths into ends within each shard)."""


@dataclass(frozen=True)
class ShardProvenance:
    """One shard's two provenance files: sizes and sha256."""

    rec_bytes: int
    rec_sha256: str
    ids_bytes: int
    ids_sha256: str


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
            "shards": [
                {"rec_bytes": s.rec_bytes, "rec_sha256": s.rec_sha256,
                 "ids_bytes": s.ids_bytes, "ids_sha256": s.ids_sha256}
                for s in self.shards
            ],
            "provenance_hash": self.provenance_hash,
        }  # fmt: skip


def provenance_hash(inputs_sha256: str, shards: tuple[ShardProvenance, ...]) -> str:
    """One hash over the inputs table and every shard's provenance files."""
    h = hashlib.sha256(f"tokentape.provenance/{PROVENANCE_VERSION}\n{inputs_sha256}".encode())
    for s in shards:
        h.update(f"\n{s.rec_bytes}:{s.rec_sha256}:{s.ids_bytes}:{s.ids_sha256}".encode())
    return "sha256:" + h.hexdigest()


def make_provenance(inputs_json: bytes, shards: list[ShardProvenance]) -> Provenance:
    """The block for a store whose ``inputs.json`` holds ``inputs_json``."""
    digest = hashlib.sha256(inputs_json).hexdigest()
    done = tuple(shards)
    return Provenance(len(inputs_json), digest, done, provenance_hash(digest, done))


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
    if data.get("version") != PROVENANCE_VERSION:
        raise StoreError(f"{where}: version {data.get('version')!r} is not supported")
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
        sizes = [_size(s.get(k), at, k) for k in ("rec_bytes", "ids_bytes")]
        shas = [_sha(s.get(k), at, k) for k in ("rec_sha256", "ids_sha256")]
        parsed.append(ShardProvenance(sizes[0], shas[0], sizes[1], shas[1]))
    digest = _sha(inputs.get("sha256"), where, "inputs.sha256")
    done = tuple(parsed)
    recorded = data.get("provenance_hash")
    if not isinstance(recorded, str):
        raise StoreError(f"{where}: field 'provenance_hash' is missing")
    if strict and recorded != provenance_hash(digest, done):
        raise StoreError(
            f"{where}: provenance_hash does not follow from the files it names; the manifest "
            "was edited (run `tokentape verify`)"
        )
    return Provenance(_size(inputs.get("bytes"), where, "inputs.bytes"), digest, done, recorded)


__all__ = [
    "ADDED",
    "IDS_SUFFIX",
    "INPUTS_FORMAT",
    "INPUTS_NAME",
    "PROVENANCE_VERSION",
    "RECORD",
    "REC_SUFFIX",
    "Provenance",
    "ShardProvenance",
    "inputs_json",
    "make_provenance",
    "parse_provenance",
    "provenance_hash",
]
