"""Read-only access to a token store, on disk or in object storage, and what every source shares.

A source is the concatenation of its shards in manifest order. Sample ``k`` at sequence length
``L`` is the window of ``L + 1`` tokens starting at token ``k * L``; a window may span shards.

A source is a *format* over a *byte reader* (``TokenFiles``). ``TokenStream`` holds what every
format shares (windows, documents, segments over the token files); ``Source`` is a tokentape
store, ``megatron.source.MegatronSource`` a Megatron ``.bin``/``.idx`` prefix. Each opens
either on disk, its token files memory-mapped (``MappedFiles``), or at an object URL, its token
files read in byte ranges through a cache (``objects.ranged.RangedFiles``).

Opening a store on disk is cheap and any number of processes may open one store at once. An
open store holds everything it reads: the manifest, each shard's ``.bin`` and ``.idx.npy`` and
the tokenizer copy are opened at open time, all through one descriptor of the store directory
(only regular files inside the store: ``store.confine``), and memory-mapped, with only the
``.npy`` headers read. So an open sees one whole store even while ``tokenize --overwrite``
swaps in a new directory (an open that met the old one being removed starts again on the new
one), and replacing or deleting the store afterwards does not change what an open ``Source``
reads. A store at an object URL is opened from its ``manifest.json`` alone (``store.remote``
says what is checked when).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tokentape._src.objects.client import StorageOptions, object_store
from tokentape._src.objects.ranged import FetchConfig, FetchStats, RangedFiles
from tokentape._src.store.confine import open_directory, open_inside, replaced
from tokentape._src.store.format import Manifest, ShardInfo, numpy_dtype, read_manifest
from tokentape._src.store.index import (
    INDEX_DTYPE,
    check_starts,
    damaged,
    index_offset,
    joined_starts,
)
from tokentape._src.store.origins import (
    Origin,
    Origins,
    ShardRecords,
    keys_offset,
    no_such_input,
    records_offset,
)
from tokentape._src.store.provenance import INPUTS_NAME, KEY_DTYPE, RECORD
from tokentape._src.store.remote import StoreObjects
from tokentape._src.store.tokenizers import STORED_NAMES, Tokenizer, tokenizer_from_manifest
from tokentape._src.util.checks import as_index, shown
from tokentape.errors import ArgumentError, OutOfRangeError, StoreError, TokentapeError

_OPEN_ATTEMPTS = 3
"""Opens of a store that is replaced while being opened, before giving up."""


def _check_size(path: Path, fd: int, expected: int) -> None:
    found = os.fstat(fd).st_size
    if found != expected:
        raise damaged(path, f"size is {found} bytes, the manifest says {expected}")


def _map_tokens(directory: Path, shard: ShardInfo, dtype: np.dtype, dir_fd: int) -> np.ndarray:
    """The shard's ``.bin``, memory-mapped (read-only), after checking its size."""
    path = directory / shard.bin_file
    with open(open_inside(directory, shard.bin_file, "shard file", dir_fd), "rb") as f:
        _check_size(path, f.fileno(), shard.n_tokens * dtype.itemsize)
        if shard.n_tokens == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(f, dtype=dtype, mode="r", shape=(shard.n_tokens,))


def _map_index(directory: Path, shard: ShardInfo, dir_fd: int) -> np.ndarray:
    """The shard's ``.idx.npy`` memory-mapped: its header read and checked (a 1-D int64 array
    of ``n_docs`` entries filling the file), no entry read; never unpickled."""
    path = directory / shard.idx_file
    with open(open_inside(directory, shard.idx_file, "document index", dir_fd), "rb") as f:
        _check_size(path, f.fileno(), shard.idx_bytes)
        offset = index_offset(f, shard, path)
        if shard.n_docs == 0:
            return np.zeros(0, dtype=INDEX_DTYPE)
        return np.memmap(f, dtype=INDEX_DTYPE, mode="r", offset=offset, shape=(shard.n_docs,))


