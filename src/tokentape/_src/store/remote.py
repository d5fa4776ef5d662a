"""A token store in object storage, read in place: exact byte ranges, fetched ahead, cached.

``RemoteSource`` is a ``TokenStream`` over a store at an object URL (``s3://bucket/stores/web``).
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
from functools import cached_property

import numpy as np

from tokentape._src.objects.client import (
    ObjectInfo,
    ObjectStore,
    StorageOptions,
    basename,
    join,
    object_store,
    parent,
    redact,
)
from tokentape._src.objects.ranged import (
    Blocks,
    FetchConfig,
    FetchStats,
    RangeCache,
    sha256_check,
)
from tokentape._src.store.format import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    block_record_problem,
    numpy_dtype,
    store_files,
)
from tokentape._src.store.format import parse_manifest as parse_manifest_text
from tokentape._src.store.reader import (
    INDEX_DTYPE,
    StoreFormat,
    TokenStream,
    check_starts,
    index_offset,
    joined_starts,
)
from tokentape._src.store.tokenizers import STORED_NAMES, Tokenizer, tokenizer_from_manifest
from tokentape.errors import StoreChanged, StoreError


class _RemoteShard:
    """A file's tokens as a sliceable sequence: ``shard[a:b]`` reads ``[a, b)`` through the
    cache (what ``TokenStream`` reads its pieces with)."""

    def __init__(self, source: RangedSource, index: int, url: str, n_tokens: int) -> None:
        self.source, self.index, self.url, self.n_tokens = source, index, url, n_tokens

    def __len__(self) -> int:
        return self.n_tokens

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, _ = key.indices(self.n_tokens)
        if stop <= start:
            return np.zeros(0, dtype=self.source.dtype)
        item = self.source.dtype.itemsize
        self.source.check_size(self.index)
        data = self.source.cache.read(self.url, start * item, stop * item)
        return np.frombuffer(data, dtype=self.source.dtype)


class RangedSource(TokenStream):
    """A source whose token files are objects read in ranges through a ``RangeCache``: the
    windows of samples about to be read are fetched ahead (``prefetch``), the rest on demand.

    Args:
        objects: The object store holding the files.
        dtype: The token ids' dtype.
        files: Each token file in stream order: its URL, token count and block hashes.
        doc_starts: The document starts, or a function that loads them on first use.
        n_docs: The document count.
        fetch: Requests in flight and bytes cached.
    """

    def __init__(
        self,
        objects: ObjectStore,
        dtype: np.dtype,
        files: list[tuple[str, int, Blocks]],
        doc_starts: np.ndarray | Callable[[], np.ndarray],
        n_docs: int,
        fetch: FetchConfig,
    ) -> None:
        self.objects = objects
        blocks = {url: b for url, _, b in files}
        self.cache = RangeCache(objects, blocks, fetch.concurrency, fetch.cache_bytes)
        self._bin_urls = [url for url, _, _ in files]
        self._by_url = {url: i for i, url in enumerate(self._bin_urls)}
        pieces = [_RemoteShard(self, i, url, n) for i, (url, n, _) in enumerate(files)]
        super().__init__(dtype, pieces, doc_starts, n_docs)

    @property
    def stats(self) -> FetchStats:
        """Requests and bytes fetched so far."""
        return self.cache.stats

    def check_size(self, index: int) -> None:
        """Refuse token file ``index`` unless it has the recorded size (the default: sizes
        were checked when the source was opened)."""

    def window_ranges(self, samples: np.ndarray, seq_len: int) -> dict[str, list[tuple[int, int]]]:
        """The byte ranges of the windows of ``samples`` (at ``seq_len``), by file URL."""
        k = self._check_samples(samples, seq_len)
        item = self.dtype.itemsize
        offsets = self._shard_offsets
        ranges: dict[str, list[tuple[int, int]]] = {}
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
                url = self._bin_urls[shard]
                ranges.setdefault(url, []).append((lo * item, hi * item))
        return ranges

    fetches_ahead = True

    def prefetch(self, samples: np.ndarray, seq_len: int) -> None:
        """Start fetching the windows of ``samples`` (returns at once, but for a first look at
        the size of each file they touch)."""
        for url, ranges in self.window_ranges(samples, seq_len).items():
            self.check_size(self._by_url[url])
            self.cache.prefetch(url, ranges)

    def windows_into(
        self, samples: np.ndarray, seq_len: int, out: np.ndarray, rows: np.ndarray | None = None
    ) -> None:
        """As ``TokenStream.windows_into``, every window fetched at once before the copy."""
        self.prefetch(samples, seq_len)
        super().windows_into(samples, seq_len, out, rows)

    def close(self) -> None:
        """Stop the fetch threads."""
        self.cache.close()


def shard_blocks(shard: ShardInfo, size: int) -> Blocks:
    """A shard's ``.bin`` block hashes, as its manifest records them."""
    return Blocks(shard.block_bytes, shard.block_sha256, size)


