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
loader's ``MegatronSource`` finds current, so it never hashes them.

A staged store is a normal tokentape store directory (the manifest and every file it names,
byte for byte), read with the usual memory maps; a staged Megatron prefix is its two files and
a local sidecar (see the end of this docstring). Cache layout (``KEY`` is the first 16 hex
digits of the sha256 of the store's URL without a trailing ``/``, ``NAME`` the URL's last
component with every character outside ``[A-Za-z0-9._-]`` replaced by ``_``)::

    DIR/KEY-NAME/              the staged store (put in place whole: see below)
    DIR/.KEY-NAME.lock         one stager per store and node; the other processes wait
    DIR/.KEY-NAME.staging/     a stage in progress, kept across a kill:
        .manifest.json           the exact bytes of the remote manifest being staged
        FILE                     a file downloaded and verified whole
        .FILE.part               a shard's .bin, its blocks written in place as they come
        .FILE.ok                 the blocks of .FILE.part verified so far (4-byte indexes)

How a store is staged, under the lock (``train.cachelock``: a node's other ranks wait for the
stager, then find its result):

1. A staged store whose manifest has the wanted content hash (the plan's, else the remote
   manifest's) and files of the sizes it names is used as is: nothing is downloaded (with a
   plan, not even the remote manifest is read).
2. Otherwise the remote manifest is read and checked (a plan's source must still have the
   content hash the plan recorded: else ``StoreChanged``); the files are listed once and their
   sizes checked against the manifest.
3. (``train.stagefetch``) Each ``.bin`` is fetched with parallel ranged GETs (``workers``
   threads; consecutive blocks grouped up to ``range_bytes`` per request) and every block is
   checked against the manifest's ``block_sha256`` as it arrives; the ``.idx.npy`` and the
   tokenizer copy are checked whole (``idx_sha256``; the tokenizer's fingerprint). A block
   that does not match is fetched again, up to ``TOKENTAPE_IO_RETRIES`` times, then the stage
   fails with a ``StoreError`` naming the object and the block.
4. A verified block's bytes are made durable (``fdatasync``) before its index is appended to
   the ``.ok`` record (and that fsynced), so a stage killed at any point resumes with what was
   verified and fetches the rest; bytes written but not recorded are fetched again. A
   ``.staging`` directory left for another version of the store is discarded.
5. Once every file is complete the manifest is written last and the directory is renamed into
   place (``store.atomic.replace_directory``: atomically swapped where the kernel allows), the
   old copy of another version removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from tokentape._src.megatron.format import MegatronIdentity
from tokentape._src.megatron.identity import SIDECAR_SUFFIX, file_keys
from tokentape._src.megatron.identity import read_sidecar as read_local_sidecar
from tokentape._src.megatron.identity import write_sidecar as write_local_sidecar
from tokentape._src.megatron.remote import current_identity as remote_identity
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.open import MEGATRON, TOKENTAPE
from tokentape._src.plan.plan import Plan, expected_index_hash
from tokentape._src.store.atomic import fsync_dir, replace_directory, write_atomic
from tokentape._src.store.format import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    numpy_dtype,
    parse_manifest,
    read_manifest,
    store_files,
)
from tokentape._src.store.objects import (
    ObjectStore,
    Retry,
    StorageOptions,
    basename,
    is_url,
    join,
    object_store,
    parent,
    redact,
)
from tokentape._src.store.remote import remote_manifest_text
from tokentape._src.train.cachelock import cache_lock
from tokentape._src.train.stagefetch import Job, download, fetch_files
from tokentape._src.util.checks import check_count, check_path
from tokentape._src.util.progress import ProgressCallback, check_callback
from tokentape.errors import ArgumentError, PlanError, StoreChanged, StoreError

RANGE_BYTES = 16 * 2**20
"""The most bytes one ranged GET asks for (and a worker holds in memory)."""
DEFAULT_WORKERS = 8
DEFAULT_WAIT_S = 4 * 3600.0
"""How long a process waits for another one staging the same store before giving up."""
MAX_WORKERS = 1024
STAGING_MANIFEST = ".manifest.json"


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
    """

    url: str
    path: Path
    content_hash: str
    total_bytes: int
    downloaded_bytes: int
    reused_bytes: int
    cached: bool
    waited_s: float = 0.0


def cache_key(url: str) -> str:
    """The name of ``url``'s staged directory in a cache (see the module docstring)."""
    url = url.rstrip("/")
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", basename(url)) or "store"
    return f"{digest}-{name}"