class TokenPiece(Protocol):
    """One token file's ids as a sliceable sequence: a memory map for a file on disk, ranged
    reads through a cache for an object (``objects.ranged.RangedPiece``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, key: slice, /) -> np.ndarray: ...


class TokenFiles(Protocol):
    """The byte reader under a source: its token files in stream order (``pieces``), and how
    they are read ahead. ``MappedFiles`` for files on disk, ``objects.ranged.RangedFiles`` for
    objects."""

    @property
    def pieces(self) -> Sequence[TokenPiece]:
        """The token files, in stream order."""

    @property
    def fetches_ahead(self) -> bool:
        """Whether ``prefetch`` does anything (object storage): a loader then tells it the
        windows of the next steps as soon as they are known."""

    @property
    def stats(self) -> FetchStats:
        """What was fetched from object storage (nothing, on disk)."""

    def prefetch(self, ranges: Mapping[int, list[tuple[int, int]]], /) -> None:
        """Start reading byte ranges of the files (by file index) in the background."""

    def advise_random(self) -> None:
        """Tell the reader the files are read at random (sample windows all over them)."""

    def close(self) -> None:
        """Let go of what reading holds beyond the memory maps (fetch threads, cached ranges)."""


class MappedFiles:
    """Token files on disk, memory-mapped (read-only): the page cache reads ahead."""

    fetches_ahead = False

    def __init__(self, pieces: Sequence[np.ndarray]) -> None:
        self.pieces = list(pieces)

    @property
    def stats(self) -> FetchStats:
        """Nothing fetched: every count 0."""
        return FetchStats()

    def prefetch(self, ranges: Mapping[int, list[tuple[int, int]]], /) -> None:
        """Nothing to start: the page cache reads the maps."""

    def advise_random(self) -> None:
        """Tell the kernel the maps are read at random, so a cold read does not pull megabytes
        of read-ahead around each window."""
        for piece in self.pieces:
            mapped = getattr(piece, "_mmap", None)  # np.memmap keeps its mmap.mmap here
            if mapped is not None and hasattr(mmap, "MADV_RANDOM"):
                mapped.madvise(mmap.MADV_RANDOM)

    def close(self) -> None:
        """Nothing held beyond the maps."""


class SourceManifest(Protocol):
    """What a source records about itself: its identity, size and vocabulary, as the plan
    records them and the loader checks them. A tokentape store's ``Manifest`` and a Megatron
    prefix's ``MegatronManifest`` have these members (as fields or properties); a new kind of
    source gives its manifest the same."""

    @property
    def content_hash(self) -> str:
        """``sha256:…`` over the source's data (tokens and document boundaries): its identity.
        A plan records it and refuses the source once it differs."""

    @property
    def dtype(self) -> str:
        """The numpy name of the dtype the token ids are stored in (``uint16``, ``uint32`` …)."""

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary: every token id is below it."""

    @property
    def eod_id(self) -> int:
        """The end-of-document id, the last token of every document."""

    @property
    def tokenizer(self) -> Mapping[str, Any]:
        """The tokenizer's fields (``kind``, ``spec``, ``vocab_size``, ``eod_id``,
        ``eod_token``, ``fingerprint``, ``file``), as a store's manifest records them."""

    @property
    def n_tokens(self) -> int:
        """Tokens in the source."""

    @property
    def n_docs(self) -> int:
        """Documents in the source."""


