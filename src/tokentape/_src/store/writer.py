"""Streaming shard writer: whole documents in, shards out, hashes computed while writing.

Documents are appended in order; a shard is closed before a document that would take it past
``shard_tokens`` (a document larger than that gets a shard of its own). The cut depends only on
the document stream, so the shards are the same whatever produced the stream. Given where each
document came from (``store.provenance.ADDED``) and its id, the writer also writes each shard's
provenance files (``part-NNNNN.rec.npy``, ``part-NNNNN.ids``, ``part-NNNNN.idkeys.npy``).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import numpy as np

from tokentape._src.store.atomic import fsync_dir, temp_name, write_atomic
from tokentape._src.store.format import (
    BIN_SUFFIX,
    DEFAULT_BLOCK_BYTES,
    IDX_SUFFIX,
    ShardInfo,
    numpy_dtype,
    shard_name,
)
from tokentape._src.store.provenance import (
    ADDED,
    IDS_SUFFIX,
    KEYS_SUFFIX,
    REC_SUFFIX,
    RECORD,
    ShardProvenance,
    id_keys,
)
from tokentape.errors import ArgumentError


def npy_bytes(array: np.ndarray) -> bytes:
    """The exact bytes of ``numpy.save`` for ``array`` (no pickle, deterministic header)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


