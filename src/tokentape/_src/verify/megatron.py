"""The checks ``tokentape verify`` runs on a Megatron prefix (``PREFIX.bin`` + ``PREFIX.idx``).

- structure: the ``.idx`` header, sizes, counts, document index and back-to-back sequences;
- bytes: full mode rehashes both files (sha256, ``.bin`` block hashes, token id range, the id
  every document ends with) and compares them with the identity recorded in the prefix's
  sidecar, if there is one: the sidecar recorded for the files as they are now (their keys)
  when there is one, else any (a stale one beside the data loses to a current one in the
  cache). A full check that finds the bytes as recorded, or finds no record, writes the
  sidecar for the files as they are now: the identity a plan would compute. ``--quick`` hashes
  the ``.idx`` and only the chosen blocks of ``.bin`` (full rehash without a sidecar);
- plans: the content hash each plan recorded for the source;
- ids: no negative id, none at or above the vocabulary size, and every document ends with the
  end-of-document id (when the vocabulary and EOD id are known: from a plan, or flags). The
  end id found while hashing (full mode) or recorded by a current sidecar (``--quick``)
  answers the last without a second read of ``.bin``; the document ends are read only when it
  does not (to name the first offending document).

The result is plain data (``MegatronCheck``); ``verify.stores`` turns it into its report.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokentape._src.megatron.format import (
    DTYPES,
    FileKeys,
    IdRange,
    MegatronIdentity,
    MegatronIndex,
    PrefixFiles,
    bin_path,
    idx_path,
    read_index,
)
from tokentape._src.megatron.identity import (
    CHUNK_BYTES,
    hash_files,
    read_sidecar,
    write_sidecar,
)
from tokentape._src.megatron.source import check_documents
from tokentape.errors import TokentapeError

Finding = tuple[str, str, str, str]
"""(file, what, expected, found)."""
Chooser = Callable[[int], list[int]]
"""The blocks a quick check hashes, given how many there are."""


@dataclass
class MegatronCheck:
    """What verifying one prefix found and how much it read."""

    n_tokens: int = 0
    n_docs: int = 0
    blocks_checked: int = 0
    blocks_total: int = 0
    bytes_hashed: int = 0
    problems: list[Finding] = field(default_factory=list)


def _quick_record(itemsize: int, bin_bytes: int, recorded: MegatronIdentity | None) -> bool:
    """Whether the sidecar's block hashes can be spot-checked against this ``.bin``."""
    if recorded is None or recorded.block_bytes <= 0:
        return False
    return recorded.block_bytes % itemsize == 0 and recorded.bin_bytes == bin_bytes


def recorded_identity(prefix: Path, keys: FileKeys) -> tuple[MegatronIdentity | None, bool]:
    """The identity a sidecar records for files with ``keys``, else any recorded one; and
    whether it is the former (current)."""
    current = read_sidecar(prefix, keys)
    if current is not None:
        return current, True
    return read_sidecar(prefix, None), False


def planned_bytes(prefix: Path, quick: bool, chooser: Chooser) -> int:
    """Bytes of ``.bin`` a check reads (0 when the ``.idx`` header cannot be read)."""
    try:
        with PrefixFiles(prefix) as files:
            _, code, _, _ = files.header()
            keys = files.keys
    except TokentapeError:
        return 0
    size = keys.bin.size
    recorded, _ = recorded_identity(prefix, keys)
    if not quick or recorded is None or not _quick_record(DTYPES[code].itemsize, size, recorded):
        return size
    return chosen_bytes(recorded, size, chooser)


def chosen_bytes(recorded: MegatronIdentity, size: int, chooser: Chooser) -> int:
    """Bytes of the ``.bin`` blocks (of ``size`` bytes in all) that ``chooser`` picks for a
    quick check."""
    bb = recorded.block_bytes
    return sum(min(bb, size - i * bb) for i in chooser(len(recorded.block_sha256)))


def check_megatron(
    prefix: Path,
    quick: bool,
    chooser: Chooser,
    progress: Callable[[int], None] | None,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    plan_hashes: Sequence[tuple[str, str, str]] = (),
) -> MegatronCheck:
    """Verify ``prefix``; ``plan_hashes`` holds (plan, source name, recorded content hash)."""
    out = MegatronCheck()
    try:
        index = read_index(prefix)
    except TokentapeError as exc:
        expected = "a Megatron dataset tokentape can read"
        out.problems.append((str(idx_path(prefix)), "unreadable", expected, str(exc)))
        return out
    assert index.keys is not None
    out.n_tokens, out.n_docs = index.n_tokens, index.n_docs
    recorded, current = recorded_identity(prefix, index.keys)
    bin_bytes = index.n_tokens * index.dtype.itemsize
    if quick and _quick_record(index.dtype.itemsize, bin_bytes, recorded):
        assert recorded is not None
        ids, content = _spot_check(index, recorded, chooser, progress, out), recorded.content_hash
        if current:  # the whole range, recorded for these very files, with what was read
            ids = union(ids, (recorded.min_id, recorded.max_id))
        end_id = recorded.end_id if current else None
    else:
        try:
            found = hash_files(index, progress)
        except TokentapeError as exc:  # changed while being read
            out.problems.append((str(bin_path(prefix)), "changed while verified", "", str(exc)))
            return out
        out.bytes_hashed += found.bin_bytes
        out.blocks_total = out.blocks_checked = len(found.block_sha256)
        bytes_differ = False
        if recorded is not None:
            data, meta = str(bin_path(index.prefix)), str(idx_path(index.prefix))
            problems = against_record(data, meta, recorded, found)
            bytes_differ = any("sha256" in what for _, what, _, _ in problems)
            out.problems += problems
        if not bytes_differ:  # as recorded (derived fields corrected), or first recorded
            write_sidecar(prefix, found, index.keys, taken_ns=index.taken_ns)
        ids, content, end_id = (found.min_id, found.max_id), found.content_hash, found.end_id
    out.problems += plan_problems(plan_hashes, content)
    out.problems += id_problems(str(bin_path(index.prefix)), ids, vocab_size)
    if eod_id is not None:
        out.problems += _eod_problems(index, eod_id, end_id)
    return out


