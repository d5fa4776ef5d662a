"""Object storage through a proxy that adds 0, 10 and 50 ms to every request, side by side.

Starts a real S3-compatible server on loopback (moto, ``tests/objstore.py``) and the tests'
fault-injecting proxy in front of it (``tests/faultproxy.py``, used here only for its
per-request delay: the latency of a real object store). One corpus of jsonl files (the
tokenize benchmark's, ``--mb`` MB of text) is uploaded to ``s3://BUCKET/raw/``, and a token
store of ``--store-mb`` MB of random ids (``bytes`` tokenizer, ``--shard-mb`` shards) to
``s3://BUCKET/stores/web/``. At each latency, every measurement runs ``--rounds`` times and
reports its best round:

- **tokenize**: ``tokentape.tokenize`` from ``s3://BUCKET/raw/`` against the same files on
  local disk, to a local store, rounds interleaved (order reversed every other round); ratio =
  bucket throughput / local throughput (1.0 = no cost for reading from the bucket), and
  whether the two stores' token files are byte-identical.
- **s3fs get**: the bare baseline for staging: ``s3fs``'s own parallel ``get`` of every
  object of the store to local files (checked against the local store), in MB/s.
- **stage**: ``stage_store`` of the same store into a fresh cache directory (block hashes
  checked, fdatasync'd, as in training) against the same s3fs ``get`` with the same
  concurrency (``--workers``: stage's ``workers``, s3fs's ``batch_size``), rounds interleaved;
  ratio = stage MB/s / s3fs MB/s (1.0 = staging costs nothing over a bare parallel get); the
  download-phase ratio leaves out what comes before stage's parallel download (the manifest's
  GET and the listing, in parallel: one round trip, which weighs on a small store at 50 ms)
  and after it (the rename): it times the download from stage's final progress report
  (``elapsed``).
- **reuse**: reusing a staged copy, as every rank's ``Loader(cache_dir=...)`` does at every
  start: sealed (its files' keys unchanged: nothing is read), one shard file changed on disk
  (it is hashed again, found damaged and fetched again), and ``verify=True`` (every file hashed
  again), against a bare read-and-sha256 of the same files (ratio: 1.0 = verify costs only the
  hashing).
- **stream**: the streamed ``Loader`` (no ``cache_dir``) on one rank, ``--batch`` windows of
  ``--seq-len`` per step, over a store of random token ids (``--stream-windows`` windows'
  worth, uploaded to ``s3://BUCKET/stores/random/``). First its production time per step with
  ``prefetch=0`` and no trainer (mean of 4 steps after a first one), then a simulated trainer
  whose step sleeps ``--headroom`` x that, with ``prefetch`` = ceil(fetch time / step time) + 1
  (docs/object-storage.md; the production time stands for the fetch time, so this is 2 at
  headroom 1.5), for ``--steps`` steps: the wait in ``step()`` (p50, p99, max; the first
  step, which has nothing prefetched, left out) and the bytes the loader fetched (its
  ``fetch_stats``) over the bytes trained. The loader fetches ``prefetch`` steps ahead, so when
  ``--steps`` have been trained it has fetched ``steps + prefetch`` steps: trained bytes are
  counted over those, ``(steps + prefetch) * batch * seq_len`` tokens (a window fetches
  ``seq_len + 1``, so 1.0005 at 2048 is the floor), after the outstanding fetches finished.

Each row also counts the requests the proxy saw (by method) and the MB it sent (bytes
fetched), in its best round's run (the stream row: in its trained run, manifest and document
index included). Rows are functions in ``MEASURES``; one that fails reports ``n/a: <error>``
and the others still run. Ratios are what matter: the proxy and the server share this
machine's cores (moto itself serves about 100-150 MB/s here, and each small request costs it
several ms of CPU in this process: that, not the latency, sets the stream row's production
time; the proxy costs little beside it), and nothing here asserts a time.

    python benchmarks/object_bench.py [--mb 8] [--store-mb 128] [--shard-mb 4]
                                      [--latency-ms 0,10,50]
                                      [--rounds 3] [--workers 8] [--batch 256] [--seq-len 2048]
                                      [--steps 20] [--headroom 1.5] [--concurrency 64]
                                      [--stream-windows 8192] [--prefetch K]
                                      [--tokenizer SPEC] [--only ROWS] [--json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # objstore (the S3 server), faultproxy
sys.path.insert(0, str(REPO / "benchmarks"))  # tokenize_bench's corpus

import numpy as np  # noqa: E402
import s3fs  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from helpers import finish_store  # noqa: E402
from objstore import ACCESS_KEY, SECRET_KEY, Bucket, S3Server, new_bucket, s3_environment  # noqa: E402
from tokenize_bench import build_corpus  # noqa: E402

import tokentape  # noqa: E402
from tokentape._src.stage.stage import stage, stage_store  # noqa: E402
from tokentape._src.store.format import DEFAULT_BLOCK_BYTES, sha256_stream  # noqa: E402
from tokentape._src.store.tokenizers import load_tokenizer  # noqa: E402
from tokentape._src.store.writer import ShardWriter  # noqa: E402
from tokentape._src.util.progress import Progress  # noqa: E402

DEFAULT_OUT = REPO / "bench-out" / "object"
DEFAULT_GPT2 = REPO.parent / "shared" / "tokenizers" / "gpt2.tiktoken"
MB = 1e6
PRODUCE_STEPS = 4
"""Steps timed (after a first, untimed one) for the streamed loader's production time."""


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Bench:
    """What every measurement shares: the server, the bucket, the corpus and the store."""

    bucket: Bucket
    work: Path
    corpus_dir: Path
    corpus_url: str
    text_bytes: int
    store_dir: Path
    store_url: str
    tokenizer: str
    rounds: int
    workers: int
    stream: Stream | None


