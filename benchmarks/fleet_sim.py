"""A model of N training nodes reading one plan from object storage, calibrated on this machine.

What it models, for N nodes of R ranks each (N in 1, 16, 128, 1,024, 4,096 by default), three
ways of getting a plan's samples onto the nodes:

- **stage**: each node downloads every store of the plan once (tokentape's ``cache_dir``:
  ranged GETs of ``range_bytes`` on ``stage_workers`` connections), then reads its disk;
- **stream**: each rank reads the exact byte ranges of its windows (tokentape without a
  cache: about one GET per window, ``stream_concurrency`` in flight per store), after opening
  the stores (one GET of each manifest, one HEAD of each shard it touches);
- **whole shards**: what MosaicML Streaming and LitData do: a shard (64 MiB, both libraries'
  default) is downloaded whole before any of its samples is used. Taken at its best for them:
  the node's first step needs ``peer_first_shards`` shards (their shuffles keep a step within
  a few), and over an epoch each node downloads only its share of the shards (1/N).

The object store is taken from Amazon S3's published limits: 5,500 GET/HEAD requests per second
per partitioned prefix (a store is one prefix here unless ``prefixes`` says more), about
85-90 MB/s per connection, first-byte latency lognormal with a median of 100 ms and a p99 of
200 ms (the performance guide's 100-200 ms for small objects); beyond the request rate S3
answers 503 SlowDown and clients back off, so what is served is the capacity and the rest
waits. No aggregate bandwidth limit is published: none is modelled. A node has a NIC
(``nic_MBps``, 100 Gb/s) and a disk (``disk_MBps``). Node starts are spread uniformly over
``jitter_s`` (a scheduler does not start 4,096 nodes in the same millisecond).

The model is a fluid one: requests are a flow, the nodes are grouped by start time into
cohorts, and at every tick the store serves min(1, capacity / demand) of what the active nodes
ask for. It prints, per N and mode: time to first batch (median and last node), bytes and
requests per node and in total, the peak demand over the store's request capacity, and the
trainer's wait per step at ``step_s`` once running.

**Calibration** (``--calibrate``, on by default): the same model, given this machine's local
S3 server (moto on loopback, behind the tests' proxy adding ``--latency-ms`` per request) as
its object store — its request rate, its bandwidth and its latency, each measured first — is
set against real runs of 1 to 4 "nodes" as processes started together: each stages a store
into its own cache (``stage_store``), or opens a streamed ``Loader`` and takes its first step.
Model and measured times are printed side by side. Nothing here asserts a time.

    python benchmarks/fleet_sim.py [--nodes 1,16,128,1024,4096] [--ranks 8] [--store-gb 1000,200]
                                   [--seq-len 4096] [--micro 4] [--accum 8] [--step-s 1.0]
                                   [--jitter-s 30] [--prefixes 1] [--range-mb 32]
                                   [--stage-workers 16] [--no-calibrate] [--latency-ms 10]
                                   [--calib-nodes 1,2,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # objstore (the S3 server), faultproxy
sys.path.insert(0, str(REPO / "benchmarks"))

from tokentape._src.stage.stage import DEFAULT_WORKERS, range_bytes_for  # noqa: E402
from tokentape._src.store.format import DEFAULT_BLOCK_BYTES  # noqa: E402

MB = 1e6
MIB = 2**20
Z99 = 2.3263  # the standard normal's 99th percentile


# --- what the object store and the nodes can do -------------------------------------------


@dataclass(frozen=True)
class Limits:
    """An object store: request rate per prefix, bandwidth per connection and in all, and
    first-byte latency (lognormal, given by its median and p99)."""

    name: str
    prefix_rps: float
    conn_MBps: float
    ttfb_p50_s: float
    ttfb_p99_s: float
    total_MBps: float = math.inf

    @property
    def sigma(self) -> float:
        return math.log(self.ttfb_p99_s / self.ttfb_p50_s) / Z99 if self.ttfb_p99_s > 0 else 0.0

    @property
    def ttfb_mean_s(self) -> float:
        return self.ttfb_p50_s * math.exp(self.sigma**2 / 2)

    def ttfb_slowest_of(self, n: float) -> float:
        """The expected slowest first byte of ``n`` requests at once (their 1 - 1/(n+1)
        quantile): what a step waits for when it needs them all."""
        if n <= 1:
            return self.ttfb_p50_s
        z = _normal_quantile(1 - 1 / (n + 1))
        return self.ttfb_p50_s * math.exp(self.sigma * z)


S3 = Limits("S3 (published)", prefix_rps=5500, conn_MBps=88, ttfb_p50_s=0.1, ttfb_p99_s=0.2)


@dataclass(frozen=True)
class NodeSpec:
    ranks: int = 8
    nic_MBps: float = 12_500  # 100 Gb/s
    disk_MBps: float = 4_000
    stage_workers: int = DEFAULT_WORKERS  # tokentape's default
    range_bytes: int | None = None
    """A stage's GET size; None: tokentape's default (``range_bytes_for`` the store)."""
    stream_concurrency: int = 32  # tokentape's default, per store
    peer_shard_bytes: int = 64 * MIB
    peer_threads: int = 8
    peer_first_shards: int = 2
    start_s: float = 0.0
    """What a rank spends before its first batch with every byte local: loading the plan,
    building the tape, opening the stores (measured here: ``--calibrate``)."""
    verify_MBps: float = math.inf
    """How fast the node hashes and writes what it stages (measured here)."""
    client_s: float = 0.0
    """A process's first request beyond its round trip: making the S3 client (imports,
    endpoint data, credentials; measured here)."""
    cpu_share: float = 1.0
    """How much slower those two run than on a node of its own: in the calibration, N
    "nodes" share this machine's cores (N / cores, at least 1); 1 on a real fleet."""

    def stage_range(self, store_bytes: int) -> int:
        """The GET size of a stage of a store of ``store_bytes``."""
        return self.range_bytes or range_bytes_for(store_bytes, self.stage_workers)

    @property
    def fixed_s(self) -> float:
        return (self.start_s + self.client_s) * self.cpu_share


