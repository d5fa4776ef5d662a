"""Issue 12 items 6 and 7 end to end: the streamed loader, the audits, staging and tokenize,
each through the fault proxy (tests/faultproxy.py) in front of the real S3 server (moto).

Under 503 SlowDown, dropped connections, truncated bodies and latency every path gives exactly
the bytes of the local path; a corrupted body (same length, one byte flipped) is refused by the
block hashes and fetched again, and nothing corrupt is kept; after the retry budget a single
line names the object and the last error (``ObjectStorageError`` from ``step()``, exit 2 from
the command line) and a retry once the store answers again succeeds.

The stores here are written with 64-byte hash blocks and read at ``seq_len = 64`` (a window
is 130 bytes of uint16), so every streamed range covers whole blocks. A streamed range
smaller than a block (a piece of a window at a shard boundary, or any window of a store
written with the default 64 MiB blocks) is checked by its length only: a same-length
corrupted body there is not detectable by the reader, which is why the corruption tests use
single-shard stores.
"""

from __future__ import annotations

import json
import random
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import jsonl_corpus, run_cli, tree_bytes, wait_for, write_store
from objstore import SECRET_KEY

from tokentape import BatchConfig, DataState, FetchConfig, Loader, Plan
from tokentape._src.stage.stage import cache_key, stage_plan
from tokentape._src.store.provenance import INPUTS_NAME
from tokentape._src.store.reader import Source, source_at_url
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape.errors import ObjectStorageError, StoreError, TokentapeError

pytestmark = pytest.mark.s3

SEQ_LEN = 64
BLOCK = 64
RUN = [(3, BatchConfig(2, 2, 2)), (3, BatchConfig(3, 1, 2))]
"""Three steps at dp = 2, then three at dp = 3 (a dp change), each rank its own loader."""
FETCH = FetchConfig(concurrency=4)
FAULTS = {
    "slowdown": {"slowdown": 0.3},
    "drop": {"drop": 0.3},
    "truncate": {"truncate": 0.3},
    "delay": {"delay": 0.01},
}


def _docs(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 256) for _ in range(rng.randint(5, 120))] for _ in range(n)]


def _write(root: Path, shard_tokens: int) -> dict[str, Path]:
    stores = {}
    for i, (name, n) in enumerate((("web", 90), ("code", 50))):
        stores[name] = root / name
        write_store(stores[name], _docs(i, n), shard_tokens, block_bytes=BLOCK)
    return stores


@pytest.fixture(scope="module")
def multi(tmp_path_factory) -> dict[str, Path]:
    """Two stores of several shards (about 3 KB each) of 64-byte blocks."""
    return _write(tmp_path_factory.mktemp("multi"), shard_tokens=1500)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict[str, Path]:
    """The same kind of stores, one shard each: every streamed range covers whole blocks."""
    return _write(tmp_path_factory.mktemp("single"), shard_tokens=100_000)


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server.endpoint, seed=5) as running:
        yield running


def _plans(stores: dict[str, Path], s3, prefix: str) -> tuple[Plan, Plan]:
    """The plan over the local stores and the same plan over their uploaded copies."""
    local = Plan.build(
        {
            "web": {"path": str(stores["web"]), "weight": 0.6, "max_repeats": 1000},
            "code": {"path": str(stores["code"]), "weight": 0.4, "max_repeats": 1000},
        },
        seq_len=SEQ_LEN,
        seed=11,
        total_samples=400,
    )
    urls = {n: s3.upload_tree(p, f"{s3.url}/{prefix}/{n}") for n, p in stores.items()}
    remote = replace(local, sources=tuple(replace(s, path=urls[s.name]) for s in local.sources))
    return local, remote


NO_BOTO_CHECKSUMS = {"config_kwargs": {"response_checksum_validation": "when_required"}}
"""botocore checks a full object's checksum when the server sends one (moto does, also for a
range that covers the whole object; S3 does not for ranges): turned off where a test is about
tokentape's own checks, which must not depend on it."""


def _via(plan: Plan, proxy: FaultProxy, **options) -> Plan:
    """``plan`` read through the proxy (the plan's storage_options table)."""
    return replace(plan, storage_options={"endpoint_url": proxy.endpoint, **options})


