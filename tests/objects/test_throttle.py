"""Answers to slow down (503 SlowDown) are waited out, not failures, and halve the requests a
store allows in flight (objects.throttle): a stage and a streamed loader complete through a
server that throttles half their requests with a retry budget of one attempt, byte for byte;
the time spent so is bounded. Against a real S3 server (moto on 127.0.0.1) through the fault
proxy; the request budget's arithmetic as properties."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from faultproxy import FaultProxy
from helpers import tree_bytes, write_store
from hypothesis import given
from hypothesis import strategies as st

import tokentape
from tokentape._src.objects.client import object_store
from tokentape._src.objects.throttle import Gate
from tokentape._src.stage.stage import stage
from tokentape.errors import ObjectStorageError


@pytest.fixture
def throttling(tmp_path, s3, s3_server, monkeypatch):
    """A store of several shards in the bucket, read through a proxy; one attempt a request
    (anything but a throttle fails at once), short waits."""
    rng = random.Random(9)
    docs = [[rng.randrange(1, 250) for _ in range(rng.randint(5, 60))] for _ in range(90)]
    local = tmp_path / "web"
    write_store(local, docs, 500, 64)
    url = s3.upload_tree(local, f"{s3.url}/stores/web")
    monkeypatch.setenv("TOKENTAPE_IO_RETRIES", "1")
    monkeypatch.setenv("TOKENTAPE_IO_BACKOFF", "0.01")
    with FaultProxy(s3_server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield url, local, proxy


@pytest.mark.s3
def test_a_stage_through_a_throttling_server_completes(throttling, tmp_path):
    url, local, proxy = throttling
    proxy.set(slowdown=0.5)
    staged = stage(url, tmp_path / "cache", workers=4, range_bytes=128).path
    assert tree_bytes(Path(staged)) == tree_bytes(local)
    assert proxy.stats().faults["slowdown"] > 0


@pytest.mark.s3
def test_a_streamed_loader_through_a_throttling_server_gives_the_same_batches(throttling):
    url, local, proxy = throttling
    spec = {"web": {"path": str(local), "weight": 1, "max_repeats": 100}}
    plan = tokentape.Plan.build(spec, seq_len=16, seed=2, total_samples=400)
    remote = tokentape.Plan.build(
        {"web": {**spec["web"], "path": url}}, seq_len=16, seed=2, total_samples=400
    )
    config = tokentape.BatchConfig(1, 16, 1)
    proxy.set(slowdown=0.5)
    with (
        tokentape.Loader(remote, 0, config, prefetch=1) as streamed,
        tokentape.Loader(plan, 0, config, prefetch=0) as expected,
    ):
        for _ in range(4):
            got, want = streamed.step(), expected.step()
            assert np.array_equal(got.micro_batches[0].tokens, want.micro_batches[0].tokens)
            streamed.commit()
            expected.commit()
    assert proxy.stats().faults["slowdown"] > 0


@pytest.mark.s3
@pytest.mark.parametrize("backoff", ["0.01", "0"])
def test_the_time_spent_slowing_down_is_bounded(throttling, monkeypatch, backoff):
    """Also with no backoff at all (the waits on throttling still grow: no endless loop)."""
    url, _, proxy = throttling
    monkeypatch.setenv("TOKENTAPE_IO_BACKOFF", backoff)
    monkeypatch.setenv("TOKENTAPE_IO_THROTTLE_S", "0.5")
    proxy.set(slowdown=1.0)
    store = object_store(url)
    with pytest.raises(ObjectStorageError, match="told to slow down") as caught:
        store.read(f"{url}/manifest.json")
    assert "\n" not in str(caught.value)
    assert proxy.stats().faults["slowdown"] >= 2  # waited, asked again, then gave up


OPS = st.lists(st.tuples(st.sampled_from(["enter", "ok", "slow", "slow-old"]), st.booleans()))


@given(st.integers(1, 64), OPS)
def test_the_request_budget_halves_on_a_throttle_and_grows_back_slowly(ceiling, ops):
    gate = Gate(ceiling)
    held: list[int] = []  # the epochs of the requests in flight
    for op, newest in ops:
        before, epoch_before = gate.limit, gate.epoch
        if op == "enter":
            if gate.in_flight < int(gate.limit):  # room: enter does not wait
                held.append(gate.enter())
            continue
        if not held:
            continue
        epoch = held.pop(-1 if newest else 0)
        if op == "slow-old" and epoch == gate.epoch:
            held.append(epoch)
            continue
        gate.leave(epoch, op != "ok")
        assert 1 <= gate.limit <= ceiling and gate.in_flight == len(held)
        if op == "ok":
            assert before <= gate.limit <= before + 1 / before
        elif epoch == epoch_before:  # the first throttle since the last decrease: halved
            assert gate.limit == max(1.0, min(before, len(held) + 1) / 2)
            assert gate.epoch == epoch_before + 1
        else:  # sent before the last decrease: already counted
            assert gate.limit == before and gate.epoch == epoch_before
