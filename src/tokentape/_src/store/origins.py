"""Where a store's documents came from, read back from its provenance files.

``Origins`` answers ``Source.provenance(doc)`` with an ``Origin``: the input file (or object URL)
the document was read from, its record there (a jsonl line, a parquet row and row group, a
``.txt`` file) and the user's id. It reads through two functions its source gives it, so that
a store on disk (files mapped when the store was opened) and one in a bucket (files fetched on
first use, checked against the manifest's sha256) are read alike; whatever is read is checked
against the manifest before it is believed (``store.provenance`` describes the files).
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from tokentape._src.store.format import NPY_ERRORS, Manifest, read_npy_header
from tokentape._src.store.index import array_offset, damaged
from tokentape._src.store.provenance import (
    INPUTS_FORMAT,
    INPUTS_NAME,
    KEY_DTYPE,
    RECORD,
    cut,
    id_key_of,
)
from tokentape._src.util.checks import shown
from tokentape.errors import InputError, StoreError

ShardRecords = tuple[np.ndarray, bytes | memoryview]
"""A shard's provenance: its ``RECORD`` rows and its ids' bytes."""
ShardKeys = Callable[[int], np.ndarray]
"""Shard ``i``'s id keys: its ``(2, m)`` ``.idkeys.npy`` array, header and size checked."""


@dataclass(frozen=True)
class Origin:
    """Where one document of a store came from.

    Attributes:
        doc: The document's id in the store.
        input: The input file or object URL it was read from, as the tokenize job named it.
        kind: The input's kind: ``jsonl``, ``jsonl.gz``, ``jsonl.zst``, ``parquet``, ``txt``.
        record: jsonl: the line (from 1; of the decompressed text); parquet: the row (from 0);
            txt: 0 (the whole file is the document).
        row_group: The parquet row group holding the row; None for other kinds.
        id: The user's id of the record (the field ``id_key`` names); None when it has none.
        id_key: The field the id was read from; None when no id was read from this input.
        input_index: The input's place in the job's inputs (``inputs.json``).
    """

    doc: int
    input: str
    kind: str
    record: int
    row_group: int | None
    id: str | None
    id_key: str | None
    input_index: int

    @property
    def where(self) -> str:
        """The record in a few words: ``web/a.jsonl:17``, ``b.parquet row 12 (row group 0)``,
        ``c.txt``."""
        if self.kind == "parquet":
            return f"{self.input} row {self.record} (row group {self.row_group})"
        if self.kind == "txt":
            return self.input
        return f"{self.input}:{self.record}"

    def to_json(self) -> dict[str, Any]:
        return {
            "input": self.input, "kind": self.kind, "record": self.record,
            "row_group": self.row_group, "id": self.id, "id_key": self.id_key,
            "input_index": self.input_index,
        }  # fmt: skip


def records_offset(f: BinaryIO, n_docs: int, path: str) -> int:
    """Where the rows of the ``.rec.npy`` open as ``f`` start, after checking its header: a
    1-D array of ``n_docs`` ``RECORD`` rows; never unpickled."""
    return array_offset(f, RECORD, n_docs, "provenance records", path)


def keys_offset(f: BinaryIO, n_docs: int, size: int, path: str) -> int:
    """Where the keys of the ``.idkeys.npy`` open as ``f`` (``size`` bytes) start, after
    checking its header: a ``(2, m)`` little-endian uint32 array, ``m`` at most ``n_docs``,
    filling the file; never unpickled."""
    try:
        shape, fortran, found = read_npy_header(f)
    except NPY_ERRORS as exc:
        raise damaged(path, f"not a readable .npy array ({exc})") from None
    m = shape[1] if len(shape) == 2 and shape[0] == 2 else -1
    at = f.tell()
    if found != KEY_DTYPE or fortran or not 0 <= m <= n_docs or at + 8 * m != size:
        raise damaged(path, f"expected a (2, m <= {n_docs}) uint32 array of id keys, found "
                            f"shape {shape} dtype {found}")  # fmt: skip
    return at


