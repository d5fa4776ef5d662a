"""Tokenize one unit of input into unit files in the work directory.

A unit's output is a pure function of its input bytes and the job settings, so it does not
matter which process makes it, or how often: ``unit-NNNNNN.json`` (written last, atomically) marks
it finished, and a rerun skips it. Beside the tokens (``.bin``), a unit records each document
it kept and the user's ids for them in one file (``.docs.npy``: for each document its length and
where it came from: the part of the unit, the record in it, the row group; then the ids, one
after another).
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, TypeVar

import numpy as np

from tokentape._src.store.atomic import atomic_writer, write_atomic
from tokentape._src.store.format import numpy_dtype
from tokentape._src.store.index import array_offset
from tokentape._src.store.tokenizers import Tokenizer
from tokentape._src.store.writer import npy_bytes
from tokentape._src.tokenize.filters import FilterSet
from tokentape._src.tokenize.inputs import (
    FIRST_BAD,
    BadRecords,
    ReadPosition,
    Unit,
    read_records,
)
from tokentape._src.tokenize.pieces import encode_documents
from tokentape._src.tokenize.records import Record
from tokentape._src.util.progress import Counters
from tokentape.errors import InputError, StoreError

BATCH_DOCS = 256
EMPTY = "empty"
UNIT_DOC = np.dtype(
    [("length", "<i8"), ("part", "<u4"), ("group", "<i4"), ("record", "<u8"), ("id_len", "<u8")]
)
"""A kept document, as a unit records it: its length in tokens (its EOD and any BOS included)
and where it came from: the part of the unit (its index in ``Unit.parts``), the row group
(parquet; else -1), the record in the part (a jsonl line within the part, from 1; a parquet row
in the file; 0 for a ``.txt``) and its id's length in bytes."""


@dataclass(frozen=True)
class WorkerSettings:
    """What every unit of one job shares."""

    text_key: str
    dtype: str
    id_limit: int  # every id must be below this: min(vocab size, 2**bits of dtype)
    work_dir: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    """fsspec options for object URLs among the inputs (``TokenizeConfig.storage_options``)."""
    skip_bad: bool = False
    """Count and skip bad records (``--on-bad-record skip``) rather than stop at the first."""
    bos_id: int | None = None
    """The id put before every document (``--bos``); None: none."""

    @property
    def framing(self) -> int:
        """The ids a kept document gets besides its text's: the EOD, and the BOS if any."""
        return 1 if self.bos_id is None else 2


@dataclass(frozen=True)
class UnitResult:
    """Counts of one finished unit, as stored in its ``.json`` marker."""

    index: int
    docs_in: int
    n_docs: int
    n_tokens: int
    text_bytes: int
    dropped_docs: dict[str, int]
    dropped_tokens: dict[str, int]
    part_lines: list[int] = field(default_factory=list)
    """Per part of the unit: the lines read (jsonl, blank ones too; else 0)."""
    part_docs_in: list[int] = field(default_factory=list)
    """Per part of the unit: the documents read (kept or dropped)."""
    bad_records: dict[str, dict[str, int]] = field(default_factory=dict)
    """Records skipped as bad, by input file and reason (``--on-bad-record skip``)."""
    bad_first: list[str] = field(default_factory=list)
    """Where the unit's first bad records were (``file:line: what``), in input order."""

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


def unit_paths(work_dir: str | Path, index: int) -> tuple[Path, Path, Path]:
    """(tokens .bin, kept documents .docs.npy, finished marker .json) of unit ``index``."""
    base = Path(work_dir) / f"unit-{index:06d}"
    return base.with_suffix(".bin"), base.with_suffix(".docs.npy"), base.with_suffix(".json")


def load_result(marker: Path) -> UnitResult | None:
    """The result recorded by a finished unit, or None when it has not finished (no marker,
    or one that is not a well-formed record: the unit is then made again)."""
    try:
        data = json.loads(marker.read_bytes())
        result = UnitResult(**data)
    except (OSError, ValueError, TypeError):  # ValueError: JSON, UTF-8
        return None
    return result if _well_formed(result) else None


