"""The blend: exact weights, a table of period D, every prefix within one sample, O(1) maps."""

from __future__ import annotations

import itertools
import math
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.tape.blend import (
    EXACT_CAP,
    MAX_POSITION,
    Blend,
    exact_weights,
    rational_weights,
)
from tokentape.errors import PlanError, TokentapeError


def reference_picks(weights: tuple[int, ...], steps: int) -> list[int]:
    """The earliest-deadline rule, restated as a plain loop over exact fractions.

    At position n, a source whose next draw c is released (c·D/W < n + 1) and is due soonest
    (ceil((c + 1)·D/W) smallest) wins; ties go to the lowest index.
    """
    denom = sum(weights)
    count = [0] * len(weights)
    picks = []
    for n in range(steps):
        best = None
        for d, w in enumerate(weights):
            if Fraction(count[d] * denom, w) < n + 1:
                due = math.ceil(Fraction((count[d] + 1) * denom, w))
                if best is None or due < best[0]:
                    best = (due, d)
        assert best is not None, "no source is released"
        picks.append(best[1])
        count[best[1]] += 1
    return picks


def max_deficit_picks(weights: tuple[int, ...], steps: int) -> list[int]:
    """The plainer rule: the largest deficit (n+1)·W_d − D·c_d, ties to the lowest index."""
    denom = sum(weights)
    count = [0] * len(weights)
    picks = []
    for n in range(steps):
        deficits = [(n + 1) * w - denom * c for w, c in zip(weights, count, strict=True)]
        d = deficits.index(max(deficits))
        picks.append(d)
        count[d] += 1
    return picks


def prefix_counts(picks: list[int], n_sources: int) -> np.ndarray:
    """counts[n, d]: how many of picks[:n] are d, for n = 0..len(picks)."""
    one_hot = np.zeros((len(picks) + 1, n_sources), dtype=np.int64)
    one_hot[np.arange(1, len(picks) + 1), picks] = 1
    return np.cumsum(one_hot, axis=0)


def assert_prefix_bound(counts: np.ndarray, weights: tuple[int, ...]) -> None:
    """|D·count_d(n) − n·W_d| < D for every prefix n and source d, in exact integers."""
    denom = sum(weights)
    n = np.arange(counts.shape[0], dtype=np.int64)[:, None]
    gap = np.abs(denom * counts - n * np.asarray(weights, dtype=np.int64)[None, :])
    worst = np.unravel_index(int(np.argmax(gap)), gap.shape)
    assert gap.max() < denom, f"prefix {worst[0]}, source {worst[1]}: {gap.max()}/{denom} off"


@st.composite
def integer_weights(draw, max_sources: int = 8, max_denominator: int = 4096) -> tuple[int, ...]:
    """2..max_sources positive integers with a sum in [2, max_denominator]."""
    n_sources = draw(st.integers(2, max_sources))
    denom = draw(st.integers(n_sources, max_denominator))
    cuts = draw(
        st.lists(
            st.integers(1, denom - 1), min_size=n_sources - 1, max_size=n_sources - 1, unique=True
        )
    )
    bounds = [0, *sorted(cuts), denom]
    return tuple(b - a for a, b in itertools.pairwise(bounds))


# ---------------------------------------------------------------------------- rational weights


@given(
    st.lists(st.floats(1e-3, 1e6, allow_nan=False), min_size=1, max_size=12),
    st.integers(64, 2**20),
)
def test_rational_weights_sum_exactly_and_round_within_one(weights, denom):
    names = [f"s{i}" for i in range(len(weights))]
    total = sum(Fraction(w) for w in weights)
    try:
        units = rational_weights(weights, names, denom)
    except TokentapeError as e:
        assert "rounds to 0" in str(e)
        assert min(Fraction(w) / total * denom for w in weights) < 1
        return
    assert sum(units) == denom
    assert all(u >= 1 for u in units)
    total = sum(Fraction(w) for w in weights)
    for w, u in zip(weights, units, strict=True):
        assert abs(u - Fraction(w) / total * denom) < 1


