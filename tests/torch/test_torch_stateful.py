"""The samplers' torchdata Stateful protocol: a state_dict round trip (through JSON too) resumes
exactly, by hand and under torchdata's StatefulDataLoader with 0 and 2 workers; a state of
another rank, shape or consumed is refused in one line."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from helpers import small_shard_stores  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tokentape._src.plan.plan import resolve_plan  # noqa: E402
from tokentape._src.plan.spec import load_plan_spec  # noqa: E402
from tokentape._src.torch.data import (  # noqa: E402
    TapeBatchSampler,
    TapeDataset,
    TapeSampler,
    collate,
)
from tokentape._src.train.partition import BatchConfig  # noqa: E402
from tokentape.errors import ArgumentError  # noqa: E402

pytestmark = pytest.mark.torch

KINDS = [TapeSampler, TapeBatchSampler]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = tmp_path_factory.mktemp("stateful")
    small_shard_stores(root)
    return resolve_plan(load_plan_spec(root / "mix.toml"))


def through_json(state):
    return json.loads(json.dumps(state))


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    dp_size=st.integers(1, 3),
    micro=st.integers(1, 4),
    accum=st.integers(1, 3),
    consumed=st.integers(0, 10**12),
    steps=st.integers(0, 4),
    data=st.data(),
)
def test_state_dict_round_trip_resumes_exactly(kind, dp_size, micro, accum, consumed, steps, data):
    """Stop after any number of items, save the state through JSON, load it into a new
    sampler: the new pass yields exactly the rest of the uninterrupted pass."""
    config = BatchConfig(dp_size, micro, accum)
    rank = data.draw(st.integers(0, dp_size - 1))
    full = list(kind(rank, config, consumed, steps))
    taken = data.draw(st.integers(0, len(full)))
    sampler = kind(rank, config, consumed, steps)
    it = iter(sampler)
    head = [next(it) for _ in range(taken)]
    state = through_json(sampler.state_dict())
    assert state["yielded"] == taken * (micro if kind is TapeBatchSampler else 1)
    resumed = kind(rank, config, consumed, steps)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    assert list(resumed) == full  # the pass after the resumed one starts from the beginning


def test_a_new_pass_restarts_and_its_state_says_so():
    """state_dict right after iter() (before any item) is the new pass's, not the last one's."""
    sampler = TapeBatchSampler(0, BatchConfig(1, 2), 0, 2)
    assert len(list(sampler)) == 2 and sampler.state_dict()["yielded"] == 4
    iter(sampler)
    assert sampler.state_dict()["yielded"] == 0


def test_sampler_and_batch_sampler_states_are_interchangeable_on_micro_batch_bounds():
    config = BatchConfig(2, 3, 2)
    items = TapeSampler(1, config, 12, 2)
    it = iter(items)
    for _ in range(3):
        next(it)
    batches = TapeBatchSampler(1, config, 12, 2)
    batches.load_state_dict(items.state_dict())
    assert list(batches) == [[21, 22, 23], [30, 31, 32], [33, 34, 35]]


def test_a_longer_run_resumes_from_a_shorter_runs_state():
    config = BatchConfig(2, 2)
    short = TapeSampler(0, config, 8, 2)
    assert list(short) == [8, 9, 12, 13]
    longer = TapeSampler(0, config, 8, 3)
    longer.load_state_dict(short.state_dict())
    assert list(longer) == [16, 17]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("other", "named"),
    [
        ({"dp_rank": 0}, "dp_rank 0 (this sampler: 1)"),
        ({"dp_size": 3}, "dp_size 3 (this sampler: 2)"),
        ({"micro": 2}, "micro 2 (this sampler: 3)"),
        ({"accum": 1}, "accum 1 (this sampler: 2)"),
        ({"consumed": 24}, "consumed 24 (this sampler: 12)"),
    ],
)
def test_a_state_of_another_rank_or_shape_is_refused_in_one_line(kind, other, named):
    sampler = kind(1, BatchConfig(2, 3, 2), 12, 2)
    state = {**sampler.state_dict(), **other}
    with pytest.raises(ArgumentError, match="another rank or shape") as caught:
        sampler.load_state_dict(state)
    assert named in str(caught.value) and "\n" not in str(caught.value)
    assert list(sampler) == list(kind(1, BatchConfig(2, 3, 2), 12, 2))  # nothing loaded


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([1, 2], "expected an object of dp_rank, dp_size"),
        ({"yielded": 0}, "expected an object of dp_rank, dp_size"),
        ({"yielded": 0, "epoch": 1}, "expected an object of dp_rank, dp_size"),
        ({"yielded": -1}, "'yielded' must be an integer >= 0, got -1"),
        ({"yielded": 1.0}, "'yielded' must be an integer >= 0, got 1.0"),
        ({"consumed": True}, "'consumed' must be an integer >= 0, got True"),
        ({"yielded": 13}, "yielded 13 is not a place in this sampler's 2 steps of 6 samples"),
        ({"yielded": 4}, "in micro-batches of 3"),
    ],
)
def test_a_malformed_state_is_refused_in_one_line(state, message):
    """A list, or a state missing keys, as given; otherwise over a valid state (an extra key)."""
    sampler = TapeBatchSampler(1, BatchConfig(2, 3, 2), 12, 2)
    if (isinstance(state, dict) and "epoch" in state) or (
        isinstance(state, dict) and state != {"yielded": 0}
    ):
        state = {**sampler.state_dict(), **state}
    with pytest.raises(ArgumentError, match="sampler state") as caught:
        sampler.load_state_dict(state)
    assert message in str(caught.value) and "\n" not in str(caught.value)


# --- torchdata's StatefulDataLoader -------------------------------------------------------------


def stateful_loader(plan, sampler, workers):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    dataset = TapeDataset(plan)
    if isinstance(sampler, TapeBatchSampler):
        return sdl.StatefulDataLoader(
            dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers
        )
    micro = sampler.config.micro
    return sdl.StatefulDataLoader(dataset, batch_size=micro, sampler=sampler, num_workers=workers)


def sampler_states(state):
    """The sampler states (``dp_rank`` ... ``yielded``) held anywhere in a loader's state."""
    if isinstance(state, dict):
        if "yielded" in state and "dp_rank" in state:
            return [state]
        return [s for value in state.values() for s in sampler_states(value)]
    if isinstance(state, list):
        return [s for value in state for s in sampler_states(value)]
    return []


