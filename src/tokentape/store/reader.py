"""Memory-mapped, read-only access to a token store.

A source is the concatenation of its shards in manifest order. Sample ``k`` at sequence length
``L`` is the window of ``L + 1`` tokens starting at token ``k * L``; a window may span shards.
Opening is cheap (the shards are memory-mapped, the document starts loaded) and any number of
processes may open one store at once.

``TokenStream`` holds what every kind of source shares (windows, documents, segments over
memory-mapped pieces); ``Source`` is a tokentape store, ``store.megatron_source.MegatronSource``
a Megatron ``.bin``/``.idx`` prefix read in place.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import numpy as np

from tokentape.errors import TokentapeError
from tokentape.store.format import Manifest, numpy_dtype, read_manifest
from tokentape.tokenize.tokenizers import Tokenizer, tokenizer_from_manifest


def _check_size(path: Path, expected: int) -> None:
    try:
        found = path.stat().st_size
    except FileNotFoundError:
        raise TokentapeError(f"{path}: shard file is missing") from None
    if found != expected:
        raise TokentapeError(
            f"{path}: size is {found} bytes, the manifest says {expected}; "
            "the store is damaged (run `tokentape verify`)"
        )


def _map_tokens(path: Path, dtype: np.dtype, n_tokens: int) -> np.ndarray:
    if n_tokens == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n_tokens,))


class TokenStream:
    """A source's token stream (the concatenation of memory-mapped pieces) and its document
    starts: the sample windows, documents and segments every kind of source shares.

    Subclasses (``Source`` for a tokentape store, ``MegatronSource`` for a Megatron prefix)
    provide ``manifest`` (with ``content_hash``, ``dtype``, ``vocab_size``, ``eod_id``),
    ``eod_id``, ``directory`` and ``tokenizer``.
    """

    def __init__(
        self,
        dtype: np.dtype,
        pieces: list[np.ndarray],
        doc_starts: np.ndarray | Callable[[], np.ndarray],
        n_docs: int | None = None,
    ) -> None:
        """``doc_starts``: the documents' first tokens in the stream, or a function that loads
        them when first needed (a training run that asks for no segments never does)."""
        self.dtype = dtype
        self._shards = pieces
        sizes = np.array([len(p) for p in pieces], dtype=np.int64)
        # Token offset of each piece in the stream, with the total appended.
        self._shard_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._doc_starts = doc_starts
        self._n_docs = n_docs

    def advise_random(self) -> None:
        """Tell the kernel these maps are read at random (sample windows all over the store),
        so a cold read does not pull megabytes of read-ahead around each window."""
        for piece in self._shards:
            mapped = getattr(piece, "_mmap", None)  # np.memmap keeps its mmap.mmap here
            if mapped is not None and hasattr(mmap, "MADV_RANDOM"):
                mapped.madvise(mmap.MADV_RANDOM)

    @cached_property
    def doc_starts(self) -> np.ndarray:
        """int64 first token of each document in the stream, ascending."""
        starts = self._doc_starts
        return starts() if callable(starts) else starts

    @property
    def n_tokens(self) -> int:
        return int(self._shard_offsets[-1])

    @property
    def n_docs(self) -> int:
        return self._n_docs if self._n_docs is not None else len(self.doc_starts)

    @property
    def eod_id(self) -> int:
        raise NotImplementedError

    @property
    def tokenizer(self) -> Tokenizer:
        raise NotImplementedError

    def n_samples(self, seq_len: int) -> int:
        """Windows of ``seq_len + 1`` tokens at stride ``seq_len``."""
        _check_seq_len(seq_len)
        return max(0, (self.n_tokens - 1) // seq_len)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the source, copied out of the shards they lie in."""
        if not 0 <= start <= stop <= self.n_tokens:
            raise IndexError(f"token range [{start}, {stop}) outside [0, {self.n_tokens})")
        first = int(np.searchsorted(self._shard_offsets, start, side="right")) - 1
        pieces, pos = [], start
        shard = max(first, 0)
        while pos < stop:
            off = int(self._shard_offsets[shard])
            end = min(stop, int(self._shard_offsets[shard + 1]))
            if end > pos:
                pieces.append(self._shards[shard][pos - off : end - off])
            pos = max(pos, end)
            shard += 1
        if not pieces:
            return np.zeros(0, dtype=self.dtype)
        return pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces)

    def window(self, k: int, seq_len: int) -> np.ndarray:
        """Sample ``k``: tokens ``[k*L, k*L + L + 1)``."""
        self._check_sample(k, seq_len)
        return self.tokens(k * seq_len, k * seq_len + seq_len + 1)

    def windows_into(
        self, samples: np.ndarray, seq_len: int, out: np.ndarray, rows: np.ndarray | None = None
    ) -> None:
        """Copy samples ``samples`` (at ``seq_len``) into rows of ``out`` (width L+1): row i
        of the result goes to ``out[rows[i]]``, or ``out[i]`` without ``rows``.

        One slice copy per row from the memory map (rows that cross a shard boundary are
        stitched); ``out`` may have any integer dtype wide enough for the ids.
        """
        k = np.asarray(samples, dtype=np.int64)
        n = self.n_samples(seq_len)
        if k.size and (int(k.min()) < 0 or int(k.max()) >= n):
            raise IndexError(f"samples outside [0, {n}) at seq_len {seq_len}")
        targets = np.arange(k.size) if rows is None else np.asarray(rows)
        if out.ndim != 2 or out.shape[1] != seq_len + 1 or targets.shape != k.shape:
            raise ValueError(f"out must have rows of {seq_len + 1} tokens, one per sample")
        starts = k * seq_len
        shard_of = np.searchsorted(self._shard_offsets, starts, side="right") - 1
        triples = zip(targets.tolist(), starts.tolist(), shard_of.tolist(), strict=True)
        for row, start, shard in triples:
            local = start - int(self._shard_offsets[shard])
            stop = local + seq_len + 1
            if start + seq_len + 1 <= self._shard_offsets[shard + 1]:
                out[row] = self._shards[shard][local:stop]
            else:
                out[row] = self.tokens(start, start + seq_len + 1)

    def segments_into(
        self, samples: np.ndarray, seq_len: int, segment: np.ndarray, position: np.ndarray
    ) -> None:
        """Per token of each window: which document it belongs to, counted from 0 within the
        window (``segment``), and its offset inside that document (``position``).

        Both outputs have shape (n, L+1). A model masks attention between different segment ids
        and restarts position embeddings where ``position`` is 0; a window's first segment
        usually starts before the window, so its positions need not start at 0.
        """
        k = np.asarray(samples, dtype=np.int64)
        width = seq_len + 1
        columns = np.arange(width, dtype=np.int64)
        for row, start in enumerate((k * seq_len).tolist()):
            first = int(np.searchsorted(self.doc_starts, start, side="right")) - 1
            last = int(np.searchsorted(self.doc_starts, start + seq_len, side="right")) - 1
            inner = self.doc_starts[first + 1 : last + 1] - start  # starts inside the window
            marks = np.zeros(width, dtype=np.int64)
            marks[inner] = 1
            np.cumsum(marks, out=segment[row])
            begins = np.concatenate([[int(self.doc_starts[first]) - start], inner])
            position[row] = columns - begins[segment[row]]

    def docs_in(self, k: int, seq_len: int) -> list[int]:
        """Ids of the documents that overlap sample ``k``."""
        self._check_sample(k, seq_len)
        start, last = k * seq_len, k * seq_len + seq_len
        first_doc = int(np.searchsorted(self.doc_starts, start, side="right")) - 1
        last_doc = int(np.searchsorted(self.doc_starts, last, side="right")) - 1
        return list(range(first_doc, last_doc + 1))

    def _check_sample(self, k: int, seq_len: int) -> None:
        n = self.n_samples(seq_len)
        if not 0 <= k < n:
            raise IndexError(f"sample {k} outside [0, {n}) at seq_len {seq_len}")

    def doc_span(self, i: int) -> tuple[int, int]:
        """Token range of document ``i``, its end-of-document token included."""
        if not 0 <= i < self.n_docs:
            raise IndexError(f"document {i} outside [0, {self.n_docs})")
        end = int(self.doc_starts[i + 1]) if i + 1 < self.n_docs else self.n_tokens
        return int(self.doc_starts[i]), end

    def doc(self, i: int) -> np.ndarray:
        """The tokens of document ``i``, without its end-of-document token."""
        start, end = self.doc_span(i)
        return self.tokens(start, end - 1)

    def decode(self, tokens: np.ndarray | list[int]) -> str:
        return self.tokenizer.decode([int(t) for t in tokens])


