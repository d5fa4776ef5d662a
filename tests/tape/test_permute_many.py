"""``permute_many``: many (n, name, epoch) domains in one walk give, value by value, what each
domain's own ``Permutation`` gives, forwards and back; and the tape's resolve built on it keeps
every sample (the golden vectors elsewhere pin the exact values)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.tape.permutation import (
    MERGE_BELOW,
    Permutation,
    permute_many,
    unique_inverse,
)
from tokentape.errors import OutOfRangeError

# Sizes around the edges the walk treats apart: tiny domains, exact powers of 4 (no walk),
# the 32-bit word's largest domain 2**32, and 64-bit ones.
SIZES = st.one_of(
    st.integers(1, 40),
    st.sampled_from([4, 16, 4**8, 4**8 + 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40, 2**62]),
    st.integers(41, 2**63),
)
DOMAIN = st.tuples(SIZES, st.sampled_from(["web", "code", "α"]), st.integers(0, 10**6))


def expected(seed: int, domains, group, x, forward: bool = True) -> np.ndarray:
    perms = [Permutation.for_epoch(n, seed, name, e) for n, name, e in domains]
    one = (lambda p, v: p(v)) if forward else (lambda p, v: p.inverse(v))
    return np.array([one(perms[g], int(v)) for g, v in zip(group, x, strict=True)], np.int64)


@st.composite
def batches(draw, max_values: int = 200):
    domains = draw(st.lists(DOMAIN, min_size=1, max_size=6))
    group = draw(st.lists(st.integers(0, len(domains) - 1), min_size=0, max_size=max_values))
    x = [draw(st.integers(0, domains[g][0] - 1)) for g in group]
    return domains, np.array(group, dtype=np.intp), np.array(x, dtype=np.int64)


@settings(max_examples=150, deadline=None)
@given(batches(), st.integers(-(2**63), 2**63 - 1))
def test_each_value_goes_through_its_own_domain(batch, seed):
    domains, group, x = batch
    got = permute_many(seed, domains, group, x)
    assert np.array_equal(got, expected(seed, domains, group, x))
    assert np.array_equal(permute_many(seed, domains, group, got, forward=False), x)


@pytest.mark.parametrize("counts", [[MERGE_BELOW, 3, 0, 1], [MERGE_BELOW + 5, MERGE_BELOW, 7, 0]])
def test_large_and_small_domains_together(counts):
    """Domains with many values walk on their own, the rest together: same values."""
    domains = [(5 * 10**8, "web", 0), (2 * 10**6, "math", 3), (4**8, "code", 1), (7, "x", 2)]
    rng = np.random.default_rng(sum(counts))
    group = rng.permutation(np.repeat(np.arange(4), counts))
    x = np.array([rng.integers(0, domains[g][0]) for g in group], dtype=np.int64)
    got = permute_many(11, domains, group, x)
    assert np.array_equal(got, expected(11, domains, group, x))
    assert np.array_equal(permute_many(11, domains, group, got, forward=False), x)


def test_an_index_outside_its_domain_is_refused():
    with pytest.raises(OutOfRangeError, match=r"index 7 is outside \[0, 7\)"):
        permute_many(0, [(10, "a", 0), (7, "b", 0)], np.array([0, 1]), np.array([9, 7]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), max_size=60), st.sampled_from([0, 3, 2**21]))
def test_unique_inverse_is_numpys(values, spread):
    """By counting (a small span) or by sorting (a wide one), the same as ``np.unique``."""
    a = np.array(values, dtype=np.int64) if spread == 0 else np.array(values) % spread
    want_u, want_i = np.unique(a, return_inverse=True)
    got_u, got_i = unique_inverse(a)
    assert np.array_equal(got_u, want_u) and np.array_equal(got_i, want_i.reshape(-1))