@given(
    st.lists(st.integers(1, 5000), min_size=1, max_size=12),
    st.lists(st.floats(1e-3, 1.0), min_size=1, max_size=12),
    st.integers(-20, 20),
)
def test_rational_weights_do_not_depend_on_scale(ints, floats, exponent):
    names = [f"s{i}" for i in range(12)]
    assert rational_weights(ints, names[: len(ints)]) == rational_weights(
        [10 * w for w in ints], names[: len(ints)]
    )
    scaled = [math.ldexp(w, exponent) for w in floats]  # exact: a power-of-two scale
    assert rational_weights(floats, names[: len(floats)]) == rational_weights(
        scaled, names[: len(floats)]
    )


def test_rational_weights_examples():
    assert rational_weights([1, 1, 1], ["a", "b", "c"]) == (21846, 21845, 21845)
    assert rational_weights([0.5, 0.25, 0.25], ["a", "b", "c"], 4) == (2, 1, 1)
    assert rational_weights([3], ["only"], 7) == (7,)
    # Exact values of the floats: 0.1 + 0.2 != 0.3 in floats, and no float sum is involved.
    assert rational_weights([0.1, 0.2, 0.7], ["a", "b", "c"], 10) == (1, 2, 7)
    # Equal remainders go to the lower index.
    assert rational_weights([1, 1, 1, 1], list("abcd"), 6) == (2, 2, 1, 1)


@pytest.mark.parametrize(
    ("weights", "denom", "message"),
    [
        ([1.0, 1e-9], 2**16, "source 'b': weight 1e-09 rounds to 0/65536; raise it"),
        ([1.0, -2.0], 2**16, "source 'b': weight -2.0 is negative"),
        ([1.0, float("nan")], 2**16, "source 'b': weight nan: expected a finite number"),
        ([float("inf"), 1.0], 2**16, "source 'a': weight inf: expected a finite number"),
        ([1.0, 0.0], 2**16, "source 'b': weight must be positive; drop the source instead"),
        ([0, 0], 2**16, "source 'a': weight must be positive"),
        (["3", 1], 2**16, "source 'a': weight '3': expected a number"),
        ([1, 1], 0, "denominator 0: expected an integer in [1, 16777216]"),
        ([1, 1], 2**24 + 1, "denominator 16777217"),
        ([1, 1], 2.0, "denominator 2.0"),
        ([1], 2**16, "1 weights for 2 source names"),
        ([], 2**16, "no sources"),
    ],
)
def test_rational_weights_refuse(weights, denom, message):
    names = ["a", "b"] if len(weights) != 0 else []
    with pytest.raises(TokentapeError, match=re.escape(message)):
        rational_weights(weights, names, denom)


# ---------------------------------------------------------------------------- the table


def test_max_deficit_rule_would_break_the_prefix_bound():
    """Why the blend uses deadlines: the largest-deficit rule falls a whole sample behind."""
    weights = (1, 1, 1, 1, 4, 4)
    counts = prefix_counts(max_deficit_picks(weights, 12), len(weights))
    assert 12 * counts[9, 5] - 9 * 4 == -12  # source 5: 2 draws after 9 positions, target 3
    with pytest.raises(AssertionError):
        assert_prefix_bound(counts, weights)
    blend = Blend.build(weights)
    assert_prefix_bound(prefix_counts(blend.table.tolist(), len(weights)), weights)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(integer_weights())
def test_table_is_the_rule_and_exactly_periodic(weights):
    denom = sum(weights)
    blend = Blend.build(weights)
    picks = reference_picks(weights, 3 * denom)
    assert blend.table.tolist() == picks[:denom]
    assert picks[:denom] == picks[denom : 2 * denom] == picks[2 * denom :]
    assert [picks.count(d) for d in range(len(weights))] == [3 * w for w in weights]