class TokenStream(ABC):
    """The interface of a source, as the plan, the loader and the audit read it: a token stream
    (the concatenation of the token files of a byte reader, ``TokenFiles``) and its document
    starts, with the sample windows, documents and segments every format shares.

    A format (``Source`` for a tokentape store, ``MegatronSource`` for a Megatron prefix)
    passes its byte reader and document starts to ``__init__`` and implements the abstract
    members ``manifest``, ``eod_id``, ``tokenizer`` and ``directory``.
    """

    dtype: np.dtype
    """The dtype of the stored token ids (``tokens`` and ``window`` return arrays of it)."""

    def __init__(
        self,
        dtype: np.dtype,
        files: TokenFiles,
        doc_starts: np.ndarray | Callable[[], np.ndarray],
        n_docs: int | None = None,
    ) -> None:
        """``doc_starts``: the documents' first tokens in the stream, or a function that loads
        them when first needed (a training run that asks for no segments never does)."""
        self.dtype = dtype
        self.files = files
        self._shards = files.pieces
        sizes = np.array([len(p) for p in self._shards], dtype=np.int64)
        # Token offset of each piece in the stream, with the total appended.
        self._shard_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._doc_starts = doc_starts
        self._n_docs = n_docs

    def advise_random(self) -> None:
        """Tell the byte reader the source is read at random (sample windows all over it)."""
        self.files.advise_random()

    @property
    def fetches_ahead(self) -> bool:
        """Whether ``prefetch`` does anything (a source in object storage): the loader then
        tells it the samples of the next steps as soon as they are known."""
        return self.files.fetches_ahead

    @property
    def stats(self) -> FetchStats:
        """What reading the source fetched from object storage so far (0s on disk)."""
        return self.files.stats

    @cached_property
    def doc_starts(self) -> np.ndarray:
        """int64 first token of each document in the stream, ascending."""
        starts = self._doc_starts
        return starts() if callable(starts) else starts

    @property
    def n_tokens(self) -> int:
        """Tokens in the stream."""
        return int(self._shard_offsets[-1])

    @property
    def n_docs(self) -> int:
        """Documents in the stream."""
        return self._n_docs if self._n_docs is not None else len(self.doc_starts)

    @property
    @abstractmethod
    def manifest(self) -> SourceManifest:
        """What the source records about itself (identity, size, vocabulary)."""

    @property
    @abstractmethod
    def eod_id(self) -> int:
        """The end-of-document id, the last token of every document."""

    @property
    @abstractmethod
    def tokenizer(self) -> Tokenizer:
        """The tokenizer that decodes the ids (``decode``); may be loaded on first use."""

    @property
    @abstractmethod
    def directory(self) -> Path | str:
        """Where the source lives, as it was opened (a store's directory, a Megatron prefix):
        what messages name."""

    def n_samples(self, seq_len: int) -> int:
        """Windows of ``seq_len + 1`` tokens at stride ``seq_len``."""
        _check_seq_len(seq_len)
        return max(0, (self.n_tokens - 1) // seq_len)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the source, copied out of the shards they lie in."""
        start, stop = as_index("start", start), as_index("stop", stop)
        if not 0 <= start <= stop <= self.n_tokens:
            raise OutOfRangeError(
                f"token range [start, stop) = [{start}, {stop}) is not inside [0, "
                f"{self.n_tokens}) with start <= stop"
            )
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
        k = self._check_sample(k, seq_len)
        return self.tokens(k * seq_len, k * seq_len + seq_len + 1)

    def close(self) -> None:
        """Let go of what reading holds beyond the memory maps (fetch threads, cached ranges)."""
        self.files.close()

    def prefetch(self, samples: np.ndarray, seq_len: int) -> None:
        """Start reading the windows of ``samples`` in the background (object storage); on
        disk the page cache does it, and only the arguments are checked."""
        k = self._check_samples(samples, seq_len)
        if self.fetches_ahead:
            self.files.prefetch(self._window_ranges(k, seq_len))

    def _window_ranges(self, k: np.ndarray, seq_len: int) -> dict[int, list[tuple[int, int]]]:
        """The byte ranges of the windows of samples ``k`` (checked) at ``seq_len``, by token
        file."""
        item = self.dtype.itemsize
        offsets = self._shard_offsets
        ranges: dict[int, list[tuple[int, int]]] = {}
        starts = k * seq_len
        stops = starts + seq_len + 1
        first = np.searchsorted(offsets, starts, side="right") - 1
        last = np.searchsorted(offsets, stops - 1, side="right") - 1
        for a, b, s0, s1 in zip(
            starts.tolist(), stops.tolist(), first.tolist(), last.tolist(), strict=True
        ):
            for shard in range(s0, s1 + 1):
                off = int(offsets[shard])
                lo, hi = max(a, off) - off, min(b, int(offsets[shard + 1])) - off
                ranges.setdefault(shard, []).append((lo * item, hi * item))
        return ranges

    def windows_into(
        self, samples: np.ndarray, seq_len: int, out: np.ndarray, rows: np.ndarray | None = None
    ) -> None:
        """Copy samples ``samples`` (at ``seq_len``) into rows of ``out`` (width L+1): row i
        of the result goes to ``out[rows[i]]``, or ``out[i]`` without ``rows``.

        One slice copy per row from the token file (rows that cross a shard boundary are
        stitched); ``out`` may have any integer dtype wide enough for the ids. In object
        storage every window is fetched at once (``prefetch``) before the copy.
        """
        k = self._check_samples(samples, seq_len)
        if self.fetches_ahead:
            self.files.prefetch(self._window_ranges(k, seq_len))
        _check_array("out", out)
        targets = np.arange(k.size) if rows is None else _integers("rows", rows)
        if out.ndim != 2 or out.shape[1] != seq_len + 1:
            raise ArgumentError(f"out must have rows of seq_len + 1 = {seq_len + 1} tokens")
        if targets.shape != k.shape:
            raise ArgumentError(
                f"rows must have one entry per sample ({k.shape}), got {targets.shape}"
            )
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
        k = self._check_samples(samples, seq_len)
        width = seq_len + 1
        for name, array in (("segment", segment), ("position", position)):
            _check_array(name, array)
            if array.shape != (k.size, width):
                raise ArgumentError(f"{name} must have shape {(k.size, width)}, got {array.shape}")
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
        k = self._check_sample(k, seq_len)
        start, last = k * seq_len, k * seq_len + seq_len
        first_doc = int(np.searchsorted(self.doc_starts, start, side="right")) - 1
        last_doc = int(np.searchsorted(self.doc_starts, last, side="right")) - 1
        return list(range(first_doc, last_doc + 1))

    def _check_sample(self, k: int, seq_len: int) -> int:
        n = self.n_samples(seq_len)
        k = as_index("k", k)
        if not 0 <= k < n:
            raise OutOfRangeError(f"sample k = {k} is not in [0, {n}) at seq_len {seq_len}")
        return k

    def _check_samples(self, samples: np.ndarray, seq_len: int) -> np.ndarray:
        n = self.n_samples(seq_len)
        raw = _integers("samples", samples)
        if raw.ndim > 1:
            raise ArgumentError(f"samples must be one-dimensional, got shape {raw.shape}")
        k = raw.astype(np.int64).reshape(-1) if raw.size else np.zeros(0, dtype=np.int64)
        if k.size and (int(k.min()) < 0 or int(k.max()) >= n):
            bad = int(k[(k < 0) | (k >= n)][0])
            raise OutOfRangeError(f"samples: {bad} is not in [0, {n}) at seq_len {seq_len}")
        return k

    def doc_span(self, i: int) -> tuple[int, int]:
        """Token range of document ``i``, its end-of-document token included."""
        i = as_index("i", i)
        if not 0 <= i < self.n_docs:
            raise OutOfRangeError(f"document i = {i} is not in [0, {self.n_docs})")
        end = int(self.doc_starts[i + 1]) if i + 1 < self.n_docs else self.n_tokens
        return int(self.doc_starts[i]), end

    def provenance(self, doc: int) -> Origin | None:
        """Where document ``doc`` came from: its input, record there and the user's id for it;
        None when the source records none (a store made before provenance was recorded, a
        Megatron prefix)."""
        doc = as_index("doc", doc)
        if not 0 <= doc < self.n_docs:
            raise OutOfRangeError(f"document doc = {doc} is not in [0, {self.n_docs})")
        origins = self._origins()
        return None if origins is None else origins.of(doc)

    def inputs(self) -> list[dict[str, Any]] | None:
        """The inputs the store was made from, in order, and what each gave (path, kind, size,
        the id field read, documents read, kept and dropped); None when the source records no
        provenance."""
        origins = self._origins()
        return None if origins is None else origins.inputs()

    @property
    def has_provenance(self) -> bool:
        """Whether the source records where its documents came from (``provenance``)."""
        return self._origins() is not None

    def find_id(self, value: str) -> list[int]:
        """The documents whose id (the ``--id-key`` field of their record) is ``value``,
        ascending: [] when none has it, several when it is not unique. A binary search of the
        id keys the store keeps per shard.

        Raises:
            StoreError: The source records no provenance, or no id keys (an earlier store).
        """
        if not isinstance(value, str):
            raise ArgumentError(f"value must be a string (an id), got {shown(value)}")
        return self._recorded("find documents by id").find_id(value)

    def find_record(self, input: str | int, record: int) -> list[int]:
        """The document read from record ``record`` of an input (a jsonl line from 1, a parquet
        row from 0, 0 for a ``.txt`` file): [doc], or [] when that record gave no document
        (dropped by a filter, unreadable, beyond the input). ``input`` is the input's path as
        the inputs table writes it (or the same local file, or the one input whose path ends
        with it) or its index in the table.

        Raises:
            InputError: No such input, or a path matching several.
            StoreError: The source records no provenance.
        """
        record = as_index("record", record)
        given = input if isinstance(input, str) else as_index("input", input)
        origins = self._recorded("find documents by input and record")
        if isinstance(given, str):
            index = origins.input_index(given)
            if index is None:
                paths = [row["path"] for row in origins.inputs()]
                raise no_such_input(paths, given, str(self.directory))
        else:
            index = given
            if index >= len(origins.inputs()):
                raise OutOfRangeError(
                    f"input {index}: the store has inputs 0..{len(origins.inputs()) - 1}"
                )
        return origins.find_record(index, record)

    def _recorded(self, what: str) -> Origins:
        origins = self._origins()
        if origins is None:
            raise StoreError(
                f"{self.directory}: records no provenance (a store made before tokentape "
                f"recorded it, or a Megatron prefix): cannot {what}"
            )
        return origins

    def _origins(self) -> Origins | None:
        """What answers ``provenance``, if the source records it."""
        return None

    def doc(self, i: int) -> np.ndarray:
        """The tokens of document ``i``, without its end-of-document token."""
        start, end = self.doc_span(i)
        return self.tokens(start, end - 1)

    def decode(self, tokens: np.ndarray | list[int]) -> str:
        """The text of ``tokens`` (with ``tokenizer``)."""
        ids = _integers("tokens", tokens)
        if ids.ndim != 1:
            raise ArgumentError(f"tokens must be one-dimensional, got shape {ids.shape}")
        return self.tokenizer.decode([int(t) for t in ids])


class Source(TokenStream):
    """One token store opened for reading, on disk (``Source(directory)``) or at an object URL
    (``source_at_url(url)``); ``tokentape.open_source`` opens it and any other source.

    On disk, the manifest is read and checked, and every shard file and document index is
    mapped (read-only) and checked for its size, all from the same open directory: a store
    swapped in at the same name meanwhile (``tokenize --overwrite``) is opened whole, never
    mixed with the old one. The files' contents are not hashed (``tokentape verify`` does
    that).

    Args:
        directory: The store's directory (the one holding ``manifest.json``); a symbolic link
            to it is followed.

    Raises:
        ArgumentError: ``directory`` is not a path.
        StoreError: No such directory, no manifest (not a complete store), an invalid
            manifest, or a file it names missing, of the wrong size, not a regular file inside
            the directory (a link, a FIFO), or a document index that is not the expected
            array.
    """

    _manifest: Manifest
    _directory: Path | str
    _tokenizer_bytes: Callable[[], bytes | None]

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        if not isinstance(directory, str | os.PathLike):
            raise ArgumentError(f"directory must be a path, got {directory!r}")
        self._directory = path = Path(directory)
        for attempt in range(1, _OPEN_ATTEMPTS + 1):
            dir_fd = open_directory(path)
            try:
                self._open_in(path, dir_fd)
                return
            except TokentapeError:
                # A store swapped in at this name while we opened (tokenize --overwrite): the
                # files came from the old directory as it was being removed. Open the new one.
                if attempt == _OPEN_ATTEMPTS or not replaced(path, dir_fd):
                    raise
            finally:
                os.close(dir_fd)

    def _open_in(self, path: Path, dir_fd: int) -> None:
        """Read the manifest and map every file it names, all from the open directory."""
        self._manifest = manifest = read_manifest(path, dir_fd)
        dtype = numpy_dtype(manifest.dtype)
        shards, indexes = [], []
        for shard in manifest.shards:
            shards.append(_map_tokens(path, shard, dtype, dir_fd))
            indexes.append(_map_index(path, shard, dir_fd))
        copy = _map_tokenizer_copy(path, manifest, dir_fd)
        self._origins_of = _map_origins(path, manifest, dir_fd)

        def doc_starts() -> np.ndarray:
            """Every shard's document starts (mapped at open), checked and joined."""
            for shard, local in zip(manifest.shards, indexes, strict=True):
                check_starts(local, shard, path / shard.idx_file)
            return joined_starts(manifest.shards, indexes)

        def tokenizer_bytes() -> bytes | None:
            """The tokenizer copy as mapped at open (never read by path afterwards)."""
            name = manifest.tokenizer.get("file")
            if copy is None and name in STORED_NAMES:
                raise StoreError(
                    f"{path / name}: the tokenizer copy the manifest names was missing when "
                    "the store was opened"
                )
            return None if copy is None else bytes(copy)

        self._tokenizer_bytes = tokenizer_bytes
        super().__init__(dtype, MappedFiles(shards), doc_starts, manifest.n_docs)

    @property
    def manifest(self) -> Manifest:
        """The store's ``manifest.json``, as read when the store was opened."""
        return self._manifest

    @property
    def eod_id(self) -> int:
        """The end-of-document id the manifest records."""
        return self._manifest.eod_id

    @property
    def directory(self) -> Path | str:
        """The store's directory (a ``Path``), or its URL."""
        return self._directory

    def _origins(self) -> Origins | None:
        return self._origins_of

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer recorded in the manifest (loaded from the copy inside the store: as
        it was when the store was opened, on disk; fetched on first use, in a bucket)."""
        data = self._tokenizer_bytes()
        return tokenizer_from_manifest(self._manifest.tokenizer, self._directory, data)

    def __repr__(self) -> str:
        return (
            f"Source({str(self.directory)!r}, n_tokens={self.n_tokens}, n_docs={self.n_docs}, "
            f"dtype={self.manifest.dtype}, shards={len(self._shards)})"
        )


def source_at_url(
    url: str,
    storage_options: StorageOptions | None = None,
    fetch: FetchConfig | None = None,
    versions: Mapping[str, str] | None = None,
) -> Source:
    """A ``Source`` for the store at an object URL, read in place (``store.remote``): its
    manifest now, byte ranges of its shards when read, fetched ahead and cached.

    Args:
        url: The store's URL (the "directory" holding ``manifest.json``).
        storage_options: fsspec options (endpoint, region ...); credentials come from the
            environment or a profile.
        fetch: Requests in flight and bytes cached (default ``FetchConfig()``).
        versions: The ETag each file of the store had when the plan was made, by file
            name: a file must still have it, and every read of it is pinned to it.
    """
    self = Source.__new__(Source)
    objects = StoreObjects(object_store(url, storage_options), url, versions)
    self._directory, self._manifest = objects.url, objects.manifest
    self._origins_of = (
        None
        if objects.manifest.provenance is None
        else Origins(
            objects.url,
            objects.manifest,
            objects.shard_records,
            objects.inputs_bytes,
            objects.shard_keys if objects.manifest.provenance.has_id_keys else None,
        )
    )
    self._tokenizer_bytes = objects.tokenizer_bytes
    dtype = numpy_dtype(self._manifest.dtype)
    files = RangedFiles(
        objects.objects, dtype, objects.token_files(), fetch or FetchConfig(), objects.look
    )
    TokenStream.__init__(self, dtype, files, objects.doc_starts, self._manifest.n_docs)
    return self


def _map_tokenizer_copy(
    directory: Path, manifest: Manifest, dir_fd: int
) -> mmap.mmap | bytes | None:
    """The tokenizer copy the manifest names, mapped (not read) at open; None when the
    manifest names none or the file is missing (the tokenizer is then refused when asked
    for, as the store reads fine without it)."""
    name = manifest.tokenizer.get("file")
    if name not in STORED_NAMES:
        return None
    try:
        fd = open_inside(directory, name, "tokenizer copy", dir_fd)
    except TokentapeError:
        try:
            os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        raise
    with open(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)


def _map_origins(directory: Path, manifest: Manifest, dir_fd: int) -> Origins | None:
    """The store's provenance files, mapped at open (their sizes and the records' header
    checked; ``inputs.json`` read and checked against its sha256 when first used)."""
    block = manifest.provenance
    if block is None:
        return None
    shards: list[ShardRecords] = []
    for shard, files in zip(manifest.shards, block.shards, strict=True):
        rec_path = directory / shard.rec_file
        with open(open_inside(directory, shard.rec_file, "provenance records", dir_fd), "rb") as f:
            _check_size(rec_path, f.fileno(), files.rec_bytes)
            at = records_offset(f, shard.n_docs, str(rec_path))
            rows = np.memmap(f, dtype=RECORD, mode="r", offset=at, shape=(shard.n_docs,))
        with open(open_inside(directory, shard.ids_file, "document ids", dir_fd), "rb") as f:
            _check_size(directory / shard.ids_file, f.fileno(), files.ids_bytes)
            ids = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if files.ids_bytes else b""
        shards.append((rows, memoryview(ids)))
    with open(open_inside(directory, INPUTS_NAME, "inputs table", dir_fd), "rb") as f:
        _check_size(directory / INPUTS_NAME, f.fileno(), block.inputs_bytes)
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if block.inputs_bytes else b""

    def inputs() -> bytes:
        """The table as mapped at open (read now: a training rank never asks for it)."""
        table = bytes(mapped)
        if hashlib.sha256(table).hexdigest() != block.inputs_sha256:
            raise damaged(directory / INPUTS_NAME, "does not match the manifest's sha256")
        return table

    keys: dict[int, np.ndarray] = {}
    lock = threading.Lock()

    def shard_keys(index: int) -> np.ndarray:
        """Shard ``index``'s id keys, mapped on first use (a lookup by id; the store's
        directory opened again, as at open: its files are looked up inside it)."""
        with lock:
            if index not in keys:
                keys[index] = _map_keys(directory, manifest, index)
            return keys[index]

    found = shard_keys if block.has_id_keys else None
    return Origins(str(directory), manifest, shards.__getitem__, inputs, found)


def _map_keys(directory: Path, manifest: Manifest, index: int) -> np.ndarray:
    """Shard ``index``'s ``.idkeys.npy``, its size and header checked, memory-mapped."""
    shard = manifest.shards[index]
    assert manifest.provenance is not None
    size = manifest.provenance.shards[index].keys_bytes or 0
    path = directory / shard.keys_file
    dir_fd = open_directory(directory)
    try:
        with open(open_inside(directory, shard.keys_file, "id keys", dir_fd), "rb") as f:
            _check_size(path, f.fileno(), size)
            at = keys_offset(f, shard.n_docs, size, str(path))
            m = (size - at) // (2 * KEY_DTYPE.itemsize)
            if not m:
                return np.zeros((2, 0), dtype=KEY_DTYPE)
            return np.memmap(f, dtype=KEY_DTYPE, mode="r", offset=at, shape=(2, m))
    finally:
        os.close(dir_fd)


