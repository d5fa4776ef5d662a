"""Stage stores from object storage to node-local disk, verified block by block as they arrive.

``stage_plan(plan, cache_dir)`` downloads every source of a plan whose path is an object URL
(``s3://...``) and returns the same plan with those paths replaced by the staged copies (the
index hash does not cover paths: it is unchanged). Local sources are left as they are.
``stage_store(url, cache_dir)`` stages one store.

A Megatron prefix (``format = "megatron"``) is staged the same way, against the identity its
sidecar object records (``megatron.remote``; no sidecar current for the objects: refused,
naming ``tokentape verify URL``): ``DIR/KEY-NAME/NAME.bin`` block by block against the recorded
block hashes, ``NAME.idx`` as one block against its sha256, both files then checked whole, and
last a local sidecar beside them (``NAME.tokentape.json``, for the files as staged) that the
loader's ``MegatronSource`` finds current, so it never hashes them. The sidecar's keys are the
prefix's seal: a staged prefix whose files changed on disk is staged again whole.

A staged store is a normal tokentape store directory (the manifest and every file it names,
byte for byte, made read-only), read with the usual memory maps; a staged Megatron prefix is
its two files and a local sidecar (see the end of this docstring). Cache layout (``KEY`` is
the first 16 hex digits of the sha256 of the store's URL without a trailing ``/``, ``NAME``
the URL's last component with every character outside ``[A-Za-z0-9._-]`` replaced by ``_``)::

    DIR/KEY-NAME/              the staged store (put in place whole: see below)
    DIR/.KEY-NAME.seal         each staged file's size, mtime and ctime when last verified
    DIR/.KEY-NAME.lock         one stager per store and node; the other processes wait
    DIR/.KEY-NAME.staging/     a stage in progress, kept across a kill:
        .manifest.json           the exact bytes of the remote manifest being staged
        FILE                     a file downloaded and verified whole
        .FILE.part               a shard's .bin, its blocks written in place as they come
        .FILE.ok                 the blocks of .FILE.part verified so far (4-byte indexes)

The cache is confined (``store.safedir``): the directory itself must be one only this user
(or root) can change, and every name above is looked up relative to its descriptor, never
through a symbolic link; each must be this user's directory or regular file (one written in
place, with no other hard link). A link, FIFO, device, a directory where a file belongs (or
the reverse) or another user's entry at any of those names is refused in one line naming it
and the remedy; nothing is written through it, nothing outside the cache is touched.

What a staged copy is trusted for: its files were verified against the hashes the store's
manifest records when they were staged, and their keys (size, mtime, ctime) sealed right
after. On reuse, a file whose keys are still the sealed ones is used without hashing (only a
write changes its bytes, and a write changes its ctime, which nothing but the clock can set
back); a file whose keys changed (or every file, with ``verify``) is hashed again whole
(``rehashed_bytes``), and one that no longer matches is fetched again while the others are
kept. Not seen without ``verify``: bytes changed beneath the file system (a failing disk, a
write to the raw device).

How a store is staged, under the lock (``stage.cachelock``: a node's other ranks wait for the
stager, then find its result):

1. A staged store whose manifest has the wanted content hash (the plan's, else the remote
   manifest's) and files of the sizes it names is used (its changed files hashed again, see
   above): nothing is downloaded (with a plan, not even the remote manifest is read).
2. Otherwise the remote manifest is read and checked (a plan's source must still have the
   content hash the plan recorded: else ``StoreChanged``); the files are listed once and their
   sizes checked against the manifest.
3. (``stage.fetch``) Each ``.bin`` is fetched with parallel ranged GETs (``workers``
   threads; consecutive blocks grouped up to ``range_bytes`` per request, by default
   ``range_bytes_for`` the store's size: 32 MiB to 1 GiB; each body written and hashed as it
   arrives, 8 MiB at a time; a GET cut short is followed by one for the rest), the blocks the
   coming steps read first (``first_use``) first, and every block is
   checked against the manifest's ``block_sha256`` as it arrives; the ``.idx.npy`` and the
   tokenizer copy are checked whole (``idx_sha256``; the tokenizer's fingerprint). A block
   that does not match is fetched again, up to ``TOKENTAPE_IO_RETRIES`` times, then the stage
   fails with a ``StoreError`` naming the object and the block.
4. A verified block's bytes are made durable (``fdatasync``) before its index is appended to
   the ``.ok`` record (and that fsynced), so a stage killed at any point resumes with what was
   verified and fetches the rest; bytes written but not recorded are fetched again. A
   ``.staging`` directory left for another version of the store is discarded.
5. Once every file is complete the manifest is written last, the files are made read-only and
   the directory is renamed into place (``store.atomic.replace_entry``: atomically swapped
   where the kernel allows), the old copy removed; last the seal is written (a stager killed
   before that leaves none: the next reuse hashes the files once and seals them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tokentape._src.megatron.format import FileKey, FileKeys, MegatronIdentity
from tokentape._src.megatron.identity import (
    SIDECAR_MAX_BYTES,
    SIDECAR_SUFFIX,
    parse_sidecar,
    sidecar_bytes,
)
from tokentape._src.megatron.remote import current_identity as remote_identity
from tokentape._src.objects.client import (
    ObjectInfo,
    ObjectStore,
    Retry,
    StorageOptions,
    basename,
    is_url,
    join,
    object_store,
    parent,
)
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.open import MEGATRON, TOKENTAPE
from tokentape._src.plan.plan import Plan, expected_index_hash
from tokentape._src.stage.cachelock import cache_lock
from tokentape._src.stage.fetch import FirstUse, Job, download, fetch_files, file_problem
from tokentape._src.store.atomic import replace_entry
from tokentape._src.store.format import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    manifest_files,
    parse_manifest,
    read_manifest_text,
)
from tokentape._src.store.remote import list_store, remote_manifest_text
from tokentape._src.store.safedir import SafeDir
from tokentape._src.util.checks import check_count, check_path
from tokentape._src.util.progress import ProgressCallback, check_callback
from tokentape.errors import ArgumentError, PlanError, StoreChanged, StoreError

RANGE_BYTES = 32 * 2**20
"""The least a ranged GET of a stage asks for (unless the file is smaller). With S3's
first-byte latency of about 100 ms, a GET of 16 MiB at about 90 MB/s spends a third of its time
waiting for its first byte, and a node's stage was as slow again as its connections allow
(benchmarks/fleet_sim.py; docs/cluster.md)."""
RANGE_BYTES_MAX = 2**30
"""The most a ranged GET of a stage asks for: a whole shard of up to 1 GiB. Its body is
written as it arrives (``objects.client.CHUNK_BYTES`` held at a time) and each block recorded
as soon as it is verified, so the size costs no memory and a kill loses at most a block; fewer,
larger GETs are what lets thousands of nodes stage one prefix at once (docs/cluster.md)."""
DEFAULT_WORKERS = 16
"""Concurrent ranged GETs of one stage: about 1.4 GB/s from S3 at about 88 MB/s each."""


def range_bytes_for(total: int, workers: int) -> int:
    """The GET size of a stage of ``total`` bytes on ``workers`` connections: as large as
    keeps about 8 GETs per connection (so that none idles at the end), within ``RANGE_BYTES``
    and ``RANGE_BYTES_MAX``."""
    return min(RANGE_BYTES_MAX, max(RANGE_BYTES, total // (8 * max(1, workers))))


DEFAULT_WAIT_S = 4 * 3600.0
"""How long a process waits for another one staging the same store before giving up."""
MAX_WORKERS = 1024
STAGING_MANIFEST = ".manifest.json"
SEAL_FORMAT = "tokentape.staged"
MANIFEST_MAX_BYTES = 256 * 2**20
REMEDY = (
    "tokentape uses that name in its stage cache and follows no link there: remove it, or use "
    "another cache directory"
)


@dataclass(frozen=True)
class StagedStore:
    """What staging one store did.

    Attributes:
        url: The store's URL.
        path: The staged store's directory.
        content_hash: Its content hash.
        total_bytes: The bytes of its files (manifest excluded).
        downloaded_bytes: Bytes fetched by this call (a block fetched again counts again).
        reused_bytes: Bytes already on disk: the whole store when it was staged before, or
            what an interrupted stage had verified.
        cached: Whether the store was already staged (nothing fetched).
        waited_s: Seconds spent waiting for another process staging the same store.
        rehashed_bytes: Bytes of a staged copy hashed again before reuse: its files changed
            on disk since they were verified (or ``verify`` asked for all of them).
    """

    url: str
    path: Path
    content_hash: str
    total_bytes: int
    downloaded_bytes: int
    reused_bytes: int
    cached: bool
    waited_s: float = 0.0
    rehashed_bytes: int = 0


def cache_key(url: str) -> str:
    """The name of ``url``'s staged directory in a cache (see the module docstring)."""
    url = url.rstrip("/")
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", basename(url)) or "store"
    return f"{digest}-{name}"


