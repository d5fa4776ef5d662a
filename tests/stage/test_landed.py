"""A store streamed while this node stages it reads the blocks the stage has landed from local
disk (stage.landed), and the stage fetches first the blocks the coming steps read first
(``first_use``). Against a real S3 server (moto) through a proxy that records every GET."""

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
from faultproxy import FaultProxy, Recorder
from helpers import write_store

import tokentape
from tokentape._src.objects.ranged import RangedFiles
from tokentape._src.plan.plan import Plan
from tokentape._src.stage.landed import LandedBlocks
from tokentape._src.stage.stage import cache_key, stage
from tokentape._src.store.reader import Source, source_at_url
from tokentape._src.train.background import first_use
from tokentape._src.train.batch import Batcher
from tokentape._src.util.faults import CRASH_ENV

pytestmark = pytest.mark.s3

BLOCK = 64
SHARD_TOKENS = 600
STAGE_SCRIPT = """\
import sys
from tokentape._src.stage.stage import stage
stage(sys.argv[1], sys.argv[2], workers=1, range_bytes=256)
"""


@pytest.fixture
def bucket(tmp_path, s3, s3_server, monkeypatch):
    """A store of several shards of 64-byte blocks, local and uploaded, read through a proxy."""
    rng = random.Random(3)
    docs = [[rng.randrange(1, 250) for _ in range(rng.randint(5, 60))] for _ in range(90)]
    local = tmp_path / "local" / "web"
    write_store(local, docs, SHARD_TOKENS, BLOCK)
    url = s3.upload_tree(local, f"{s3.url}/stores/web")
    gets = Recorder()
    with FaultProxy(s3_server.endpoint, before=gets) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield url, local, gets