def _arrays(step) -> list[np.ndarray]:
    return [
        a
        for b in step.micro_batches
        for a in (b.positions, b.tokens, b.segment_ids, b.doc_positions)
    ]


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def _step(loader: Loader, tries: int = 1, refused: list[str] | None = None):
    """``loader.step()``, retried after a refused (corrupted) range up to ``tries`` times."""
    for attempt in range(1, tries + 1):
        try:
            return loader.step()
        except StoreError as exc:
            if attempt == tries or refused is None:
                raise
            refused.append(str(exc))
    raise AssertionError("unreachable")


def _run(plan: Plan, tries: int = 1, refused: list[str] | None = None) -> list[list[np.ndarray]]:
    """Every rank's step arrays over ``RUN`` (the dp change through the saved state)."""
    out: list[list[np.ndarray]] = []
    state = None
    for steps, config in RUN:
        loaders = [
            Loader(plan, r, config, state=state, prefetch=2, segments=True, fetch=FETCH)
            for r in range(config.dp_size)
        ]
        try:
            for _ in range(steps):
                out.append([a for ld in loaders for a in _arrays(_step(ld, tries, refused))])
                for ld in loaders:
                    ld.commit()
            state = DataState.from_dict(loaders[0].state_dict())
        finally:
            for ld in loaders:
                ld.close()
    return out


@pytest.fixture(scope="module")
def local_run(multi) -> list[list[np.ndarray]]:
    """The run over the local multi-shard stores (the plan has no URL in it)."""
    local = Plan.build(
        {
            "web": {"path": str(multi["web"]), "weight": 0.6, "max_repeats": 1000},
            "code": {"path": str(multi["code"]), "weight": 0.4, "max_repeats": 1000},
        },
        seq_len=SEQ_LEN,
        seed=11,
        total_samples=400,
    )
    return _run(local)


# --- 1. the streamed loader under each fault ----------------------------------------------


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_streamed_run_with_a_dp_change_is_exact_under_faults(
    kind, multi, local_run, s3, proxy, monkeypatch
):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "25")
    _, remote = _plans(multi, s3, "stores")
    proxy.set(**FAULTS[kind])
    got = _run(_via(remote, proxy))
    stats = proxy.stats()
    assert len(got) == len(local_run) == 6
    for g, w in zip(got, local_run, strict=True):
        _assert_same(g, w)
    ranged = [p for m, p, _, _ in stats.log if m == "GET" and ".bin" in p]
    assert len(ranged) >= 6  # the windows really came through the proxy
    if kind != "delay":
        assert stats.faults[kind] >= 3, stats.faults


# --- 2. corrupted bodies while streaming --------------------------------------------------


@pytest.mark.parametrize("retries", ["1", "4"])
def test_corrupted_ranges_are_refused_and_nothing_corrupt_is_cached(
    retries, single, s3, proxy, monkeypatch
):
    """A corrupted body of a range covering whole blocks fails its hash check: it is fetched
    again within the retry budget, else the step fails with a StoreError naming the object and
    block and a retry of the step fetches afresh (failed fetches are not kept). Once the fault
    is off, the same loader serves every step again from its cache, identical to local. (A
    range smaller than a block would be checked by its length only.)"""
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", retries)
    local, remote = _plans(single, s3, "one")
    config = BatchConfig(2, 2, 2)
    steps, prefetch = 6, 2
    # segments off: the document index's own check is test_a_corrupted_document_index_...
    with Loader(local, 1, config) as ll:
        want = []
        for _ in range(steps + prefetch):
            want.append(_arrays(ll.step()))
            ll.commit()
    proxy.set(corrupt=0.3, ranged=True)  # the ranged GETs: windows and document indexes
    refused: list[str] = []
    via = _via(remote, proxy, **NO_BOTO_CHECKSUMS)
    with Loader(via, 1, config, prefetch=prefetch, fetch=FETCH) as rl:
        for i in range(steps + prefetch):
            _assert_same(_arrays(_step(rl, 40, refused)), want[i])
            rl.commit()
        assert proxy.stats().faults["corrupt"] >= 3
        if retries == "1":  # no second fetch: every corrupted window refused the step
            assert refused, "no corrupted body was refused"
        assert rl.fetch_stats.blocks_checked > 0
        for message in refused:
            assert "\n" not in message and f"{s3.url}/one/" in message, message
            assert "does not match" in message or "damaged" in message, message
        proxy.clear()
        _settle(rl)  # the fetches for the steps past these have ended
        before = proxy.stats().requests
        rl.load_state_dict(DataState.start(remote).to_dict())
        for i in range(steps):  # their windows and those prefetched after: all read above
            _assert_same(_arrays(rl.step()), want[i])
            rl.commit()
        # Served from what was cached under the faults: no new request, nothing corrupt kept.
        assert proxy.stats().requests == before