def staging_name(name: str) -> str:
    """The staging directory of the cache entry ``name`` (``cache_key``): a stage in
    progress."""
    return f".{name}.staging"


def _file_sizes(manifest: Manifest) -> dict[str, int | None]:
    """Each file's expected size (None: the tokenizer copy, whose size is not recorded)."""
    return {f.name: f.size for f in manifest_files(manifest)}


@dataclass(frozen=True)
class _Found:
    """A staged copy of the wanted version: its manifest, its files' sizes, the files that
    failed their hashes when checked again (to fetch anew), and the bytes checked again."""

    manifest: Manifest
    sizes: dict[str, int]
    damaged: tuple[str, ...]
    rehashed: int


def _seal_name(name: str) -> str:
    """Beside the staged copy ``name``: each of its files' keys (size, mtime, ctime) when it
    was last verified."""
    return f".{name}.seal"


def _read_seal(cache: SafeDir, name: str) -> dict[str, FileKey]:
    """The keys the seal of the staged copy ``name`` records (empty when there is none, or it
    is not one)."""
    text = cache.read(_seal_name(name), MANIFEST_MAX_BYTES)
    try:
        data = json.loads(text) if text is not None else None
        if not isinstance(data, dict) or data.get("format") != SEAL_FORMAT:
            return {}
        return {name: FileKey(**key) for name, key in data["files"].items()}
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return {}