def record_order_problem(
    rows: np.ndarray, last: np.ndarray | None, n_inputs: int, ids_bytes: int
) -> tuple[str, str] | None:
    """What is wrong with a shard's ``RECORD`` rows (expected, found), if anything: each names
    an input of the table's ``n_inputs``, they ascend by (input, record) after ``last`` (the
    previous shard's last row, if any), and their ids end in order within the shard's
    ``ids_bytes``."""
    bad = np.flatnonzero(rows["input"] >= n_inputs)
    if bad.size:
        i = int(bad[0])
        return f"inputs below {n_inputs}", f"document {i} names input {int(rows[i]['input'])}"
    seq = rows if last is None else np.concatenate([last.reshape(1), rows])
    inputs, records = seq["input"], seq["record"]
    same = inputs[1:] == inputs[:-1]
    bad = np.flatnonzero((inputs[1:] < inputs[:-1]) | (same & (records[1:] <= records[:-1])))
    if bad.size:
        i = int(bad[0]) + (last is None)
        return "records ascending by (input, record)", f"document {i} goes back"
    ends = rows["id_end"]
    bad = np.flatnonzero(ends[1:] < ends[:-1])
    if bad.size or (len(rows) and int(ends[-1]) != ids_bytes):
        i = int(bad[0]) + 1 if bad.size else len(rows) - 1
        return f"ids ending in order at byte {ids_bytes}", f"document {i}'s id ends elsewhere"
    return None


def match_input(inputs: list[str], path: str, where: str) -> int | None:
    """The index among ``inputs`` (an inputs table's paths) of the one ``path`` names: as the
    table writes it, or (a local path) the same file, or the one input whose path ends with
    ``path`` at a ``/``; None when it names none, an ``InputError`` listing them when it
    names several."""
    if path in inputs:
        return inputs.index(path)
    if "://" not in path:
        real = os.path.realpath(path)
        same = [i for i, p in enumerate(inputs) if "://" not in p and os.path.realpath(p) == real]
        if len(same) == 1:
            return same[0]
    tail = "/" + path.lstrip("/")
    ends = [i for i, p in enumerate(inputs) if p.endswith(tail)]
    if len(ends) > 1:
        names = ", ".join(shown(inputs[i]) for i in ends[:5])
        more = f" and {len(ends) - 5} more" if len(ends) > 5 else ""
        raise InputError(f"{where}: input {shown(path)} matches {len(ends)} inputs: "
                         f"{names}{more}; give more of its path")  # fmt: skip
    return ends[0] if ends else None


def no_such_input(inputs: list[str], path: str, where: str) -> InputError:
    """The error of an input ``path`` that names none of ``inputs``."""
    listed = ", ".join(shown(p) for p in inputs[:5]) + (" ..." if len(inputs) > 5 else "")
    return InputError(f"{where}: no input {shown(path)}; its inputs are {listed}")


def parse_inputs(data: bytes, where: str) -> list[dict[str, Any]]:
    """The inputs of ``inputs.json`` (its bytes already checked against the manifest), each
    with a text ``path`` and ``kind``."""
    try:
        table = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise StoreError(f"{where}: not a readable inputs table (JSON)") from None
    if not isinstance(table, dict) or table.get("format") != INPUTS_FORMAT:
        raise StoreError(f"{where}: not a tokentape inputs table")
    rows = table.get("inputs")
    if not isinstance(rows, list):
        raise StoreError(f"{where}: not a tokentape inputs table (no list of inputs)")
    for i, row in enumerate(rows):
        if not (
            isinstance(row, dict)
            and isinstance(row.get("path"), str)
            and isinstance(row.get("kind"), str)
            and isinstance(row.get("id_key"), str | None)
        ):
            raise StoreError(f"{where}: inputs[{i}] lacks a path, kind or id_key")
    return rows