@settings(max_examples=60, deadline=None)
@given(integer_weights())
def test_every_prefix_of_two_periods_is_within_one_sample(weights):
    denom = sum(weights)
    expected = prefix_counts(reference_picks(weights, 2 * denom), len(weights))
    assert_prefix_bound(expected, weights)
    table = Blend.build(weights).table
    got = prefix_counts(np.tile(table, 2).tolist(), len(weights))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("n_sources", [1, 2, 5, 64, pytest.param(300, marks=pytest.mark.slow)])
def test_full_size_period(n_sources):
    rng = np.random.default_rng(n_sources)
    raw = (
        rng.lognormal(0.0, 1.0, size=n_sources) if n_sources < 100 else rng.uniform(1, 5, n_sources)
    )
    weights = rational_weights(raw.tolist(), [f"s{i}" for i in range(n_sources)])
    blend = Blend.build(weights)
    assert blend.table.dtype == np.int16 and blend.table.shape == (2**16,)
    counts = prefix_counts(np.tile(blend.table, 2).tolist(), n_sources)
    assert counts[2**16].tolist() == list(weights)
    assert_prefix_bound(counts, weights)
    assert not blend.table.flags.writeable


def test_build_refuses_bad_weights():
    for weights, message in [
        ([], "no sources"),
        ([2, 0, 3], r"weights \[2, 0, 3\]: expected integers >= 1"),
        ([1.5, 2], "expected integers >= 1"),
        ([2**23, 2**23, 1], "sum to 16777217"),
    ]:
        with pytest.raises(TokentapeError, match=message):
            Blend.build(weights)


# ---------------------------------------------------------------------------- O(1) maps


@settings(max_examples=40, deadline=None)
@given(integer_weights(max_denominator=600))
def test_source_and_draw_follow_the_rule_for_several_periods(weights):
    denom = sum(weights)
    picks = reference_picks(weights, 4 * denom)
    seen = [0] * len(weights)
    draws = []
    for d in picks:
        draws.append(seen[d])
        seen[d] += 1
    source, draw = Blend.build(weights).source_and_draw(np.arange(4 * denom))
    assert source.dtype == draw.dtype == np.int64
    assert source.tolist() == picks
    assert draw.tolist() == draws


@pytest.mark.slow
@settings(deadline=None)
@given(
    integer_weights(max_sources=64, max_denominator=2**16),
    st.lists(st.integers(0, MAX_POSITION - 1), min_size=1, max_size=50),
)
def test_position_inverts_source_and_draw(weights, positions):
    blend = Blend.build(weights)
    p = np.array([*positions, 0, MAX_POSITION - 1], dtype=np.int64)
    source, draw = blend.source_and_draw(p)
    np.testing.assert_array_equal(blend.position(source, draw), p)
    # a draw of d at p: exactly `draw` earlier draws of d, and one more right after p
    np.testing.assert_array_equal(blend.count(source, p), draw)
    np.testing.assert_array_equal(blend.count(source, p + 1), draw + 1)


@settings(deadline=None)
@given(integer_weights(max_sources=64, max_denominator=2**16), st.data())
def test_source_and_draw_invert_position(weights, data):
    blend = Blend.build(weights)
    d = data.draw(st.integers(0, len(weights) - 1))
    last = blend.count(d, MAX_POSITION) - 1  # the last draw of d before 2**62
    draws = data.draw(st.lists(st.integers(0, last), min_size=1, max_size=50))
    j = np.array([*draws, 0, last], dtype=np.int64)
    p = blend.position(d, j)
    assert p.max() < MAX_POSITION
    source, draw = blend.source_and_draw(p)
    assert (source == d).all()
    np.testing.assert_array_equal(draw, j)
    for beyond in (last + 1, MAX_POSITION, 2**63 - 1):
        with pytest.raises(TokentapeError, match="beyond position 2"):
            blend.position(d, beyond)


