"""Exact stated weights by default (issue 13, item 1), as a review probed them: what holds,
and the cases it found wrong (each failed before its fix)."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from helpers import PLAN, SIZES, make_store, plan_of
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import index_hash
from tokentape._src.render.text import plan_text
from tokentape._src.tape.blend import EXACT_CAP, Blend, exact_weights, rational_weights
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.state import DataState
from tokentape.errors import PlanError


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("exact")
    for name, n in SIZES.items():
        make_store(root, name, n)
    return root


def _two(a: object, b: object) -> str:
    """A plan of two sources (web, code) with weights written as ``a`` and ``b``."""
    return (
        "seq_len = 64\nseed = 1\ntotal_samples = 100\n"
        f'[[source]]\nname = "web"\npath = "stores/web"\nweight = {a}\nmax_repeats = 1e9\n'
        f'[[source]]\nname = "code"\npath = "stores/code"\nweight = {b}\nmax_repeats = 1e9\n'
    )


def _weights_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith("weights"))


# --- what holds --------------------------------------------------------------------------------


def test_the_issue_example_end_to_end(stores):
    text = PLAN.replace("weight = 60", "weight = 0.55").replace("weight = 30", "weight = 0.3")
    plan = plan_of(stores, text.replace("weight = 10\n", "weight = 0.15\n"))
    assert ([s.weight_units for s in plan.sources], plan.denominator) == ([11, 6, 3], 20)
    assert "over 20: the stated weights exactly" in _weights_line(plan_text(plan))
    # ints and floats mixed, exponents: the decimals as written
    mixed = plan_of(stores, _two("6e1", 30))
    assert ([s.weight_units for s in mixed.sources], mixed.denominator) == ([2, 1], 3)
    tiny = plan_of(stores, _two("1e-7", "2e-7"))
    assert ([s.weight_units for s in tiny.sources], tiny.denominator) == ([1, 2], 3)


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


def test_a_plan_file_claiming_the_other_version_is_refused_or_has_the_same_tape(stores, tmp_path):
    """The version is in the index hash: flipping it without the hash is refused; with the hash
    recomputed it loads, but the tape follows from weight_units/denominator alone, so no plan
    file of one version passes for the other with a different tape."""
    plan = plan_of(stores)  # version 2, 6/3/1 over 10
    data = json.loads(plan.to_json())
    data["algorithm_version"] = 1
    (tmp_path / "flip.json").write_text(json.dumps(data))
    with pytest.raises(PlanError, match="index_hash does not match"):
        load_plan(tmp_path / "flip.json")
    rows = [(s.name, s.weight_units, s.n_tokens, s.dtype, s.content_hash) for s in plan.sources]
    data["index_hash"] = index_hash(plan.seq_len, plan.seed, plan.denominator, rows, version=1)
    (tmp_path / "v1.json").write_text(json.dumps(data))
    v1 = load_plan(tmp_path / "v1.json")
    assert v1.algorithm_version == 1 and v1.index_hash != plan.index_hash
    p = np.arange(0, 5000)
    a, b = v1.tape().resolve(p), plan.tape().resolve(p)
    assert np.array_equal(a.source, b.source) and np.array_equal(a.sample, b.sample)
    # The same tape under either version: a run resumes on the other (the change recorded).
    state = DataState.start(v1).commit(BatchConfig(1, 5000))
    moved = state.resume_on(plan)
    assert moved.index_hash == plan.index_hash and len(moved.plan_changes) == 1


# --- bugs --------------------------------------------------------------------------------------


def test_integer_weights_beyond_two_to_the_53_are_read_as_written(stores):
    plan = plan_of(stores, _two(9_007_199_254_740_995, 27_021_597_764_222_985))
    assert ([s.weight_units for s in plan.sources], plan.denominator) == ([1, 3], 4)
    unequal = plan_of(stores, _two(9_007_199_254_740_993, 9_007_199_254_740_992))
    assert "the stated weights exactly" not in _weights_line(plan_text(unequal))


def test_exact_weights_take_numpy_floats():
    weights = [np.float64(0.55), np.float64(0.45)]
    assert rational_weights(weights, ("a", "b"), 20) == (11, 9)  # the rounding path takes them
    assert exact_weights(weights, ("a", "b")) == ((11, 9), 20)


def test_a_weight_lost_to_the_fallback_rounding_names_weight_denominator(stores):
    with pytest.raises(PlanError) as info:
        plan_of(stores, _two(1, "1e-7"))
    assert "weight_denominator" in str(info.value)


def test_the_target_share_of_huge_weights(stores):
    plan = plan_of(stores, _two("1e308", "1e308"))
    assert plan.denominator == 2
    assert plan_text(plan).count("50.0000%") == 4  # target and effective share, both sources