def _write_seal(cache: SafeDir, entry: SafeDir, names: list[str]) -> None:
    """Record the keys the files ``names`` of the staged copy ``entry`` have now (they were
    just verified)."""
    files = {}
    for name in names:
        st = entry.check(name, "file")
        if st is not None:
            files[name] = asdict(FileKey.of(st))
    seal = json.dumps({"format": SEAL_FORMAT, "files": files}).encode()
    cache.write_atomic(_seal_name(entry.path.name), seal)


def _staged(cache: SafeDir, name: str, content_hash: str, recheck: bool) -> _Found | None:
    """The staged copy ``name`` when it holds the store of ``content_hash`` with files of the
    sizes its manifest names (else None: stage it). Files whose keys are not the ones sealed
    when they were verified (every file, with ``recheck``) are hashed again; those that do not
    match are listed in ``damaged``. A link, FIFO or foreign entry at any name is refused."""
    entry = cache.child(name)
    if entry is None:
        return None
    with entry:
        if entry.check(MANIFEST_NAME, "file") is None:
            return None
        try:
            text, where = read_manifest_text(entry.path, entry.fd)
            manifest = parse_manifest(text, str(where))
        except StoreError:
            return None  # damaged: staged again
        if manifest.content_hash != content_hash:
            return None
        sizes: dict[str, int] = {}
        keys: dict[str, FileKey] = {}
        for file, size in _file_sizes(manifest).items():
            st = entry.check(file, "file")
            if st is None or (size is not None and st.st_size != size):
                return None
            sizes[file], keys[file] = st.st_size, FileKey.of(st)
        sealed = _read_seal(cache, name)
        changed = [f for f in sizes if recheck or sealed.get(f) != keys[f]]
        damaged = tuple(f for f in changed if file_problem(entry, f, manifest) is not None)
        if changed and not damaged:
            _write_seal(cache, entry, list(sizes))
        return _Found(manifest, sizes, damaged, sum(sizes[f] for f in changed))