@settings(max_examples=40, deadline=None)
@given(integer_weights(max_denominator=1000), st.integers(0, 2**40))
def test_draws_of_each_source_count_up_in_position_order(weights, start_period):
    denom = sum(weights)
    blend = Blend.build(weights)
    p = start_period * denom + np.arange(3 * denom, dtype=np.int64)
    source, draw = blend.source_and_draw(p)
    for d, w in enumerate(weights):
        first = start_period * w
        np.testing.assert_array_equal(draw[source == d], np.arange(first, first + 3 * w))


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(integer_weights(max_denominator=300))
def test_count_matches_brute_force(weights):
    denom = sum(weights)
    blend = Blend.build(weights)
    picks = np.array(reference_picks(weights, 3 * denom))
    for d in range(len(weights)):
        for n in range(3 * denom + 1):
            assert blend.count(d, n) == int((picks[:n] == d).sum())
    n = np.arange(3 * denom + 1)
    expected = prefix_counts(picks.tolist(), len(weights))
    for d in range(len(weights)):
        np.testing.assert_array_equal(blend.count(d, n), expected[:, d])


def test_count_at_large_n():
    weights = (3, 1, 5, 7)
    blend = Blend.build(weights)
    assert isinstance(blend.count(2, 10**15), int)
    for d, w in enumerate(weights):
        assert blend.count(d, 16 * 10**15) == w * 10**15
        assert blend.count(d, MAX_POSITION) == MAX_POSITION // 16 * w
        n = 10**15 + np.arange(200)
        c = blend.count(d, n)
        source, _ = blend.source_and_draw(n)
        np.testing.assert_array_equal(np.diff(c), (source[:-1] == d).astype(np.int64))
        assert np.all(np.abs(16 * c - n * w) < 16)


def test_maps_refuse_out_of_range():
    blend = Blend.build((2, 3))
    for bad in (-1, MAX_POSITION, [0, -5]):
        with pytest.raises(TokentapeError, match=r"expected \[0, 2\*\*62\)"):
            blend.source_and_draw(np.asarray(bad, dtype=np.int64))
    with pytest.raises(TokentapeError, match="source index 2: expected 0 <= index < 2"):
        blend.position(2, 0)
    with pytest.raises(TokentapeError, match="draw -1: expected a draw index >= 0"):
        blend.position(0, -1)
    with pytest.raises(TokentapeError, match="prefix length -3"):
        blend.count(0, -3)
    with pytest.raises(TokentapeError, match="source index -1"):
        blend.count(-1, 3)


# --- exact stated weights (algorithm version 2) ---------------------------------------------


def test_exact_weights_examples():
    names3 = ("a", "b", "c")
    assert exact_weights((60, 30, 10), names3) == ((6, 3, 1), 10)
    assert exact_weights((0.55, 0.3, 0.15), names3) == ((11, 6, 3), 20)
    assert exact_weights((0.6, 0.3, 0.1), names3) == ((6, 3, 1), 10)  # not the floats' binary
    assert exact_weights((1, 1, 1), names3) == ((1, 1, 1), 3)
    assert exact_weights((7,), ("a",)) == ((1,), 1)
    assert exact_weights((2.5, 5), ("a", "b")) == ((1, 2), 3)
    assert exact_weights((1e-3, 2e-3), ("a", "b")) == ((1, 2), 3)
    # 65,536 + 1 = 65,537 positions would be exact: more than the cap, so rounded over it.
    assert exact_weights((65_536, 1), ("a", "b")) == (
        rational_weights((65_536, 1), ("a", "b")),
        2**16,
    )
    assert exact_weights((1, 0.123457), ("a", "b")) == (
        rational_weights((1, 0.123457), ("a", "b")),
        2**16,
    )
    assert exact_weights((3, 1), ("a", "b"), cap=3) == (rational_weights((3, 1), ("a", "b"), 3), 3)
    with pytest.raises(TokentapeError, match="source 'b': weight must be positive"):
        exact_weights((1, 0), ("a", "b"))


