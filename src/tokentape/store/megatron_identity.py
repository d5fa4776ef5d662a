"""The identity of a Megatron prefix, computed once and cached beside it.

A Megatron source's content hash covers every byte of ``PREFIX.bin`` and ``PREFIX.idx``.
Hashing a multi-GB ``.bin`` whenever a plan is resolved or a loader starts would be slow, so the
identity (``MegatronIdentity``: both sha256, the ``.bin`` block hashes, the smallest and largest
token id, the content hash, and the id every document ends with) is written once to a sidecar
file together with the size, ``mtime_ns`` and inode of both files. It is reused only while all
of those are unchanged; otherwise the files are hashed again (with a progress bar on a
terminal). The cache saves time and nothing else: the identity is the same function of the
bytes either way.

The end id lets an open check the end-of-document id without reading a page of ``.bin`` per
document: it is found while hashing (the last token of each document, as the chunks stream
past). A sidecar written before it was recorded lacks it; the open then checks the document
ends itself and adds the id to the sidecar (``record_end_id``).

File timestamps are coarse (a clock tick of a few milliseconds), so a file written again within
the tick it was hashed in would keep its ``mtime_ns``: an identity is not cached while either
file was modified less than ``RACY_SECONDS`` ago (the next open hashes again), except by the
writer that has just produced the bytes itself (``tokentape convert``).

The sidecar is ``PREFIX.tokentape.json``; where the data's directory is read-only it goes to
``$TOKENTAPE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/tokentape``, else
``~/.cache/tokentape``), named after a hash of the prefix's absolute path.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from tokentape.errors import TokentapeError
from tokentape.store.atomic import write_atomic
from tokentape.store.format import DEFAULT_BLOCK_BYTES
from tokentape.store.megatron import (
    CHUNK,
    DTYPE_NAMES,
    EndIds,
    IdRange,
    MegatronIdentity,
    MegatronIndex,
    bin_path,
    content_hash,
    idx_path,
)
from tokentape.store.writer import BlockHasher
from tokentape.tokenize.progress import bytes_progress

SIDECAR_SUFFIX = ".tokentape.json"
SIDECAR_FORMAT = "tokentape.megatron-identity"
SIDECAR_VERSION = 1
RACY_SECONDS = 2.0
"""Files modified more recently than this are not cached (see the module docstring)."""
CHUNK_BYTES = 8 * 2**20
"""Bytes read (and hashed) at a time."""

Progress = Callable[[int], None]
"""Called with the bytes just read."""


def file_key(path: Path) -> dict[str, int]:
    """What must not change for a cached identity to stand: size, mtime_ns and inode (not the
    device number, which differs between machines mounting one shared file system)."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def file_keys(prefix: Path) -> dict[str, dict[str, int]]:
    return {"bin": file_key(bin_path(prefix)), "idx": file_key(idx_path(prefix))}


