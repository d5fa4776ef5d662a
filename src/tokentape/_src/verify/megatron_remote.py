"""The checks ``tokentape verify`` runs on a Megatron prefix in object storage.

As on local disk (``verify.megatron``), but the recorded identity is the sidecar object beside
the prefix (``megatron.remote``). A full check reads both objects once (the ``.idx`` whole and
parsed in full, the ``.bin`` in ranged GETs), compares what it computes with a sidecar current
for the objects (same sizes and versions) if there is one, and, when the bytes are as recorded
or nothing current was recorded, writes the sidecar for the objects as they are now: what
makes the prefix usable by ``plan``, ``stage`` and the loader. ``--quick`` (with a current
sidecar) fetches the ``.idx`` and only the chosen ``.bin`` blocks.

Unlike a local file's keys, an object's version (its ETag) changes only when the object is
written again, so a sidecar recorded for other versions describes other bytes: it is not
compared with, and verify records the objects anew. What guards a training run against data
replaced under it is its plan, which recorded the content hash: `verify PLAN.json` reports the
difference, and the loader and ``stage`` refuse the source (``StoreChanged``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from tokentape._src.megatron.format import IdRange, MegatronIdentity, index_from_bytes
from tokentape._src.megatron.remote import (
    ObjectKeys,
    bin_url,
    identify,
    idx_url,
    object_keys,
    read_sidecar,
    sidecar_url,
    write_sidecar,
)
from tokentape._src.objects.client import ObjectStore
from tokentape._src.verify.megatron import (
    Chooser,
    MegatronCheck,
    against_record,
    chosen_bytes,
    id_problems,
    plan_problems,
    union,
)
from tokentape.errors import TokentapeError


def _recorded(objects: ObjectStore, url: str) -> tuple[ObjectKeys, MegatronIdentity | None, bool]:
    """The objects' keys now, the sidecar's identity (any), and whether it is current."""
    keys = object_keys(objects, url)
    found = read_sidecar(objects, url)
    if found is None:
        return keys, None, False
    return keys, found[1], found[0] == keys


def _quick_usable(keys: ObjectKeys, recorded: MegatronIdentity | None, current: bool) -> bool:
    if recorded is None or not current or recorded.block_bytes <= 0:
        return False
    itemsize = np.dtype(recorded.dtype).itemsize
    return recorded.block_bytes % itemsize == 0 and recorded.bin_bytes == keys.bin.size


def planned_remote_bytes(objects: ObjectStore, url: str, quick: bool, chooser: Chooser) -> int:
    """Bytes of ``.bin`` a check reads (0 when the objects cannot be looked at)."""
    try:
        keys, recorded, current = _recorded(objects, url)
    except TokentapeError:
        return 0
    if not quick or not _quick_usable(keys, recorded, current):
        return keys.bin.size
    assert recorded is not None
    return chosen_bytes(recorded, keys.bin.size, chooser)


def check_remote_megatron(
    objects: ObjectStore,
    url: str,
    quick: bool,
    chooser: Chooser,
    progress: Callable[[int], None] | None,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    plan_hashes: Sequence[tuple[str, str, str]] = (),
) -> MegatronCheck:
    """Verify the prefix at ``url``; ``plan_hashes`` holds (plan, source name, content hash)."""
    out = MegatronCheck()
    data, meta = bin_url(url), idx_url(url)
    try:
        keys, recorded, current = _recorded(objects, url)
        if quick and _quick_usable(keys, recorded, current):
            assert recorded is not None
            ids = union(_spot_check(objects, url, recorded, chooser, progress, out), _ids(recorded))
            content, end_id = recorded.content_hash, recorded.end_id
        else:
            found, read, index = identify(objects, url, progress)
            out.n_tokens, out.n_docs = index.n_tokens, index.n_docs
            out.bytes_hashed += found.bin_bytes
            out.blocks_total = out.blocks_checked = len(found.block_sha256)
            bytes_differ = False
            current = current and read == keys  # not replaced since the sidecar was read
            if current and recorded is not None:
                problems = against_record(data, meta, recorded, found)
                bytes_differ = any("sha256" in what for _, what, _, _ in problems)
                out.problems += problems
            as_recorded = current and recorded == found  # nothing to write
            if not (bytes_differ or as_recorded) and not write_sidecar(objects, url, found, read):
                out.problems.append(
                    (
                        sidecar_url(url),
                        "identity not recorded",
                        "write access beside the prefix",
                        "access denied: plan, stage and the loader refuse the prefix until "
                        "someone who may write there runs verify",
                    )
                )
            ids, content, end_id = _ids(found), found.content_hash, found.end_id
    except TokentapeError as exc:
        out.problems.append((meta, "unreadable", "a Megatron dataset tokentape can read", str(exc)))
        return out
    out.problems += plan_problems(plan_hashes, content)
    out.problems += id_problems(data, ids, vocab_size)
    if eod_id is not None and out.n_docs and end_id != eod_id:
        ends = "not one id" if end_id is None else f"id {end_id}"
        expected = f"id {eod_id} at every document end"
        out.problems.append(
            (data, "missing end-of-document id", expected, f"documents end with {ends}")
        )
    return out


def _ids(identity: MegatronIdentity) -> tuple[int | None, int | None]:
    return identity.min_id, identity.max_id


def _spot_check(
    objects: ObjectStore,
    url: str,
    recorded: MegatronIdentity,
    chooser: Chooser,
    progress: Callable[[int], None] | None,
    out: MegatronCheck,
) -> tuple[int | None, int | None]:
    """Hash the ``.idx`` (and parse it) and the chosen ``.bin`` blocks against the sidecar;
    their id range."""
    out.n_tokens, out.n_docs = recorded.n_tokens, recorded.n_docs
    data, meta = bin_url(url), idx_url(url)
    index = objects.read_whole(meta, recorded.idx_bytes)
    digest = hashlib.sha256(index).hexdigest()
    if digest != recorded.idx_sha256:
        out.problems.append((meta, "sha256 mismatch (sidecar)", recorded.idx_sha256, digest))
    else:
        index_from_bytes(url, index, recorded.bin_bytes, recorded.n_tokens)
    bb, size, dtype = recorded.block_bytes, recorded.bin_bytes, np.dtype(recorded.dtype)
    chosen = chooser(len(recorded.block_sha256))
    out.blocks_total, out.blocks_checked = len(recorded.block_sha256), len(chosen)
    ids = IdRange()
    for i in chosen:
        block = objects.read(data, i * bb, min(size, (i + 1) * bb))
        out.bytes_hashed += len(block)
        if progress is not None:
            progress(len(block))
        ids.update(np.frombuffer(block, dtype=dtype))
        found = hashlib.sha256(block).hexdigest()
        if found != recorded.block_sha256[i]:
            out.problems.append(
                (data, f"block {i} sha256 mismatch", recorded.block_sha256[i], found)
            )
    return ids.min, ids.max


__all__ = ["check_remote_megatron", "planned_remote_bytes"]