def _file_sizes(manifest: Manifest) -> dict[str, int | None]:
    """Each file's expected size (None: the tokenizer copy, whose size is not recorded)."""
    itemsize = numpy_dtype(manifest.dtype).itemsize
    sizes: dict[str, int | None] = {}
    for s in manifest.shards:
        sizes[s.bin_file] = s.n_tokens * itemsize
        sizes[s.idx_file] = s.idx_bytes
    for name, what in store_files(manifest):
        if what == "tokenizer copy":
            sizes[name] = None
    return sizes


def _staged(entry: Path, content_hash: str) -> Manifest | None:
    """The manifest of the staged store at ``entry`` when it has ``content_hash`` and files of
    the sizes it names (cheap checks: no hashing), else None."""
    try:
        manifest = read_manifest(entry)
        if manifest.content_hash != content_hash:
            return None
        for name, size in _file_sizes(manifest).items():
            found = os.stat(entry / name).st_size
            if size is not None and found != size:
                return None
    except (OSError, StoreError):
        return None
    return manifest


def _read_remote_manifest(store: ObjectStore, url: str) -> tuple[bytes, Manifest]:
    """The remote manifest's exact bytes and what they say."""
    text = remote_manifest_text(store, url)
    return text.encode("utf-8"), parse_manifest(text, join(url, MANIFEST_NAME))


def _listing(store: ObjectStore, url: str) -> dict[str, int]:
    """The size of every object directly under the store's prefix, by name."""
    url = url.rstrip("/")
    try:
        found = store.find(url)
    except PermissionError as exc:
        raise StoreError(f"{url}/: listing denied ({redact(str(exc))})") from None
    return {basename(i.url): i.size for i in found if parent(i.url) == url}


def _remote_sizes(url: str, manifest: Manifest, listed: dict[str, int]) -> dict[str, int]:
    """Each file's size in the bucket (``listed``), checked against the manifest."""
    url = url.rstrip("/")
    sizes = {}
    for name, expected in _file_sizes(manifest).items():
        where = join(url, name)
        if name not in listed:
            raise StoreError(f"{where}: no such object, though the store's manifest names it")
        if expected is not None and listed[name] != expected:
            raise StoreError(
                f"{where}: {listed[name]} bytes, the store's manifest says {expected}; the "
                "object was changed or cut short"
            )
        sizes[name] = listed[name]
    return sizes


def _prepare_work(work: Path, manifest_bytes: bytes) -> None:
    """The staging directory for this manifest: kept when it stages the same one, else new."""
    marker = work / STAGING_MANIFEST
    try:
        same = marker.read_bytes() == manifest_bytes
    except OSError:
        same = False
    if not same and os.path.lexists(work):
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if not same:
        write_atomic(marker, manifest_bytes)


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


def _put_in_place(work: Path, entry: Path) -> None:
    """Rename the complete staging directory ``work`` to ``entry`` (replacing an old copy)."""
    (work / STAGING_MANIFEST).unlink()
    fsync_dir(work)
    replace_directory(work, entry)


def _stage_locked(
    url: str,
    entry: Path,
    expected: str | None,
    options: StorageOptions | None,
    progress: ProgressCallback | None,
    workers: int,
    label: str,
    range_bytes: int,
) -> StagedStore:
    if expected is not None and (m := _staged(entry, expected)) is not None:
        total = sum(os.stat(entry / n).st_size for n, _ in store_files(m))
        return StagedStore(url, entry, expected, total, 0, total, True)
    store = object_store(url, options)
    with ThreadPoolExecutor(1) as pool:  # the listing meanwhile: one round trip, not two
        listing = pool.submit(_listing, store, url)
        manifest_bytes, manifest = _read_remote_manifest(store, url)
        listed = listing.result()
    _check_planned(url, "the store", manifest.content_hash, expected)
    if expected is None and (m := _staged(entry, manifest.content_hash)) is not None:
        total = sum(os.stat(entry / n).st_size for n, _ in store_files(m))
        return StagedStore(url, entry, manifest.content_hash, total, 0, total, True)
    sizes = _remote_sizes(url, manifest, listed)
    work = entry.with_name(f".{entry.name}.staging")
    _prepare_work(work, manifest_bytes)
    retry = Retry.from_env()
    job = Job(store, url, work, retry.attempts, retry.backoff, range_bytes)
    fetched, reused = download(job, manifest, sizes, workers, label, progress)
    write_atomic(work / MANIFEST_NAME, manifest_bytes)  # last: the store is complete
    _put_in_place(work, entry)
    total = sum(sizes.values())
    return StagedStore(url, entry, manifest.content_hash, total, fetched, reused, False)


