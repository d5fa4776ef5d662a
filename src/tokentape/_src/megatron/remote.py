"""A Megatron prefix in object storage (``s3://bucket/data/web_text_document`` for the objects
``…/web_text_document.bin`` and ``…/web_text_document.idx``), identified once and read in place.

Its identity (``MegatronIdentity``: both sha256, the ``.bin`` block hashes, the id range, the id
every document ends with, the content hash) is recorded beside the data in the object
``PREFIX.tokentape.json``, with each object's size and version (its ETag): the same JSON as a
local sidecar, but ``objects`` where a local one has ``files``, so neither is ever taken for
the other. ``tokentape verify URL`` computes it (``identify``: both objects read once, ranged
GETs in order, a few ahead) and writes it; nothing else reads the token data to identify a
prefix. ``tokentape plan``, the loader and ``stage`` read the sidecar and look at both objects'
size and version (``current_identity``); a prefix without a current sidecar (never verified,
or changed since) is refused in one line naming the command to run.

``megatron.source.megatron_at_url`` reads the prefix as a source: token windows as byte
ranges of the ``.bin`` object through the byte reader ``objects.ranged.RangedFiles``, whole
blocks checked against the recorded block hashes; the document starts from the ``.idx``
fetched whole and checked against its recorded sha256, on first use (segments, replay,
locate).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tokentape._src.megatron.format import (
    MegatronIdentity,
    MegatronIndex,
    index_from_bytes,
)
from tokentape._src.megatron.identity import (
    CHUNK_BYTES,
    SIDECAR_FORMAT,
    SIDECAR_MAX_BYTES,
    SIDECAR_SUFFIX,
    SIDECAR_VERSION,
    Progress,
    hash_chunks,
    identity_from_json,
    identity_to_json,
)
from tokentape._src.objects.client import (
    ObjectInfo,
    ObjectStore,
    redact,
)
from tokentape._src.util.checks import is_int
from tokentape.errors import StoreError

MAX_BLOCK_BYTES = 2**30
"""A recorded ``.bin`` block larger than this is not one of ours (``verify --quick`` holds a
block in memory): the sidecar counts as absent."""
READ_AHEAD = 4
"""Ranged GETs of ``.bin`` in flight while a prefix is identified (each ``CHUNK_BYTES``)."""


@dataclass(frozen=True)
class ObjectKey:
    """What stands for an object's bytes without reading them: its size and version (ETag)."""

    size: int
    version: str


@dataclass(frozen=True)
class ObjectKeys:
    """The keys of a prefix's two objects."""

    bin: ObjectKey
    idx: ObjectKey


def bin_url(url: str) -> str:
    return f"{url}.bin"


def idx_url(url: str) -> str:
    return f"{url}.idx"


def sidecar_url(url: str) -> str:
    return f"{url}{SIDECAR_SUFFIX}"


def object_keys(objects: ObjectStore, url: str) -> ObjectKeys:
    """Both objects' keys, as they are now; a missing one is one clear line."""
    keys = []
    for where in (bin_url(url), idx_url(url)):
        try:
            info: ObjectInfo | None = objects.info(where)
        except PermissionError as exc:
            raise StoreError(f"{where}: access denied ({redact(str(exc))})") from None
        if info is None:
            raise StoreError(f"{where}: no such object (a Megatron prefix needs .bin and .idx)")
        keys.append(ObjectKey(info.size, info.version))
    return ObjectKeys(*keys)


def _keys_from_json(data: Any) -> ObjectKeys | None:
    if not isinstance(data, dict) or set(data) != {"bin", "idx"}:
        return None
    keys = []
    for part in (data["bin"], data["idx"]):
        if not isinstance(part, dict) or set(part) != {"size", "version"}:
            return None
        size, version = part["size"], part["version"]
        if not (is_int(size) and size >= 0 and isinstance(version, str) and version):
            return None
        keys.append(ObjectKey(size, version))
    return ObjectKeys(*keys)


