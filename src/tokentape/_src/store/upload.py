"""A store in object storage: what a prefix holds, and uploading a complete local store to it.

A store at an object URL (``s3://bucket/stores/web``) has the same objects as a local store
directory: every shard's ``.bin`` and ``.idx.npy``, the tokenizer copy, and ``manifest.json``.
It is built in a local directory first; ``upload_store`` then puts it under the URL:

1. A ``manifest.json`` already under the URL (an older store being replaced) is deleted
   **first**: from then on no new reader takes the prefix for a complete store.
2. Every other file, a few at a time (``UPLOAD_THREADS``; fsspec uploads a large one in
   parts), each with the user metadata ``sha256`` = the hex sha256 of its bytes (the
   manifest's ``bin_sha256``/``idx_sha256`` for shards). An object already there with the same
   size and the same ``sha256`` metadata is kept, not uploaded again: a rerun after a kill
   uploads only what is missing or different.
3. ``manifest.json`` **last** (one PUT, atomic for readers): a reader that finds it finds every
   object it names.
4. Objects of an older store that the new one does not name (shards beyond its count) are
   deleted after the new manifest is up.

``inspect_remote`` decides, before any work, what the URL holds: nothing of ours yet, an
unfinished upload (store objects without a manifest: resumed, each object checked as above),
this job's complete store, another store (refused without ``overwrite``), or objects that are
not a store's (refused, like a local directory that is not empty).

One writer at a time is **not** enforced in the bucket: object storage has no lock. The caller
holds the writer lock of its local build directory (``store.lock``), which excludes writers on
this machine, or on any machine sharing that directory; two machines uploading to one URL from
different work directories are not excluded.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokentape._src.objects.client import ObjectInfo, ObjectStore, join, redact
from tokentape._src.store.format import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    manifest_files,
    parse_manifest,
    provenance_files,
    read_manifest,
    store_files,
)
from tokentape._src.store.output import is_store_file
from tokentape._src.store.provenance import ShardProvenance
from tokentape._src.store.rerun import other_job
from tokentape._src.store.safedir import check_directory
from tokentape._src.util.faults import crashpoint
from tokentape._src.util.progress import ProgressCallback, tally
from tokentape.errors import OutputError, StoreError, TokentapeError

UPLOAD_THREADS = 4
"""Objects uploaded (or checked) at a time."""
HASH_KEY = "sha256"
"""The user-metadata key holding an uploaded object's content hash (hex sha256)."""
UPLOADS_DIR = ("tokentape", "uploads")