class Origins:
    """Where the documents of one store came from (see the module docstring).

    Args:
        where: The store's directory or URL (what messages name).
        manifest: The store's manifest (with a ``provenance`` block).
        shard: Shard ``i``'s provenance (``ShardRecords``), its sizes already checked.
        inputs: The bytes of ``inputs.json``, checked against the manifest.
        keys: Shard ``i``'s id keys (``ShardKeys``); None for a store without them.
    """

    def __init__(
        self,
        where: str,
        manifest: Manifest,
        shard: Callable[[int], ShardRecords],
        inputs: Callable[[], bytes],
        keys: ShardKeys | None = None,
    ) -> None:
        self.where, self.manifest = where.rstrip("/"), manifest
        counts = [s.n_docs for s in manifest.shards]
        self._first_doc = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._shard, self._inputs_bytes, self._keys = shard, inputs, keys
        self._inputs: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def inputs(self) -> list[dict[str, Any]]:
        """The inputs table: each input and what it gave (``inputs.json``)."""
        with self._lock:
            if self._inputs is None:
                self._inputs = parse_inputs(self._inputs_bytes(), f"{self.where}/{INPUTS_NAME}")
            return self._inputs

    def find_id(self, value: str) -> list[int]:
        """The documents whose id is ``value`` (as the store keeps ids: cut to
        ``MAX_ID_BYTES``), ascending; a binary search of each shard's id keys."""
        if self._keys is None:
            raise StoreError(
                f"{self.where}: its provenance has no id keys (made by an earlier tokentape); "
                "tokenize it again to find documents by id"
            )
        wanted = cut(value).encode("utf-8")
        if not wanted:
            return []
        key = KEY_DTYPE.type(id_key_of(wanted))  # of the keys' dtype: searched, not copied
        found = []
        for i, shard in enumerate(self.manifest.shards):
            keys = self._keys(i)
            lo = int(np.searchsorted(keys[0], key, side="left"))
            hi = int(np.searchsorted(keys[0], key, side="right"))
            if lo == hi:
                continue
            for local in keys[1, lo:hi].tolist():
                if local >= shard.n_docs:
                    raise damaged(f"{self.where}/{shard.keys_file}", f"document {local} is "
                                  f"outside the shard's {shard.n_docs}")  # fmt: skip
                if self._id_bytes(i, local) == wanted:
                    found.append(int(self._first_doc[i]) + local)
        return sorted(found)

    def _id_bytes(self, shard: int, local: int) -> bytes:
        """The id of document ``local`` of shard ``shard``, as stored (checked to lie in its
        ids file)."""
        rows, ids = self._shard(shard)
        start = int(rows[local - 1]["id_end"]) if local else 0
        end = int(rows[local]["id_end"])
        if not start <= end <= len(ids):
            raise StoreError(
                f"{self.where}/{self.manifest.shards[shard].name}: document {local}'s id ends at "
                f"byte {end}, outside [{start}, {len(ids)}]; the store is damaged (run "
                "`tokentape verify`)"
            )
        return bytes(ids[start:end])

    def find_record(self, input_index: int, record: int) -> list[int]:
        """The document read from record ``record`` of input ``input_index`` ([] when none
        was kept): a binary search, the records ascending by (input, record) through the
        store."""
        wanted = (input_index, record)
        n = int(self._first_doc[-1])
        doc = bisect.bisect_left(range(n), wanted, key=self._record_of)
        return [doc] if doc < n and self._record_of(doc) == wanted else []

    def _record_of(self, doc: int) -> tuple[int, int]:
        shard = int(np.searchsorted(self._first_doc, doc, side="right")) - 1
        row = self._shard(shard)[0][doc - int(self._first_doc[shard])]
        return int(row["input"]), int(row["record"])

    def input_index(self, path: str) -> int | None:
        """The input ``path`` names (``match_input``), None when none."""
        return match_input([row["path"] for row in self.inputs()], path, self.where)

    def of(self, doc: int) -> Origin:
        """Where document ``doc`` (in range: the caller checked) came from."""
        shard = int(np.searchsorted(self._first_doc, doc, side="right")) - 1
        local = doc - int(self._first_doc[shard])
        row = self._shard(shard)[0][local]
        name = self.manifest.shards[shard].name
        id_bytes = self._id_bytes(shard, local)
        inputs = self.inputs()
        index = int(row["input"])
        if index >= len(inputs):
            raise StoreError(
                f"{self.where}/{name}: document {local} names input {index}, the inputs table "
                f"has {len(inputs)}; the store is damaged (run `tokentape verify`)"
            )
        entry = inputs[index]
        try:
            text = id_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise StoreError(f"{self.where}/{name}: document {local}'s id is not UTF-8") from None
        group = int(row["group"])
        return Origin(
            doc=doc,
            input=entry["path"],
            kind=entry["kind"],
            record=int(row["record"]),
            row_group=group if group >= 0 else None,
            id=text or None,
            id_key=entry.get("id_key"),
            input_index=index,
        )


__all__ = [
    "Origin",
    "Origins",
    "ShardKeys",
    "ShardRecords",
    "keys_offset",
    "match_input",
    "no_such_input",
    "parse_inputs",
    "record_order_problem",
    "records_offset",
]