decimals = st.integers(1, 10_000).map(lambda n: float(Fraction(n, 10_000)))  # 4 places at most


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(1, 5000), min_size=1, max_size=12),
        st.lists(decimals, min_size=1, max_size=8),
    )
)
def test_exact_weights_are_the_stated_shares_over_the_smallest_period(weights):
    names = [f"s{i}" for i in range(len(weights))]
    units, period = exact_weights(weights, names)
    stated = [Fraction(repr(w)) if isinstance(w, float) else Fraction(w) for w in weights]
    total = sum(stated)
    smallest = math.lcm(*((s / total).denominator for s in stated))
    if smallest <= 2**16:
        assert period == smallest == sum(units)
        assert [Fraction(u, period) for u in units] == [s / total for s in stated]
        assert math.gcd(*units) == 1
    else:  # rounded over the cap, as an explicit denominator of 2^16 would be
        assert (units, period) == (rational_weights(weights, names, 2**16), 2**16)


def test_sixty_thirty_ten_stays_within_one_sample_of_the_stated_weights():
    """No knob: every prefix of the blend of 60/30/10 is within one sample of 0.6 n, 0.3 n and
    0.1 n (the period is 10, so the prefixes of two periods cover all)."""
    units, period = exact_weights((60, 30, 10), ("web", "code", "math"))
    blend = Blend.build(units)
    n = np.arange(0, 10 * period + 1)
    for d, share in enumerate((Fraction(6, 10), Fraction(3, 10), Fraction(1, 10))):
        counts = blend.count(d, n)
        gap = counts * share.denominator - n * share.numerator  # exact, in tenths of a sample
        assert np.abs(gap).max() < share.denominator
    rounded = Blend.build(rational_weights((60, 30, 10), ("web", "code", "math")))
    far = 10**8  # over 2^16 the shares are 39,322/65,536 ...: they drift from 60 %
    assert abs(rounded.count(0, far) - 0.6 * far) > 1 and blend.count(0, far) == 6 * far // 10


# --- exact_weights at its cap, on any stated weights ------------------------------------------


def test_the_period_just_below_and_just_above_the_cap():
    assert exact_weights((65_535, 1), ("a", "b")) == ((65_535, 1), 65_536)
    assert exact_weights((65_536, 1), ("a", "b")) == ((65_535, 1), 65_536)  # rounded
    with pytest.raises(PlanError, match="rounds to 0/65536"):  # 1 over 1e300 + 1
        exact_weights((1, 1e300), ("a", "b"))


_wide = st.one_of(
    st.integers(1, 200_000),
    st.builds(lambda n, k: float(f"{n}e-{k}"), st.integers(1, 99_999), st.integers(0, 9)),
)


_short = st.one_of(  # mostly within the cap: a few places, small integers
    st.integers(1, 100),
    st.builds(lambda n, k: float(f"{n}e-{k}"), st.integers(1, 999), st.integers(0, 3)),
)


@settings(max_examples=80, deadline=None)
@given(
    st.one_of(
        st.lists(_short, min_size=1, max_size=6),
        st.lists(_wide, min_size=1, max_size=6),
    )
)
def test_every_prefix_is_within_one_sample_of_the_stated_weights(weights):
    """When the stated shares fit the cap, every prefix n (one period covers all: the counts are
    exact at n = D) is within one sample of n times the share as written (decimals as written,
    not the floats' binary values)."""
    names = [f"s{i}" for i in range(len(weights))]
    stated = [Fraction(repr(w)) if isinstance(w, float) else Fraction(w) for w in weights]
    shares = [w / sum(stated) for w in stated]
    smallest = math.lcm(*(s.denominator for s in shares))
    try:
        units, period = exact_weights(weights, names)
    except PlanError:  # only when rounding over the cap would drop a source
        assert smallest > EXACT_CAP
        return
    if smallest > EXACT_CAP:
        assert period == EXACT_CAP
        return
    assert period == smallest
    blend = Blend.build(units)
    n = np.arange(period + 1, dtype=np.int64)
    for d, share in enumerate(shares):
        gap = blend.count(d, n) * share.denominator - n * share.numerator
        assert np.abs(gap).max() < share.denominator


def test_exact_weights_take_numpy_floats():
    weights = [np.float64(0.55), np.float64(0.45)]
    assert rational_weights(weights, ("a", "b"), 20) == (11, 9)  # the rounding path takes them
    assert exact_weights(weights, ("a", "b")) == ((11, 9), 20)