def _settle(loader: Loader) -> None:
    """Wait until the steps ``loader`` builds ahead and its sources' range fetches have all
    ended (observed on their futures, not on a quiet spell: a busy machine stalls anything)."""

    def idle() -> bool:
        futures = [a.batches for a in loader._ahead.values()]
        for source in loader.batcher.sources:
            cache = getattr(source, "cache", None)
            if cache is not None:
                with cache._lock:
                    futures += list(cache._lru.values())
        return all(f.done() for f in futures)

    wait_for(idle, "the loader's fetches ahead to end")


def test_a_corrupted_document_index_is_never_used(tmp_path, s3, proxy, monkeypatch):
    """The ``.idx.npy`` is read whole through a ranged GET (with ``segments``): a corrupted
    body must be refused (or fetched again), never used. Documents of 400 tokens and an even
    number per shard: the proxy flips the low byte of one document start, which stays inside
    the shard and ascending, so only the manifest's ``idx_sha256`` can tell."""
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "2")
    docs = [[(7 * i + j) % 255 + 1 for j in range(400)] for i in range(40)]
    manifest = write_store(tmp_path / "s", docs, shard_tokens=401 * 20, block_bytes=BLOCK)
    assert [s.n_docs for s in manifest.shards] == [20, 20]
    url = s3.upload_tree(tmp_path / "s", f"{s3.url}/s")
    want = Source(tmp_path / "s").doc_starts
    source = source_at_url(url, {"endpoint_url": proxy.endpoint, **NO_BOTO_CHECKSUMS})
    proxy.set(corrupt=1.0, ranged=True)
    try:
        got = source.doc_starts
    except (StoreError, ObjectStorageError) as exc:
        assert "idx.npy" in str(exc) and "\n" not in str(exc)
    else:
        np.testing.assert_array_equal(got, want)
    finally:
        source.close()
    assert proxy.stats().faults["corrupt"] >= 1


def _is_503(message: str) -> bool:
    """S3's 503 SlowDown as botocore words it: its message, or the status of a HEAD."""
    return "reduce your request rate" in message or "Service Unavailable" in message


# --- 3. after the retry budget ------------------------------------------------------------


@pytest.mark.parametrize(
    "ranged",
    [
        pytest.param(False, id="every-request"),
        pytest.param(True, id="ranged-gets"),
    ],
)
def test_after_the_retry_budget_step_raises_one_line_and_a_retry_recovers(
    ranged, multi, s3, proxy, monkeypatch
):
    """Every request refused, or only the ranged GETs (the shard sizes are read, the window
    fetches fail, prefetched ones included): one line; the store back, every step works. (The
    503s count as attempts once the time for waiting them out is spent: none here.)"""
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "2")
    monkeypatch.setenv("TOKENTAPE_IO_THROTTLE_S", "0")
    local, remote = _plans(multi, s3, "stores")
    config = BatchConfig(2, 2, 1)
    with Loader(local, 0, config, segments=True) as ll:
        want = []
        for _ in range(4):
            want.append(_arrays(ll.step()))
            ll.commit()
    with Loader(_via(remote, proxy), 0, config, prefetch=2, segments=True, fetch=FETCH) as rl:
        proxy.set(slowdown=1.0, ranged=ranged)  # the store opened; now requests are refused
        with pytest.raises(ObjectStorageError) as caught:
            rl.step()
        exc = caught.value
        message = str(exc)
        assert isinstance(exc, TokentapeError)
        assert "\n" not in message and SECRET_KEY not in message
        assert message.startswith(f"{s3.url}/stores/"), message
        assert "after 2 attempts" in message and _is_503(message), message
        assert exc.url in message and exc.last_error in message
        proxy.clear()
        for i in range(4):  # the store answers again: the retry, and every later step, works
            _assert_same(_arrays(rl.step()), want[i])
            rl.commit()