def _well_formed(r: UnitResult) -> bool:
    def count(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    def counts(d: object) -> bool:
        return isinstance(d, dict) and all(isinstance(k, str) and count(v) for k, v in d.items())

    numbers = (r.index, r.docs_in, r.n_docs, r.n_tokens, r.text_bytes)
    per_part = (r.part_lines, r.part_docs_in)
    return (
        all(map(count, numbers))
        and counts(r.dropped_docs)
        and counts(r.dropped_tokens)
        and all(isinstance(v, list) and all(map(count, v)) for v in per_part)
        and len(r.part_lines) == len(r.part_docs_in)
        and sum(r.part_docs_in) == r.docs_in
        and isinstance(r.bad_records, dict)
        and all(isinstance(k, str) and counts(v) for k, v in r.bad_records.items())
        and isinstance(r.bad_first, list)
        and all(isinstance(v, str) for v in r.bad_first)
    )


_T = TypeVar("_T")


def _batches(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    """``items`` in lists of ``size`` (the last one shorter)."""
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def _documents(
    unit: Unit, settings: WorkerSettings, positions: list[ReadPosition]
) -> Iterator[tuple[int, Record]]:
    """The unit's documents, each with the index of its part; ``positions`` gets each part's
    reading position, in order."""
    for k, part in enumerate(unit.parts):
        position = ReadPosition(bad=BadRecords() if settings.skip_bad else None)
        positions.append(position)
        for record in read_records(part, settings.text_key, settings.storage_options, position):
            yield k, record


def framed(flat: np.ndarray, counts: np.ndarray, eod: int, bos: int | None = None) -> np.ndarray:
    """The documents of ``flat`` (sizes ``counts``), each preceded by the ``bos`` id (unless
    None) and followed by the ``eod`` id."""
    extra = 1 if bos is None else 2
    ends = np.cumsum(counts + extra)
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.uint32)
    is_text = np.ones(len(out), dtype=bool)
    is_text[ends - 1] = False
    out[ends - 1] = eod
    if bos is not None:
        is_text[ends - counts - 2] = False
        out[ends - counts - 2] = bos
    out[is_text] = flat
    return out


def _overflow(
    unit: Unit,
    batch: list[tuple[int, Record]],
    keep: np.ndarray,
    counts: np.ndarray,
    tokens: np.ndarray,
    settings: WorkerSettings,
    tokenizer: Tokenizer,
) -> InputError:
    """The error for the first id at or above the limit, naming the file it came from."""
    first = int(np.argmax(tokens >= settings.id_limit))
    kept_parts = [unit.parts[part] for (part, _), k in zip(batch, keep, strict=True) if k]
    doc = int(np.searchsorted(np.cumsum(counts[keep] + settings.framing), first, side="right"))
    return InputError(
        f"{kept_parts[doc].file.path}: token id {int(tokens[first])} does not fit: ids must be "
        f"below {settings.id_limit} ({settings.dtype}, vocabulary {tokenizer.vocab_size})"
    )


WRITE_BLOCK = 1 << 20
"""Tokens converted to the store's dtype and written at a time (a long document's tokens are
not copied whole)."""


def _write_tokens(
    out: BinaryIO, kept: np.ndarray, counts: np.ndarray, eod: int, bos: int | None, dtype: np.dtype
) -> None:
    """The documents of ``kept`` (sizes ``counts``), each framed as ``framed`` does, written
    to ``out`` in ``dtype``: a batch of small documents at once, a long one block by block."""
    if len(kept) <= WRITE_BLOCK:
        tokens = framed(kept, counts, eod, bos).astype(dtype, copy=False)
        out.write(np.ascontiguousarray(tokens).data)
        return
    end_of_doc = np.asarray([eod], dtype=dtype)
    start_of_doc = np.asarray([] if bos is None else [bos], dtype=dtype)
    start = 0
    for n in counts.tolist():
        out.write(start_of_doc.data)
        for a in range(start, start + n, WRITE_BLOCK):
            piece = kept[a : min(a + WRITE_BLOCK, start + n)]
            out.write(np.ascontiguousarray(piece.astype(dtype, copy=False)).data)
        out.write(end_of_doc.data)
        start += n


def _utf8_length(text: str, block: int = 1 << 20) -> int:
    """Bytes of ``text`` in UTF-8 (lone surrogates as 3 each), a block at a time: a long
    document is not copied whole to count them."""
    if text.isascii():
        return len(text)
    return sum(
        len(text[i : i + block].encode("utf-8", "surrogatepass"))
        for i in range(0, len(text), block)
    )


@dataclass
class _Heartbeat:
    """Reports a batch's input bytes (``told`` .. ``read``) in proportion to the characters
    of its documents encoded, as a long document's pieces are."""

    counters: Counters
    told: int
    read: int
    chars: int

    def __call__(self, encoded: int) -> None:
        if self.chars <= 0:
            return
        target = self.told + (self.read - self.told) * min(encoded, self.chars) // self.chars
        if target > self.told:
            self.counters.add(input_bytes=target - self.told)
            self.told = target


def tokenize_unit(
    unit: Unit,
    tokenizer: Tokenizer,
    filters: FilterSet,
    settings: WorkerSettings,
    counters: Counters | None = None,
) -> UnitResult:
    """Tokenize ``unit``, frame each kept document (the EOD id after it, the BOS id before it
    if the job has one), and write its unit files."""
    bin_path, docs_path, marker = unit_paths(settings.work_dir, unit.index)
    dtype = numpy_dtype(settings.dtype)
    lengths: list[int] = []
    records: list[np.ndarray] = []  # where each kept document came from, batch by batch
    part_docs_in = [0] * len(unit.parts)
    dropped_docs: Counter[str] = Counter()
    dropped_tokens: Counter[str] = Counter()
    docs_in = text_bytes = n_tokens = 0
    eod, bos, framing = tokenizer.eod_id, settings.bos_id, settings.framing
    positions: list[ReadPosition] = []  # how far each part of the unit was read
    told = 0  # input bytes of the unit reported so far
    ids: list[bytes] = []  # the kept documents' ids, one after another
    with atomic_writer(bin_path) as out:
        for batch in _batches(_documents(unit, settings, positions), BATCH_DOCS):
            texts = [record.text for _, record in batch]
            heartbeat = None
            if counters is not None:  # a long document's pieces move the bar as they go
                parts = zip(positions, unit.parts, strict=False)  # the parts begun so far
                read = sum(p.share(part.n_bytes) for p, part in parts)
                heartbeat = _Heartbeat(counters, told, max(told, read), sum(map(len, texts)))
            flat, counts = encode_documents(tokenizer, texts, encoded=heartbeat)
            reasons = [
                EMPTY if not n else filters.text_reason(text) or filters.token_reason(int(n))
                for text, n in zip(texts, counts, strict=True)
            ]
            for reason, n in zip(reasons, counts, strict=True):
                if reason:
                    dropped_docs[reason] += 1
                    dropped_tokens[reason] += int(n)
            keep = np.array([r is None for r in reasons], dtype=bool)
            kept = flat if keep.all() else flat[np.repeat(keep, counts)]  # no copy when all kept
            del flat
            if len(kept) and max(int(kept.max()), eod, bos or 0) >= settings.id_limit:
                tokens = framed(kept, counts[keep], eod, bos)
                raise _overflow(unit, batch, keep, counts, tokens, settings, tokenizer)
            _write_tokens(out, kept, counts[keep], eod, bos, dtype)
            n_kept = len(kept) + framing * int(keep.sum())  # the EOD (and BOS) of each
            del kept
            lengths.extend((counts[keep] + framing).tolist())
            records.append(_kept_records(batch, keep, ids))
            for part, _ in batch:
                part_docs_in[part] += 1
            batch_bytes = sum(map(_utf8_length, texts))
            docs_in += len(batch)
            text_bytes += batch_bytes
            n_tokens += n_kept
            if heartbeat is not None:  # the rest of the input bytes read for this batch
                heartbeat.counters.add(docs=len(batch), tokens=n_kept, text_bytes=batch_bytes,
                                       input_bytes=heartbeat.read - heartbeat.told)  # fmt: skip
                told = heartbeat.read
    docs = np.concatenate(records) if records else np.zeros(0, dtype=UNIT_DOC)
    docs["length"] = lengths
    write_atomic(docs_path, npy_bytes(docs) + b"".join(ids))  # one file: fewer to fsync
    result = UnitResult(
        index=unit.index,
        docs_in=docs_in,
        n_docs=len(lengths),
        n_tokens=n_tokens,
        text_bytes=text_bytes,
        dropped_docs=dict(sorted(dropped_docs.items())),
        dropped_tokens=dict(sorted(dropped_tokens.items())),
        part_lines=[p.lines for p in positions] + [0] * (len(unit.parts) - len(positions)),
        part_docs_in=part_docs_in,
        **_bad_of(unit, positions),
    )
    write_atomic(marker, result.to_json().encode())
    if counters is not None:
        counters.add(input_bytes=unit.n_bytes - told)
    return result


def keep_unit_files(work_dir: str | Path, result: UnitResult, tokens: bytes, docs: bytes) -> None:
    """Write the files of a unit made elsewhere (a Ray task's) into ``work_dir`` as
    ``tokenize_unit`` writes its own: each atomically, the marker last."""
    bin_path, docs_path, marker = unit_paths(work_dir, result.index)
    write_atomic(bin_path, tokens)
    write_atomic(docs_path, docs)
    write_atomic(marker, result.to_json().encode())


def _bad_of(unit: Unit, positions: list[ReadPosition]) -> dict[str, Any]:
    """The unit's bad records, by input file and reason, and its first locations."""
    by_input: dict[str, dict[str, int]] = {}
    first: list[str] = []
    for part, position in zip(unit.parts, positions, strict=False):
        if position.bad is None or not position.bad.counts:
            continue
        mine = by_input.setdefault(part.file.path, {})
        for reason, n in position.bad.counts.items():
            mine[reason] = mine.get(reason, 0) + n
        first += position.bad.first
    return {
        "bad_records": {f: dict(sorted(c.items())) for f, c in by_input.items()},
        "bad_first": first[:FIRST_BAD],
    }


def _kept_records(
    batch: list[tuple[int, Record]], keep: np.ndarray, ids_out: list[bytes]
) -> np.ndarray:
    """Where the kept documents of ``batch`` came from (``UNIT_DOC``, but for their lengths);
    their ids are added to ``ids_out``, one after another."""
    kept = [item for item, k in zip(batch, keep.tolist(), strict=True) if k]
    ids = [record.id.encode("utf-8") for _, record in kept]
    ids_out.append(b"".join(ids))
    rows = [(0, part, r.group, r.number, len(i)) for (part, r), i in zip(kept, ids, strict=True)]
    return np.array(rows, dtype=UNIT_DOC)


def unit_intact(work_dir: str | Path, result: UnitResult, dtype: str) -> bool:
    """Whether a finished unit's files are what its marker records (sizes, documents, where
    each came from); a unit whose files were damaged after it finished is made again."""
    bin_path = unit_paths(work_dir, result.index)[0]
    try:
        if bin_path.stat().st_size != result.n_tokens * numpy_dtype(dtype).itemsize:
            return False
    except OSError:
        return False
    return _unit_docs(work_dir, result) is not None


def _unit_docs(work_dir: str | Path, result: UnitResult) -> tuple[np.ndarray, bytes] | None:
    """The unit's documents (``UNIT_DOC``) and ids, or None when they are not what its marker
    records (its documents and tokens; each naming a part of the unit; ids that fill the rest
    of the file).

    ``unit-N.docs.npy`` is the ``.npy`` array of the documents followed by their ids, one
    after another (a ``.npy`` reader sees the array alone)."""
    docs_path = unit_paths(work_dir, result.index)[1]
    try:
        data = docs_path.read_bytes()
        at = array_offset(io.BytesIO(data), UNIT_DOC, result.n_docs, "unit documents", docs_path)
    except (OSError, StoreError):
        return None
    end = at + UNIT_DOC.itemsize * result.n_docs
    if len(data) < end:
        return None
    docs = np.frombuffer(data, dtype=UNIT_DOC, count=result.n_docs, offset=at)
    ids = data[end:]
    good = (
        int(docs["length"].sum()) == result.n_tokens
        and (not len(docs) or int(docs["part"].max()) < len(result.part_lines))
        and int(docs["id_len"].sum()) == len(ids)
    )
    return (docs, ids) if good else None


class UnitOutput(NamedTuple):
    """What a finished unit wrote: its documents' tokens, their lengths and origins
    (``UNIT_DOC``) and their ids one after another."""

    tokens: np.ndarray
    docs: np.ndarray
    ids: bytes


def read_unit(work_dir: str | Path, result: UnitResult, dtype: str) -> UnitOutput:
    """What a finished unit wrote, checked against its marker."""
    bin_path, _, marker = unit_paths(work_dir, result.index)
    found = None
    try:
        tokens = np.fromfile(bin_path, dtype=numpy_dtype(dtype))
        if len(tokens) == result.n_tokens:
            found = _unit_docs(work_dir, result)
    except (OSError, ValueError):
        found = None
    if found is None:
        marker.unlink(missing_ok=True)  # the rerun makes this unit again
        raise StoreError(
            f"{bin_path}: unit {result.index}'s output does not match its marker (damaged); "
            "run the same command again to make it anew"
        )
    return UnitOutput(tokens, *found)


__all__ = [
    "UNIT_DOC",
    "UnitOutput",
    "UnitResult",
    "WorkerSettings",
    "framed",
    "keep_unit_files",
    "load_result",
    "read_unit",
    "tokenize_unit",
    "unit_intact",
    "unit_paths",
]
