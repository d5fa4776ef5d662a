"""A bucket whose manifest had its block hashes rewritten to match changed bytes (the block
hashes are not part of the content hash; each file's sha256 is): staging refuses the store."""

from __future__ import annotations

import hashlib
import json

import pytest
from helpers import write_store

from tokentape._src.stage.stage import stage_store
from tokentape.errors import StoreError

pytestmark = pytest.mark.s3

BLOCK = 64


def test_block_hashes_forged_to_match_changed_bytes_do_not_stage(tmp_path, s3):
    docs = [[(5 * i + j) % 250 + 1 for j in range(90)] for i in range(20)]
    write_store(tmp_path / "s", docs, shard_tokens=10_000, block_bytes=BLOCK)
    url = s3.upload_tree(tmp_path / "s", f"{s3.url}/s")
    data = bytearray(s3.get(f"{url}/part-00000.bin"))
    data[BLOCK * 2 + 3] ^= 0x01
    s3.put(f"{url}/part-00000.bin", bytes(data))
    manifest = json.loads(s3.get(f"{url}/manifest.json"))
    block = bytes(data[BLOCK * 2 : BLOCK * 3])
    manifest["shards"][0]["block_sha256"][2] = hashlib.sha256(block).hexdigest()
    s3.put(f"{url}/manifest.json", json.dumps(manifest).encode())  # content hash unchanged
    cache = tmp_path / "cache"
    with pytest.raises(StoreError, match=r"part-00000\.bin: every block matches .* altered"):
        stage_store(url, cache)
    staged = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert staged == []  # no complete store in the cache
    assert not any(p.name.endswith(".part") for p in cache.rglob("*"))  # nothing kept as verified