@pytest.mark.slow
def test_cli_after_the_retry_budget_exits_2_with_one_line(multi, s3, proxy, tmp_path):
    """replay, verify and stage against the bucket through the proxy (AWS_ENDPOINT_URL):
    every request or every ranged GET refused is one line and exit 2; 503s for a third of the
    requests, with retries, give the local answers."""
    local, remote = _plans(multi, s3, "stores")
    saved, saved_local = tmp_path / "remote.json", tmp_path / "local.json"
    remote.save(saved)
    local.save(saved_local)
    env = {
        "AWS_ENDPOINT_URL": proxy.endpoint,
        "TOKENTAPE_IO_RETRIES": "2",
        "TOKENTAPE_IO_THROTTLE_S": "0",  # 503s count as attempts
    }
    replay = ("replay", str(saved), "--step", "1", "--global-batch", "8", "--json")
    verify = ("verify", f"{s3.url}/stores/web")
    stage = ("stage", str(saved), "--cache", str(tmp_path / "cache"), "--json")
    cases = [(False, replay), (True, replay), (False, verify), (True, stage)]
    for ranged, args in cases:
        proxy.clear()
        proxy.set(slowdown=1.0, ranged=ranged)
        done = run_cli(*args, env=env)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, (args, ranged, done.stderr)
        assert len(lines) == 1, done.stderr
        assert f"{s3.url}/stores/" in lines[0] and _is_503(lines[0]), lines[0]
        assert SECRET_KEY not in done.stderr + done.stdout
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    # Only the ranged GETs refused: verify has read the manifest and lists each shard it could
    # not read as a finding ("not read", exit 1), as it does for an unreadable local file; the
    # finding names the object and the last error.
    done = run_cli(*verify, "--json", env=env)
    assert done.returncode == 1, done.stderr
    problems = json.loads(done.stdout)["stores"][0]["problems"]
    assert problems and all(p["what"] == "not read" for p in problems), problems
    assert all("after 2 attempts" in p["found"] and _is_503(p["found"]) for p in problems)
    assert SECRET_KEY not in done.stderr + done.stdout
    proxy.clear()
    proxy.set(slowdown=0.3)
    env["TOKENTAPE_IO_RETRIES"] = "25"
    want = run_cli(*replay[:1], str(saved_local), *replay[2:])
    got = run_cli(*replay, env=env)
    assert got.returncode == 0 == want.returncode, got.stderr + want.stderr
    assert json.loads(got.stdout) == json.loads(want.stdout)
    done = run_cli(*verify, env=env)
    assert done.returncode == 0, done.stderr
    assert proxy.stats().faults["slowdown"] >= 3


# --- 4. staging ---------------------------------------------------------------------------


def _recorded_blocks_match(cache: Path, originals: dict[str, Path]) -> int:
    """Check that every block a (failed) stage recorded as verified, and every file it
    completed, is byte-identical to the original; returns the staging directories found."""
    works = sorted(cache.glob(".*.staging"))
    for work in works:
        name = work.name.split("-", 1)[1].removesuffix(".staging")
        original = originals[name]
        for part in work.glob(".*.part"):
            want = (original / part.name[1:].removesuffix(".part")).read_bytes()
            have = part.read_bytes()
            ok = part.with_name(part.name.removesuffix(".part") + ".ok")
            data = ok.read_bytes() if ok.exists() else b""
            data = data[: len(data) - len(data) % 4]
            for (i,) in struct.iter_unpack("<I", data):
                assert have[i * BLOCK : (i + 1) * BLOCK] == want[i * BLOCK : (i + 1) * BLOCK]
        for done in work.iterdir():
            if not done.name.startswith("."):
                assert done.read_bytes() == (original / done.name).read_bytes(), done
    return len(works)


