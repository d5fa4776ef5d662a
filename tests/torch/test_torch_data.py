"""The torch pair: a stock DataLoader (with workers) yields the native loader's micro-batches."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import small_shard_stores  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.utils.data import DataLoader, default_collate  # noqa: E402

from tokentape._src.plan.plan import resolve_plan  # noqa: E402
from tokentape._src.plan.spec import load_plan_spec  # noqa: E402
from tokentape._src.torch import data as torch_data  # noqa: E402
from tokentape._src.torch.data import (  # noqa: E402
    TapeBatchSampler,
    TapeDataset,
    TapeSampler,
    TapeSamples,
    collate,
    to_torch,
)
from tokentape._src.train.batch import Batcher  # noqa: E402
from tokentape._src.train.loader import Loader  # noqa: E402
from tokentape._src.train.partition import BatchConfig  # noqa: E402
from tokentape._src.train.state import DataState  # noqa: E402
from tokentape.errors import OutOfRangeError  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch")
    small_shard_stores(root)
    return resolve_plan(load_plan_spec(root / "mix.toml"))


@pytest.mark.subprocess
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_equals_the_native_loader(plan, workers):
    config, rank, consumed, steps = BatchConfig(dp_size=2, micro=3, accum=2), 1, 24, 3
    sampler = TapeSampler(rank, config, consumed, steps)
    dataset = TapeDataset(plan, segments=True)
    loader = DataLoader(dataset, batch_size=config.micro, sampler=sampler, num_workers=workers)
    got = list(loader)
    native = Loader(plan, rank, config, segments=True)
    native.load_state_dict(DataState.start(plan).commit(config).commit(config).to_dict())
    assert native.state.consumed == consumed
    expected = []
    for _ in range(steps):
        expected += [to_torch(m, pin=False) for m in native.step().micro_batches]
        native.commit()
    native.close()
    assert len(got) == len(expected) == steps * config.accum
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert got[0]["inputs"].dtype == torch.int64 and got[0]["inputs"].shape == (3, plan.seq_len)
    assert np.array_equal(got[0]["positions"].numpy(), [30, 31, 32])  # 24 + rank 1 * 6


def test_sampler_misuse_names_the_argument():
    from tokentape.errors import ArgumentError, OutOfRangeError

    with pytest.raises(ArgumentError, match="steps must be an integer >= 0"):
        TapeSampler(0, BatchConfig(2, 2), 0, -1)
    with pytest.raises(ArgumentError, match="dp_rank"):
        TapeSampler(2, BatchConfig(2, 2), 0, 3)
    with pytest.raises(OutOfRangeError, match=r"beyond position 2\*\*62"):
        TapeSampler(0, BatchConfig(2, 2), 2**62 - 8, 3)
    assert len(TapeSampler(0, BatchConfig(2, 2), 2**62 - 8, 2)) == 4


def test_sampler_takes_numpy_integers_and_checks_their_sum_without_overflow():
    """np.int64 steps were refused (accepted before the hardening); an np.int64 consumed made
    the 2**62 check overflow: an OverflowError, or a wrapped sum that passed."""
    config = BatchConfig(2, 2)
    assert list(TapeSampler(1, config, np.int64(4), np.int64(2))) == [6, 7, 10, 11]
    for steps in (2**62, 2**62 + 5):
        with pytest.raises(OutOfRangeError, match=r"2\*\*62"):
            TapeSampler(0, BatchConfig(1, 1), np.int64(2**62 - 2), steps)


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        assert a[key].is_contiguous(), key


def run_phases(phases):
    """(config, consumed, steps) of each phase of a run whose shape changes, ``consumed``
    carried over as ``DataState`` counts it."""
    consumed, out = 0, []
    for config, steps in phases:
        out.append((config, consumed, steps))
        consumed += steps * config.global_batch
    return out, consumed


shapes = st.builds(
    BatchConfig,
    dp_size=st.integers(1, 3),
    micro=st.integers(1, 4),
    accum=st.integers(1, 3),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    phases=st.lists(st.tuples(shapes, st.integers(0, 4)), min_size=1, max_size=3),
    ahead=st.sampled_from([1, 5, 16, torch_data.AHEAD]),
)
def test_getitems_equals_the_direct_path_for_every_position_across_dp_changes(plan, phases, ahead):
    """Every rank's micro-batches of every phase, read by __getitems__ + collate (resolved
    ``ahead`` positions of coming steps at a time, by one dataset across the shape changes),
    are to_torch(Batcher.batch(...)) of the same positions, as are plain lists of them;
    together they cover the run's positions exactly once."""
    dataset, batcher = TapeDataset(plan, segments=True), Batcher(plan, np.int64, segments=True)
    runs, total = run_phases(phases)
    seen = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch_data, "AHEAD", ahead)
        for config, consumed, steps in runs:
            for rank in range(config.dp_size):
                for micro in TapeBatchSampler(rank, config, consumed, steps):
                    got = collate(dataset.__getitems__(micro))
                    direct = to_torch(batcher.batch(np.array(micro)), pin=False)
                    assert_same(got, direct)
                    assert_same(collate(dataset.__getitems__(list(reversed(micro)))[::-1]), direct)
                    assert got["inputs"].shape == (config.micro, plan.seq_len)
                    seen += micro
    assert sorted(seen) == list(range(total))