def _read_remote_manifest(store: ObjectStore, url: str) -> tuple[bytes, Manifest]:
    """The remote manifest's exact bytes and what they say."""
    text = remote_manifest_text(store, url)
    return text.encode("utf-8"), parse_manifest(text, join(url, MANIFEST_NAME))


def _remote_sizes(url: str, manifest: Manifest, listed: dict[str, ObjectInfo]) -> dict[str, int]:
    """Each file's size in the bucket (``listed``), checked against the manifest."""
    url = url.rstrip("/")
    sizes = {}
    for name, expected in _file_sizes(manifest).items():
        where = join(url, name)
        if name not in listed:
            raise StoreError(f"{where}: no such object, though the store's manifest names it")
        if expected is not None and listed[name].size != expected:
            raise StoreError(
                f"{where}: {listed[name].size} bytes, the store's manifest says {expected}; the "
                "object was changed or cut short"
            )
        sizes[name] = listed[name].size
    return sizes


def _prepare_work(cache: SafeDir, name: str, marker: bytes) -> SafeDir:
    """The staging directory ``name`` for the stage that ``marker`` describes: kept when it
    holds the same stage (an interrupted one), else made anew."""
    work = cache.child(name)
    if work is not None and work.read(STAGING_MANIFEST, len(marker) + 1) == marker:
        return work
    if work is not None:
        work.close()
        cache.remove_tree(name)
    work = cache.make(name)
    work.write_atomic(STAGING_MANIFEST, marker)
    return work


def _check_planned(url: str, what: str, found: str, expected: str | None) -> None:
    """Refuse a source whose content hash is not the one the plan recorded (when it did)."""
    if expected is not None and found != expected:
        raise StoreChanged(
            f"{url}: {what}'s content hash is {found}, the plan recorded {expected}; it "
            "changed since the plan was made (re-run `tokentape plan`)",
            path=url,
            planned=expected,
            found=found,
        )


def _read_only(work: SafeDir) -> None:
    """Make the files of the complete staging directory ``work`` read-only (a stray write to a
    staged copy then fails; it changes their ctime, so their keys are taken after)."""
    for file in work.names():
        if not file.startswith("."):
            fd = work.open_file(file, os.O_RDONLY)
            try:
                os.fchmod(fd, 0o444)
            finally:
                os.close(fd)


def _put_in_place(cache: SafeDir, work: SafeDir, name: str) -> None:
    """Make the complete staging directory ``work`` the staged copy ``name`` (replacing an
    old copy, which is removed)."""
    work.unlink(STAGING_MANIFEST)
    work.fsync()
    cache.unlink(_seal_name(name))  # the old copy's: no longer true
    replace_entry(cache.fd, work.path.name, name, cache.remove_tree)


@dataclass(frozen=True)
class _Stage:
    """One store to stage: where from, into which cache entry, and how."""

    url: str
    cache: SafeDir
    name: str
    """The cache entry's name (``cache_key``)."""
    expected: str | None
    options: StorageOptions | None
    progress: ProgressCallback | None
    workers: int
    label: str
    range_bytes: int | None
    """None: ``range_bytes_for`` the bytes to stage."""
    recheck: bool
    first_use: FirstUse

    @property
    def path(self) -> Path:
        return self.cache.path / self.name

    @property
    def work_name(self) -> str:
        return staging_name(self.name)

    def job(self, store: ObjectStore, url: str, work: SafeDir, total: int, **more: Any) -> Job:
        """The fetch job into ``work`` of a store of ``total`` bytes (``more``: ``Job``'s
        optional fields)."""
        retry = Retry.from_env()
        size = self.range_bytes or range_bytes_for(total, self.workers)
        return Job(
            store, url, work, retry.attempts, retry.backoff, size, first_use=self.first_use,
            **more,
        )  # fmt: skip

    def cached(self, found: _Found) -> StagedStore:
        total = sum(found.sizes.values())
        return StagedStore(
            self.url, self.path, found.manifest.content_hash, total, 0, total, True,
            rehashed_bytes=found.rehashed,
        )  # fmt: skip


