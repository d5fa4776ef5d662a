"""A token store in object storage, read in place: exact byte ranges, fetched ahead, cached.

``store.reader.source_at_url`` opens a store at an object URL (``s3://bucket/stores/web``):
what it reads through ``StoreObjects``, over the byte reader ``objects.ranged.RangedFiles``.
Opening reads ``manifest.json`` only. Token windows are read as the exact byte ranges they
cover: ``prefetch`` (called with the samples of the next steps, whose positions are known in
advance) computes every window's range, merges ranges that touch or overlap, and starts ranged
GETs on a bounded pool (``concurrency`` requests in flight); ``windows_into`` then copies from
those fetches, waiting only for what has not arrived. Fetched ranges are kept in a cache of at
most ``cache_bytes`` (least recently used go first). A range that covers a whole hash block of
a shard (``ShardInfo.block_sha256``) is checked against its hash before it is used; the rest
is checked by its length (a body cut short is retried, ``objects.client``). Document starts (for
segments, replay and locate) are read whole, one ``.idx.npy`` per shard, on first use.

Every shard's size and version (ETag) are looked at (one HEAD) before its first range is read:
a store cut short or replaced in the bucket is refused by name, like a local one. Every GET of
the shard then carries that ETag (or the one the plan recorded, ``versions``, which the object
must still have) as ``If-Match``: an object rewritten in place while it is read, even at the
same size, fails the read with ``StoreChanged`` naming it instead of serving other bytes.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tokentape._src.objects.client import (
    ObjectInfo,
    ObjectStore,
    basename,
    join,
    parent,
    redact,
)
from tokentape._src.objects.ranged import Blocks, sha256_check
from tokentape._src.store.format import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    block_record_problem,
    numpy_dtype,
    store_files,
)
from tokentape._src.store.format import parse_manifest as parse_manifest_text
from tokentape._src.store.index import INDEX_DTYPE, check_starts, index_offset, joined_starts
from tokentape._src.store.origins import ShardRecords, keys_offset, records_offset
from tokentape._src.store.provenance import INPUTS_NAME, KEY_DTYPE, RECORD
from tokentape._src.store.tokenizers import STORED_NAMES
from tokentape.errors import StoreChanged, StoreError


class StoreObjects:
    """The objects of a tokentape store at ``url``, as a ``Source`` reads them: its manifest
    (read now), its shards' URLs and block hashes, the first look at each shard before it is
    read, its document starts and its tokenizer copy.

    Args:
        objects: The object store holding the store.
        url: The store's URL (the "directory" holding ``manifest.json``).
        versions: The ETag each file of the store had when the plan was made, by file name:
            a file must still have it, and every read of it is pinned to it.
    """

    def __init__(
        self, objects: ObjectStore, url: str, versions: Mapping[str, str] | None = None
    ) -> None:
        self.objects, self.url = objects, url.rstrip("/")
        self.versions = dict(versions or {})
        self.manifest = read_remote_manifest(objects, self.url)
        self.itemsize = numpy_dtype(self.manifest.dtype).itemsize
        self._records: dict[int, ShardRecords] = {}
        self._keys: dict[int, np.ndarray] = {}
        self._records_lock = threading.Lock()
        self._files = []
        for shard in self.manifest.shards:
            size = shard.n_tokens * self.itemsize
            problem = block_record_problem(shard, size)
            if problem is not None:  # its blocks could not be checked
                raise StoreError(f"{join(self.url, MANIFEST_NAME)}: {problem}")
            blocks = Blocks(shard.block_bytes, shard.block_sha256, size)
            self._files.append((join(self.url, shard.bin_file), shard.n_tokens, blocks))

    def token_files(self) -> list[tuple[str, int, Blocks]]:
        """Each shard's ``.bin``: its URL, token count and block hashes."""
        return list(self._files)

    def look(self, index: int) -> str:
        """Refuse shard ``index`` unless its ``.bin`` has the size the manifest says and the
        version the plan recorded (if it did); the version its reads are pinned to."""
        shard = self.manifest.shards[index]
        url = join(self.url, shard.bin_file)
        try:
            info = self.objects.info(url)
        except PermissionError as exc:
            raise StoreError(f"{url}: access denied ({redact(str(exc))})") from None
        expected = shard.n_tokens * self.itemsize
        if info is None:
            raise StoreError(f"{url}: shard file is missing; the store is damaged")
        if info.size != expected:
            raise StoreError(
                f"{url}: size is {info.size} bytes, the manifest says {expected}; the store is "
                "damaged (run `tokentape verify`)"
            )
        recorded = self.versions.get(shard.bin_file)
        if recorded and info.version and info.version != recorded:
            raise StoreChanged(
                f"{url}: the object was rewritten since the plan recorded it (ETag "
                f"{info.version}, the plan recorded {recorded}); it is not the object planned: "
                "re-run `tokentape plan` (and `tokentape verify` the store)",
                path=url,
            )
        return recorded or info.version

    def doc_starts(self) -> np.ndarray:
        """Every shard's ``.idx.npy``, fetched in parallel, checked, offset and joined."""
        shards = self.manifest.shards
        with ThreadPoolExecutor(max(1, min(16, len(shards)))) as pool:
            indexes = list(pool.map(self._shard_starts, shards))
        return joined_starts(shards, indexes)

    def _shard_starts(self, shard: ShardInfo) -> np.ndarray:
        """A shard's document starts, its ``.idx.npy`` checked against the manifest's hash
        (fetched again when it does not match, up to the retry budget)."""
        url = join(self.url, shard.idx_file)
        etag = self.versions.get(shard.idx_file, "")
        data = self.objects.read_checked(url, 0, shard.idx_bytes, idx_check(shard), etag)
        at = index_offset(io.BytesIO(data), shard, url)
        local = np.frombuffer(data, dtype=INDEX_DTYPE, count=shard.n_docs, offset=at)
        check_starts(local, shard, url)
        return local

    def shard_records(self, index: int) -> ShardRecords:
        """Shard ``index``'s provenance files, fetched (once) and checked against the
        manifest's sha256 and the shard's document count."""
        with self._records_lock:
            if index not in self._records:
                self._records[index] = self._fetch_records(index)
            return self._records[index]

    def _fetch_records(self, index: int) -> ShardRecords:
        shard = self.manifest.shards[index]
        block = self.manifest.provenance
        assert block is not None  # asked only of a store that records provenance
        files = block.shards[index]
        fetched = []
        for name, size, digest in (
            (shard.rec_file, files.rec_bytes, files.rec_sha256),
            (shard.ids_file, files.ids_bytes, files.ids_sha256),
        ):
            url = join(self.url, name)
            check = sha256_check(digest, "the manifest's sha256")
            fetched.append(
                self.objects.read_checked(url, 0, size, check, self.versions.get(name, ""))
            )
        rec_url = join(self.url, shard.rec_file)
        at = records_offset(io.BytesIO(fetched[0]), shard.n_docs, rec_url)
        rows = np.frombuffer(fetched[0], dtype=RECORD, count=shard.n_docs, offset=at)
        return rows, fetched[1]

    def shard_keys(self, index: int) -> np.ndarray:
        """Shard ``index``'s id keys, fetched (once) and checked against the manifest's sha256
        and the shard's document count."""
        with self._records_lock:
            if index not in self._keys:
                shard = self.manifest.shards[index]
                block = self.manifest.provenance
                assert block is not None and block.has_id_keys
                files = block.shards[index]
                assert files.keys_bytes is not None and files.keys_sha256 is not None
                url = join(self.url, shard.keys_file)
                check = sha256_check(files.keys_sha256, "the manifest's sha256")
                etag = self.versions.get(shard.keys_file, "")
                data = self.objects.read_checked(url, 0, files.keys_bytes, check, etag)
                at = keys_offset(io.BytesIO(data), shard.n_docs, len(data), url)
                m = (len(data) - at) // (2 * KEY_DTYPE.itemsize)
                keys = np.frombuffer(data, dtype=KEY_DTYPE, count=2 * m, offset=at)
                self._keys[index] = keys.reshape(2, m)
            return self._keys[index]

    def inputs_bytes(self) -> bytes:
        """``inputs.json``, fetched and checked against the manifest's sha256."""
        block = self.manifest.provenance
        assert block is not None  # asked only of a store that records provenance
        url = join(self.url, INPUTS_NAME)
        check = sha256_check(block.inputs_sha256, "the manifest's sha256")
        etag = self.versions.get(INPUTS_NAME, "")
        return self.objects.read_checked(url, 0, block.inputs_bytes, check, etag)

    def tokenizer_bytes(self) -> bytes | None:
        """The tokenizer copy the manifest names, fetched now; None when it names none."""
        name = self.manifest.tokenizer.get("file")
        if name not in STORED_NAMES:
            return None
        url = join(self.url, str(name))
        try:
            return self.objects.read(url, etag=self.versions.get(str(name), ""))
        except FileNotFoundError:
            raise StoreError(f"{url}: the tokenizer copy the manifest names is missing") from None


