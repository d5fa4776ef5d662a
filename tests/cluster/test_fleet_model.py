"""``benchmarks/fleet_sim.py``: its counts are what tokentape does, and its sharing of the object
store obeys the store's limits.

The request count the model takes for a stage is the one a real stage makes (counted at a
proxy in front of the local S3 server); below the store's capacity a node stages at its own
pace whatever the number of nodes, above it the whole fleet cannot be served faster than the
capacity allows; adding nodes never makes the last one earlier."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from faultproxy import FaultProxy
from helpers import SIZES, small_shard_stores

import tokentape
from tokentape._src.stage.stage import stage

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import fleet_sim

pytestmark = [pytest.mark.s3]


def test_a_stage_makes_the_requests_the_model_counts(tmp_path, s3, s3_server, monkeypatch):
    small_shard_stores(tmp_path)
    local = {name: str(tmp_path / "stores" / name) for name in SIZES}
    plan = tokentape.Plan.build(
        {n: {"path": p, "weight": 1, "max_repeats": 100} for n, p in local.items()},
        seq_len=64, seed=3, total_samples=500,
    )  # fmt: skip
    plan.save(tmp_path / "plan.json")
    spec = fleet_sim.NodeSpec(ranks=1, range_bytes=1000)  # several GETs for the larger files
    w = fleet_sim.plan_workload(str(tmp_path / "plan.json"), spec, micro=4, accum=1)
    s3.upload_tree(tmp_path / "stores", f"{s3.url}/stores")
    with FaultProxy(s3_server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        for name, requests, size in zip(SIZES, w.store_requests, w.store_bytes, strict=True):
            proxy.reset()
            url = f"{s3.url}/stores/{name}"
            staged = stage(url, tmp_path / "cache", workers=2, range_bytes=spec.range_bytes).path
            assert proxy.stats().requests == requests, name
            assert sum(f.stat().st_size for f in staged.iterdir()) == size, name


def test_sharing_keeps_to_the_capacity():
    lim = fleet_sim.Limits("test", prefix_rps=100, conn_MBps=100, ttfb_p50_s=0.01,
                           ttfb_p99_s=0.02)  # fmt: skip
    # One node at 10 requests/s for 50 requests: 5 s, alone or with 9 others (100/s in all).
    for n in (1, 10):
        groups, peak = fleet_sim._share(n, 0.0, 50, 10.0, 1e6, lim, 1, 0.0)
        assert max(g.done_at for g in groups) == pytest.approx(5.0, rel=0.01)
        assert peak <= 1.0
    # 40 nodes ask 400/s of a store serving 100/s: 2,000 requests take 20 s at best.
    groups, peak = fleet_sim._share(40, 0.0, 50, 10.0, 1e6, lim, 1, 0.0)
    assert max(g.done_at for g in groups) == pytest.approx(20.0, rel=0.01)
    assert peak == pytest.approx(4.0)
    # More nodes never finish earlier; started over a spread, never earlier than without it.
    lasts = [max(g.done_at for g in fleet_sim._share(n, 0.0, 50, 10.0, 1e6, lim, 1, 0.0)[0])
             for n in (1, 5, 10, 20, 80)]  # fmt: skip
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(lasts)), lasts
    assert fleet_sim._quantiles(fleet_sim._share(40, 10.0, 50, 10.0, 1e6, lim, 1, 0.0)[0])[1] >= 5