def _stage_locked(s: _Stage) -> StagedStore:
    found = None if s.expected is None else _staged(s.cache, s.name, s.expected, s.recheck)
    if found is not None and not found.damaged:
        return s.cached(found)
    store = object_store(s.url, s.options)
    with ThreadPoolExecutor(1) as pool:  # the listing meanwhile: one round trip, not two
        listing = pool.submit(list_store, store, s.url)
        manifest_bytes, manifest = _read_remote_manifest(store, s.url)
        listed = listing.result()
    _check_planned(s.url, "the store", manifest.content_hash, s.expected)
    if s.expected is None:
        found = _staged(s.cache, s.name, manifest.content_hash, s.recheck)
        if found is not None and not found.damaged:
            return s.cached(found)
    sizes = _remote_sizes(s.url, manifest, listed)
    with _prepare_work(s.cache, s.work_name, manifest_bytes) as work:
        verified = set()
        if found is not None:  # a staged copy with damaged files: the others are kept
            verified = _link_verified(s.cache, s.name, work, found)
        versions = {name: listed[name].version for name in sizes}
        total = sum(sizes.values())
        job = s.job(store, s.url, work, total, verified=frozenset(verified), versions=versions)
        fetched, reused = download(job, manifest, sizes, s.workers, s.label, s.progress)
        work.write_atomic(MANIFEST_NAME, manifest_bytes)  # last: the store is complete
        _read_only(work)
        _put_in_place(s.cache, work, s.name)
    with s.cache.make(s.name) as entry:
        _write_seal(s.cache, entry, list(sizes))
    rehashed = 0 if found is None else found.rehashed
    return StagedStore(
        s.url, s.path, manifest.content_hash, total, fetched, reused, False, rehashed_bytes=rehashed
    )


def _link_verified(cache: SafeDir, name: str, work: SafeDir, found: _Found) -> set[str]:
    """Hard-link the files of the staged copy ``name`` that were verified into ``work``, so
    that only the damaged ones are fetched again; returns their names."""
    linked = set()
    with cache.make(name) as entry:
        for file in found.sizes:
            if file in found.damaged or work.lstat(file) is not None:
                continue
            os.link(file, file, src_dir_fd=entry.fd, dst_dir_fd=work.fd, follow_symlinks=False)
            linked.add(file)
    return linked


def _staged_prefix(
    cache: SafeDir, name: str, prefix: str, content_hash: str
) -> MegatronIdentity | None:
    """The identity of the staged Megatron prefix ``name/prefix`` when its sidecar is current
    for its files and has ``content_hash`` (cheap checks: no hashing), else None."""
    entry = cache.child(name)
    if entry is None:
        return None
    with entry:
        found = [entry.check(f"{prefix}{suffix}", "file") for suffix in (".bin", ".idx")]
        text = entry.read(prefix + SIDECAR_SUFFIX, SIDECAR_MAX_BYTES)
        if found[0] is None or found[1] is None:
            return None
        record = None if text is None else parse_sidecar(text.decode("utf-8", "replace"))
    keys = FileKeys(FileKey.of(found[0]), FileKey.of(found[1]))
    if record is None or record[0] != keys or record[1].content_hash != content_hash:
        return None
    identity = record[1]
    if (identity.bin_bytes, identity.idx_bytes) != (keys.bin.size, keys.idx.size):
        return None
    return identity