def idx_check(shard: ShardInfo) -> Callable[[bytes], str | None]:
    """A check (for ``ObjectStore.read_checked``) of a shard's ``.idx.npy`` bytes against the
    manifest's ``idx_sha256``."""
    return sha256_check(shard.idx_sha256, "the manifest's idx_sha256")


def read_remote_manifest(objects: ObjectStore, url: str) -> Manifest:
    """The validated ``manifest.json`` of the store at ``url``; a prefix without one is not a
    complete store."""
    return parse_manifest_text(remote_manifest_text(objects, url), join(url, MANIFEST_NAME))


def remote_manifest_text(objects: ObjectStore, url: str) -> str:
    """The text of the ``manifest.json`` of the store at ``url`` (not parsed)."""
    where = join(url, MANIFEST_NAME)
    try:
        data = objects.read(where)
    except (FileNotFoundError, IsADirectoryError) as exc:
        if "bucket" in str(exc).lower():  # S3's NoSuchBucket: say so, not "no manifest"
            raise StoreError(f"store '{url}': no such bucket ({redact(str(exc))})") from None
        raise StoreError(
            f"store '{url}': no {MANIFEST_NAME}; not a complete tokentape store"
        ) from None
    except PermissionError as exc:
        raise StoreError(f"{where}: access denied ({redact(str(exc))})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise StoreError(f"{where}: not UTF-8 text; not a readable manifest") from None


def list_store(objects: ObjectStore, url: str) -> dict[str, ObjectInfo]:
    """Every object directly under the store's prefix ``url`` (its size and version), by
    name: one listing."""
    url = url.rstrip("/")
    try:
        found = objects.find(url)
    except PermissionError as exc:
        raise StoreError(f"{url}/: listing denied ({redact(str(exc))})") from None
    return {basename(i.url): i for i in found if parent(i.url) == url}


def store_versions(
    objects: ObjectStore, url: str, manifest: Manifest
) -> tuple[tuple[str, str], ...]:
    """(name, version) of each file ``manifest`` names in the store at ``url``, as listed now
    (what a plan records: every later read of the file is pinned to it); a file not listed, or
    listed without a version, is left out (reading it says what is wrong)."""
    listed = list_store(objects, url)
    names = [name for name, _ in store_files(manifest)]
    return tuple((n, listed[n].version) for n in names if n in listed and listed[n].version)


__all__ = [
    "StoreObjects",
    "idx_check",
    "list_store",
    "read_remote_manifest",
    "remote_manifest_text",
    "store_versions",
]
