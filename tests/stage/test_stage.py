"""Staging object-storage stores to local disk (stage.stage) against a real S3 server (moto):
identical bytes and batches, reuse, kill and resume, corrupted objects, changed stores, and
one downloader per node while the others wait."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import tree_bytes, write_store

from tokentape._src.plan.plan import Plan
from tokentape._src.stage.cachelock import cache_lock
from tokentape._src.stage.stage import cache_key, stage, stage_plan, stage_sources, stage_store
from tokentape._src.store.safedir import SafeDir
from tokentape._src.store.tokenizers import load_tokenizer
from tokentape._src.train.batch import Batcher
from tokentape._src.util.faults import CRASH_ENV
from tokentape._src.util.progress import Progress
from tokentape.errors import CacheLocked, ObjectStorageError, StoreChanged, StoreError

pytestmark = pytest.mark.s3

STAGE_SCRIPT = """\
import json, sys
from tokentape._src.stage.stage import stage
print("ready", flush=True)
r = stage(sys.argv[1], sys.argv[2], workers=int(sys.argv[3]), range_bytes=int(sys.argv[4]))
print(json.dumps({"downloaded": r.downloaded_bytes, "reused": r.reused_bytes,
                  "total": r.total_bytes, "cached": r.cached, "waited": r.waited_s}))