@dataclass
class Stream:
    """The streamed-loader measurement's store (random token ids) and shape."""

    url: str
    windows: int
    batch: int
    seq_len: int
    steps: int
    headroom: float
    concurrency: int
    prefetch: int | None
    itemsize: int


@dataclass
class Row:
    """One measurement at one latency (figures: name -> value, printed in order)."""

    measure: str
    latency_ms: float
    figures: dict[str, float | str] = field(default_factory=dict)
    requests: int = 0
    mb_fetched: float = 0.0
    note: str = ""


Measurement = Callable[[Bench, FaultProxy], Row]


def by_method(proxy: FaultProxy) -> str:
    """The requests the proxy saw since its last reset, by method (``GET 13, HEAD 8``)."""
    counts = Counter(method for method, _, _, _ in proxy.stats().log)
    return ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))


def store_files(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` by relative path, the manifest left out (it names the inputs,
    which differ between a bucket and local files)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


# --- measurements ------------------------------------------------------------------------


def tokenize_row(bench: Bench, proxy: FaultProxy) -> Row:
    """``tokentape.tokenize`` from the bucket vs from local files (a fresh store each run)."""
    options = {"endpoint_url": proxy.endpoint}
    best = {"local": float("inf"), "bucket": float("inf")}
    requests, fetched, identical, methods = 0, 0, True, ""
    for r in range(bench.rounds):
        order = ["local", "bucket"] if r % 2 == 0 else ["bucket", "local"]
        outs = {}
        for where in order:
            out = bench.work / f"tok-{where}"
            shutil.rmtree(out, ignore_errors=True)
            source = str(bench.corpus_dir) if where == "local" else bench.corpus_url + "/"
            proxy.reset()
            started = time.perf_counter()
            tokentape.tokenize(
                source,
                out,
                tokenizer=bench.tokenizer,
                storage_options=options if where == "bucket" else None,
            )
            best[where] = min(best[where], time.perf_counter() - started)
            if where == "bucket":
                stats = proxy.stats()
                requests, fetched, methods = stats.requests, stats.bytes_sent, by_method(proxy)
            outs[where] = out
        identical = identical and store_files(outs["local"]) == store_files(outs["bucket"])
    return Row(
        "tokenize (bucket / local)",
        proxy.faults.delay * 1000,
        {
            "local MB/s": bench.text_bytes / MB / best["local"],
            "bucket MB/s": bench.text_bytes / MB / best["bucket"],
            "ratio": best["local"] / best["bucket"],
        },
        requests,
        fetched / MB,
        ("stores identical" if identical else "STORES DIFFER") + f"; {methods}",
    )


class S3fsGet:
    """``s3fs``'s own parallel ``get`` of every object of the store (session set up, not
    timed), each run checked against the local store."""

    def __init__(self, bench: Bench, proxy: FaultProxy) -> None:
        self.bench, self.proxy = bench, proxy
        self.fs = s3fs.S3FileSystem(
            endpoint_url=proxy.endpoint,
            key=ACCESS_KEY,
            secret=SECRET_KEY,
            skip_instance_cache=True,
            use_listings_cache=False,
        )
        self.prefix = bench.bucket.key(bench.store_url + "/")
        self.keys = bench.bucket.keys(bench.store_url)
        self.expected = {k[len(self.prefix) :]: d for k, d in _local_objects(bench).items()}
        self.total = sum(len(d) for d in self.expected.values())
        self.fs.info(f"{bench.bucket.name}/{self.keys[0]}")

    def run(self, batch_size: int | None = None) -> float:
        """Seconds for one ``get`` (``batch_size``: files in flight; None: fsspec's default)."""
        target = self.bench.work / "s3fs-get"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        rpaths = [f"{self.bench.bucket.name}/{k}" for k in self.keys]
        lpaths = [str(target / k[len(self.prefix) :]) for k in self.keys]
        for path in lpaths:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.proxy.reset()
        started = time.perf_counter()
        self.fs.get(rpaths, lpaths, batch_size=batch_size)
        took = time.perf_counter() - started
        got = {
            k[len(self.prefix) :]: Path(p).read_bytes()
            for k, p in zip(self.keys, lpaths, strict=True)
        }
        if got != self.expected:
            raise AssertionError("s3fs get: the downloaded store differs from the local one")
        return took


def s3fs_get_row(bench: Bench, proxy: FaultProxy) -> Row:
    """The bare baseline for staging: ``s3fs``'s parallel ``get`` of every object of the
    store (fsspec's default batch size), checked against the local store."""
    get = S3fsGet(bench, proxy)
    keys, total = get.keys, get.total
    best, requests, fetched, methods = float("inf"), 0, 0, ""
    for _ in range(bench.rounds):
        best = min(best, get.run())
        stats = proxy.stats()
        requests, fetched, methods = stats.requests, stats.bytes_sent, by_method(proxy)
    return Row(
        "s3fs get (staging baseline)",
        proxy.faults.delay * 1000,
        {"MB/s": total / MB / best, "objects": len(keys), "store MB": total / MB},
        requests,
        fetched / MB,
        f"parallel fs.get, checked; {methods}",
    )


def stage_row(bench: Bench, proxy: FaultProxy) -> Row:
    """``stage_store`` into a fresh cache directory vs the s3fs ``get`` of the same objects,
    both with ``bench.workers`` requests in flight, rounds interleaved."""
    get = S3fsGet(bench, proxy)
    options = {"endpoint_url": proxy.endpoint}
    best = {"stage": float("inf"), "s3fs": float("inf"), "download": float("inf")}
    requests, fetched, methods = 0, 0, ""
    finals: list[Progress] = []
    for r in range(bench.rounds):
        for what in ("stage", "s3fs") if r % 2 == 0 else ("s3fs", "stage"):
            if what == "s3fs":
                best["s3fs"] = min(best["s3fs"], get.run(batch_size=bench.workers))
                continue
            cache = bench.work / "stage-cache"
            shutil.rmtree(cache, ignore_errors=True)
            proxy.reset()
            started = time.perf_counter()
            staged = stage_store(
                bench.store_url,
                cache,
                storage_options=options,
                progress=lambda p: finals.append(p) if p.final else None,
                workers=bench.workers,
            )
            best["stage"] = min(best["stage"], time.perf_counter() - started)
            best["download"] = min(best["download"], finals[-1].elapsed)
            stats = proxy.stats()
            requests, fetched, methods = stats.requests, stats.bytes_sent, by_method(proxy)
            if store_files(staged) != store_files(bench.store_dir):
                raise AssertionError("stage: the staged store differs from the local one")
    return Row(
        "stage (stage / s3fs get)",
        proxy.faults.delay * 1000,
        {
            "stage MB/s": get.total / MB / best["stage"],
            "s3fs MB/s": get.total / MB / best["s3fs"],
            "ratio": best["s3fs"] / best["stage"],
            "download-phase ratio": best["s3fs"] / best["download"],
        },
        requests,
        fetched / MB,
        f"{bench.workers} workers = batch_size; staged = local; {methods}",
    )


def reuse_row(bench: Bench, proxy: FaultProxy) -> Row:
    """Reusing a staged copy (what every rank's ``Loader(cache_dir=...)`` does at every start):
    sealed (nothing read), one shard file changed on disk (hashed again, found damaged, fetched
    again), and ``verify=True`` (every file hashed again) against a bare read-and-sha256 of the
    same files; best of the rounds."""
    options = {"endpoint_url": proxy.endpoint}
    cache = bench.work / "reuse-cache"
    shutil.rmtree(cache, ignore_errors=True)
    entry = stage(bench.store_url, cache, storage_options=options, workers=bench.workers).path
    stage(bench.store_url, cache, storage_options=options)  # sealed once (a fresh copy is)
    files = sorted(p for p in entry.iterdir() if p.name != "manifest.json")
    total = sum(p.stat().st_size for p in files)
    best = dict.fromkeys(("sealed", "changed", "verify", "sha256"), float("inf"))
    for _ in range(bench.rounds):
        started = time.perf_counter()
        sealed = stage(bench.store_url, cache, storage_options=options)
        best["sealed"] = min(best["sealed"], time.perf_counter() - started)
        assert sealed.cached and sealed.rehashed_bytes == 0
        started = time.perf_counter()
        for path in files:
            with open(path, "rb") as f:
                sha256_stream(f)
        best["sha256"] = min(best["sha256"], time.perf_counter() - started)
        started = time.perf_counter()
        checked = stage(bench.store_url, cache, storage_options=options, verify=True)
        best["verify"] = min(best["verify"], time.perf_counter() - started)
        assert checked.rehashed_bytes == total
        victim = files[0]
        victim.chmod(0o644)
        with open(victim, "r+b") as f:  # one byte changed in place, the size kept
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 1]))
        proxy.reset()
        started = time.perf_counter()
        repaired = stage(bench.store_url, cache, storage_options=options)
        best["changed"] = min(best["changed"], time.perf_counter() - started)
        assert repaired.downloaded_bytes == victim.stat().st_size
        files = sorted(p for p in entry.iterdir() if p.name != "manifest.json")
    if store_files(entry) != store_files(bench.store_dir):
        raise AssertionError("reuse: the repaired copy differs from the local store")
    return Row(
        "stage reuse (sealed / 1 changed / verify)",
        proxy.faults.delay * 1000,
        {
            "sealed ms": best["sealed"] * 1000,
            "1 changed s": best["changed"],
            "verify s": best["verify"],
            "sha256 s": best["sha256"],
            "verify / sha256": best["verify"] / best["sha256"],
            "verify GB/s": total / 1e9 / best["verify"],
        },
        proxy.stats().requests,
        proxy.stats().bytes_sent / MB,
        f"{len(files)} files, {total / MB:.0f} MB; a change: 1 file fetched again",
    )


def _drained(loader: tokentape.Loader, quiet_s: float = 0.5, limit_s: float = 60.0) -> None:
    """Return once the loader's fetch counters have not moved for ``quiet_s`` (its prefetched
    steps' reads finished), or after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = (loader.fetch_stats.requests, loader.fetch_stats.bytes)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)


def stream_row(bench: Bench, proxy: FaultProxy) -> Row:
    """The streamed loader: its production time per step, then the waits of a trainer whose
    step takes ``headroom`` times that, and bytes fetched over bytes trained."""
    s = bench.stream
    if s is None:
        raise RuntimeError("no stream store (built only when the stream row is chosen)")
    plan = tokentape.Plan.build(
        {"random": {"path": s.url, "weight": 1, "max_repeats": 10**4}},
        seq_len=s.seq_len,
        seed=1,
        total_samples=(1 + PRODUCE_STEPS + s.steps + 64) * s.batch,  # a horizon past the run
        storage_options={"endpoint_url": proxy.endpoint},
    )
    config = tokentape.BatchConfig(1, s.batch, 1)
    fetch = tokentape.FetchConfig(concurrency=s.concurrency)
    with tokentape.Loader(plan, 0, config, prefetch=0, fetch=fetch) as loader:
        loader.step()  # the manifest, the document index, connections: not timed
        loader.commit()
        started = time.perf_counter()
        for _ in range(PRODUCE_STEPS):
            loader.step()
            loader.commit()
        produce = (time.perf_counter() - started) / PRODUCE_STEPS
    step_s = s.headroom * produce
    k = s.prefetch if s.prefetch is not None else math.ceil(produce / step_s) + 1
    if (s.steps + k) * s.batch > s.windows:  # a window read twice could come from the cache
        raise RuntimeError(f"--stream-windows {s.windows} < (steps + prefetch) x batch")
    proxy.reset()
    with tokentape.Loader(plan, 0, config, prefetch=k, fetch=fetch) as loader:
        for _ in range(s.steps):
            loader.step()
            time.sleep(step_s)  # the trainer's compute
            loader.commit()
        _drained(loader)
        waits = np.array(list(loader.waits)[1:])
        fetched = loader.fetch_stats.bytes
    stats = proxy.stats()
    trained = (s.steps + k) * s.batch * s.seq_len * s.itemsize
    return Row(
        f"stream (B {s.batch}, L {s.seq_len})",
        proxy.faults.delay * 1000,
        {
            "produce s/step": produce,
            "step s": step_s,
            "prefetch": k,
            "wait p50 s": float(np.percentile(waits, 50)),
            "p99": float(np.percentile(waits, 99)),
            "max": float(waits.max()),
            "fetched/trained": f"{fetched / trained:.4f}",
        },
        stats.requests,
        stats.bytes_sent / MB,
        f"{s.steps} steps, concurrency {s.concurrency}; trained = steps + prefetch; "
        f"{by_method(proxy)}",
    )


FIRST_BATCH = """
import sys, time
import tokentape
plan = tokentape.load_plan(sys.argv[1])
started = time.perf_counter()
with tokentape.Loader(plan, 0, tokentape.BatchConfig(1, 64, 1), prefetch=1,
                      cache_dir=sys.argv[2] or None) as loader:
    loader.step()
    print(time.perf_counter() - started)
    if loader._stage is not None:
        loader._stage.wait()
"""
"""A trainer's start, timed from the loader's construction to its first step."""
HYBRID_BATCH = 64
HYBRID_STEPS = 100
"""Steps timed for the steady rate, once the hybrid loader reads its staged copies: the best
of ``HYBRID_CHUNKS`` runs of that many, for it and for the staged copy alike, interleaved."""
HYBRID_CHUNKS = 5
"""Also: first batches timed, for streaming and the hybrid loader each (the best kept)."""


def _steps_per_s(
    loader: tokentape.Loader, expected: tokentape.Loader, n: int
) -> tuple[float, bool]:
    """``n`` steps of ``loader`` (each compared with ``expected``'s): samples/s, all equal."""
    same = True
    started = time.perf_counter()
    for _ in range(n):
        got = loader.step()
        want = expected.step()
        pairs = zip(got.micro_batches, want.micro_batches, strict=True)
        same &= all(np.array_equal(a.tokens, b.tokens) for a, b in pairs)
        loader.commit()
        expected.commit()
    return n * loader.config.global_batch / (time.perf_counter() - started), same


def hybrid_row(bench: Bench, proxy: FaultProxy) -> Row:
    """A loader with a ``cache_dir`` (its default, ``stage="background"``) against streaming
    (first batch) and the staged copy (steady samples/s), batch 64, no worker processes; bytes
    fetched at the proxy over the store's size; every batch against the local store's."""
    s = bench.stream
    if s is None:
        raise RuntimeError("no stream store (built only when the stream or hybrid row is chosen)")
    shape = {"seq_len": s.seq_len, "seed": 1, "total_samples": 10**6}
    remote = tokentape.Plan.build(
        {"random": {"path": s.url, "weight": 1, "max_repeats": 10**4}},
        storage_options={"endpoint_url": proxy.endpoint}, **shape,
    )  # fmt: skip
    local_dir = bench.work / "random-store"
    local = tokentape.Plan.build(
        {"random": {"path": str(local_dir), "weight": 1, "max_repeats": 10**4}}, **shape
    )
    config = tokentape.BatchConfig(1, HYBRID_BATCH, 1)
    cache = bench.work / "hybrid-cache"

    plan_path = bench.work / "hybrid-plan.json"
    remote.save(plan_path)

    def first_batch(cached: bool) -> float:
        """Seconds from a loader's construction to its first step (prefetch 1 either way), in
        a fresh process as a trainer starts (a fresh cache each time)."""
        shutil.rmtree(cache, ignore_errors=True)
        child = subprocess.run(
            [sys.executable, "-c", FIRST_BATCH, str(plan_path), str(cache) if cached else ""],
            capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        return float(child.stdout.split()[-1])

    stream_first = hybrid_first = math.inf
    for _ in range(HYBRID_CHUNKS):  # interleaved, best of each
        stream_first = min(stream_first, first_batch(False))
        hybrid_first = min(hybrid_first, first_batch(True))
    shutil.rmtree(cache, ignore_errors=True)
    proxy.reset()
    with (
        tokentape.Loader(local, 0, config, prefetch=0) as expected,
        tokentape.Loader(remote, 0, config, prefetch=1, cache_dir=cache) as loader,
    ):
        _, same = _steps_per_s(loader, expected, 1)  # the first step
        streamed_steps = 1
        while not loader.staged:
            _, ok = _steps_per_s(loader, expected, 1)
            same &= ok
            streamed_steps += 1
        _, ok = _steps_per_s(loader, expected, loader.prefetch + 2)  # scheduled before
        same &= ok
        stats = proxy.stats()  # what the hybrid loader and its stage fetched
        landed_mb = loader.fetch_stats.staged_bytes / MB  # read from blocks staged meanwhile
        staged_plan = tokentape.Plan.build(
            {"random": {"path": str(next(d for d in cache.iterdir() if d.is_dir())),
                        "weight": 1, "max_repeats": 10**4}}, **shape,
        )  # fmt: skip
        with (
            tokentape.Loader(staged_plan, 0, config, prefetch=1) as staged,
            tokentape.Loader(local, 0, config, prefetch=0) as also,
        ):
            rate = staged_rate = 0.0
            for _ in range(HYBRID_CHUNKS):  # interleaved, best of each
                chunk, ok = _steps_per_s(loader, expected, HYBRID_STEPS)
                rate, same = max(rate, chunk), same and ok
                staged_rate = max(staged_rate, _steps_per_s(staged, also, HYBRID_STEPS)[0])
    store_bytes = sum(p.stat().st_size for p in local_dir.iterdir() if p.is_file())
    return Row(
        f"hybrid (B {HYBRID_BATCH}, L {s.seq_len})",
        proxy.faults.delay * 1000,
        {
            "first s": hybrid_first,
            "vs stream": hybrid_first / stream_first,
            "steady/s": rate,
            "vs staged": rate / staged_rate,
            "fetched/store": f"{stats.bytes_sent / store_bytes:.3f}",
            "same": "yes" if same else "NO",
        },
        stats.requests,
        stats.bytes_sent / MB,
        f"stream first {stream_first:.3g} s, staged {staged_rate:.0f}/s; {streamed_steps} "
        f"steps before the switch, which read {landed_mb:.2f} MB of landed blocks locally; "
        f"{by_method(proxy)}",
    )


def _mirror(bench: Bench) -> dict[str, Path]:
    """Request path -> local file of every object of the benchmark's stores."""
    stores = [(bench.store_dir, bench.store_url)]
    if bench.stream is not None:
        stores.append((bench.work / "random-store", bench.stream.url))
    return {
        f"/{bench.bucket.name}/{bench.bucket.key(url + '/' + p.name)}": p
        for directory, url in stores
        for p in directory.iterdir()
        if p.is_file()
    }


def _local_objects(bench: Bench) -> dict[str, bytes]:
    prefix = bench.bucket.key(bench.store_url + "/")
    return {
        prefix + p.relative_to(bench.store_dir).as_posix(): p.read_bytes()
        for p in sorted(bench.store_dir.rglob("*"))
        if p.is_file()
    }


MEASURES: dict[str, Measurement] = {
    "tokenize": tokenize_row,
    "s3fs-get": s3fs_get_row,
    "stage": stage_row,
    "reuse": reuse_row,
    "stream": stream_row,
    "hybrid": hybrid_row,
}


def run_measure(name: str, fn: Measurement, bench: Bench, proxy: FaultProxy) -> Row:
    """``fn``'s row, or a row reporting 'n/a: <error>' when it cannot run (yet)."""
    try:
        return fn(bench, proxy)
    except Exception as exc:  # a row that fails is reported, the others still run
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        return Row(name, proxy.faults.delay * 1000, note=f"n/a: {text}")


# --- set-up --------------------------------------------------------------------------------


def write_random_store(
    directory: Path,
    n_tokens: int,
    seed: int = 0,
    shard_tokens: int = 8_000_000,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> int:
    """A store of about ``n_tokens`` random byte-tokenizer ids in documents of 200-5,000
    tokens (one shard per ``shard_tokens``, hash blocks of ``block_bytes``); returns its token
    dtype's item size."""
    tok = load_tokenizer("bytes")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(200, 5000, size=n_tokens // 2600 + 1)
    tokens = rng.integers(0, 256, size=int(lengths.sum()), dtype=np.uint16)
    tokens[np.cumsum(lengths) - 1] = tok.eod_id  # each document ends with EOD
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    writer = ShardWriter(directory, "uint16", shard_tokens, block_bytes=block_bytes)
    writer.add(tokens, lengths)
    finish_store(
        directory,
        writer.finish(),
        "uint16",
        tok,
        job="object_bench random",
        created_by="benchmarks/object_bench.py",
    )
    return 2


def build(args: argparse.Namespace, bucket: Bucket, chosen: list[str]) -> Bench:
    """The corpus (reused between runs), its store, both uploaded to the bucket."""
    work = args.out
    work.mkdir(parents=True, exist_ok=True)
    corpus = build_corpus(work / "corpus-work", args.mb, args.n_files)
    corpus_dir = Path(corpus.files[0]).parent
    store_dir = work / "store"
    write_random_store(store_dir, int(args.store_mb * MB) // 2, 1, int(args.shard_mb * MB) // 2)
    corpus_url = bucket.upload_tree(corpus_dir, f"{bucket.url}/raw")
    store_url = bucket.upload_tree(store_dir, f"{bucket.url}/stores/web")
    stream = None
    if "stream" in chosen or "hybrid" in chosen:
        random_dir = work / "random-store"
        n_tokens = args.stream_windows * (args.seq_len + 1)
        block = int(args.stream_block_kb * 1024) if args.stream_block_kb else DEFAULT_BLOCK_BYTES
        itemsize = write_random_store(random_dir, n_tokens, block_bytes=block)
        stream = Stream(
            bucket.upload_tree(random_dir, f"{bucket.url}/stores/random"),
            args.stream_windows,
            args.batch,
            args.seq_len,
            args.steps,
            args.headroom,
            args.concurrency,
            args.prefetch,
            itemsize,
        )
    tokenizer = args.tokenizer
    if tokenizer is None:
        tokenizer = f"tiktoken:{DEFAULT_GPT2}" if DEFAULT_GPT2.is_file() else "bytes"
    return Bench(
        bucket,
        work,
        corpus_dir,
        corpus_url,
        corpus.text_bytes,
        store_dir,
        store_url,
        tokenizer,
        args.rounds,
        args.workers,
        stream,
    )


def fmt(value: float | str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def print_table(rows: list[Row]) -> None:
    print(f"{'measure':30s} {'ms/req':>6s}  {'figures':48s} {'requests':>8s} {'MB fetched':>10s}")
    for row in rows:
        figures = ", ".join(f"{k} {fmt(v)}" for k, v in row.figures.items())
        print(
            f"{row.measure:30s} {row.latency_ms:6.0f}  {figures:48s} {row.requests:8d} "
            f"{row.mb_fetched:10.1f}  {row.note}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=8.0, help="MB of jsonl text (the corpus)")
    ap.add_argument("--n-files", type=int, default=8, help="jsonl files in the corpus")
    ap.add_argument("--store-mb", type=float, default=128.0, help="size of the staged store")
    ap.add_argument("--shard-mb", type=float, default=4.0, help="shard size of the store")
    ap.add_argument("--latency-ms", default="0,10,50", help="per-request delays, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=8, help="stage workers = s3fs batch_size")
    ap.add_argument("--batch", type=int, default=256, help="stream: windows per step")
    ap.add_argument("--seq-len", type=int, default=2048, help="stream: tokens per window")
    ap.add_argument("--steps", type=int, default=20, help="stream: steps trained")
    ap.add_argument("--headroom", type=float, default=1.5, help="stream: step / production")
    ap.add_argument("--concurrency", type=int, default=64, help="stream: FetchConfig's")
    ap.add_argument("--stream-windows", type=int, default=8192, help="stream: store size")
    ap.add_argument("--stream-block-kb", type=float, default=None,
                    help="stream, hybrid: the store's hash blocks (default 64 MiB)")  # fmt: skip
    ap.add_argument("--prefetch", type=int, default=None, help="stream: default by the rule")
    ap.add_argument("--tokenizer", default=None, help="default: GPT-2 (tiktoken) if present")
    ap.add_argument("--only", default=None, help=f"comma-separated, of: {', '.join(MEASURES)}")
    ap.add_argument(
        "--range-aware",
        action="store_true",
        help="answer ranged GETs of the stores from their local copies, reading only the range "
        "(moto copies the whole object for each): the proxy's mirror",
    )
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    latencies = [float(x) for x in args.latency_ms.split(",") if x.strip()]
    chosen = args.only.split(",") if args.only else list(MEASURES)

    server = S3Server()
    try:
        os.environ.update(s3_environment(server.endpoint))
        bucket = new_bucket(server.endpoint)
        note("building and uploading the corpus and the store ...")
        bench = build(args, bucket, chosen)
        note(
            f"corpus {bench.text_bytes / MB:.1f} MB of text in {args.n_files} files; "
            f"store {sum(len(d) for d in _local_objects(bench).values()) / MB:.1f} MB; "
            f"tokenizer {bench.tokenizer}"
        )
        rows = []
        mirror = _mirror(bench) if args.range_aware else None
        note("server: " + ("moto; the stores' ranged GETs read from their files "
                           "(--range-aware)" if mirror
                           else "stock moto (a ranged GET copies the whole object)"))  # fmt: skip
        with FaultProxy(server.endpoint, mirror=mirror) as proxy:
            for latency in latencies:
                proxy.set(delay=latency / 1000)
                for name in chosen:
                    note(f"{name} at {latency:g} ms/request ...")
                    rows.append(run_measure(name, MEASURES[name], bench, proxy))
        print_table(rows)
        if args.json:
            print(json.dumps([asdict(r) for r in rows], indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