def _stage_prefix_locked(s: _Stage) -> StagedStore:
    """``_stage_locked`` for a Megatron prefix: its two objects, checked against the identity
    its sidecar object records, staged as ``entry/NAME.bin`` and ``entry/NAME.idx`` with a
    local sidecar beside them (written last, for the files as staged)."""
    name = basename(s.url)
    prefix = s.path / name
    if s.expected is not None and (known := _staged_prefix(s.cache, s.name, name, s.expected)):
        total = known.bin_bytes + known.idx_bytes
        return StagedStore(s.url, prefix, s.expected, total, 0, total, True)
    store = object_store(s.url, s.options)
    identity, keys = remote_identity(store, s.url)
    _check_planned(s.url, "the Megatron prefix", identity.content_hash, s.expected)
    total = identity.bin_bytes + identity.idx_bytes
    if s.expected is None and _staged_prefix(s.cache, s.name, name, identity.content_hash):
        return StagedStore(s.url, prefix, identity.content_hash, total, 0, total, True)
    marker = {"url": s.url, "bin": keys.bin.version, "idx": keys.idx.version}
    marker_bytes = json.dumps(marker | {"content_hash": identity.content_hash}).encode()
    bin_record = ShardInfo(
        name=name,
        n_tokens=identity.n_tokens,
        n_docs=identity.n_docs,
        bin_sha256=identity.bin_sha256,
        idx_sha256=identity.idx_sha256,
        idx_bytes=identity.idx_bytes,
        block_bytes=identity.block_bytes,
        block_sha256=identity.block_sha256,
    )
    idx_record = replace(  # one block: the whole .idx, checked against its sha256
        bin_record,
        bin_sha256=identity.idx_sha256,
        block_bytes=max(1, identity.idx_bytes),
        block_sha256=(identity.idx_sha256,),
    )
    blocked = [(f"{name}.bin", bin_record, identity.bin_bytes)]
    blocked.append((f"{name}.idx", idx_record, identity.idx_bytes))
    with _prepare_work(s.cache, s.work_name, marker_bytes) as work:
        versions = {f"{name}.bin": keys.bin.version, f"{name}.idx": keys.idx.version}
        job = s.job(store, parent(s.url), work, total, record="its sidecar", versions=versions)
        fetched, reused = fetch_files(job, blocked, [], s.workers, s.label, s.progress)
        _read_only(work)
        staged = FileKeys(*(FileKey.of(work.check(f, "file")) for f, _, _ in blocked))  # type: ignore[arg-type]
        work.write_atomic(name + SIDECAR_SUFFIX, sidecar_bytes(work.path / name, identity, staged))
        _put_in_place(s.cache, work, s.name)
    return StagedStore(s.url, prefix, identity.content_hash, total, fetched, reused, False)


def stage(
    url: str,
    cache_dir: str | os.PathLike[str],
    *,
    expected_hash: str | None = None,
    storage_options: StorageOptions | None = None,
    progress: ProgressCallback | None = None,
    workers: int = DEFAULT_WORKERS,
    wait_s: float = DEFAULT_WAIT_S,
    label: str | None = None,
    range_bytes: int | None = None,
    format: str = TOKENTAPE,
    verify: bool = False,
    first_use: FirstUse | None = None,
) -> StagedStore:
    """Stage the store at ``url`` into ``cache_dir`` and say what that took (see the module
    docstring). ``expected_hash``: the content hash the store must have (a plan's record);
    ``label`` names the store in progress reports (default: the URL's last component);
    ``format``: ``megatron`` for a Megatron prefix (staged as ``KEY-NAME/NAME.bin`` and
    ``.idx``); ``verify``: hash every file of a staged copy again before reusing it, not only
    those that changed on disk since they were verified; ``first_use``: the blocks the coming
    steps read, fetched first (``stage.fetch.FirstUse``)."""
    if not is_url(url):
        raise ArgumentError(f"url must be an object URL (s3://bucket/prefix), got {url!r}")
    check_path("cache_dir", cache_dir)
    check_count("workers", workers, 1, MAX_WORKERS)
    if range_bytes is not None:
        check_count("range_bytes", range_bytes, 1, 2**40)
    check_callback(progress)
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not wait_s >= 0:
        raise ArgumentError(f"wait_s must be a number of seconds >= 0, got {wait_s!r}")
    if not isinstance(verify, bool):
        raise ArgumentError(f"verify must be True or False, got {verify!r}")
    with SafeDir.open(cache_dir, "stage cache", REMEDY) as cache:
        name = cache_key(url)
        with cache_lock(cache, f".{name}.lock", f"stage {url}", wait_s) as waited:
            for old in cache.names():  # left by a stager killed mid-swap
                if old.startswith(f".{name}.old-"):
                    cache.remove_tree(old)
            job = _Stage(
                url.rstrip("/"), cache, name, expected_hash, storage_options, progress, workers,
                label or basename(url), range_bytes, verify, first_use or {},
            )  # fmt: skip
            result = (_stage_prefix_locked if format == MEGATRON else _stage_locked)(job)
    return replace(result, waited_s=waited)