def _staged_prefix(prefix: Path, content_hash: str) -> MegatronIdentity | None:
    """The identity of the staged Megatron prefix when its sidecar is current for its files
    and has ``content_hash`` (cheap checks: no hashing), else None."""
    try:
        keys = file_keys(prefix)
    except OSError:
        return None
    identity = read_local_sidecar(prefix, keys)
    if identity is None or identity.content_hash != content_hash:
        return None
    if (identity.bin_bytes, identity.idx_bytes) != (keys.bin.size, keys.idx.size):
        return None
    return identity


def _stage_prefix_locked(
    url: str,
    entry: Path,
    expected: str | None,
    options: StorageOptions | None,
    progress: ProgressCallback | None,
    workers: int,
    label: str,
    range_bytes: int,
) -> StagedStore:
    """``_stage_locked`` for a Megatron prefix: its two objects, checked against the identity
    its sidecar object records, staged as ``entry/NAME.bin`` and ``entry/NAME.idx`` with a
    local sidecar beside them (written last, for the files as staged)."""
    name = basename(url)
    prefix = entry / name
    if expected is not None and (known := _staged_prefix(prefix, expected)) is not None:
        total = known.bin_bytes + known.idx_bytes
        return StagedStore(url, prefix, expected, total, 0, total, True)
    store = object_store(url, options)
    identity, keys = remote_identity(store, url)
    _check_planned(url, "the Megatron prefix", identity.content_hash, expected)
    total = identity.bin_bytes + identity.idx_bytes
    if expected is None and _staged_prefix(prefix, identity.content_hash) is not None:
        return StagedStore(url, prefix, identity.content_hash, total, 0, total, True)
    work = entry.with_name(f".{entry.name}.staging")
    marker = {"url": url, "bin": keys.bin.version, "idx": keys.idx.version}
    _prepare_work(work, (json.dumps(marker | {"content_hash": identity.content_hash})).encode())
    retry = Retry.from_env()
    job = Job(
        store, parent(url), work, retry.attempts, retry.backoff, range_bytes, record="its sidecar"
    )
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
    fetched, reused = fetch_files(job, blocked, [], workers, label, progress)
    staged = work / name
    if write_local_sidecar(staged, identity, file_keys(staged), writer=True) != Path(
        f"{staged}{SIDECAR_SUFFIX}"
    ):
        raise StoreError(f"{work}: cannot write the staged prefix's sidecar there")
    _put_in_place(work, entry)
    return StagedStore(url, prefix, identity.content_hash, total, fetched, reused, False)


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
    range_bytes: int = RANGE_BYTES,
    format: str = TOKENTAPE,
) -> StagedStore:
    """Stage the store at ``url`` into ``cache_dir`` and say what that took (see the module
    docstring). ``expected_hash``: the content hash the store must have (a plan's record);
    ``label`` names the store in progress reports (default: the URL's last component);
    ``format``: ``megatron`` for a Megatron prefix (staged as ``KEY-NAME/NAME.bin`` and
    ``.idx``)."""
    if not is_url(url):
        raise ArgumentError(f"url must be an object URL (s3://bucket/prefix), got {url!r}")
    check_path("cache_dir", cache_dir)
    check_count("workers", workers, 1, MAX_WORKERS)
    check_count("range_bytes", range_bytes, 1, 2**40)
    check_callback(progress)
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not wait_s >= 0:
        raise ArgumentError(f"wait_s must be a number of seconds >= 0, got {wait_s!r}")
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    entry = cache / cache_key(url)
    with cache_lock(cache / f".{entry.name}.lock", f"stage {url}", wait_s) as waited:
        for old in cache.glob(f".{entry.name}.old-*"):  # left by a stager killed mid-swap
            shutil.rmtree(old, ignore_errors=True)
        staging = _stage_prefix_locked if format == MEGATRON else _stage_locked
        result = staging(
            url.rstrip("/"),
            entry,
            expected_hash,
            storage_options,
            progress,
            workers,
            label or basename(url),
            range_bytes,
        )
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
) -> tuple[Plan, dict[str, StagedStore]]:
    """``stage_plan``'s plan and, per staged source name, what staging it did."""
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
        )
        staged[s.name] = result
        sources.append(replace(s, path=str(result.path)))
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
