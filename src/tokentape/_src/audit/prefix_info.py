"""``tokentape info PREFIX``: a Megatron indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``, on
local disk or in a bucket) described from its ``.idx`` and its recorded identity, reading no
token data and hashing nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokentape._src.megatron.format import MegatronIdentity, PrefixFiles, read_index
from tokentape._src.megatron.identity import current_identity
from tokentape._src.megatron.remote import object_keys, read_sidecar
from tokentape._src.megatron.remote import read_index as read_remote_index
from tokentape._src.objects.client import StorageOptions, is_url, object_store


@dataclass(frozen=True)
class PrefixInfo:
    """A Megatron prefix as its ``.idx`` describes it, and its identity if one is recorded."""

    prefix: str
    dtype: str
    n_sequences: int
    n_docs: int
    n_tokens: int
    bin_bytes: int
    idx_bytes: int
    identity: MegatronIdentity | None
    """The identity recorded for the files as they are now (a sidecar, or the local cache);
    None: not identified yet (``tokentape verify PREFIX --vocab-size V --eod-id E`` does it)."""

    def to_json(self) -> dict[str, Any]:
        """``tokentape info PREFIX --json``."""
        ident = self.identity
        return {
            "format": "megatron",
            "prefix": self.prefix,
            "dtype": self.dtype,
            "n_sequences": self.n_sequences,
            "n_docs": self.n_docs,
            "n_tokens": self.n_tokens,
            "bin_bytes": self.bin_bytes,
            "idx_bytes": self.idx_bytes,
            "content_hash": None if ident is None else ident.content_hash,
            "min_id": None if ident is None else ident.min_id,
            "max_id": None if ident is None else ident.max_id,
            "end_id": None if ident is None else ident.end_id,
        }


def prefix_info(prefix: str, storage_options: StorageOptions | None = None) -> PrefixInfo:
    """Read ``prefix``'s ``.idx`` (checked in full against the ``.bin`` size) and its current
    identity, if any; a missing or damaged file raises ``StoreError`` naming it."""
    if is_url(prefix):
        objects = object_store(prefix, storage_options)
        keys = object_keys(objects, prefix)
        _, index = read_remote_index(objects, prefix, keys)
        found = read_sidecar(objects, prefix)
        identity = found[1] if found is not None and found[0] == keys else None
        bin_bytes, idx_bytes = keys.bin.size, keys.idx.size
    else:
        with PrefixFiles(prefix) as files:
            index = read_index(prefix, files)
            identity, _ = current_identity(files)
            bin_bytes, idx_bytes = files.keys.bin.size, files.keys.idx.size
    return PrefixInfo(
        prefix=prefix if is_url(prefix) else str(Path(prefix)),
        dtype=index.dtype_name,
        n_sequences=index.n_sequences,
        n_docs=index.n_docs,
        n_tokens=index.n_tokens,
        bin_bytes=bin_bytes,
        idx_bytes=idx_bytes,
        identity=identity,
    )


__all__ = ["PrefixInfo", "prefix_info"]