@dataclass(frozen=True)
class Workload:
    """What the plan and the batch shape ask of the store."""

    store_bytes: tuple[int, ...]
    """Each store's files (what a stage downloads)."""
    store_requests: tuple[int, ...]
    """GETs a stage of each store makes (a ``.bin``'s blocks in runs of up to ``range_bytes``
    (at least a block each, ``stage_gets``), other files
    whole) and the listing and manifest."""
    shards: tuple[int, ...]
    """Each store's shards."""
    window_bytes: int
    gets_per_rank_step: float
    """Ranged GETs a rank makes for one step's windows (windows that touch merge)."""
    bytes_per_get: float
    heads_at_start: float
    """HEADs a rank makes before its first step (one per shard its first steps touch)."""

    @property
    def total_bytes(self) -> int:
        return sum(self.store_bytes)


def stage_gets(file_bytes: int, block_bytes: int, range_bytes: int) -> int:
    """GETs a stage makes of a ``.bin``: its blocks in runs of as many as fit ``range_bytes``
    (at least one), one GET a run (``stage.fetch``)."""
    blocks = max(1, math.ceil(file_bytes / block_bytes))
    return math.ceil(blocks / max(1, range_bytes // block_bytes))


def _range_words(spec: NodeSpec, w: Workload) -> str:
    sizes = sorted({spec.stage_range(b) for b in w.store_bytes})
    return "GETs of up to " + "/".join(f"{b / MIB:g}" for b in sizes) + " MiB (a shard at most)"


def synthetic_workload(
    store_gb: list[float],
    seq_len: int,
    itemsize: int,
    samples: int,
    spec: NodeSpec,
    shard: int = 256 * MIB,
) -> Workload:
    """Stores of ``store_gb`` in shards of ``shard`` bytes (tokentape's default 256 MiB); a
    rank's ``samples`` windows a step, each in its own GET (random windows in stores this size
    almost never touch)."""
    sizes = tuple(int(g * 1e9) for g in store_gb)
    shards = tuple(max(1, math.ceil(s / shard)) for s in sizes)
    per_store = [
        n * stage_gets(shard, DEFAULT_BLOCK_BYTES, spec.stage_range(size)) + n + 2
        for n, size in zip(shards, sizes, strict=True)
    ]  # bins in runs of blocks, one index each, manifest and listing
    window = (seq_len + 1) * itemsize
    touched = sum(min(n, samples * n / sum(shards)) for n in shards)
    return Workload(sizes, tuple(per_store), shards, window, samples, window, touched)


def plan_workload(
    plan_path: str, spec: NodeSpec, micro: int, accum: int, steps: int = 4
) -> Workload:
    """The exact requests of a plan on local disk (its stores' manifests; rank 0's windows of
    the first ``steps`` steps, merged as the streamed loader merges them)."""
    from tokentape._src.objects.ranged import merge_ranges
    from tokentape._src.plan.load import load_plan
    from tokentape._src.plan.plan import open_planned
    from tokentape._src.store.format import manifest_files, numpy_dtype, read_manifest

    plan = load_plan(plan_path)
    sizes, requests, shards, itemsize = [], [], [], 1
    for s in plan.sources:
        manifest = read_manifest(Path(s.path))
        itemsize = max(itemsize, numpy_dtype(manifest.dtype).itemsize)
        files = manifest_files(manifest)
        bins = {sh.bin_file for sh in manifest.shards}
        size = (Path(s.path) / "manifest.json").stat().st_size  # the manifest comes too
        size += sum((Path(s.path) / f.name).stat().st_size for f in files)
        n = 2  # the listing and the manifest
        block = {sh.bin_file: sh.block_bytes for sh in manifest.shards}
        for f in files:
            length = (Path(s.path) / f.name).stat().st_size
            if length:
                n += (
                    stage_gets(length, block[f.name], spec.stage_range(size))
                    if f.name in bins
                    else 1
                )
        sizes.append(size)
        requests.append(n)
        shards.append(len(manifest.shards))
    sources = [open_planned(plan, i, None) for i in range(len(plan.sources))]
    tape = plan.tape()
    per_rank = micro * accum
    dp = spec.ranks
    gets = get_bytes = 0
    touched: set[tuple[int, int]] = set()
    for step in range(steps):
        positions = step * dp * per_rank + np.arange(per_rank)
        r = tape.resolve(positions)
        for d, source in enumerate(sources):
            k = r.sample[r.source == d]
            if not len(k):
                continue
            for shard, ranges in source._window_ranges(k, plan.seq_len).items():
                merged = merge_ranges(ranges)
                gets += len(merged)
                get_bytes += sum(b - a for a, b in merged)
                if step == 0:
                    touched.add((d, shard))
    return Workload(
        tuple(sizes), tuple(requests), tuple(shards), (plan.seq_len + 1) * itemsize,
        gets / steps, get_bytes / max(1, gets), len(touched),
    )  # fmt: skip


# --- the fluid model ------------------------------------------------------------------------


@dataclass
class Outcome:
    nodes: int
    mode: str
    first_batch_p50_s: float
    first_batch_max_s: float
    bytes_per_node: float
    requests_per_node: float
    requests_total: float
    peak_load: float
    """The largest demand over the store's request capacity (above 1: throttled, 503s)."""
    wait_per_step_s: float
    notes: str = ""


def _normal_quantile(p: float) -> float:
    """The standard normal's quantile (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.3577518672690,
         -30.66479806614716, 2.506628277459239)  # fmt: skip
    b = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972,
         -13.28068155288572)  # fmt: skip
    c = (-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734,
         4.374664141464968, 2.938163982698783)  # fmt: skip
    d = (0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416)
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
        )
    if p > 1 - lo:
        return -_normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return ((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q) / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1
    )


@dataclass
class _Cohort:
    start: float
    weight: float  # nodes in it
    left: float  # requests still to make (per node)
    done_at: float = math.nan


def _share(
    n_nodes: int,
    jitter_s: float,
    requests: float,
    rate: float,
    bytes_per_req: float,
    lim: Limits,
    prefixes: int,
    fixed_s: float,
    cohorts: int = 64,
) -> tuple[list[_Cohort], float]:
    """Every node makes ``requests`` requests at ``rate`` a second (its own bound) after
    ``fixed_s`` of round trips; the store serves min(1, capacity / demand) of all the active
    nodes ask at each tick. Returns the cohorts (``done_at``: when their last request was
    served) and the peak demand over capacity."""
    k = max(1, min(cohorts, n_nodes))
    groups = [_Cohort(jitter_s * (i + 0.5) / k if k > 1 else 0.0, n_nodes / k, requests)
              for i in range(k)]  # fmt: skip
    capacity = lim.prefix_rps * prefixes
    byte_cap = lim.total_MBps * MB
    horizon = jitter_s + fixed_s + requests / rate * (1 + n_nodes * rate / capacity) + 1
    dt = horizon / 4000
    t, peak = 0.0, 0.0
    while any(math.isnan(g.done_at) for g in groups):
        active = [g for g in groups if math.isnan(g.done_at) and t >= g.start + fixed_s]
        demand = sum(g.weight for g in active) * rate
        if demand:
            served = min(1.0, capacity / demand, byte_cap / (demand * bytes_per_req))
            peak = max(peak, demand / capacity)
            for g in active:
                g.left -= served * rate * dt
                if g.left <= 0:
                    g.done_at = t + dt
        t += dt
    return groups, peak


def _quantiles(groups: list[_Cohort]) -> tuple[float, float]:
    """Median and largest time from a node's start to its last request served."""
    ends = sorted(g.done_at - g.start for g in groups)
    return ends[len(ends) // 2], ends[-1]


def stage_outcome(n: int, w: Workload, lim: Limits, spec: NodeSpec, prefixes: int,
                  jitter_s: float) -> Outcome:  # fmt: skip
    requests = sum(w.store_requests)
    per_req = w.total_bytes / requests
    one = lim.ttfb_mean_s + per_req / (lim.conn_MBps * MB)
    rate = spec.stage_workers / one
    rate = min(rate, min(spec.nic_MBps, spec.disk_MBps, spec.verify_MBps) * MB / per_req)
    groups, peak = _share(n, jitter_s, requests, rate, per_req, lim,
                          prefixes * len(w.store_bytes), lim.ttfb_slowest_of(3))  # fmt: skip
    p50, last = _quantiles(groups)
    return Outcome(n, "stage", p50 + spec.fixed_s, last + spec.fixed_s, w.total_bytes, requests,
                   requests * n, peak, 0.0, "then local reads: no wait")  # fmt: skip


def stream_outcome(n: int, w: Workload, lim: Limits, spec: NodeSpec, prefixes: int,
                   jitter_s: float, step_s: float) -> Outcome:  # fmt: skip
    stores = len(w.store_bytes)
    conc = spec.stream_concurrency * stores
    opening = lim.ttfb_slowest_of(stores) + math.ceil(w.heads_at_start / conc) * (
        lim.ttfb_slowest_of(min(conc, w.heads_at_start))
    )
    waves = math.ceil(w.gets_per_rank_step / conc)
    first = opening + waves * (
        lim.ttfb_slowest_of(min(conc, w.gets_per_rank_step))
        + w.bytes_per_get / (lim.conn_MBps * MB)
    )
    per_rank_start = stores + w.heads_at_start + w.gets_per_rank_step
    capacity = lim.prefix_rps * prefixes * stores
    ranks = n * spec.ranks
    start_load = ranks * per_rank_start / max(jitter_s, first) / capacity
    # Each rank's ranks start at once: beyond capacity, the start stretches by the overload.
    first_p50 = first_max = first * max(1.0, start_load) + spec.fixed_s
    one = lim.ttfb_mean_s + w.bytes_per_get / (lim.conn_MBps * MB)
    fetch_s = w.gets_per_rank_step * one / conc  # pipelined: prefetch keeps conc in flight
    node_bytes = spec.ranks * w.gets_per_rank_step * w.bytes_per_get
    fetch_s = max(fetch_s, node_bytes / (spec.nic_MBps * MB))
    # Once running, a step takes the longest of the trainer's step, the rank's own fetch, and
    # the store's time to serve every rank's GETs of a step at its capacity.
    served_s = ranks * w.gets_per_rank_step / capacity
    step = max(step_s, fetch_s, served_s)
    load = max(start_load, ranks * w.gets_per_rank_step / max(step_s, fetch_s) / capacity)
    wait = step - step_s
    per_node_req = spec.ranks * per_rank_start
    return Outcome(n, "stream", first_p50, first_max, spec.ranks * w.gets_per_rank_step
                   * w.bytes_per_get, per_node_req, per_node_req * n, load, wait,
                   f"bytes a step and node; a step takes {_human_s(step)}")  # fmt: skip


def whole_shard_outcome(n: int, w: Workload, lim: Limits, spec: NodeSpec, prefixes: int,
                        jitter_s: float) -> Outcome:  # fmt: skip
    k = spec.peer_first_shards
    shard = spec.peer_shard_bytes
    one = lim.ttfb_mean_s + shard / (lim.conn_MBps * MB)
    rate = min(spec.peer_threads, k) / one
    rate = min(rate, min(spec.nic_MBps, spec.disk_MBps) * MB / shard)
    groups, peak = _share(n, jitter_s, k, rate, shard, lim, prefixes * len(w.store_bytes),
                          lim.ttfb_slowest_of(len(w.store_bytes)))  # fmt: skip
    p50, last = _quantiles(groups)
    p50, last = p50 + spec.fixed_s, last + spec.fixed_s
    epoch_shards = math.ceil(w.total_bytes / shard / n)
    return Outcome(n, "whole shards", p50, last, k * shard, k, k * n, peak, 0.0,
                   f"then {epoch_shards} shards ({epoch_shards * shard / 1e9:.1f} GB) "
                   "a node over an epoch")  # fmt: skip


def model(nodes: list[int], w: Workload, lim: Limits, spec: NodeSpec, prefixes: int,
          jitter_s: float, step_s: float) -> list[Outcome]:  # fmt: skip
    rows = []
    for n in nodes:
        rows.append(stage_outcome(n, w, lim, spec, prefixes, jitter_s))
        rows.append(stream_outcome(n, w, lim, spec, prefixes, jitter_s, step_s))
        rows.append(whole_shard_outcome(n, w, lim, spec, prefixes, jitter_s))
    return rows


def _human_s(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _human_n(x: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size:
            return f"{x / size:.1f}{unit}"
    return f"{x:.0f}"


def print_model(rows: list[Outcome], title: str) -> None:
    print(title)
    head = ("nodes", "mode", "first batch p50", "last node", "bytes/node", "req/node",
            "req total", "peak load", "wait/step")  # fmt: skip
    print("  " + " | ".join(head))
    for r in rows:
        cells = (
            str(r.nodes), r.mode, _human_s(r.first_batch_p50_s), _human_s(r.first_batch_max_s),
            _human_n(r.bytes_per_node) + "B", _human_n(r.requests_per_node),
            _human_n(r.requests_total), f"{r.peak_load:.2f}", _human_s(r.wait_per_step_s),
        )  # fmt: skip
        print("  " + " | ".join(cells) + (f"   ({r.notes})" if r.notes else ""))
    print()


# --- calibration: measured runs of 1-4 "nodes" on this machine ------------------------------


def _child(argv: list[str]) -> None:
    """One "node": wait for the start file, then stage or take a first step; print seconds."""
    mode, url_or_plan, cache, start_file, ranks, rank = argv
    import tokentape
    from tokentape._src.stage.stage import stage_store

    while not os.path.exists(start_file):
        time.sleep(0.001)
    t0 = time.perf_counter()
    if mode == "stage":
        stage_store(url_or_plan, cache)
    elif mode == "client":
        from tokentape._src.objects.client import object_store

        object_store(url_or_plan, {}).read(url_or_plan, 0, 4096)
    else:
        plan = tokentape.load_plan(url_or_plan)
        config = tokentape.BatchConfig(int(ranks), 8, 1)
        with tokentape.Loader(plan, int(rank), config, prefetch=0) as loader:
            loader.step()
    print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


def _measure_limits(endpoint: str, url: str, delay_s: float) -> Limits:
    """The local server through the proxy: one small GET's latency (median of 30), the request
    rate of 16 threads of small GETs, one connection's MB/s and 4 connections' MB/s."""
    from tokentape._src.objects.client import object_store

    store = object_store(url, {"endpoint_url": endpoint})
    big = max(store.find(url.rsplit("/", 1)[0]), key=lambda i: i.size)
    lat = []
    for _ in range(30):
        t = time.perf_counter()
        store.read(big.url, 0, 4096)
        lat.append(time.perf_counter() - t)
    lat.sort()

    def burst(threads: int, size: int, seconds: float) -> tuple[float, float]:
        count = [0]
        stop = time.perf_counter() + seconds
        lock = threading.Lock()

        def work() -> None:
            while time.perf_counter() < stop:
                store.read(big.url, 0, size)
                with lock:
                    count[0] += 1

        pool = [threading.Thread(target=work) for _ in range(threads)]
        t = time.perf_counter()
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        elapsed = time.perf_counter() - t
        return count[0] / elapsed, count[0] * size / elapsed / MB

    rps, _ = burst(16, 4096, 2.0)
    _, one_conn = burst(1, min(big.size, 4 * MIB), 2.0)
    _, total = burst(4, min(big.size, 4 * MIB), 2.0)
    return Limits(
        f"local moto + proxy {delay_s * 1000:.0f} ms", prefix_rps=rps, conn_MBps=one_conn,
        ttfb_p50_s=lat[len(lat) // 2], ttfb_p99_s=lat[-2], total_MBps=total,
    )  # fmt: skip


def _measure_node(
    local_plan: str, bin_url: str, ttfb_s: float, work: Path, env: dict[str, str]
) -> NodeSpec:
    """This machine as a node (best of 3 each): a first batch with the stores on local disk,
    sha256's MB/s, and a fresh process's first GET less its round trip (the client's making)."""
    import hashlib

    start = min(min(_run_nodes("stream", 1, local_plan, work, env, tag=str(i)))
                for i in range(3))  # fmt: skip
    data = os.urandom(64 * MIB)
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        hashlib.sha256(data).digest()
        best = min(best, time.perf_counter() - t)
    client = min(min(_run_nodes("client", 1, bin_url, work, env, tag=str(i)))
                 for i in range(3)) - ttfb_s  # fmt: skip
    return NodeSpec(ranks=1, nic_MBps=10_000, disk_MBps=2_000, start_s=start,
                    verify_MBps=len(data) / best / MB, client_s=max(0.0, client))  # fmt: skip


def _run_nodes(
    mode: str, n: int, target: str, work: Path, env: dict[str, str], tag: str = ""
) -> list[float]:
    """``n`` child processes ("nodes") of ``mode`` started together; each one's seconds."""
    start = work / f"start-{mode}-{n}{tag}"
    procs = []
    for i in range(n):
        cache = work / f"cache-{mode}-{n}{tag}-{i}"
        args = [sys.executable, __file__, "--child", mode, target, str(cache), str(start), str(n),
                str(i)]  # fmt: skip
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env))
    time.sleep(3.0)  # the children import tokentape; the clock starts when all are waiting
    start.touch()
    seconds = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        seconds.append(json.loads(out.strip().splitlines()[-1])["seconds"])
    return seconds


def calibrate(args: argparse.Namespace) -> tuple[list[dict], NodeSpec]:
    """Model and measured times for 1-4 local "nodes", stage and stream, side by side; and
    this machine as a node (its fixed costs)."""
    from faultproxy import FaultProxy
    from object_bench import write_random_store
    from objstore import S3Server, new_bucket, s3_environment

    import tokentape

    work = Path(tempfile.mkdtemp(prefix="fleet-"))
    server = S3Server()
    rows = []
    try:
        bucket = new_bucket(server.endpoint)
        local = work / "store"
        write_random_store(local, int(args.calib_store_mb * MB) // 2, 3, int(1 * MB) // 2)
        url = bucket.upload_tree(local, f"{bucket.url}/stores/web")
        with FaultProxy(server.endpoint, delay=args.latency_ms / 1000) as proxy:
            env = {**os.environ, **s3_environment(proxy.endpoint), "OMP_NUM_THREADS": "1"}
            os.environ.update(s3_environment(proxy.endpoint))
            plan = tokentape.Plan.build(
                {"web": {"path": url, "weight": 1, "max_repeats": 1000}}, seq_len=2048, seed=5,
                total_samples=100_000,
            )  # fmt: skip
            plan_path = work / "plan.json"
            plan.save(plan_path)
            local_plan = tokentape.Plan.build(
                {"web": {"path": str(local), "weight": 1, "max_repeats": 1000}}, seq_len=2048,
                seed=5, total_samples=100_000,
            )  # fmt: skip
            local_plan_path = work / "local-plan.json"
            local_plan.save(local_plan_path)
            lim = _measure_limits(proxy.endpoint, url + "/part-00000.bin", args.latency_ms / 1000)

            print(f"local store measured: {lim.prefix_rps:.0f} requests/s, "
                  f"{lim.conn_MBps:.0f} MB/s one connection, {lim.total_MBps:.0f} MB/s in all, "
                  f"first byte {lim.ttfb_p50_s * 1000:.1f} ms (p50), "
                  f"{lim.ttfb_p99_s * 1000:.1f} ms (~p97)")  # fmt: skip
            bin_url = url + "/part-00000.bin"
            spec = _measure_node(str(local_plan_path), bin_url, lim.ttfb_p50_s, work, env)
            print(f"a node measured: {spec.start_s * 1000:.0f} ms to a first batch from local "
                  f"disk, {spec.verify_MBps:.0f} MB/s of sha256, {spec.client_s * 1000:.0f} ms "
                  "to make an S3 client")  # fmt: skip
            for n in args.calib_nodes:
                w = plan_workload(str(local_plan_path), replace(spec, ranks=n), 8, 1)
                node = replace(spec, cpu_share=max(1.0, n / (os.cpu_count() or 1)))
                for mode, target in (("stage", url), ("stream", str(plan_path))):
                    proxy.reset()
                    measured = _run_nodes(mode, n, target, work, env)
                    stats = proxy.stats()
                    if mode == "stage":
                        m = stage_outcome(n, w, lim, node, 1, 0.0)
                    else:
                        m = stream_outcome(n, w, lim, node, 1, 0.0, 1.0)
                    rows.append({
                        "nodes": n, "mode": mode,
                        "model_s": m.first_batch_max_s, "measured_s": max(measured),
                        "model_requests": m.requests_total, "measured_requests": stats.requests,
                        "model_MB": m.bytes_per_node * n / MB,
                        "measured_MB": stats.bytes_sent / MB,
                    })  # fmt: skip
    finally:
        server.stop()
    return rows, spec


def print_calibration(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"calibration: {args.calib_store_mb:.0f} MB store in 1 MB shards on this machine's "
          f"S3 server (moto) behind a proxy adding {args.latency_ms:.0f} ms; N processes at "
          "once")  # fmt: skip
    print("  nodes | mode | time to first batch: model | measured | ratio | requests: model |"
          " measured | MB: model | measured")  # fmt: skip
    for r in rows:
        print(f"  {r['nodes']} | {r['mode']} | {_human_s(r['model_s'])} | "
              f"{_human_s(r['measured_s'])} | {r['measured_s'] / r['model_s']:.2f} | "
              f"{r['model_requests']:.0f} | {r['measured_requests']} | {r['model_MB']:.1f} | "
              f"{r['measured_MB']:.1f}")  # fmt: skip
    print()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--nodes", type=ints, default=[1, 16, 128, 1024, 4096])
    ap.add_argument("--ranks", type=int, default=8, help="ranks per node")
    ap.add_argument("--store-gb", type=floats, default=[1000.0, 200.0], help="each store's GB")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--itemsize", type=int, default=4)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--step-s", type=float, default=1.0, help="the trainer's step time")
    ap.add_argument("--jitter-s", type=float, default=30.0, help="node starts spread over this")
    ap.add_argument("--prefixes", type=int, default=1, help="prefixes each store is spread over")
    ap.add_argument("--range-mb", type=float, default=None,
                    help="stage: MiB per ranged GET (default: tokentape's, by size)")  # fmt: skip
    ap.add_argument("--stage-workers", type=int, default=DEFAULT_WORKERS)
    ap.add_argument("--shard-mb", type=float, default=256.0,
                    help="the stores' shards (tokenize --shard-mb)")  # fmt: skip
    ap.add_argument("--no-calibrate", action="store_true")
    ap.add_argument("--latency-ms", type=float, default=10.0)
    ap.add_argument("--calib-nodes", type=ints, default=[1, 2, 4])
    ap.add_argument("--calib-store-mb", type=float, default=24.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ranged = None if args.range_mb is None else int(args.range_mb * MIB)
    spec = NodeSpec(ranks=args.ranks, range_bytes=ranged, stage_workers=args.stage_workers)
    w = synthetic_workload(args.store_gb, args.seq_len, args.itemsize, args.micro * args.accum,
                           spec, int(args.shard_mb * MIB))  # fmt: skip
    calib: list[dict] = []
    if not args.no_calibrate:  # this machine's fixed costs (a client, a start) go into the model
        calib, here = calibrate(args)
        spec = replace(spec, start_s=here.start_s, client_s=here.client_s)
    rows = model(args.nodes, w, S3, spec, args.prefixes, args.jitter_s, args.step_s)
    title = (f"model: stores {', '.join(f'{g:g} GB' for g in args.store_gb)} on S3 (published "
             f"limits), {args.ranks} ranks a node, {args.micro}x{args.accum} windows of "
             f"{args.seq_len} a rank and step, step {args.step_s:g} s, starts over "
             f"{args.jitter_s:g} s, {args.prefixes} prefix(es) a store, stage "
             f"{args.stage_workers} x {_range_words(spec, w)}; a rank's fixed costs "
             f"{spec.fixed_s * 1000:.0f} ms")  # fmt: skip
    if args.json:
        print(json.dumps({"model": [asdict(r) for r in rows], "calibration": calib}, indent=1))
        return
    print_model(rows, title)
    if calib:
        print_calibration(calib, args)


if __name__ == "__main__":
    main()