def read_sidecar(objects: ObjectStore, url: str) -> tuple[ObjectKeys, MegatronIdentity] | None:
    """The keys and identity the sidecar object beside ``url`` records; None when there is
    none, or it is not a well-formed one of ours (too large, not JSON, fields missing or
    inconsistent with each other or with the object sizes it records: counted as absent)."""
    where = sidecar_url(url)
    try:
        info = objects.info(where)
        if info is None or info.size > SIDECAR_MAX_BYTES:
            return None
        data = json.loads(objects.read_whole(where, info.size).decode("utf-8"))
    except (FileNotFoundError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    except PermissionError as exc:
        raise StoreError(f"{where}: access denied ({redact(str(exc))})") from None
    if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
        return None
    if data.get("version") != SIDECAR_VERSION:
        return None
    keys, identity = _keys_from_json(data.get("objects")), identity_from_json(data.get("identity"))
    if keys is None or identity is None:
        return None
    if identity.n_tokens and not 0 < identity.block_bytes <= MAX_BLOCK_BYTES:
        return None  # whole blocks could not be checked (or one would not fit in memory)
    if (identity.bin_bytes, identity.idx_bytes) != (keys.bin.size, keys.idx.size):
        return None  # describes other objects than those it names
    return keys, identity


def write_sidecar(
    objects: ObjectStore, url: str, identity: MegatronIdentity, keys: ObjectKeys
) -> bool:
    """Record ``identity`` for objects with ``keys`` beside ``url``; False when the bucket
    refuses the write (read-only access: the next verify identifies the prefix again)."""
    data = {
        "format": SIDECAR_FORMAT,
        "version": SIDECAR_VERSION,
        "prefix": url,
        "objects": {
            "bin": {"size": keys.bin.size, "version": keys.bin.version},
            "idx": {"size": keys.idx.size, "version": keys.idx.version},
        },
        "identity": identity_to_json(identity),
    }
    try:
        objects.put_bytes(sidecar_url(url), (json.dumps(data, indent=2) + "\n").encode())
    except PermissionError:
        return False
    return True


def no_identity(url: str, why: str) -> StoreError:
    return StoreError(
        f"Megatron prefix '{url}' has no current identity: {why}; identifying it reads all of "
        f"it: run `tokentape verify {url} --vocab-size V --eod-id E` once (it records "
        f"{url.rsplit('/', 1)[-1]}{SIDECAR_SUFFIX} beside it)"
    )


def current_identity(objects: ObjectStore, url: str) -> tuple[MegatronIdentity, ObjectKeys]:
    """The identity the sidecar records for the objects as they are now (their sizes and
    versions), read without touching the token data; refused when there is none."""
    keys = object_keys(objects, url)
    found = read_sidecar(objects, url)
    if found is None:
        raise no_identity(url, "no sidecar records one (none, or not a well-formed one of ours)")
    recorded, identity = found
    if recorded != keys:
        raise no_identity(url, "its .bin or .idx changed since the sidecar recorded them")
    return identity, keys


def read_index(objects: ObjectStore, url: str, keys: ObjectKeys) -> tuple[bytes, MegatronIndex]:
    """The ``.idx`` object's bytes, parsed and checked in full against the ``.bin`` size."""
    data = objects.read_whole(idx_url(url), keys.idx.size)
    return data, index_from_bytes(url, data, keys.bin.size)


def _bin_chunks(objects: ObjectStore, url: str, size: int, itemsize: int) -> Iterator[bytes]:
    """The ``.bin`` object in order, ``CHUNK_BYTES`` per ranged GET, ``READ_AHEAD`` ahead."""
    step = CHUNK_BYTES - CHUNK_BYTES % itemsize
    with ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="tokentape-identify") as pool:
        pending: deque[Future[bytes]] = deque()
        starts = iter(range(0, size, step))
        try:
            for start in starts:
                pending.append(
                    pool.submit(objects.read, bin_url(url), start, min(size, start + step))
                )
                if len(pending) < READ_AHEAD:
                    continue
                yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()


def identify(
    objects: ObjectStore, url: str, progress: Progress | None = None
) -> tuple[MegatronIdentity, ObjectKeys, MegatronIndex]:
    """Read both objects once and compute their identity (``megatron.identity.hash_chunks``),
    with the keys they had throughout: objects replaced while being read are refused."""
    keys = object_keys(objects, url)
    data, index = read_index(objects, url, keys)
    chunks = _bin_chunks(objects, url, keys.bin.size, index.dtype.itemsize)
    identity = hash_chunks(index, chunks, [data], progress)
    if object_keys(objects, url) != keys:
        raise StoreError(
            f"Megatron prefix '{url}': .bin or .idx changed while it was being read; try again "
            "once the objects are complete"
        )
    return identity, keys, index


__all__ = [
    "ObjectKey",
    "ObjectKeys",
    "bin_url",
    "current_identity",
    "identify",
    "idx_url",
    "object_keys",
    "read_sidecar",
    "sidecar_url",
    "write_sidecar",
]