class RemoteSource(StoreFormat, RangedSource):
    """A tokentape store at an object URL, read in place (see the module docstring).

    Args:
        url: The store's URL (the "directory" holding ``manifest.json``).
        storage_options: fsspec options (endpoint, region ...); credentials come from the
            environment or a profile.
        fetch: Requests in flight and bytes cached (default ``FetchConfig()``).
        versions: The ETag each file of the store had when the plan was made, by file name:
            a file must still have it, and every read of it is pinned to it.
    """

    def __init__(
        self,
        url: str,
        storage_options: StorageOptions | None = None,
        fetch: FetchConfig | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.versions = dict(versions or {})
        objects = object_store(self.url, storage_options)
        self._manifest = read_remote_manifest(objects, self.url)
        dtype = numpy_dtype(self._manifest.dtype)
        files = []
        for shard in self._manifest.shards:  # its blocks could not be checked
            size = shard.n_tokens * dtype.itemsize
            problem = block_record_problem(shard, size)
            if problem is not None:
                raise StoreError(f"{join(self.url, MANIFEST_NAME)}: {problem}")
            files.append(
                (join(self.url, shard.bin_file), shard.n_tokens, shard_blocks(shard, size))
            )
        self._sizes_checked: set[int] = set()
        self._size_lock = threading.Lock()
        super().__init__(
            objects,
            dtype,
            files,
            self._load_doc_starts,
            self._manifest.n_docs,
            fetch or FetchConfig(),
        )

    @property
    def directory(self) -> str:
        """The store's URL."""
        return self.url

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer the manifest records (its copy fetched from the store on first use)."""
        name = self._manifest.tokenizer.get("file")
        data = None
        if name in STORED_NAMES:
            url = join(self.url, str(name))
            try:
                data = self.objects.read(url, etag=self.versions.get(str(name), ""))
            except FileNotFoundError:
                raise StoreError(
                    f"{url}: the tokenizer copy the manifest names is missing"
                ) from None
        return tokenizer_from_manifest(self._manifest.tokenizer, self.url, data)

    def check_size(self, index: int) -> None:
        """Refuse shard ``index`` unless its ``.bin`` has the size the manifest says and the
        version the plan recorded (if it did), then pin its reads to that version (checked
        once per shard)."""
        if index in self._sizes_checked:
            return
        shard = self._manifest.shards[index]
        url = join(self.url, shard.bin_file)
        try:
            info = self.objects.info(url)
        except PermissionError as exc:
            raise StoreError(f"{url}: access denied ({redact(str(exc))})") from None
        expected = shard.n_tokens * self.dtype.itemsize
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
        self.cache.pin(url, recorded or info.version)
        with self._size_lock:
            self._sizes_checked.add(index)

    def _load_doc_starts(self) -> np.ndarray:
        """Every shard's ``.idx.npy``, fetched in parallel, checked, offset and joined."""
        shards = self._manifest.shards
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

    def __repr__(self) -> str:
        return (
            f"RemoteSource({self.url!r}, n_tokens={self.n_tokens}, n_docs={self.n_docs}, "
            f"dtype={self._manifest.dtype}, shards={len(self._shards)})"
        )


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


def total_stats(sources: list[TokenStream]) -> FetchStats:
    """What the sources in object storage among ``sources`` fetched, added up."""
    found = [s.stats for s in sources if isinstance(s, RangedSource)]
    return FetchStats(
        sum(f.requests for f in found),
        sum(f.bytes for f in found),
        sum(f.blocks_checked for f in found),
    )


__all__ = [
    "RangedSource",
    "RemoteSource",
    "idx_check",
    "list_store",
    "read_remote_manifest",
    "remote_manifest_text",
    "store_versions",
    "total_stats",
]