def window_bytes(
    source: TokenStream, samples: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the windows of ``samples`` at ``seq_len`` lie in ``source``: each one's token
    file (its first) and its byte range ``[start, stop)`` in that file (cut at the file's
    end)."""
    k = source._check_samples(samples, seq_len)
    offsets = source._shard_offsets
    starts = k * seq_len
    files = np.searchsorted(offsets, starts, side="right") - 1
    stops = np.minimum(starts + seq_len + 1, offsets[files + 1])
    item = source.dtype.itemsize
    return files, (starts - offsets[files]) * item, (stops - offsets[files]) * item


def total_stats(sources: Sequence[TokenStream]) -> FetchStats:
    """What ``sources`` fetched from object storage, added up."""
    return sum((s.stats for s in sources), FetchStats())


def _check_array(name: str, value: object) -> None:
    """An output array (written in place)."""
    if not isinstance(value, np.ndarray):
        raise ArgumentError(f"{name} must be a numpy array, got {type(value).__name__}")


def _integers(name: str, value: object) -> np.ndarray:
    """An array of integers, or what ``np.asarray`` reads as one (a list of ints, an int), as
    an array (an empty one of any dtype too); bools, floats, text and objects are refused."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # a ragged list, an object numpy cannot read
        raise ArgumentError(f"{name} must be integers, got {shown(value)}") from None
    if array.size and array.dtype.kind not in "iu":
        given = f"an array of {array.dtype}" if isinstance(value, np.ndarray) else shown(value)
        raise ArgumentError(f"{name} must be integers, got {given}")
    return array


def _check_seq_len(seq_len: int) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int | np.integer) or seq_len <= 0:
        raise ArgumentError(f"seq_len must be a positive integer, got {seq_len!r}")


__all__ = [
    "MappedFiles",
    "Source",
    "SourceManifest",
    "TokenFiles",
    "TokenPiece",
    "TokenStream",
    "source_at_url",
    "total_stats",
    "window_bytes",
]
