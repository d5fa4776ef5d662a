"""Megatron-LM's ``--step-batch-size-schedule`` (not in megatron-core 0.16.1, whose own
calculators tests/megatron/test_megatron_run.py compares with): iterations and samples against
a plain simulation of the rule (each iteration's batch is that of the last threshold, in
samples, at or below the samples consumed before it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.megatron.iterations import BatchSchedule, parse_steps
from tokentape.errors import ArgumentError


def _simulate(steps: list[tuple[int, int]], iterations: int) -> list[tuple[int, int]]:
    """(consumed before, batch) of iterations 1..n, one iteration at a time."""
    out, consumed = [], 0
    for _ in range(iterations):
        batch = [b for t, b in steps if t <= consumed][-1]
        out.append((consumed, batch))
        consumed += batch
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 64)), max_size=6),
    st.integers(1, 64),
)
def test_the_step_schedule_is_the_rule(later, first):
    steps = sorted({t: b for t, b in [(0, first), *later]}.items())
    schedule = BatchSchedule(steps[-1][1], steps=tuple(steps))
    expected = _simulate(steps, 400)
    for n, (consumed, batch) in enumerate(expected, 1):
        assert schedule.consumed_before(n) == (consumed, batch), n
        for g in (consumed, consumed + batch - 1):
            assert schedule.iteration_of(g) == (n, consumed, batch), g


def test_thresholds_are_tokens_with_suffixes():
    assert parse_steps("0:768 250B:1536, 500B:3072", 4096) == (
        (0, 768),
        (250 * 10**9 // 4096, 1536),
        (500 * 10**9 // 4096, 3072),
    )
    assert parse_steps("1.5K:8 0:4", None) == ((0, 4), (1500, 8))


@pytest.mark.parametrize(
    "spec", ["", "5000:8", "0:8 0:16", "0:0", "0:8 x:16", "0-8", "0:8 1e3:16", "0:" + "9" * 40]
)
def test_a_bad_step_schedule_is_refused(spec):
    with pytest.raises(ArgumentError, match="--step-batch-size-schedule"):
        parse_steps(spec, 1024)