class Source(TokenStream):
    """One token store opened for reading; see ``open_source``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.manifest: Manifest = read_manifest(self.directory)
        dtype = numpy_dtype(self.manifest.dtype)
        shards = []
        for shard in self.manifest.shards:
            bin_path = self.directory / shard.bin_file
            _check_size(bin_path, shard.n_tokens * dtype.itemsize)
            _check_size(self.directory / shard.idx_file, shard.idx_bytes)
            shards.append(_map_tokens(bin_path, dtype, shard.n_tokens))
        super().__init__(dtype, shards, self._load_doc_starts, self.manifest.n_docs)

    def _load_doc_starts(self) -> np.ndarray:
        """Every shard's ``.idx.npy``, offset into the stream and concatenated."""
        starts, offset = [], 0
        for shard in self.manifest.shards:
            idx_path = self.directory / shard.idx_file
            local = np.load(idx_path, allow_pickle=False)
            if local.shape != (shard.n_docs,) or local.dtype != np.int64:
                raise TokentapeError(
                    f"{idx_path}: expected {shard.n_docs} int64 document starts, "
                    f"found shape {local.shape} dtype {local.dtype}"
                )
            starts.append(local + offset)
            offset += shard.n_tokens
        return np.concatenate(starts or [np.zeros(0, dtype=np.int64)]).astype(np.int64)

    @property
    def eod_id(self) -> int:
        return self.manifest.eod_id

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer recorded in the manifest (loaded from the copy inside the store)."""
        return tokenizer_from_manifest(self.manifest.tokenizer, self.directory)

    def __repr__(self) -> str:
        return (
            f"Source({str(self.directory)!r}, n_tokens={self.n_tokens}, n_docs={self.n_docs}, "
            f"dtype={self.manifest.dtype}, shards={len(self._shards)})"
        )


def _check_seq_len(seq_len: int) -> None:
    if not isinstance(seq_len, int | np.integer) or seq_len <= 0:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")


def open_source(path: str | os.PathLike[str]) -> Source:
    """Open the token store at ``path`` (a directory with ``manifest.json``)."""
    return Source(path)
