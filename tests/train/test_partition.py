"""Data-parallel partition: disjoint ranks, exact union, TP peers identical, contiguity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokentape._src.train.partition import BatchConfig, positions_for
from tokentape.errors import ArgumentError, OutOfRangeError

configs = st.builds(
    BatchConfig, dp_size=st.integers(1, 64), micro=st.integers(1, 16), accum=st.integers(1, 8)
)


@given(consumed=st.integers(0, 2**61), config=configs)
def test_ranks_are_disjoint_and_cover_the_step_exactly(consumed, config):
    per_rank = [positions_for(consumed, r, config) for r in range(config.dp_size)]
    flat = np.concatenate([p.ravel() for p in per_rank])
    assert len(np.unique(flat)) == flat.size  # no position read by two ranks
    expected = np.arange(consumed, consumed + config.global_batch)
    assert np.array_equal(np.sort(flat), expected)  # union = [consumed, consumed + B)
    for p in per_rank:
        assert p.shape == (config.accum, config.micro)
        assert np.all(np.diff(p.ravel()) == 1)  # each rank reads a contiguous run


# Tensor-parallel peers reading identical inputs is checked in real gloo processes, where a
# peer could differ (tests/test_smoke.py): here it would only call a pure function twice.


@given(steps=st.lists(configs, min_size=1, max_size=12))
def test_changing_the_batch_shape_between_steps_loses_and_repeats_nothing(steps):
    consumed, seen = 0, []
    for config in steps:
        for r in range(config.dp_size):
            seen.append(positions_for(consumed, r, config).ravel())
        consumed += config.global_batch
    flat = np.concatenate(seen)
    assert np.array_equal(np.sort(flat), np.arange(consumed))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dp_size": 0, "micro": 1}, "dp_size"),
        ({"dp_size": 2, "micro": -1}, "micro"),
        ({"dp_size": 2, "micro": 1, "accum": 1.5}, "accum"),
    ],
)
def test_bad_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchConfig(**kwargs)


def test_bad_rank_or_consumed():
    config = BatchConfig(dp_size=4, micro=2, accum=3)
    with pytest.raises(ValueError, match="dp_rank"):
        positions_for(0, 4, config)
    with pytest.raises(ValueError, match="consumed"):
        positions_for(-1, 0, config)
    assert positions_for(10, 1, config).tolist() == [[16, 17], [18, 19], [20, 21]]


@pytest.mark.parametrize("rank", [1.5, True, "1", None])
def test_dp_rank_must_be_an_integer(rank) -> None:
    with pytest.raises(ValueError, match="dp_rank must be an integer"):
        positions_for(0, rank, BatchConfig(4, 2))


def test_misuse_is_a_tokentape_error_naming_the_argument():
    for args, name in (((0, 1), "dp_size"), ((1, 0), "micro"), ((1, 1, -2), "accum")):
        with pytest.raises(ArgumentError, match=f"BatchConfig: {name} must be"):
            BatchConfig(*args)
    with pytest.raises(ArgumentError, match="global batch"):
        BatchConfig(2**31, 2**31, 2)
    with pytest.raises(ArgumentError, match=r"dp_rank must be in \[0, 2\), got 2"):
        positions_for(0, 2, BatchConfig(2, 1))
    with pytest.raises(OutOfRangeError, match=r"beyond position 2\*\*62"):
        positions_for(2**62 - 2, 0, BatchConfig(1, 4))
    assert positions_for(2**62 - 4, 0, BatchConfig(1, 4)).max() == 2**62 - 1
