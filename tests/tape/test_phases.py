"""Blends in phases (tape.phases) and the tape over them: within each phase every prefix
(counted from the phase's start) keeps every source within one sample of the phase's weights;
each source's draws continue across phases, so its samples come in the order a single-phase
tape gives them; every map inverts. Expected values are brute-force counts over the positions,
never the code's own closed forms."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.tape.blend import Blend
from tokentape._src.tape.phases import PhasedBlend
from tokentape._src.tape.resolve import Tape
from tokentape.errors import ArgumentError, OutOfRangeError, PlanError


@st.composite
def phased(draw, max_sources: int = 4, max_phases: int = 4):
    """(starts, weights): 1-4 sources, 1-4 phases of 1-60 positions apart, weights 0-6 with
    one positive per phase."""
    n_sources = draw(st.integers(1, max_sources))
    n_phases = draw(st.integers(1, max_phases))
    gaps = draw(st.lists(st.integers(1, 60), min_size=n_phases - 1, max_size=n_phases - 1))
    starts = [0, *np.cumsum(gaps).tolist()]
    weights = []
    for _ in range(n_phases):
        w = draw(st.lists(st.integers(0, 6), min_size=n_sources, max_size=n_sources))
        if not any(w):
            w[draw(st.integers(0, n_sources - 1))] = draw(st.integers(1, 6))
        weights.append(w)
    return starts, weights


def _brute_sources(blend: PhasedBlend, n: int) -> np.ndarray:
    return blend.source_and_draw(np.arange(n))[0]


@settings(max_examples=200, deadline=None)
@given(phased())
def test_every_prefix_of_every_phase_is_within_one_sample_of_its_weights(case):
    starts, weights = case
    blend = PhasedBlend.build(starts, weights)
    horizon = starts[-1] + 3 * sum(weights[-1]) + 5
    sources = _brute_sources(blend, horizon)
    ends = [*starts[1:], horizon]
    for start, end, w in zip(starts, ends, weights, strict=True):
        inside = sources[start:end]
        total = sum(w)
        for d, wd in enumerate(w):
            counts = np.concatenate([[0], np.cumsum(inside == d)])
            n = np.arange(len(counts))
            gap = counts * total - n * wd  # exact: count_d(n) - n * w_d / total, times total
            assert np.abs(gap).max() < total, (d, w)


@settings(max_examples=200, deadline=None)
@given(phased())
def test_draws_continue_across_phases_and_every_map_inverts(case):
    starts, weights = case
    blend = PhasedBlend.build(starts, weights)
    horizon = starts[-1] + 2 * sum(weights[-1]) + 3
    p = np.arange(horizon)
    source, draw = blend.source_and_draw(p)
    for d in range(len(weights[0])):
        mine = np.flatnonzero(source == d)
        assert draw[mine].tolist() == list(range(mine.size))  # 0, 1, 2 ... in position order
        assert np.array_equal(blend.position(d, draw[mine]), mine)
        for n in range(horizon + 1):
            assert blend.count(d, n) == int(np.count_nonzero(mine < n))
    assert np.array_equal(blend.position(source, draw), p)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.integers(0, 500))
def test_one_phase_is_the_plain_blend(weights, offset):
    plain, phased_ = Blend.build(weights), PhasedBlend.build([0], [weights])
    p = np.arange(offset, offset + 3 * sum(weights))
    for a, b in zip(plain.source_and_draw(p), phased_.source_and_draw(p), strict=True):
        assert np.array_equal(a, b)
    for d in range(len(weights)):
        assert np.array_equal(plain.count(d, p), phased_.count(d, p))
        assert np.array_equal(plain.position(d, p), phased_.position(d, p))


@settings(max_examples=60, deadline=None)
@given(phased(max_sources=3), st.integers(0, 2**31))
def test_a_phased_tape_draws_each_source_s_samples_in_single_phase_order(case, seed):
    """Each source's k-th draw anywhere in the run is draw k of its passes: its samples, in
    position order, are the ones a single-phase tape draws for it, in the same order."""
    starts, weights = case
    names = [f"s{d}" for d in range(len(weights[0]))]
    n_samples = [7, 11, 3][: len(names)]
    tape = Tape.build_phased(names, n_samples, starts, weights, seed)
    single = Tape.build(names, n_samples, [1] * len(names), seed)
    horizon = starts[-1] + 40
    got = tape.resolve(np.arange(horizon))
    reference = single.resolve(np.arange(40 * horizon * len(names)))
    for d in range(len(names)):
        mine = got.source == d
        expected = reference.sample[reference.source == d][: int(mine.sum())]
        assert got.sample[mine].tolist() == expected.tolist()
        positions = tape.position_of(d, got.sample[mine], got.epoch[mine])
        assert np.array_equal(positions, np.flatnonzero(mine))
    # The range fast path and the general path agree.
    scattered = tape.resolve(np.arange(horizon)[::-1].copy())
    assert np.array_equal(scattered.sample[::-1], got.sample)


def test_a_source_may_start_late_and_stop_early():
    # "code" has weight 0 in the first phase (starts at 10) and in the last (from 30 on).
    blend = PhasedBlend.build([0, 10, 30], [[1, 0], [1, 1], [1, 0]])
    sources = blend.source_and_draw(np.arange(40))[0]
    assert sources[:10].tolist() == [0] * 10 and sources[30:].tolist() == [0] * 10
    assert sources[10:30].tolist().count(1) == 10
    assert blend.count(1, 10**6) == 10
    assert blend.position(1, 9) < 30
    with pytest.raises(OutOfRangeError, match="draw 10 of source 1 is never made"):
        blend.position(1, 10)
    for n in range(10, 31):  # within the phase, "code" keeps within one sample of half
        assert abs(int(np.count_nonzero(sources[10:n] == 1)) - Fraction(n - 10, 2)) < 1


@pytest.mark.parametrize(
    ("starts", "weights", "message"),
    [
        ([5], [[1]], "first phase starts at position 0"),
        ([0, 10, 10], [[1], [1], [1]], "starts must increase"),
        ([0, 10], [[1, 1], [0, 0]], "one positive at least"),
        ([0, 10], [[1, 1], [1]], "expected 2 integers"),
        ([0], [[1, -1]], "integers >= 0"),
        ([0, 1], [[1]], "one start per phase"),
    ],
)
def test_bad_phases_are_refused(starts, weights, message):
    with pytest.raises(PlanError, match=message):
        PhasedBlend.build(starts, weights)


def test_a_phased_tape_refuses_a_phase_without_a_weight_per_source():
    with pytest.raises(ArgumentError, match="one weight per source"):
        Tape.build_phased(["a", "b"], [5, 5], [0, 10], [[1, 1], [1]], 0)


@settings(max_examples=100, deadline=None)
@given(phased(max_sources=3), st.integers(0, 2**20), st.integers(0, 300), st.integers(1, 300))
def test_a_range_across_phases_resolves_as_its_positions_one_by_one(case, seed, start, count):
    """The range fast path tiles each phase's stretch: it agrees with the general path."""
    starts, weights = case
    names = [f"s{d}" for d in range(len(weights[0]))]
    tape = Tape.build_phased(names, [5, 9, 2][: len(names)], starts, weights, seed)
    got = tape.resolve_range(start, count)
    positions = np.arange(start, start + count)
    expected = tape._samples(*tape.blend.source_and_draw(positions))
    for a, b in zip(
        (got.source, got.epoch, got.sample),
        (expected.source, expected.epoch, expected.sample),
        strict=True,
    ):
        assert np.array_equal(a, b)