class BlockHasher:
    """sha256 of the whole stream and of every ``block_bytes`` block, fed in any chunking."""

    def __init__(self, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.whole = hashlib.sha256()
        self.block = hashlib.sha256()
        self.in_block = 0
        self.blocks: list[str] = []

    def update(self, data: memoryview | bytes) -> None:
        self.whole.update(data)
        while len(data):
            take = min(len(data), self.block_bytes - self.in_block)
            self.block.update(data[:take])
            self.in_block += take
            data = data[take:]
            if self.in_block == self.block_bytes:
                self._close_block()

    def _close_block(self) -> None:
        self.blocks.append(self.block.hexdigest())
        self.block = hashlib.sha256()
        self.in_block = 0

    def finish(self) -> tuple[str, tuple[str, ...]]:
        if self.in_block:
            self._close_block()
        return self.whole.hexdigest(), tuple(self.blocks)


class _OpenShard:
    def __init__(self, directory: Path, index: int, block_bytes: int) -> None:
        self.name = shard_name(index)
        self.final = directory / (self.name + BIN_SUFFIX)
        self.tmp = temp_name(self.final)
        # "x": a new file (O_EXCL), never one (or a link) already at the name
        self.file = open(self.tmp, "xb")  # noqa: SIM115 - closed in close()/abort()
        self.hasher = BlockHasher(block_bytes)
        self.n_tokens = 0
        self.starts: list[np.ndarray] = []
        self.records: list[np.ndarray] = []
        self.ids: list[bytes] = []
        self.ids_bytes = 0

    def write(
        self, tokens: np.ndarray, lengths: np.ndarray, records: np.ndarray | None, ids: bytes
    ) -> None:
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        self.starts.append(starts + self.n_tokens)
        if records is not None:
            rows = np.empty(len(records), dtype=RECORD)
            for name in ("input", "group", "record"):
                rows[name] = records[name]
            rows["id_end"] = np.cumsum(records["id_len"]) + self.ids_bytes
            self.records.append(rows)
            self.ids.append(ids)
            self.ids_bytes += len(ids)
        data = tokens.data.cast("B")
        self.file.write(data)
        self.hasher.update(data)
        self.n_tokens += len(tokens)

    def close_provenance(self) -> ShardProvenance:
        """Write the shard's provenance files (before its ``.bin`` takes its name)."""
        rec = np.concatenate(self.records) if self.records else np.zeros(0, dtype=RECORD)
        rec_data = npy_bytes(rec)
        ids_data = b"".join(self.ids)
        keys_data = npy_bytes(id_keys(ids_data, rec["id_end"]))
        files = {REC_SUFFIX: rec_data, IDS_SUFFIX: ids_data, KEYS_SUFFIX: keys_data}
        for suffix, data in files.items():
            write_atomic(self.final.with_name(self.name + suffix), data)
        sha = {suffix: hashlib.sha256(data).hexdigest() for suffix, data in files.items()}
        return ShardProvenance(
            len(rec_data), sha[REC_SUFFIX], len(ids_data), sha[IDS_SUFFIX],
            len(keys_data), sha[KEYS_SUFFIX],
        )  # fmt: skip

    def close(self, block_bytes: int) -> ShardInfo:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        idx = np.concatenate(self.starts) if self.starts else np.zeros(0, dtype=np.int64)
        idx_data = npy_bytes(idx.astype("<i8", copy=False))
        write_atomic(self.final.with_name(self.name + IDX_SUFFIX), idx_data)
        os.replace(self.tmp, self.final)
        bin_hash, blocks = self.hasher.finish()
        return ShardInfo(
            name=self.name,
            n_tokens=self.n_tokens,
            n_docs=len(idx),
            bin_sha256=bin_hash,
            idx_sha256=hashlib.sha256(idx_data).hexdigest(),
            idx_bytes=len(idx_data),
            block_bytes=block_bytes,
            block_sha256=blocks,
        )

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


class ShardWriter:
    """Appends whole documents to ``part-NNNNN`` shards in ``directory``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        dtype: str,
        shard_tokens: int,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
    ) -> None:
        if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens <= 0:
            raise ArgumentError(f"shard_tokens must be a positive integer, got {shard_tokens!r}")
        self.directory = Path(directory)
        self.dtype = numpy_dtype(dtype)
        self.shard_tokens = shard_tokens
        self.block_bytes = block_bytes
        self.shards: list[ShardInfo] = []
        self.provenance: list[ShardProvenance] = []
        """Each closed shard's provenance files (when ``add`` is given records)."""
        self._open: _OpenShard | None = None

    def add(
        self,
        tokens: np.ndarray,
        lengths: np.ndarray,
        records: np.ndarray | None = None,
        ids: bytes = b"",
    ) -> None:
        """Append documents: ``tokens`` is their concatenation, ``lengths`` their sizes, and
        (given on every call, or never) ``records`` where each came from (``ADDED``) and
        ``ids`` their ids, one after another."""
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype)
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != len(tokens):
            raise ArgumentError(
                f"lengths add up to {int(lengths.sum())} tokens, tokens has {len(tokens)}"
            )
        id_starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        if records is not None:
            if records.dtype != ADDED or records.shape != lengths.shape:
                raise ArgumentError("records must hold one ADDED record per document")
            np.cumsum(records["id_len"], out=id_starts[1:])
            if int(id_starts[-1]) != len(ids):
                raise ArgumentError(f"the ids hold {len(ids)} bytes, records {id_starts[-1]}")
        ends = np.cumsum(lengths)
        doc, tok = 0, 0
        while doc < len(lengths):
            shard = self._current()
            room = self.shard_tokens - shard.n_tokens
            # Documents that fit in the room left; at least one if the shard is empty.
            stop = int(np.searchsorted(ends, tok + room, side="right"))
            if stop == doc:
                if shard.n_tokens == 0:
                    stop = doc + 1
                else:
                    self._close()
                    continue
            end_tok = int(ends[stop - 1])
            shard.write(
                tokens[tok:end_tok],
                lengths[doc:stop],
                None if records is None else records[doc:stop],
                ids[int(id_starts[doc]) : int(id_starts[stop])],
            )
            doc, tok = stop, end_tok
            if shard.n_tokens >= self.shard_tokens:
                self._close()

    def _current(self) -> _OpenShard:
        if self._open is None:
            self._open = _OpenShard(self.directory, len(self.shards), self.block_bytes)
        return self._open

    def _close(self) -> None:
        assert self._open is not None
        if self._open.records:
            self.provenance.append(self._open.close_provenance())
        self.shards.append(self._open.close(self.block_bytes))
        self._open = None

    def finish(self) -> list[ShardInfo]:
        """Close the last shard and return every shard's record."""
        if self._open is not None and self._open.n_tokens:
            self._close()
        fsync_dir(self.directory)
        return list(self.shards)

    def abort(self) -> None:
        if self._open is not None:
            self._open.abort()
            self._open = None


__all__ = [
    "BlockHasher",
    "ShardWriter",
    "npy_bytes",
]
