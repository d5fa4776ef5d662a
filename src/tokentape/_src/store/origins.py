"""Where a store's documents came from, read back from its provenance files.

``Origins`` answers ``Source.provenance(doc)`` with an ``Origin``: the input file (or object URL)
the document was read from, its record there (a jsonl line, a parquet row and row group, a
``.txt`` file) and the user's id. It reads through two functions its source gives it, so that
a store on disk (files mapped when the store was opened) and one in a bucket (files fetched on
first use, checked against the manifest's sha256) are read alike; whatever is read is checked
against the manifest before it is believed (``store.provenance`` describes the files).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from tokentape._src.store.format import Manifest
from tokentape._src.store.index import array_offset
from tokentape._src.store.provenance import INPUTS_FORMAT, INPUTS_NAME, RECORD
from tokentape.errors import StoreError

ShardRecords = tuple[np.ndarray, bytes | memoryview]
"""A shard's provenance: its ``RECORD`` rows and its ids' bytes."""


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
    """

    def __init__(
        self,
        where: str,
        manifest: Manifest,
        shard: Callable[[int], ShardRecords],
        inputs: Callable[[], bytes],
    ) -> None:
        self.where, self.manifest = where.rstrip("/"), manifest
        counts = [s.n_docs for s in manifest.shards]
        self._first_doc = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._shard, self._inputs_bytes = shard, inputs
        self._inputs: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def inputs(self) -> list[dict[str, Any]]:
        """The inputs table: each input and what it gave (``inputs.json``)."""
        with self._lock:
            if self._inputs is None:
                self._inputs = parse_inputs(self._inputs_bytes(), f"{self.where}/{INPUTS_NAME}")
            return self._inputs

    def of(self, doc: int) -> Origin:
        """Where document ``doc`` (in range: the caller checked) came from."""
        shard = int(np.searchsorted(self._first_doc, doc, side="right")) - 1
        local = doc - int(self._first_doc[shard])
        rows, ids = self._shard(shard)
        row = rows[local]
        name = self.manifest.shards[shard].name
        start = int(rows[local - 1]["id_end"]) if local else 0
        end = int(row["id_end"])
        if not start <= end <= len(ids):
            raise StoreError(
                f"{self.where}/{name}: document {local}'s id ends at byte {end}, outside "
                f"[{start}, {len(ids)}]; the store is damaged (run `tokentape verify`)"
            )
        inputs = self.inputs()
        index = int(row["input"])
        if index >= len(inputs):
            raise StoreError(
                f"{self.where}/{name}: document {local} names input {index}, the inputs table "
                f"has {len(inputs)}; the store is damaged (run `tokentape verify`)"
            )
        entry = inputs[index]
        try:
            text = bytes(ids[start:end]).decode("utf-8")
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


__all__ = ["Origin", "Origins", "ShardRecords", "parse_inputs", "records_offset"]
