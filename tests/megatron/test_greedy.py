"""megatron-core's blending rule as tokentape rebuilds it (``megatron.greedy``): the compiled
rule against the Python loop, both against megatron-core's own compiled helper where it is
installed, and the sizes each version gives a blend against its builder's formula.

The kernel test is skipped only where the kernel is not built in this install; CI sets
``TOKENTAPE_REQUIRE_COMPILED=1``, which makes its absence a failure instead."""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.megatron import greedy
from tokentape._src.megatron.greedy import blend_sizes, blending_indices, normalize

weights = st.lists(
    st.one_of(st.integers(1, 5).map(float), st.floats(1e-3, 100.0)), min_size=1, max_size=12
)


def test_the_kernel_is_built_where_ci_requires_it():
    if os.environ.get("TOKENTAPE_REQUIRE_COMPILED") != "1":
        pytest.skip("TOKENTAPE_REQUIRE_COMPILED is not set (only CI requires the kernel)")
    assert greedy.compiled(), "the compiled blending rule did not build or import"


@pytest.mark.skipif(not greedy.compiled(), reason="the compiled rule is not built here")
@settings(max_examples=150, deadline=None)
@given(weights, st.integers(0, 3000))
def test_the_compiled_rule_is_the_python_loop(w, size):
    w = normalize(normalize(w))
    fast = blending_indices(w, size)
    slow = blending_indices(w, size, use_compiled=False)
    assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1])


def test_each_dataset_is_drawn_in_order_and_on_its_share():
    """Independent of megatron-core: the k-th draw of a dataset is its sample k, and after
    every prefix each count is within one of its share (the rule's bound)."""
    w = normalize([5, 3, 2])
    which, nth = blending_indices(w, 2000)
    counts = np.zeros(3, dtype=np.int64)
    for t, (d, j) in enumerate(zip(which.tolist(), nth.tolist(), strict=True)):
        assert j == counts[d]
        counts[d] += 1
        assert np.all(np.abs(counts - np.asarray(w) * (t + 1)) <= 1.0 + 1e-9)


@pytest.mark.megatron
@pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed"
)
@settings(max_examples=60, deadline=None)
@given(weights, st.integers(1, 3000))
def test_the_rule_is_megatron_cores(w, size):
    helpers = pytest.importorskip("megatron.core.datasets.helpers_cpp")
    w = normalize(normalize(w))
    which = np.zeros(size, dtype=np.int16)
    nth = np.zeros(size, dtype=np.int64)
    helpers.build_blending_indices(which, nth, w, len(w), size, False)
    for use_compiled in (True, False):
        ours = blending_indices(w, size, use_compiled)
        assert np.array_equal(ours[0], which) and np.array_equal(ours[1], nth)


@given(weights, st.integers(0, 10**9))
def test_the_sizes_each_version_gives(w, samples):
    n = normalize(w)
    size, built = blend_sizes(w, samples)
    assert size == sum(math.ceil(samples * x) for x in n)
    assert built == [math.ceil(math.ceil(samples * x) * 1.005) for x in n]
    size, built = blend_sizes(w, samples, before_0_11=True)
    assert built == [math.ceil(samples * x * 1.005) for x in n] and size == sum(built)