"""


def _docs(seed: int, n: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(5, 60))] for _ in range(n)]


def _local_stores(root: Path, tokenizer_json: Path, edit: int = 0) -> dict[str, Path]:
    """Two stores of several shards of many 64-byte blocks, with a tokenizer copy."""
    tok = load_tokenizer(f"hf:{tokenizer_json}")
    stores = {}
    for i, (name, n, shard_tokens) in enumerate((("web", 80, 600), ("code", 50, 500))):
        path = root / "local" / name
        write_store(path, _docs(i + 10 * edit, n, tok.vocab_size), shard_tokens, 64, tok)
        stores[name] = path
    return stores


def _plans(root: Path, s3, tokenizer_json: Path) -> tuple[Plan, Plan, dict[str, Path]]:
    """The plan over the local stores, the same plan over their uploaded copies, the stores."""
    stores = _local_stores(root, tokenizer_json)
    local = Plan.build(
        {
            "web": {"path": str(stores["web"]), "weight": 0.7, "max_repeats": 1000},
            "code": {"path": str(stores["code"]), "weight": 0.3, "max_repeats": 1000},
        },
        seq_len=16,
        seed=7,
        total_samples=300,
    )
    urls = {name: s3.upload_tree(path, f"{s3.url}/stores/{name}") for name, path in stores.items()}
    remote = replace(local, sources=tuple(replace(s, path=urls[s.name]) for s in local.sources))
    return local, remote, stores


@pytest.fixture
def setup(tmp_path, s3, hf_tokenizer_json):
    local, remote, stores = _plans(tmp_path, s3, hf_tokenizer_json)
    return local, remote, stores, tmp_path / "cache"


def _visible(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))


def test_staged_plan_is_byte_identical_and_reused(setup, s3):
    local, remote, stores, cache = setup
    reports: list[Progress] = []
    staged = stage_plan(remote, cache, progress=reports.append, workers=4)
    assert staged.index_hash == local.index_hash == remote.index_hash
    for source, original in zip(staged.sources, local.sources, strict=True):
        assert Path(source.path).parent == cache
        assert source.path == str(cache / cache_key(f"{s3.url}/stores/{source.name}"))
        assert tree_bytes(Path(source.path)) == tree_bytes(stores[source.name])
        assert replace(source, path=original.path) == original
    assert "tokenizer.json" in tree_bytes(Path(staged.sources[0].path))
    positions = np.arange(local.horizon_samples)
    assert np.array_equal(
        Batcher(staged).batch(positions).tokens, Batcher(local).batch(positions).tokens
    )
    finals = [r for r in reports if r.final]
    assert [r.label for r in finals] == ["stage web", "stage code"]
    assert all(r.done_bytes == r.total_bytes > 0 for r in finals)
    assert _visible(cache) == sorted(Path(s.path).name for s in staged.sources)
    assert not [p for p in cache.iterdir() if p.name.endswith(".staging")]

    again, results = stage_sources(remote, cache)
    assert again == staged
    assert all(r.cached and r.downloaded_bytes == 0 for r in results.values())
    assert all(r.reused_bytes == r.total_bytes > 0 for r in results.values())
    url = remote.sources[0].path
    one = stage(url, cache)  # no plan: the remote manifest's identity decides
    assert one.cached and one.downloaded_bytes == 0 and one.path == Path(staged.sources[0].path)


def test_the_plans_storage_options_apply(setup, s3_server):
    _, remote, stores, cache = setup
    with FaultProxy(s3_server.endpoint) as proxy:
        planned = replace(remote, storage_options={"endpoint_url": proxy.endpoint})
        staged = stage_plan(planned, cache)
        assert proxy.stats().requests > 0  # every object came through the plan's endpoint
    assert staged.storage_options == planned.storage_options
    assert tree_bytes(Path(staged.sources[1].path)) == tree_bytes(stores["code"])


def test_local_sources_are_left_as_they_are(setup):
    local, remote, _, cache = setup
    mixed = replace(remote, sources=(remote.sources[0], local.sources[1]))
    staged, results = stage_sources(mixed, cache)
    assert list(results) == ["web"]
    assert staged.sources[1] == local.sources[1]
    assert staged.index_hash == local.index_hash


def _run_stage(url: str, cache: Path, workers: int, range_bytes: int, crash: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash:
        env[CRASH_ENV] = crash
    args = [sys.executable, "-c", STAGE_SCRIPT, url, str(cache), str(workers), str(range_bytes)]
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.subprocess
@pytest.mark.parametrize("point", ["stage.verified.part-00002.bin", "stage.written.part-00001.bin"])
def test_killed_stage_resumes_with_verified_blocks_kept(setup, point):
    _, remote, stores, cache = setup
    url = remote.sources[0].path
    proc = _run_stage(url, cache, 1, 256, crash=point)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, (out, err)
    entry = cache / cache_key(url)
    staging = cache / f".{entry.name}.staging"
    assert not entry.exists() and staging.is_dir()
    parts = sorted(p.name for p in staging.iterdir())
    assert ".part-00002.bin.part" in parts or ".part-00001.bin.part" in parts
    assert "manifest.json" not in parts  # never complete before every file is

    result = stage(url, cache, workers=3, range_bytes=256)
    assert not result.cached
    assert result.reused_bytes > 0 and result.downloaded_bytes > 0
    assert result.reused_bytes + result.downloaded_bytes == result.total_bytes
    assert tree_bytes(entry) == tree_bytes(stores["web"])
    assert not staging.exists()


@pytest.mark.subprocess
def test_unrecorded_bytes_are_never_trusted(setup):
    """Bytes written before a kill but not yet recorded as verified are fetched again, even
    when they were damaged on disk meanwhile."""
    _, remote, stores, cache = setup
    url = remote.sources[0].path
    proc = _run_stage(url, cache, 1, 256, crash="stage.written.part-00001.bin")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    part = cache / f".{cache_key(url)}.staging" / ".part-00001.bin.part"
    data = bytearray(part.read_bytes())
    data[:256] = bytes(256)  # the first range: written, then the kill before its record
    part.write_bytes(bytes(data))
    stage(url, cache, workers=2, range_bytes=256)
    assert tree_bytes(cache / cache_key(url)) == tree_bytes(stores["web"])


def test_corrupted_object_fails_naming_object_and_block(setup, s3, monkeypatch):
    _, remote, stores, cache = setup
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "2")
    url = remote.sources[0].path
    target = f"{url}/part-00001.bin"
    good = s3.get(target)
    bad = bytearray(good)
    bad[64 * 3 + 5] ^= 0xFF  # block 3
    s3.put(target, bytes(bad))
    with pytest.raises(StoreError) as caught:
        stage_plan(remote, cache, workers=4)
    message = str(caught.value)
    assert "\n" not in message
    assert target in message and "block 3 " in message and "bytes 192-256" in message
    entry = cache / cache_key(url)
    assert not entry.exists()
    assert _visible(cache) == []  # nothing in the cache looks like a complete store
    assert not list(cache.rglob(".part-00001.bin")) and not list(cache.rglob("part-00001.bin"))

    s3.put(target, good)  # repaired: the next stage completes, keeping what was verified
    staged = stage_plan(remote, cache, workers=4)
    assert tree_bytes(Path(staged.sources[0].path)) == tree_bytes(stores["web"])


def test_corrupted_index_and_tokenizer_copy_are_refused(setup, s3, monkeypatch):
    _, remote, _, cache = setup
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "1")
    url = remote.sources[1].path
    for name, what in (("part-00000.idx.npy", "idx_sha256"), ("tokenizer.json", "fingerprint")):
        good = s3.get(f"{url}/{name}")
        s3.put(f"{url}/{name}", good[:-1] + bytes([good[-1] ^ 1]))
        with pytest.raises(StoreError, match=f"{url}/{name}: .*{what}"):
            stage(url, cache / name)
        assert not (cache / name / cache_key(url)).exists()
        s3.put(f"{url}/{name}", good)


def test_stage_through_faults_is_exact(setup, s3_server, monkeypatch):
    """503s, dropped connections, truncated and corrupted bodies on the ranged GETs: the
    staged store is still byte-identical; every corrupted body was caught and fetched again."""
    _, remote, stores, cache = setup
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "10")
    url = remote.sources[0].path
    with FaultProxy(s3_server.endpoint, seed=3) as proxy:
        proxy.set(slowdown=0.1, drop=0.05, truncate=0.1, corrupt=0.2, ranged=True)
        result = stage(url, cache, storage_options={"endpoint_url": proxy.endpoint}, workers=4,
                       range_bytes=256)  # fmt: skip
        faults = proxy.stats().faults
    assert faults["corrupt"] > 0 and faults["truncate"] > 0 and faults["slowdown"] > 0
    assert tree_bytes(result.path) == tree_bytes(stores["web"])
    assert result.downloaded_bytes > result.total_bytes  # the corrupted blocks, fetched again


def test_not_a_store_and_a_failing_bucket_are_one_line(setup, s3, s3_server, monkeypatch):
    _, remote, _, cache = setup
    with pytest.raises(
        StoreError, match=r"/nothing': no manifest\.json; not a complete tokentape store"
    ):
        stage(f"{s3.url}/nothing", cache)
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "2")
    monkeypatch.setenv("TOKENTAPE_IO_THROTTLE_S", "0")  # 503s count as attempts
    url = remote.sources[0].path
    with FaultProxy(s3_server.endpoint) as proxy:
        proxy.set(slowdown=1.0, ranged=True)  # the manifest and listing pass, every range fails
        with pytest.raises(ObjectStorageError) as caught:
            stage(url, cache, storage_options={"endpoint_url": proxy.endpoint})
    message = str(caught.value)
    assert message.startswith(f"{url}/part-") and "after 2 attempts" in message
    assert "\n" not in message and not (cache / cache_key(url)).exists()


def test_changed_remote_store_replaces_the_cached_one(setup, s3, tmp_path, hf_tokenizer_json):
    _, remote, stores, cache = setup
    url = remote.sources[0].path
    first = stage(url, cache)
    assert tree_bytes(first.path) == tree_bytes(stores["web"])
    changed = _local_stores(tmp_path / "v2", hf_tokenizer_json, edit=1)["web"]
    for key in s3.keys(url):
        s3.client.delete_object(Bucket=s3.name, Key=key)
    s3.upload_tree(changed, url)

    pinned = stage_plan(remote, cache)  # the plan pinned the old content: the cache has it
    assert pinned.sources[0].path == str(first.path)
    with pytest.raises(StoreChanged) as caught:  # a cache without it cannot get it any more
        stage_plan(remote, tmp_path / "fresh-cache")
    assert caught.value.planned == remote.sources[0].content_hash
    assert caught.value.found != caught.value.planned and caught.value.path == url
    assert tree_bytes(first.path) == tree_bytes(stores["web"])  # the old copy is untouched

    second = stage(url, cache)
    assert second.path == first.path and not second.cached and second.downloaded_bytes > 0
    assert second.content_hash != first.content_hash
    assert tree_bytes(second.path) == tree_bytes(changed)
    assert first.path.name in _visible(cache) and len(_visible(cache)) == 2  # web, code
    assert [p.name for p in cache.iterdir() if ".old-" in p.name or "staging" in p.name] == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_concurrent_stagers_one_downloads_the_other_waits(setup):
    _, remote, stores, cache = setup
    url = remote.sources[0].path
    cache.mkdir()
    held = SafeDir.open(cache, "stage cache", "")
    with held, cache_lock(held, f".{cache_key(url)}.lock", "test holding the lock", 10):
        procs = [_run_stage(url, cache, 2, 128) for _ in range(2)]
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    results.sort(key=lambda r: r["downloaded"])
    waiter, downloader = results
    assert downloader["downloaded"] == downloader["total"] > 0 and not downloader["cached"]
    assert waiter["downloaded"] == 0 and waiter["cached"]
    assert waiter["reused"] == waiter["total"]
    assert waiter["waited"] > 0
    assert tree_bytes(cache / cache_key(url)) == tree_bytes(stores["web"])


def test_lock_wait_times_out_naming_the_holder(setup):
    _, remote, _, cache = setup
    url = remote.sources[0].path
    cache.mkdir()
    held = SafeDir.open(cache, "stage cache", "")
    expected = pytest.raises(CacheLocked, match=r"stage by another rank on host .*pid")
    with held, cache_lock(held, f".{cache_key(url)}.lock", "stage by another rank", 10), expected:
        stage(url, cache, wait_s=0.2)
    assert stage_store(url, cache) == cache / cache_key(url)


def test_cache_key_is_stable_and_readable():
    key = cache_key("s3://bucket/stores/web mix/")
    assert key == cache_key("s3://bucket/stores/web mix")
    assert key.endswith("-web_mix") and len(key.split("-")[0]) == 16
    assert cache_key("s3://other/stores/web mix") != key