def cache_dir() -> Path:
    """Where sidecars go when the data's directory is read-only."""
    if os.environ.get("TOKENTAPE_CACHE_DIR"):
        return Path(os.environ["TOKENTAPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tokentape"


def sidecar_paths(prefix: Path) -> list[Path]:
    """Where a prefix's sidecar may be, in the order looked at: beside it, then the cache."""
    absolute = os.path.abspath(prefix)
    name = "megatron-" + hashlib.sha256(absolute.encode()).hexdigest()[:24] + ".json"
    return [Path(absolute + SIDECAR_SUFFIX), cache_dir() / name]


def identity_to_json(identity: MegatronIdentity) -> dict[str, Any]:
    return asdict(identity) | {"block_sha256": list(identity.block_sha256)}


def identity_from_json(data: Any) -> MegatronIdentity | None:
    """The identity recorded in a sidecar, or None when it is not a well-formed record."""
    if not isinstance(data, dict):
        return None
    try:
        identity = MegatronIdentity(**data | {"block_sha256": tuple(data["block_sha256"])})
    except (TypeError, KeyError):
        return None
    if identity.end_id is not None and type(identity.end_id) is not int:
        return None
    recomputed = content_hash(
        identity.dtype, identity.n_tokens, identity.n_docs, identity.bin_sha256, identity.idx_sha256
    )
    return identity if recomputed == identity.content_hash else None


def read_sidecar(prefix: Path, keys: dict[str, dict[str, int]] | None) -> MegatronIdentity | None:
    """The cached identity of ``prefix`` if a sidecar records it for files with ``keys`` (any
    recorded identity when ``keys`` is None: what ``verify`` checks the files against)."""
    for path in sidecar_paths(prefix):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
            continue
        if data.get("version") != SIDECAR_VERSION:
            continue
        if keys is not None and data.get("files") != keys:
            continue
        identity = identity_from_json(data.get("identity"))
        if identity is not None:
            return identity
    return None


def racy(keys: dict[str, dict[str, int]]) -> bool:
    """Whether a file was modified too recently for its timestamp to tell a later change."""
    now = time.time_ns()
    return any(k["mtime_ns"] > now - RACY_SECONDS * 1e9 for k in keys.values())


def write_sidecar(
    prefix: Path, identity: MegatronIdentity, keys: dict[str, dict[str, int]], writer: bool = False
) -> Path | None:
    """Cache ``identity`` beside the prefix, else in the cache directory; where it went (None
    when neither place is writable, or when the files are too recent to cache unless
    ``writer``, who produced the bytes itself: the identity is then recomputed next time)."""
    if not writer and racy(keys):
        return None
    data = {
        "format": SIDECAR_FORMAT,
        "version": SIDECAR_VERSION,
        "prefix": os.path.abspath(prefix),
        "files": keys,
        "identity": identity_to_json(identity),
    }
    text = (json.dumps(data, indent=2) + "\n").encode()
    for path in sidecar_paths(prefix):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text)
        except OSError:
            continue
        return path
    return None


def hash_files(
    index: MegatronIndex, progress: Progress | None = None, block_bytes: int = DEFAULT_BLOCK_BYTES
) -> MegatronIdentity:
    """Read both files once: sha256 of each, ``.bin`` block hashes, the id range and the id
    every document ends with."""
    hasher, ids, ends = BlockHasher(block_bytes), IdRange(), _DocumentEnds(index)
    buf = bytearray(CHUNK_BYTES - CHUNK_BYTES % index.dtype.itemsize)
    view = memoryview(buf)
    path = bin_path(index.prefix)
    first = 0  # token offset of the chunk
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            hasher.update(view[:n])
            tokens = _as_tokens(view[:n], index)
            ids.update(tokens)
            ends.update(first, tokens)
            first += len(tokens)
            if progress is not None:
                progress(n)
    bin_sha, blocks = hasher.finish()
    idx = hashlib.sha256()
    with open(idx_path(index.prefix), "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            idx.update(chunk)
    name = DTYPE_NAMES[index.code]
    return MegatronIdentity(
        dtype=name,
        n_tokens=index.n_tokens,
        n_docs=index.n_docs,
        n_sequences=index.n_sequences,
        bin_bytes=index.n_tokens * index.dtype.itemsize,
        idx_bytes=index.idx_bytes,
        bin_sha256=bin_sha,
        idx_sha256=idx.hexdigest(),
        block_bytes=block_bytes,
        block_sha256=blocks,
        min_id=ids.min,
        max_id=ids.max,
        content_hash=content_hash(name, index.n_tokens, index.n_docs, bin_sha, idx.hexdigest()),
        end_id=ends.value,
    )


def _as_tokens(data: memoryview, index: MegatronIndex) -> np.ndarray:
    return np.frombuffer(data, dtype=index.dtype, count=len(data) // index.dtype.itemsize)


def _last_tokens(index: MegatronIndex) -> Iterator[np.ndarray | None]:
    """Where each document's last token is in ``.bin`` (token offsets, ascending), ``CHUNK``
    documents at a time; ``None`` for a chunk holding an empty document."""
    docs, pointers = index.document_indices, index.sequence_pointers
    itemsize, n_seq = index.dtype.itemsize, index.n_sequences
    for lo in range(0, index.n_docs, CHUNK):
        seqs = np.asarray(docs[lo : lo + CHUNK + 1])  # each document's first sequence, and next
        offsets = np.full(len(seqs), index.n_tokens, dtype=np.int64)
        inside = seqs < n_seq
        offsets[inside] = np.asarray(pointers[seqs[inside]]) // itemsize
        if (np.diff(offsets) <= 0).any():
            yield None
            return
        yield offsets[1:] - 1


_DONE = np.zeros(0, dtype=np.int64)
"""``_last_tokens`` has no more chunks."""


class _DocumentEnds:
    """The id every document ends with, from ``.bin`` chunks read in order."""

    def __init__(self, index: MegatronIndex) -> None:
        self.ends = EndIds()
        self._chunks = _last_tokens(index)
        self._pending = np.zeros(0, dtype=np.int64)  # last-token offsets not yet reached

    def update(self, first: int, tokens: np.ndarray) -> None:
        """Take the last tokens of documents ending in ``tokens`` (offsets ``first`` on)."""
        stop = first + len(tokens)
        while not self.ends.mixed:
            if not self._pending.size:
                chunk = next(self._chunks, _DONE)
                if chunk is None:
                    self.ends.empty()
                    return
                if chunk is _DONE:
                    return
                self._pending = chunk
            k = int(np.searchsorted(self._pending, stop))
            self.ends.update(tokens[self._pending[:k] - first])
            self._pending = self._pending[k:]
            if self._pending.size:
                return

    @property
    def value(self) -> int | None:
        """The end id, once every chunk of ``.bin`` has been seen."""
        if self._pending.size or next(self._chunks, _DONE) is not _DONE:
            return None  # documents ending past the tokens seen (or an empty one there)
        return self.ends.value


def current_identity(
    index: MegatronIndex,
) -> tuple[MegatronIdentity | None, dict[str, dict[str, int]]]:
    """The identity a sidecar records for the files as they are now (``None`` if none does),
    read without hashing; and the files' keys it was looked up with."""
    keys = file_keys(index.prefix)
    cached = read_sidecar(index.prefix, keys)
    if cached is None or (cached.n_tokens, cached.n_docs) != (index.n_tokens, index.n_docs):
        return None, keys
    return cached, keys


def record_end_id(
    index: MegatronIndex, identity: MegatronIdentity, keys: dict[str, dict[str, int]], end_id: int
) -> None:
    """Add ``end_id`` (every document ends with it: checked by the caller on the files with
    ``keys``) to the cached ``identity`` if it lacks it (a sidecar written before the end id was
    recorded) and the files are still unchanged."""
    if identity.end_id != end_id and file_keys(index.prefix) == keys:
        write_sidecar(index.prefix, replace(identity, end_id=end_id), keys)


def megatron_identity(index: MegatronIndex, show_progress: bool = True) -> MegatronIdentity:
    """The identity of ``index.prefix``: from its sidecar when the files are unchanged, else
    hashed (a progress bar on a terminal when ``show_progress``) and cached."""
    prefix = index.prefix
    cached, keys = current_identity(index)
    if cached is not None:
        return cached
    total = keys["bin"]["size"]
    stream = sys.stderr if show_progress else None
    with bytes_progress(total, f"hashing {prefix.name}", stream) as progress:
        identity = hash_files(index, progress)
    if file_keys(prefix) != keys:
        raise TokentapeError(
            f"{prefix}: .bin or .idx changed while it was being hashed; try again once the "
            "files are complete"
        )
    write_sidecar(prefix, identity, keys)
    return identity
