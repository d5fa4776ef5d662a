"""A Megatron prefix (``PREFIX.bin`` + ``PREFIX.idx``) read in place as a tokentape source.

``MegatronSource`` is the format; its token file is read through either byte reader: on disk
(``MegatronSource(prefix, ...)``) a read-only memory map of ``.bin``, with the document starts
from the ``.idx`` (itself memory-mapped), computed only when documents or segments are asked
for; at an object URL (``megatron_at_url(url, ...)``) byte ranges of the ``.bin`` object,
with an identity recorded beforehand (``megatron.remote``). What follows is about a prefix on
disk. A tokentape
document is a Megatron *document* (a run of sequences delimited by the document index), so a
document made of several sequences (sentences) is one document here. tokentape's contract needs
every document to end with the end-of-document id; the ``.idx`` records no vocabulary, so the
caller gives ``vocab_size`` and ``eod_id`` (or a tokenizer that has them).

Both files are opened once and their keys taken (``megatron.PrefixFiles``); an identity
recorded for those keys (by the plan, or in a sidecar: ``store.megatron_identity``) is
*current*. Opening checks, cheaply:

- the ``.idx`` header, sizes and counts, always; the document index and back-to-back sequences
  (an O(sequences) scan, ``store.megatron.read_index``) only without a current identity, whose
  sha256 of the ``.idx`` covers an index checked when it was recorded;
- that no document is empty and every document's last token is the EOD id. The identity
  records the id every document ends with, found while the data was hashed: while it is
  current, that id is compared and no token is read. Otherwise (the first open, changed files,
  an older sidecar, ``identify=False`` without a current identity) one vectorised gather reads
  every document's last token (a page of ``.bin`` per short document) and refuses the first
  offending document;
- the smallest and largest token id, recorded with the identity when the data is first hashed:
  no negative id, none at or above ``vocab_size``.

Without a current identity the data is hashed, unless ``hash_missing=False`` (the loader, on
every rank), which refuses the prefix naming the command to run once instead.

A tokenizer given as a spec is loaded only when something needs it (decoding, a preview, the
manifest's tokenizer fields) if the vocabulary size and EOD id are given too: a training rank
reads tokens without it. When it is loaded it must agree with them and, when the caller gives
one (a plan), with the recorded fingerprint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.megatron.format import (
    CHUNK,
    FileKeys,
    MegatronIdentity,
    MegatronIndex,
    PrefixFiles,
    bin_path,
    index_from_bytes,
    read_index,
)
from tokentape._src.megatron.identity import (
    SIDECAR,
    MegatronRecord,
    current_identity,
    megatron_identity,
    no_identity,
    racy,
    record_end_id,
)
from tokentape._src.megatron.remote import bin_url, idx_url
from tokentape._src.megatron.remote import current_identity as bucket_identity
from tokentape._src.objects.client import StorageOptions, object_store
from tokentape._src.objects.ranged import Blocks, FetchConfig, RangedFiles, sha256_check
from tokentape._src.store.reader import MappedFiles, TokenStream
from tokentape._src.store.tokenizers import (
    NoTokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_manifest,
)
from tokentape._src.util.checks import check_flag, check_optional_text, check_path, shown
from tokentape._src.util.progress import ProgressCallback, check_callback
from tokentape.errors import ArgumentError, PlanError, StoreError

MEGATRON = "megatron"

APPEND_EOD_HINT = (
    "tokentape needs every document to end with it (Megatron's preprocess_data.py "
    "--append-eod); `tokentape convert --from megatron --append-eod` makes a store that does"
)


@dataclass(frozen=True)
class MegatronManifest:
    """A Megatron source's counterpart of a store's ``manifest.json``: its identity and the
    vocabulary it is read with. ``tokenizer`` (the tokenizer's manifest fields) loads the
    tokenizer on first use."""

    prefix: str
    dtype: str
    vocab_size: int
    eod_id: int
    n_tokens: int
    n_docs: int
    n_sequences: int
    content_hash: str
    identity: MegatronIdentity
    format: str = MEGATRON
    tokenizer_of: Callable[[], Tokenizer] | None = field(default=None, repr=False, compare=False)

    @property
    def tokenizer(self) -> dict[str, Any]:
        if self.tokenizer_of is None:
            return tokenizer_manifest(NoTokenizer(self.vocab_size, self.eod_id))
        return tokenizer_manifest(self.tokenizer_of())


def resolve_vocabulary(
    vocab_size: int | None, eod_id: int | None, tokenizer: Tokenizer | None, where: str
) -> tuple[int, int]:
    """``vocab_size`` and ``eod_id`` as given, or taken from the tokenizer; checked."""
    if tokenizer is not None:
        for name, given, known in (
            ("vocab_size", vocab_size, tokenizer.vocab_size),
            ("eod_id", eod_id, tokenizer.eod_id),
        ):
            if given is not None and given != known:
                raise ArgumentError(
                    f"{where}: {name} {given} differs from the tokenizer's ({known}); give the "
                    "tokenizer's values or leave them out"
                )
        vocab_size, eod_id = tokenizer.vocab_size, tokenizer.eod_id
    for name, value in (("vocab_size", vocab_size), ("eod_id", eod_id)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | np.integer)
        ):
            raise ArgumentError(f"{where}: {name} must be an integer, got {value!r}")
    if vocab_size is None or eod_id is None:
        missing = "vocab_size" if vocab_size is None else "eod_id"
        raise ArgumentError(
            f"{where}: a Megatron .idx records no vocabulary: give {missing} (or a tokenizer)"
        )
    if vocab_size <= 0:
        raise ArgumentError(f"{where}: vocab_size must be positive, got {vocab_size}")
    if not 0 <= eod_id < vocab_size:
        raise ArgumentError(f"{where}: eod_id {eod_id} is not in [0, vocab_size = {vocab_size})")
    return vocab_size, eod_id


def check_documents(tokens: np.ndarray, doc_starts: np.ndarray, eod_id: int, where: str) -> None:
    """Refuse the first document that is empty or whose last token is not ``eod_id``."""
    n_docs, n_tokens = len(doc_starts), len(tokens)
    for lo in range(0, n_docs, CHUNK):
        starts = doc_starts[lo : lo + CHUNK]
        ends = doc_starts[lo + 1 : lo + CHUNK + 1]
        if lo + CHUNK >= n_docs:
            ends = np.append(ends, n_tokens)
        empty = ends <= starts
        last = tokens[np.maximum(ends - 1, 0)] if n_tokens else np.zeros(len(ends), np.int64)
        bad = np.flatnonzero(empty | (last != eod_id))
        if not bad.size:
            continue
        j = int(bad[0])
        if empty[j]:
            raise StoreError(
                f"{where}: document {lo + j} is empty, so it cannot end with the end-of-document "
                f"id {eod_id}; {APPEND_EOD_HINT}"
            )
        raise StoreError(
            f"{where}: document {lo + j} (tokens [{int(starts[j])}, {int(ends[j])})) ends "
            f"with id {int(last[j])}, not the end-of-document id {eod_id}; {APPEND_EOD_HINT}"
        )


def checked_tokenizer(spec: str, fingerprint: str | None, where: str) -> Tokenizer:
    """Load the tokenizer ``spec``; it must have the recorded ``fingerprint`` (when known)."""
    tok = load_tokenizer(spec)
    if fingerprint is not None and tok.fingerprint != fingerprint:
        raise PlanError(
            f"{where}: tokenizer '{spec}' has fingerprint {tok.fingerprint}, the plan "
            f"recorded {fingerprint}: the tokenizer changed since the plan was made"
        )
    return tok


def id_range_problem(identity: MegatronIdentity, vocab_size: int) -> str | None:
    """What is wrong with the identity's id range for ``vocab_size`` (a negative id, one at or
    above it), or None."""
    if identity.min_id is not None and identity.min_id < 0:
        return f"holds the negative token id {identity.min_id}"
    if identity.max_id is not None and identity.max_id >= vocab_size:
        return f"holds token id {identity.max_id}, not below vocab_size {vocab_size}"
    return None


class Vocabulary:
    """A Megatron source's vocabulary size and EOD id, as given or from its tokenizer, and the
    tokenizer itself: a spec is loaded only when the two values are not given or something
    needs it (decoding), and must then agree with them and with a recorded fingerprint."""

    def __init__(
        self,
        vocab_size: int | None,
        eod_id: int | None,
        tokenizer: str | Tokenizer | None,
        fingerprint: str | None,
        where: str,
    ) -> None:
        self.where, self._fingerprint = where, fingerprint
        self._spec = tokenizer if isinstance(tokenizer, str) else None
        self._loaded = None if isinstance(tokenizer, str) else tokenizer
        if self._spec is not None and (vocab_size is None or eod_id is None):
            self._loaded = checked_tokenizer(self._spec, fingerprint, where)
        self.vocab_size, self.eod_id = resolve_vocabulary(vocab_size, eod_id, self._loaded, where)

    def tokenizer(self) -> Tokenizer:
        """The tokenizer given (a spec is loaded now, and checked), or a stand-in that shows ids
        (no tokenizer known)."""
        if self._loaded is None and self._spec is not None:
            tok = checked_tokenizer(self._spec, self._fingerprint, self.where)
            resolve_vocabulary(self.vocab_size, self.eod_id, tok, self.where)
            self._loaded = tok
        if self._loaded is not None:
            return self._loaded
        return NoTokenizer(self.vocab_size, self.eod_id)

    def manifest(
        self, prefix: str, identity: MegatronIdentity, tokenizer_of: Callable[[], Tokenizer]
    ) -> MegatronManifest:
        """The manifest of the source at ``prefix`` with ``identity``, read with this
        vocabulary."""
        return MegatronManifest(
            prefix=prefix,
            dtype=identity.dtype,
            vocab_size=self.vocab_size,
            eod_id=self.eod_id,
            n_tokens=identity.n_tokens,
            n_docs=identity.n_docs,
            n_sequences=identity.n_sequences,
            content_hash=identity.content_hash,
            identity=identity,
            tokenizer_of=tokenizer_of,
        )


def _check_arguments(
    prefix: object,
    tokenizer: object,
    progress: object,
    planned: object,
    fingerprint: object,
    flags: dict[str, object],
) -> None:
    """The types of ``MegatronSource``'s arguments (``vocab_size`` and ``eod_id``: see
    ``resolve_vocabulary``), each refused naming it."""
    check_path("prefix", prefix)
    loaded = ("vocab_size", "eod_id", "decode")  # what a Tokenizer has
    if not isinstance(tokenizer, str | None) and not all(hasattr(tokenizer, a) for a in loaded):
        raise ArgumentError(
            f"tokenizer must be a tokenizer spec, a tokenizer or None, got {shown(tokenizer)}"
        )
    check_callback(progress)
    if planned is not None and not (
        isinstance(planned, tuple)
        and len(planned) == 2
        and isinstance(planned[0], FileKeys)
        and isinstance(planned[1], MegatronIdentity)
    ):
        raise ArgumentError(
            f"planned must be a (FileKeys, MegatronIdentity) pair or None, got {shown(planned)}"
        )
    check_optional_text("fingerprint", fingerprint)
    for name, value in flags.items():
        check_flag(name, value)


class MegatronSource(TokenStream):
    """A Megatron prefix opened for reading, with the interface of ``reader.Source``: on disk
    (``MegatronSource(prefix, ...)``, memory-mapped) or at an object URL
    (``megatron_at_url(url, ...)``, read in byte ranges: ``megatron.remote``)."""

    vocab: Vocabulary
    _directory: Path | str
    _bin: str
    _index: MegatronIndex | None
    _known: MegatronIdentity | None
    _origin: str | None
    _progress: ProgressCallback | None
    _n_sequences: int

    def __init__(
        self,
        prefix: str | os.PathLike[str],
        vocab_size: int | None = None,
        eod_id: int | None = None,
        tokenizer: str | Tokenizer | None = None,
        *,
        check_eod: bool = True,
        identify: bool = True,
        progress: ProgressCallback | None = None,
        planned: tuple[FileKeys, MegatronIdentity] | None = None,
        hash_missing: bool = True,
        fingerprint: str | None = None,
    ) -> None:
        """Open ``prefix`` and check it (what is checked, and when: see the module's docstring).

        Args:
            prefix: The Megatron prefix: ``PREFIX`` of ``PREFIX.bin`` and ``PREFIX.idx``.
            vocab_size: The vocabulary size (the ``.idx`` records none); None: the tokenizer's.
            eod_id: The end-of-document id every document ends with; None: the tokenizer's.
            tokenizer: A tokenizer or its spec (as for ``tokentape tokenize``); a spec is
                loaded only when something needs it if ``vocab_size`` and ``eod_id`` are
                given. None: no tokenizer (decoding shows ids).
            check_eod: Check that every document ends with ``eod_id``; False skips the check
                (a conversion appending the EOD).
            identify: Establish the identity (hash and id range) now; False defers it to the
                first use of ``manifest``.
            progress: Receives the hashing's progress (if it must hash); None: no reports.
            planned: The files' keys and identity a plan recorded (used while the keys
                match); None: the plan recorded none.
            hash_missing: Hash a prefix without a current identity; False refuses it instead,
                naming the command to run once (every rank of a training run opens it).
            fingerprint: The tokenizer's fingerprint a plan recorded: a spec loaded must have
                it. None: not checked.

        Raises:
            ArgumentError: An argument of the wrong type (the message names it);
                ``vocab_size`` or ``eod_id`` missing (and no tokenizer), not an integer, out
                of range (``eod_id`` not below ``vocab_size``), or different from the
                tokenizer's.
            InputError: The tokenizer spec cannot be loaded.
            PlanError: The tokenizer loaded has another fingerprint than ``fingerprint``.
            StoreError: ``PREFIX.bin`` or ``PREFIX.idx`` is missing or damaged; a document is
                empty or does not end with ``eod_id``; the data holds an id outside the
                vocabulary (checked with the identity); or, with ``hash_missing=False``, there
                is no current identity.
        """
        _check_arguments(
            prefix, tokenizer, progress, planned, fingerprint,
            {"check_eod": check_eod, "identify": identify, "hash_missing": hash_missing},
        )  # fmt: skip
        self._directory, self._bin = Path(prefix), str(bin_path(prefix))
        where = f"Megatron prefix '{prefix}'"
        self.vocab = Vocabulary(vocab_size, eod_id, tokenizer, fingerprint, where)
        self._progress = progress
        with PrefixFiles(prefix) as files:
            known, origin = current_identity(files, planned)
            if known is None and not hash_missing:
                raise no_identity(self._directory, planned is not None)
            index = read_index(prefix, files, None if known is None else known.n_tokens)
            data: np.ndarray
            if index.n_tokens:
                shape = (index.n_tokens,)
                data = np.memmap(files.bin, dtype=index.dtype, mode="r", shape=shape)
            else:
                data = np.zeros(0, dtype=index.dtype)
        self._index, self._known, self._origin = index, known, origin
        self._n_sequences = index.n_sequences
        super().__init__(index.dtype, MappedFiles([data]), index.doc_starts, index.n_docs)
        if check_eod:
            self._check_ends(data, where, update_sidecar=hash_missing)
        if identify:
            _ = self.manifest

    def _check_ends(self, data: np.ndarray, where: str, update_sidecar: bool) -> None:
        """Every document ends with the EOD id: known from a current identity's end id without
        reading ``.bin``, else checked at every document end (before any hashing, so bad data
        is refused at once) and, for a sidecar that lacks the end id, recorded (when
        ``update_sidecar``)."""
        known = self._known
        if known is not None and known.end_id == self.eod_id:
            return
        check_documents(data, self.doc_starts, self.eod_id, where)
        if known is not None and self.n_docs:
            self._known = replace(known, end_id=self.eod_id)
            if update_sidecar and self._origin == SIDECAR:
                record_end_id(self.index, known, self.eod_id)

    def _check_id_range(self, identity: MegatronIdentity) -> None:
        """Refuse data with a negative id or one at or above ``vocab_size``."""
        problem = id_range_problem(identity, self.vocab_size)
        if problem is not None:
            raise StoreError(f"{self._bin}: {problem}")

    @property
    def directory(self) -> Path | str:
        """The prefix (``PREFIX`` of ``PREFIX.bin`` and ``PREFIX.idx``; a ``Path``, or its
        URL): where the source lives, as for a store."""
        return self._directory

    @property
    def index(self) -> MegatronIndex:
        """The ``.idx`` as mapped at open (a prefix on disk only)."""
        if self._index is None:
            raise StoreError(
                f"Megatron prefix '{self._directory}': in object storage, its index is not "
                "mapped (it is fetched whole when documents are first asked for)"
            )
        return self._index

    @property
    def eod_id(self) -> int:
        """The end-of-document id given (or the tokenizer's)."""
        return self.vocab.eod_id

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    @property
    def n_sequences(self) -> int:
        return self._n_sequences

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer given (a spec is loaded now, and checked), or a stand-in that shows ids
        (no tokenizer known)."""
        return self.vocab.tokenizer()

    @cached_property
    def manifest(self) -> MegatronManifest:
        """The identity (current, or hashed now) and the vocabulary; refuses data with a
        negative id or one at or above ``vocab_size``."""
        identity = self._known
        if identity is None:
            identity = self._known = megatron_identity(self.index, self._progress)
        self._check_id_range(identity)
        return self.vocab.manifest(str(self._directory), identity, lambda: self.tokenizer)

    def plan_record(self) -> MegatronRecord | None:
        """What a plan records of this source (its identity, hashed now if need be, and the
        files' keys); None while the files are too recent for their keys to vouch for them,
        and for a prefix in object storage (its sidecar records its identity)."""
        identity = self.manifest.identity
        if self._index is None:
            return None
        keys = self._index.keys
        if keys is None or racy(keys, self._index.taken_ns):
            return None
        return MegatronRecord.of(keys, identity)

    def __repr__(self) -> str:
        return (
            f"MegatronSource({str(self.directory)!r}, n_tokens={self.n_tokens}, "
            f"n_docs={self.n_docs}, n_sequences={self.n_sequences}, "
            f"dtype={self.dtype.name})"
        )


def megatron_at_url(
    url: str,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    tokenizer: str | None = None,
    *,
    storage_options: StorageOptions | None = None,
    fetch: FetchConfig | None = None,
    fingerprint: str | None = None,
) -> MegatronSource:
    """A ``MegatronSource`` for the prefix at an object URL, read in place: its identity from
    the sidecar ``tokentape verify URL`` records (never hashed here), token windows as byte
    ranges of the ``.bin`` object with whole blocks checked against the recorded block hashes,
    the document starts from the ``.idx`` fetched whole on first use and checked against its
    recorded sha256. Every read is pinned to the objects' versions (ETags).

    Args:
        url: The prefix's URL (``PREFIX`` of ``PREFIX.bin`` and ``PREFIX.idx``).
        vocab_size: The vocabulary size (the ``.idx`` records none); None: the
            tokenizer's.
        eod_id: The end-of-document id every document ends with; None: the tokenizer's.
        tokenizer: A tokenizer spec (loaded only when needed if both values are given).
        storage_options: fsspec options (endpoint, region ...).
        fetch: Requests in flight and bytes cached.
        fingerprint: The tokenizer fingerprint a plan recorded (a spec loaded must have
            it).

    Raises:
        ArgumentError: The vocabulary is missing or inconsistent.
        StoreError: An object is missing; there is no current identity; the data holds
            an id outside the vocabulary, or its documents do not all end with
            ``eod_id``.
    """
    self = MegatronSource.__new__(MegatronSource)
    url = url.rstrip("/")
    self._directory, self._bin = url, bin_url(url)
    where = f"Megatron prefix '{url}'"
    self.vocab = Vocabulary(vocab_size, eod_id, tokenizer, fingerprint, where)
    objects = object_store(url, storage_options)
    identity, keys = bucket_identity(objects, url)
    self._check_id_range(identity)
    if identity.n_docs and identity.end_id != self.vocab.eod_id:
        ends = (
            "not every document ends with one id (an empty document, or different last tokens)"
            if identity.end_id is None
            else f"its documents end with id {identity.end_id}"
        )
        raise StoreError(
            f"{where}: {ends}, not the end-of-document id {self.vocab.eod_id}; {APPEND_EOD_HINT}"
        )
    self._index, self._known, self._origin, self._progress = None, identity, None, None
    self._n_sequences = identity.n_sequences
    blocks = Blocks(
        identity.block_bytes, identity.block_sha256, identity.bin_bytes, keys.bin.version
    )
    dtype = np.dtype(identity.dtype)
    files = RangedFiles(
        objects, dtype, [(self._bin, identity.n_tokens, blocks)], fetch or FetchConfig()
    )

    def doc_starts() -> np.ndarray:
        """The ``.idx`` object, checked against its recorded sha256, parsed."""
        check = sha256_check(identity.idx_sha256, "the sha256 its sidecar records")
        data = objects.read_checked(idx_url(url), 0, identity.idx_bytes, check, keys.idx.version)
        index = index_from_bytes(url, data, identity.bin_bytes, identity.n_tokens)
        return index.doc_starts()

    TokenStream.__init__(self, dtype, files, doc_starts, identity.n_docs)
    return self


__all__ = [
    "APPEND_EOD_HINT",
    "MEGATRON",
    "MegatronManifest",
    "MegatronSource",
    "Vocabulary",
    "check_documents",
    "id_range_problem",
    "megatron_at_url",
]