def test_staging_is_exact_under_503s_drops_and_truncation(multi, s3, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "25")
    local, remote = _plans(multi, s3, "stores")
    proxy.set(slowdown=0.15, drop=0.1, truncate=0.1)
    staged = stage_plan(_via(remote, proxy), tmp_path / "cache", workers=3)
    faults = proxy.stats().faults
    assert faults["slowdown"] and faults["drop"] and faults["truncate"], faults
    assert staged.index_hash == local.index_hash
    for source in staged.sources:
        assert tree_bytes(Path(source.path)) == tree_bytes(multi[source.name])


@pytest.mark.parametrize("retries", ["1", "25"])
def test_staging_under_corrupted_bodies_keeps_nothing_corrupt(
    retries, multi, s3, proxy, tmp_path, monkeypatch
):
    """With one try per request a corrupted block fails the stage naming the object and block
    (no complete store; what was recorded is exact); with retries, it is fetched again."""
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", retries)
    _, remote = _plans(multi, s3, "stores")
    cache = tmp_path / "cache"
    proxy.set(corrupt=0.3, ranged=True)
    via = _via(remote, proxy, **NO_BOTO_CHECKSUMS)
    try:
        staged = stage_plan(via, cache, workers=3)
    except StoreError as exc:
        assert retries == "1", exc
        message = str(exc)
        assert "\n" not in message and f"{s3.url}/stores/" in message, message
        assert ("block " in message and "does not match" in message) or "idx" in message
        for source in remote.sources:
            assert not (cache / cache_key(source.path)).exists()
        assert not [p for p in cache.iterdir() if not p.name.startswith(".")]
        assert _recorded_blocks_match(cache, multi) >= 1  # what it verified is kept
        proxy.clear()
        staged = stage_plan(via, cache, workers=3)  # resumes from the verified blocks
    assert proxy.stats().faults["corrupt"] >= 1
    for source in staged.sources:
        assert tree_bytes(Path(source.path)) == tree_bytes(multi[source.name])


# --- 5. tokenize from and to the bucket ---------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return jsonl_corpus(tmp_path_factory.mktemp("fault-corpus"), 120, seed=3)


def _tokenize(inputs: str, out: str, **extra) -> None:
    tokenize(TokenizeConfig(inputs=(inputs,), out=out, unit_mb=0.004, shard_mb=0.004, **extra))


@pytest.mark.slow
def test_tokenize_from_and_to_the_bucket_under_503s_and_drops(
    corpus, s3, proxy, tmp_path, monkeypatch
):
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "25")
    _tokenize(str(corpus), str(tmp_path / "local"))
    prefix = s3.upload_tree(corpus, f"{s3.url}/raw")
    out = f"{s3.url}/stores/web"
    proxy.set(slowdown=0.2, drop=0.1)
    _tokenize(
        prefix,
        out,
        storage_options={"endpoint_url": proxy.endpoint},
        work_dir=str(tmp_path / "work"),
    )
    faults = proxy.stats().faults
    assert faults["slowdown"] and faults["drop"], faults
    methods = {m for m, _, _, f in proxy.stats().log if f}
    assert {"GET", "PUT"} <= methods, methods  # faults on the inputs' reads and the uploads
    got = tree_bytes(s3.download_tree(out, tmp_path / "down"))
    want = tree_bytes(tmp_path / "local")
    assert sorted(got) == sorted(want)
    for name in want:
        if name not in ("manifest.json", INPUTS_NAME):  # those name the inputs (here URLs)
            assert got[name] == want[name], name
    inputs = [row["path"] for row in json.loads(got[INPUTS_NAME])["inputs"]]
    local = [row["path"] for row in json.loads(want[INPUTS_NAME])["inputs"]]
    assert [p.removeprefix(prefix) for p in inputs] == [p.removeprefix(str(corpus)) for p in local]
    mine, theirs = json.loads(got["manifest.json"]), json.loads(want["manifest.json"])
    assert mine["content_hash"] == theirs["content_hash"]
    assert mine["shards"] == theirs["shards"] and len(mine["shards"]) > 1
    assert mine["provenance"]["shards"] == theirs["provenance"]["shards"]