def plan_problems(plan_hashes: Sequence[tuple[str, str, str]], content: str) -> list[Finding]:
    """Each plan (plan, source name, recorded content hash) that recorded another hash."""
    return [
        (plan, f"source '{source}' content_hash", expected, content)
        for plan, source, expected in plan_hashes
        if expected != content
    ]


def union(
    a: tuple[int | None, int | None], b: tuple[int | None, int | None]
) -> tuple[int | None, int | None]:
    """The id range covering both (None: no ids)."""
    lows = [x for x in (a[0], b[0]) if x is not None]
    highs = [x for x in (a[1], b[1]) if x is not None]
    return (min(lows) if lows else None, max(highs) if highs else None)


def against_record(
    data: str, meta: str, recorded: MegatronIdentity, found: MegatronIdentity
) -> list[Finding]:
    """The recorded identity against the one just computed (``data`` and ``meta`` name the
    ``.bin`` and the ``.idx``): both sha256 (and, for ``.bin``, the blocks that differ); with
    the bytes as recorded, the fields derived from them (id range, end id), which an open
    trusts."""
    problems = []
    if found.idx_sha256 != recorded.idx_sha256:
        problems.append((meta, "sha256 mismatch (sidecar)", recorded.idx_sha256, found.idx_sha256))
    if found.bin_sha256 != recorded.bin_sha256:
        problems.append((data, "sha256 mismatch (sidecar)", recorded.bin_sha256, found.bin_sha256))
        if found.block_bytes == recorded.block_bytes and len(recorded.block_sha256) > 1:
            pairs = zip(recorded.block_sha256, found.block_sha256, strict=False)
            problems += [
                (data, f"block {i} sha256 mismatch", want, got)
                for i, (want, got) in enumerate(pairs)
                if want != got
            ]
    if problems:
        return problems
    for name in ("min_id", "max_id", "end_id"):
        want, got = getattr(recorded, name), getattr(found, name)
        if want != got and not (name == "end_id" and want is None):  # None: no claim
            problems.append((data, f"{name} mismatch (sidecar)", str(want), str(got)))
    return problems


def _spot_check(
    index: MegatronIndex,
    recorded: MegatronIdentity,
    chooser: Chooser,
    progress: Callable[[int], None] | None,
    out: MegatronCheck,
) -> tuple[int | None, int | None]:
    """Hash the ``.idx`` and the chosen ``.bin`` blocks against the sidecar; their id range."""
    data, meta = bin_path(index.prefix), idx_path(index.prefix)
    digest = hashlib.sha256(meta.read_bytes()).hexdigest()
    if digest != recorded.idx_sha256:
        out.problems.append((str(meta), "sha256 mismatch (sidecar)", recorded.idx_sha256, digest))
    bb, ids = recorded.block_bytes, IdRange()
    chosen = chooser(len(recorded.block_sha256))
    out.blocks_total, out.blocks_checked = len(recorded.block_sha256), len(chosen)
    with open(data, "rb") as f:
        for i in chosen:
            f.seek(i * bb)
            block, left = hashlib.sha256(), bb
            while left and (chunk := f.read(min(CHUNK_BYTES, left))):
                block.update(chunk)
                ids.update(np.frombuffer(chunk, dtype=index.dtype))
                left -= len(chunk)
                out.bytes_hashed += len(chunk)
                if progress is not None:
                    progress(len(chunk))
            if block.hexdigest() != recorded.block_sha256[i]:
                want = recorded.block_sha256[i]
                out.problems.append(
                    (str(data), f"block {i} sha256 mismatch", want, block.hexdigest())
                )
    return ids.min, ids.max


def id_problems(
    where: str, ids: tuple[int | None, int | None], vocab_size: int | None
) -> list[Finding]:
    """A negative id, or one at or above ``vocab_size``, in the range ``ids`` of ``where``."""
    lo, hi = ids
    problems = []
    if lo is not None and lo < 0:
        problems.append((where, "negative token id", "ids >= 0", str(lo)))
    if vocab_size is not None and hi is not None and hi >= vocab_size:
        problems.append((where, "token id out of range", f"ids < {vocab_size}", str(hi)))
    return problems


def _eod_problems(index: MegatronIndex, eod_id: int, end_id: int | None) -> list[Finding]:
    """Every document ends with ``eod_id``: known when ``end_id`` (the id every document ends
    with, if one) is it; otherwise the document ends are read to name the first offender."""
    if not index.n_docs or end_id == eod_id:
        return []
    tokens = (
        np.memmap(bin_path(index.prefix), dtype=index.dtype, mode="r", shape=(index.n_tokens,))
        if index.n_tokens
        else np.zeros(0, dtype=index.dtype)
    )
    try:
        check_documents(tokens, index.doc_starts(), eod_id, str(index.prefix))
    except TokentapeError as exc:
        expected = f"id {eod_id} at every document end"
        return [(str(bin_path(index.prefix)), "missing end-of-document id", expected, str(exc))]
    return []


__all__ = [
    "Chooser",
    "MegatronCheck",
    "against_record",
    "check_documents",
    "check_megatron",
    "chosen_bytes",
    "id_problems",
    "plan_problems",
    "planned_bytes",
    "recorded_identity",
    "union",
]
