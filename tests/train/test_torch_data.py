"""The torch pair: a stock DataLoader (with workers) yields the native loader's micro-batches."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import small_shard_stores  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from tokentape._src.plan.plan import resolve_plan  # noqa: E402
from tokentape._src.plan.spec import load_plan_spec  # noqa: E402
from tokentape._src.train.loader import Loader  # noqa: E402
from tokentape._src.train.partition import BatchConfig  # noqa: E402
from tokentape._src.train.state import DataState  # noqa: E402
from tokentape._src.train.torch_data import TapeDataset, TapeSampler, to_torch  # noqa: E402
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