def _killed_stage(url: str, cache: Path, point: str) -> Path:
    """Stage ``url`` in a process SIGKILLed at ``point``; the staging directory it leaves."""
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV} | {CRASH_ENV: point}
    proc = subprocess.run(
        [sys.executable, "-c", STAGE_SCRIPT, url, str(cache)], env=env, capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return cache / f".{cache_key(url)}.staging"


def _plan(store: Path) -> Plan:
    spec = {"web": {"path": str(store), "weight": 1.0, "max_repeats": 1000}}
    return Plan.build(spec, seq_len=16, seed=5, total_samples=1000)


def _streamed(url: str, cache: Path) -> Source:
    source = source_at_url(url)
    assert isinstance(source.files, RangedFiles)
    source.files.use_local(LandedBlocks(cache, url))
    return source


def _chunks(source: Source, size: int) -> list[tuple[int, int, int]]:
    """(token file, start byte, stop byte) of reading each file in chunks of ``size`` tokens."""
    item = source.dtype.itemsize
    out = []
    for i, shard in enumerate(source.manifest.shards):
        for a in range(0, shard.n_tokens, size):
            out.append((i, a * item, min(a + size, shard.n_tokens) * item))
    return out


def _read_all(source: Source, local: Source, size: int) -> None:
    """Read every token in chunks through ``source``; each equals the local store's."""
    offsets = np.cumsum([0] + [s.n_tokens for s in local.manifest.shards])
    item = source.dtype.itemsize
    for i, lo, hi in _chunks(source, size):
        a, b = int(offsets[i]) + lo // item, int(offsets[i]) + hi // item
        assert np.array_equal(source.tokens(a, b), local.tokens(a, b))


@pytest.mark.subprocess
def test_landed_blocks_are_read_locally_and_the_rest_fetched(bucket, tmp_path):
    url, local_dir, gets = bucket
    cache = tmp_path / "cache"
    staging = _killed_stage(url, cache, "stage.verified.part-00002.bin")
    # What the killed stage left, read here independently of stage.landed: two files finished
    # (at their names), the third a .part whose .ok record names the blocks verified so far.
    names = sorted(p.name for p in staging.iterdir())
    assert "part-00000.bin" in names and "part-00001.bin" in names
    assert ".part-00002.bin.part" in names and "part-00003.bin" not in names
    landed = set(np.frombuffer((staging / ".part-00002.bin.ok").read_bytes(), "<u4").tolist())
    assert landed and max(landed) < 10

    local = Source(local_dir)
    source = _streamed(url, cache)
    before = len(gets.ranged_gets(".bin"))
    _read_all(source, local, 10)
    fetched = gets.ranged_gets(".bin")[before:]

    def is_local(i: int, lo: int, hi: int) -> bool:
        if i in (0, 1):
            return True
        return i == 2 and all(b in landed for b in range(lo // BLOCK, (hi - 1) // BLOCK + 1))

    chunks = _chunks(source, 10)
    expected_local = sum(hi - lo for i, lo, hi in chunks if is_local(i, lo, hi))
    name = [s.bin_file for s in local.manifest.shards]
    assert sorted(fetched) == sorted(
        (name[i], lo, hi) for i, lo, hi in chunks if not is_local(i, lo, hi)
    )
    assert source.stats.staged_bytes == expected_local > 0
    assert source.stats.requests == len(fetched) > 0

    # The stage completes (the .part renamed to its name, the directory put in place): the
    # view goes on reading the files it holds, and finds the others; nothing more is fetched.
    # (Read in chunks of another size: those inside a range fetched before come from the
    # source's cache of fetched ranges.)
    stage(url, cache, workers=2, range_bytes=256)
    assert not staging.exists()
    requests, staged = source.stats.requests, source.stats.staged_bytes
    _read_all(source, local, 7)
    assert source.stats.requests == requests
    cached = [
        (i, lo, hi)
        for i, lo, hi in _chunks(source, 7)
        if any(f == name[i] and a <= lo and hi <= b for f, a, b in fetched)
    ]
    new = sum(hi - lo for _, lo, hi in _chunks(source, 7)) - sum(hi - lo for _, lo, hi in cached)
    assert source.stats.staged_bytes == staged + new > staged
    source.close()


@pytest.mark.subprocess
def test_a_stage_of_another_version_or_a_planted_link_is_not_read(bucket, tmp_path):
    url, local_dir, _ = bucket
    cache = tmp_path / "cache"
    staging = _killed_stage(url, cache, "stage.verified.part-00002.bin")
    local = Source(local_dir)

    # The staging manifest records other block hashes: its blocks were verified against them.
    marker = staging / ".manifest.json"
    original = marker.read_bytes()
    other = json.loads(original)
    for shard in other["shards"]:
        shard["block_sha256"][0] = "0" * 64
    marker.write_text(json.dumps(other))
    source = _streamed(url, cache)
    _read_all(source, local, 25)
    assert source.stats.staged_bytes == 0 and source.stats.requests > 0
    source.close()

    # A link planted at the staging directory's name, to a directory that holds the store: the
    # view refuses it (no link is followed in the cache) and every read is fetched.
    marker.write_bytes(original)
    elsewhere = tmp_path / "elsewhere"
    staging.rename(elsewhere)
    staging.symlink_to(elsewhere)
    source = _streamed(url, cache)
    _read_all(source, local, 25)
    assert source.stats.staged_bytes == 0 and source.stats.requests > 0
    source.close()


def test_the_stage_fetches_the_blocks_read_first_first(bucket, tmp_path):
    url, local_dir, gets = bucket
    order = {"part-00002.bin": {5: 0, 1: 2}, "part-00000.bin": {3: 1}}
    before = len(gets.ranged_gets(".bin"))
    stage(url, tmp_path / "cache", workers=1, range_bytes=BLOCK, first_use=order)
    fetched = gets.ranged_gets(".bin")[before:]
    assert fetched[:3] == [
        ("part-00002.bin", 5 * BLOCK, 6 * BLOCK),
        ("part-00000.bin", 3 * BLOCK, 4 * BLOCK),
        ("part-00002.bin", 1 * BLOCK, 2 * BLOCK),
    ]
    rest = fetched[3:]
    assert rest == sorted(rest)  # then file by file, block by block
    assert len(fetched) == sum(
        -(-s.n_tokens * 2 // BLOCK) for s in Source(local_dir).manifest.shards
    )


def test_first_use_names_each_block_at_the_first_position_that_reads_it(bucket, tmp_path):
    url, local_dir, _ = bucket
    local = _plan(local_dir)
    remote = replace(local, sources=(replace(local.sources[0], path=url),))
    start, count = 7, 300
    got = first_use(Batcher(remote), start, count)
    # Derived here from the local store's manifest: each position's window, its first token
    # file, the blocks of its first and last byte in that file.
    store = Source(local_dir)
    sizes = [s.n_tokens for s in store.manifest.shards]
    bounds = np.cumsum([0, *sizes])
    expected: dict[str, dict[int, int]] = {}
    samples = Batcher(local).batch(np.arange(start, start + count)).sample
    for rank, k in enumerate(samples.tolist()):
        a = k * 16
        i = int(np.searchsorted(bounds, a, side="right")) - 1
        b = min(a + 17, int(bounds[i + 1]))
        lo, hi = (a - int(bounds[i])) * 2, (b - int(bounds[i])) * 2
        blocks = expected.setdefault(store.manifest.shards[i].bin_file, {})
        for block in (lo // BLOCK, (hi - 1) // BLOCK):
            blocks.setdefault(block, rank)
    assert got == {url: expected}


@pytest.mark.subprocess
def test_a_background_loader_reads_landed_blocks_from_its_first_step(bucket, tmp_path):
    """A node whose stage is under way (another process was staging: here, killed midway):
    a loader's first step, built before its own stage begins, reads the landed blocks."""
    url, local_dir, _ = bucket
    cache = tmp_path / "cache"
    _killed_stage(url, cache, "stage.verified.part-00003.bin")
    local = _plan(local_dir)
    remote = replace(local, sources=(replace(local.sources[0], path=url),))
    config = tokentape.BatchConfig(1, 32, 1)
    with (
        tokentape.Loader(remote, 0, config, prefetch=0, cache_dir=cache) as loader,
        tokentape.Loader(local, 0, config, prefetch=0) as expected,
    ):
        step = loader.step()
        assert np.array_equal(step.micro_batches[0].tokens, expected.step().micro_batches[0].tokens)
        stats = loader.fetch_stats
        assert stats.staged_bytes > 0 and stats.requests > 0