def upload_work_dir(url: str) -> Path:
    """The default local build directory of a store headed for ``url``:
    ``$XDG_CACHE_HOME/tokentape/uploads/<16 hex of sha256(url)>`` (``~/.cache`` when the
    variable is unset or not absolute). Trailing slashes of ``url`` do not count."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return base.joinpath(*UPLOADS_DIR, digest)


def check_upload_work_dir(work_dir: Path) -> None:
    """Refuse the default build directory ``work_dir`` (``upload_work_dir``) unless the two
    names below the user's cache directory (``.../tokentape``, which may be a link) are
    missing or this user's directories: tokentape's names, never followed through a link
    (the writer lock goes beside ``work_dir``)."""
    remedy = "tokentape makes it for the uploads it builds: remove it, or give --work-dir"
    check_directory(work_dir.parent, remedy)
    check_directory(work_dir, remedy)


def _listing(store: ObjectStore, url: str) -> dict[str, ObjectInfo]:
    """The objects under ``url/``, by name relative to it."""
    prefix = url.rstrip("/") + "/"
    return {i.url[len(prefix) :]: i for i in store.find(url) if i.url.startswith(prefix)}


def inspect_remote(
    store: ObjectStore,
    url: str,
    job_hash: str,
    overwrite: bool,
    identity: dict[str, Any] | None = None,
    tokenizer: str = "",
) -> Manifest | None:
    """This job's complete store at ``url`` (its manifest), or None when the job's store is
    to be uploaded there.

    Raises:
        OutputError: ``url`` is an object, or holds objects no store has (even with
            ``overwrite``); or, without ``overwrite``, holds another job's store, this job's
            store damaged, or a manifest that cannot be read; or the object store refuses
            (no such bucket, access denied).
        ObjectStorageError: listing or reading failed after retries.
    """
    with _refusals(url, "listing"):
        return _inspect(store, url, job_hash, overwrite, (identity or {}, tokenizer))


@contextmanager
def _refusals(url: str, what: str) -> Iterator[None]:
    """The object store's permanent refusals (no such bucket, access denied: not retried) as
    one ``OutputError`` naming ``url``."""
    try:
        yield
    except (FileNotFoundError, PermissionError) as exc:
        reason = redact(" ".join(str(exc).split()) or type(exc).__name__)
        raise OutputError(f"--out '{url}': {what} failed ({reason})") from None


def _inspect(
    store: ObjectStore,
    url: str,
    job_hash: str,
    overwrite: bool,
    job: tuple[dict[str, Any], str] = ({}, ""),
) -> Manifest | None:
    if store.info(url) is not None:
        raise OutputError(f"--out '{url}': an object, not a prefix; choose another URL")
    found = _listing(store, url)
    foreign = [name for name in found if "/" in name or not is_store_file(name)]
    if foreign:
        raise OutputError(
            f"--out '{url}': not empty and not a tokentape store (found '{foreign[0]}'); "
            "choose a new or empty prefix"
        )
    info = found.get(MANIFEST_NAME)
    manifest_url = join(url, MANIFEST_NAME)
    data = None if info is None else store.read_whole(manifest_url, info.size)
    _check_claimed(store, url, found, data)
    if data is None:
        return None  # nothing there, or an unfinished upload: resumed object by object
    problem = _problem(data, manifest_url, url, job_hash, found, job)
    if isinstance(problem, Manifest):
        return problem
    if not overwrite:
        raise OutputError(problem)
    return None  # replaced


def _check_claimed(
    store: ObjectStore, url: str, found: dict[str, ObjectInfo], manifest: bytes | None
) -> None:
    """Refuse (with or without ``--overwrite``) an object at a store name that tokentape cannot
    tell is its own: the manifest there (readable) does not name it, and it does not carry the
    ``sha256`` metadata every object tokentape uploads carries. An upload would replace or
    delete it. Where the object store keeps no metadata (not S3), store names are trusted."""
    if store.protocol != "s3":  # no user metadata (ObjectStore.metadata): names trusted
        return
    named: set[str] = set()
    if manifest is not None:
        with suppress(UnicodeDecodeError, TokentapeError):
            parsed = parse_manifest(manifest.decode(), join(url, MANIFEST_NAME), strict=False)
            named = {name for name, _ in store_files(parsed)}
    for name in sorted(found):
        if name == MANIFEST_NAME or name in named:
            continue
        tag = store.metadata(join(url, name)).get(HASH_KEY, "")
        if not re.fullmatch(r"[0-9a-f]{64}", tag):
            raise OutputError(
                f"--out '{url}': holds '{name}', which tokentape cannot tell is its own (no "
                f"readable {MANIFEST_NAME} there names it, and tokentape did not upload it); "
                "--overwrite never replaces such an object: move it away or choose another URL"
            )


def _problem(
    data: bytes,
    manifest_url: str,
    url: str,
    job_hash: str,
    found: dict[str, ObjectInfo],
    job: tuple[dict[str, Any], str] = ({}, ""),
) -> Manifest | str:
    """The manifest ``data`` when it is this job's complete store, else why the store under
    ``url`` must be replaced (a refusal without ``--overwrite``)."""
    try:
        manifest = parse_manifest(data.decode(), manifest_url)
    except UnicodeDecodeError:
        return (
            f"{manifest_url}: not UTF-8 text; not a readable manifest; "
            "pass --overwrite to replace the store"
        )
    except StoreError as exc:
        return f"{exc}; pass --overwrite to replace the store"
    if manifest.job != job_hash:
        return other_job(f"--out '{url}'", manifest, *job)
    damage = remote_damage(manifest, found)
    if damage is not None:
        return (
            f"--out '{url}': holds this job's store, but it is damaged ({damage}); "
            "pass --overwrite to rebuild it"
        )
    return manifest


def remote_damage(manifest: Manifest, found: dict[str, ObjectInfo]) -> str | None:
    """What is wrong with a store whose manifest is up, from a listing of its prefix (cheap:
    every object it names is there, shards of the sizes it records; ``verify`` rehashes)."""
    for file in manifest_files(manifest):
        info = found.get(file.name)
        if info is None:
            return f"{file.name} is missing"
        if file.size is not None and info.size != file.size:
            return f"{file.name} holds {info.size} bytes, the manifest says {file.size}"
    return None


@dataclass(frozen=True)
class UploadReport:
    """What ``upload_store`` did: objects uploaded, objects found intact and kept, and old
    objects deleted (an older store's manifest and the shards the new store does not name)."""

    uploaded: tuple[str, ...]
    kept: tuple[str, ...]
    deleted: tuple[str, ...]


@dataclass(frozen=True)
class _File:
    name: str
    path: Path
    size: int
    sha256: str


def _local_files(local: Path, manifest: Manifest) -> list[_File]:
    """Every file the local store's manifest names, with its size and content hash."""
    files = []
    for file in manifest_files(manifest):
        path = local / file.name
        sha = file.sha256 or _file_sha256(path)
        files.append(_File(file.name, path, path.stat().st_size, sha))
    return files


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * 2**20):
            digest.update(chunk)
    return digest.hexdigest()