def stage_store(
    url: str,
    cache_dir: str | os.PathLike[str],
    storage_options: StorageOptions | None = None,
    progress: ProgressCallback | None = None,
    workers: int = DEFAULT_WORKERS,
) -> Path:
    """Stage the store at ``url`` into ``cache_dir``; returns the staged directory.

    Args:
        url: The store's URL (``s3://bucket/stores/web``).
        cache_dir: The node-local cache directory (created if missing).
        storage_options: The fsspec filesystem's options (endpoint, credentials...).
        progress: Receives the download's progress (``Progress``); nothing is drawn.
        workers: Concurrent ranged GETs.

    Returns:
        The staged store's directory (``cache_dir/KEY-NAME``).

    Raises:
        StoreError: The store is not one, or an object does not match its manifest (after the
            retry budget; the message names the object and the block).
        ObjectStorageError: Reading an object kept failing.
        CacheLocked: Another process kept the store's cache lock beyond the wait.
    """
    return stage(
        url, cache_dir, storage_options=storage_options, progress=progress, workers=workers
    ).path


def stage_sources(
    plan: Plan | str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    storage_options: StorageOptions | None = None,
    progress: ProgressCallback | None = None,
    workers: int = DEFAULT_WORKERS,
    wait_s: float = DEFAULT_WAIT_S,
    verify: bool = False,
    first_use: Mapping[str, FirstUse] | None = None,
) -> tuple[Plan, dict[str, StagedStore]]:
    """``stage_plan``'s plan and, per staged source name, what staging it did (``verify``:
    see ``stage``; ``first_use``: per source path, see ``stage``)."""
    if not isinstance(plan, Plan):
        check_path("plan", plan)
        plan = load_plan(plan)
    if storage_options is None:  # the plan's own (a plan file's storage_options table)
        storage_options = plan.storage_options
    staged: dict[str, StagedStore] = {}
    sources = []
    for s in plan.sources:
        if not is_url(s.path):
            sources.append(s)
            continue
        result = stage(
            s.path,
            cache_dir,
            expected_hash=s.content_hash,
            storage_options=storage_options,
            progress=progress,
            workers=workers,
            wait_s=wait_s,
            label=s.name,
            format=s.format,
            verify=verify,
            first_use=(first_use or {}).get(s.path),
        )
        staged[s.name] = result
        sources.append(replace(s, path=str(result.path), versions=()))  # local now
    new = replace(plan, sources=tuple(sources))
    if expected_index_hash(new) != plan.index_hash:
        raise PlanError("the plan's index hash does not follow from its sources; re-run plan")
    return new, staged


def stage_plan(
    plan: Plan | str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    storage_options: StorageOptions | None = None,
    progress: ProgressCallback | None = None,
    workers: int = DEFAULT_WORKERS,
) -> Plan:
    """Stage every object-storage store of ``plan`` into ``cache_dir``.

    Args:
        plan: The resolved plan (or its ``PLAN.json``).
        cache_dir: The node-local cache directory (created if missing).
        storage_options: The fsspec filesystem's options (endpoint, credentials...); default:
            the plan's ``storage_options``.
        progress: Receives each store's download progress (label ``stage NAME``).
        workers: Concurrent ranged GETs per store.

    Returns:
        The same plan with each object-URL source's ``path`` replaced by its staged directory
        (same index hash).

    Raises:
        StoreChanged: A store's content hash is not the one the plan recorded.
        StoreError: A store is damaged: an object does not match its manifest (the message
            names the object and the block).
        ObjectStorageError: Reading an object kept failing.
        CacheLocked: Another process kept a store's cache lock beyond the wait.
    """
    return stage_sources(plan, cache_dir, storage_options, progress, workers)[0]


__all__ = [
    "DEFAULT_WAIT_S",
    "DEFAULT_WORKERS",
    "MAX_WORKERS",
    "RANGE_BYTES",
    "RANGE_BYTES_MAX",
    "StagedStore",
    "cache_key",
    "range_bytes_for",
    "stage",
    "stage_plan",
    "stage_sources",
    "stage_store",
    "staging_name",
]