def rows(batches):
    return [(b["positions"].tolist(), b["inputs"].sum().item()) for b in batches]


@pytest.mark.subprocess
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stop", [0, 3, 7, 12])
def test_stateful_dataloader_resumes_exactly(plan, kind, workers, stop):
    """Stop after ``stop`` batches, save the loader's state through JSON, resume in a new
    loader: the batches are those of the uninterrupted run, none lost, repeated or extra."""
    config, rank, consumed, steps = BatchConfig(2, 3, 2), 1, 12, 6
    uninterrupted = rows(stateful_loader(plan, kind(rank, config, consumed, steps), workers))
    assert len(uninterrupted) == steps * config.accum == 12
    first = stateful_loader(plan, kind(rank, config, consumed, steps), workers)
    it = iter(first)
    head = [next(it) for _ in range(stop)]
    state = through_json(first.state_dict())
    del it
    ours = sampler_states(state)  # resumed by our protocol, not torchdata's fast-forward
    assert ours and all(s["dp_rank"] == rank and s["consumed"] == consumed for s in ours)
    if workers == 0:
        assert ours[0]["yielded"] == stop * config.micro
    second = stateful_loader(plan, kind(rank, config, consumed, steps), workers)
    second.load_state_dict(state)
    assert rows(head) + rows(second) == uninterrupted


@pytest.mark.subprocess
def test_stateful_dataloader_refuses_another_ranks_state(plan):
    config = BatchConfig(2, 3, 2)
    first = stateful_loader(plan, TapeBatchSampler(1, config, 12, 2), 0)
    it = iter(first)
    next(it)
    state = first.state_dict()
    second = stateful_loader(plan, TapeBatchSampler(0, config, 12, 2), 0)
    second.load_state_dict(state)
    with pytest.raises(ArgumentError, match=r"another rank or shape: dp_rank 1 \(this sampler: 0"):
        next(iter(second))