def _intact(store: ObjectStore, url: str, file: _File, info: ObjectInfo | None) -> bool:
    """Whether the object ``url`` is already ``file``: same size, same ``sha256`` metadata."""
    if info is None or info.size != file.size:
        return False
    return store.metadata(url).get(HASH_KEY) == file.sha256


def _sync(store: ObjectStore, url: str, file: _File, info: ObjectInfo | None) -> bool:
    """Upload ``file`` to ``url`` unless it is there already; True when it was uploaded."""
    if _intact(store, url, file, info):
        return False
    store.put_file(file.path, url, metadata={HASH_KEY: file.sha256})
    crashpoint("mid-upload")  # test hook: killed with some objects up, others not
    return True


def upload_store(
    store: ObjectStore,
    local: str | os.PathLike[str],
    url: str,
    threads: int = UPLOAD_THREADS,
    progress: ProgressCallback | None = None,
) -> UploadReport:
    """Upload the complete store in the local directory ``local`` to the prefix ``url``: an
    older manifest there deleted first, the files (those not already there intact) next, the
    manifest last, then the older store's leftovers deleted (see the module docstring).
    ``progress`` receives reports labelled ``upload`` (bytes of the files done, a file at a
    time).

    Raises:
        StoreError: ``local`` is not a complete store.
        OutputError: the object store refuses (no such bucket, access denied).
        ObjectStorageError: an object could not be read, written or deleted (after retries).
    """
    local = Path(local)
    with _refusals(url, "uploading"):
        return _upload(store, local, url, threads, progress)


def _upload(
    store: ObjectStore,
    local: Path,
    url: str,
    threads: int,
    progress: ProgressCallback | None,
) -> UploadReport:
    manifest = read_manifest(local)
    manifest_bytes = (local / MANIFEST_NAME).read_bytes()
    files = _local_files(local, manifest)
    found = _listing(store, url)
    deleted = []
    manifest_url = join(url, MANIFEST_NAME)
    if MANIFEST_NAME in found:  # first: the older store stops being complete for readers
        store.delete(manifest_url)
        deleted.append(MANIFEST_NAME)
    uploaded = _sync_all(store, url, files, found, threads, progress)
    crashpoint("before-upload-manifest")
    store.put_bytes(
        manifest_url,
        manifest_bytes,
        metadata={HASH_KEY: hashlib.sha256(manifest_bytes).hexdigest()},
    )
    names = {f.name for f in files} | {MANIFEST_NAME}
    stale = sorted(n for n in found if n not in names and is_store_file(n))
    for name in stale:
        store.delete(join(url, name))
    kept = tuple(f.name for f in files if f.name not in uploaded)
    return UploadReport(tuple(sorted(uploaded)), kept, (*deleted, *stale))