def test_a_micro_batch_outside_the_steps_resolved_ahead_is_resolved_afresh(plan):
    """Positions that are not in the cached steps' grid (another rank's, a gap, before the
    first step) miss the cache and still get their own samples."""
    dataset, batcher = TapeDataset(plan), Batcher(plan)
    config = BatchConfig(dp_size=2, micro=2, accum=1)
    mine = list(TapeBatchSampler(0, config, 0, 3))
    assert mine == [[0, 1], [4, 5], [8, 9]]
    dataset.__getitems__(mine[0])  # resolves steps 0..2 of rank 0 ahead
    for other in ([2, 3], [1, 2], [5, 6], [12, 13], [0, 4]):
        micro = torch_data.MicroBatch(range(0), 0, 4, 2)
        micro.extend(other)  # claims rank 0's steps, holds positions outside them
        got = collate(dataset.__getitems__(micro))
        assert_same(got, to_torch(batcher.batch(np.array(other)), pin=False))


def test_getitems_under_default_collate_gives_the_same_batch(plan):
    """TapeSamples is a sequence of per-sample dicts too: torch's default_collate stacks them
    back into the batch collate hands on without a copy; and __getitem__ is one of them."""
    dataset = TapeDataset(plan, segments=True)
    samples = dataset.__getitems__([7, 3, 11])
    assert isinstance(samples, TapeSamples) and len(samples) == 3
    assert collate(samples) is samples.tensors
    assert_same(default_collate(list(samples)), samples.tensors)
    assert_same(samples[1], dataset[3])
    assert_same(samples[-1], dataset[11])
    assert [s["positions"].item() for s in samples[1:]] == [3, 11]
    with pytest.raises(IndexError):
        samples[3]
    direct = to_torch(Batcher(plan, segments=True).batch(np.array([7, 3])), pin=False)
    assert_same(collate([dataset[7], dataset[3]]), direct)


def test_batch_sampler_hands_out_each_micro_batch_as_a_list():
    sampler = TapeBatchSampler(1, BatchConfig(dp_size=2, micro=3, accum=2), 24, 2)
    got = list(sampler)
    assert got == [[30, 31, 32], [33, 34, 35], [42, 43, 44], [45, 46, 47]]
    assert len(sampler) == 4 and all(type(p) is int for m in got for p in m)
    assert [p for m in got for p in m] == list(TapeSampler(1, sampler.config, 24, 2))


@pytest.mark.subprocess
@pytest.mark.parametrize("workers", [0, 2])
def test_batch_sampler_dataloader_equals_the_native_loader_across_a_dp_change(plan, workers):
    """DataLoader(batch_sampler=TapeBatchSampler, collate_fn=collate), one sampler per shape
    from the consumed the native loader reached, yields the native loader's micro-batches."""
    first, second, rank = BatchConfig(2, 3, 2), BatchConfig(3, 2, 1), 1
    native = Loader(plan, rank, first, segments=True, prefetch=0)
    expected = []
    for config, steps in ((first, 2), (second, 3)):
        native.set_config(config)
        for _ in range(steps):
            expected += [to_torch(m, pin=False) for m in native.step().micro_batches]
            native.commit()
    native.close()
    dataset, got = TapeDataset(plan, segments=True), []
    for config, consumed, steps in run_phases([(first, 2), (second, 3)])[0]:
        sampler = TapeBatchSampler(rank, config, consumed, steps)
        got += list(
            DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers)
        )
    assert len(got) == len(expected) == 2 * 2 + 3
    for a, b in zip(got, expected, strict=True):
        assert_same(a, b)
    assert got[-1]["positions"].tolist() == [12 + 2 * 6 + 2 * 6 + 2, 12 + 2 * 6 + 2 * 6 + 3]