def _sync_all(
    store: ObjectStore,
    url: str,
    files: list[_File],
    found: dict[str, ObjectInfo],
    threads: int,
    progress: ProgressCallback | None,
) -> set[str]:
    """Every file synced, ``threads`` at a time; the names uploaded. The first failure stops
    the rest (those already running finish) and is raised. ``progress`` hears of the bytes of
    every file done (uploaded or found intact), labelled ``upload``."""
    uploaded = set()
    with (
        tally(sum(f.size for f in files), "upload", progress) as counting,
        ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="upload") as pool,
    ):
        futures = {
            pool.submit(_sync, store, join(url, f.name), f, found.get(f.name)): f for f in files
        }
        try:
            for future in as_completed(futures):
                if future.result():
                    uploaded.add(futures[future].name)
                if counting is not None:
                    counting.add(futures[future].size)
        except BaseException:
            for other in futures:
                other.cancel()
            raise
    return uploaded


def _shard_files(shard: ShardInfo, provenance: ShardProvenance | None) -> list[tuple[str, str]]:
    """(name, sha256) of a shard's files: its two, and its provenance files when it has them
    (as the writer recorded them: the manifest is not written yet)."""
    files = [(shard.bin_file, shard.bin_sha256), (shard.idx_file, shard.idx_sha256)]
    if provenance is not None:
        files += [(f.name, str(f.sha256)) for f in provenance_files(shard, provenance)]
    return files


class ShardUploader:
    """Uploads each shard of a local build as soon as it is closed, while the build goes on
    (``tokenize --out s3://...``): its two files, a few at a time, as ``upload_store`` would
    (kept when already there intact). Before the first, the URL is looked at again
    (``inspect_remote``: another writer may have been at it during the build): this job's
    complete store there means nothing is uploaded; an older store's ``manifest.json`` (with
    ``overwrite``) is deleted, as ``upload_store`` does first. ``upload_store`` then finds these
    files intact and uploads only the rest and the manifest."""

    def __init__(
        self,
        store: ObjectStore,
        url: str,
        job_hash: str,
        overwrite: bool,
        threads: int = UPLOAD_THREADS,
    ) -> None:
        self.store, self.url, self.job_hash, self.overwrite = store, url, job_hash, overwrite
        self._off = False
        self._refused: TokentapeError | None = None
        self.uploaded: set[str] = set()
        """The names uploaded (not found intact) so far."""
        self._found: dict[str, ObjectInfo] | None = None
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="upload")
        self._futures: dict[Future[bool], str] = {}

    def shard_done(
        self, directory: Path, shard: ShardInfo, provenance: ShardProvenance | None = None
    ) -> None:
        """Start uploading ``shard``'s files (in place under their names in ``directory``; its
        provenance files too, when ``provenance`` records them)."""
        if self._found is None and not self._off:
            try:
                self._start()
            except TokentapeError as exc:  # raised by finish(): the local build goes on
                self._refused, self._off = exc, True
        if self._off or self._found is None:  # refused, or this job's store is there already
            return
        for name, sha in _shard_files(shard, provenance):
            path = directory / name
            file = _File(name, path, path.stat().st_size, sha)
            found = self._found.get(name)
            job = self._pool.submit(_sync, self.store, join(self.url, name), file, found)
            self._futures[job] = name

    def _start(self) -> None:
        mine = inspect_remote(self.store, self.url, self.job_hash, self.overwrite)
        self._off = mine is not None  # another writer's: nothing to upload
        with _refusals(self.url, "uploading"):
            found = _listing(self.store, self.url)
            if MANIFEST_NAME in found and not self._off:  # an older store's: deleted first
                self.store.delete(join(self.url, MANIFEST_NAME))
        self._found = found

    def finish(self) -> None:
        """Wait for every upload started; a refusal of the URL, or the first failure, is raised
        (never while the local build goes on: it is kept for a rerun)."""
        if self._refused is not None:
            raise self._refused
        with _refusals(self.url, "uploading"):
            for job in as_completed(self._futures):
                if job.result():
                    self.uploaded.add(self._futures[job])

    def close(self) -> None:
        """Stop: uploads not started are dropped (a rerun uploads what is missing)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


__all__ = [
    "HASH_KEY",
    "UPLOAD_THREADS",
    "ShardUploader",
    "UploadReport",
    "check_upload_work_dir",
    "inspect_remote",
    "remote_damage",
    "upload_store",
    "upload_work_dir",
]
