"""The keyed permutation: a bijection of [0, n) for every n, exact inverse, frozen output."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.tape.permutation import (
    MAX_N,
    ROUNDS,
    SCALAR_MAX,
    Permutation,
    half_bits_for,
    permute,
    permute_epochs,
    round_keys,
)
from tokentape.errors import ArgumentError

MASK64 = (1 << 64) - 1


def exhaustive_ns() -> list[int]:
    ns = {1, 2, 3, 65_537, 65_521, 1_000_003}
    for k in range(1, 21):
        ns |= {2**k - 1, 2**k, 2**k + 1}
    return sorted(ns)


def assert_bijection(p: Permutation) -> None:
    x = np.arange(p.n, dtype=np.int64)
    y = p(x)
    assert y.dtype == np.int64 and y.shape == x.shape
    assert int(y.min()) >= 0 and int(y.max()) < p.n
    assert np.all(np.bincount(y, minlength=p.n) == 1), f"n={p.n}: not a permutation"
    back = p.inverse(y)
    assert np.array_equal(back, x), f"n={p.n}: inverse(forward(x)) != x"


@pytest.mark.parametrize("n", exhaustive_ns())
def test_exhaustive_bijection(n: int) -> None:
    assert_bijection(Permutation.for_epoch(n, 42, "web", 0))


@pytest.mark.parametrize("n", [n for n in exhaustive_ns() if n <= 2**12 + 1] + [65_537, 65_521])
@pytest.mark.parametrize(
    ("seed", "name", "epoch"),
    [(0, "", 0), (1, "code", 7), (2**64 - 1, "wikipédia/fr", 123_456), (-5, "a", 1)],
)
def test_exhaustive_bijection_other_keys(n: int, seed: int, name: str, epoch: int) -> None:
    assert_bijection(Permutation.for_epoch(n, seed, name, epoch))


def test_n_one_is_identity() -> None:
    p = Permutation.for_epoch(1, 9, "x", 3)
    assert p(0) == 0 and p.inverse(0) == 0
    assert np.array_equal(p(np.zeros(5, dtype=np.int64)), np.zeros(5, dtype=np.int64))


@pytest.mark.parametrize(("n", "h"), [(1, 1), (4, 1), (5, 2), (16, 2), (17, 3), (2**62, 31)])
def test_half_bits(n: int, h: int) -> None:
    assert half_bits_for(n) == h
    assert half_bits_for(2**63) == 32
    assert Permutation.for_epoch(n, 0, "s", 0).half_bits == h


LARGE_NS = [2**40 - 1, 2**40, 2**40 + 1, 10**18 + 9, 2**61 + 1, 2**62 - 1, 2**62, 2**62 + 1, MAX_N]


@pytest.mark.parametrize("n", LARGE_NS)
def test_large_n_sampled(n: int) -> None:
    rng = np.random.default_rng(n % 1_000_003)
    p = Permutation.for_epoch(n, 7, "books", 2)
    x = np.unique(rng.integers(0, n, 200_000, dtype=np.uint64)).astype(np.int64)
    x = np.concatenate([x, [0, n - 1]])  # the ends of the domain
    x = np.unique(x)
    y = p(x)
    assert y.dtype == np.int64
    assert int(y.min()) >= 0 and int(y.max()) < n
    assert np.unique(y).size == x.size, "two inputs map to one output"
    assert np.array_equal(p.inverse(y), x)
    z = np.unique(rng.integers(0, n, 200_000, dtype=np.uint64)).astype(np.int64)
    assert np.array_equal(p(p.inverse(z)), z)


@st.composite
def domain_and_index(draw: st.DrawFn) -> tuple[int, int]:
    n = draw(st.one_of(st.integers(1, 2**20), st.integers(1, MAX_N)))
    return n, draw(st.integers(0, n - 1))


@settings(max_examples=300, deadline=None)
@given(
    domain_and_index(),
    st.integers(-(2**70), 2**70),
    st.text(max_size=20),
    st.integers(0, 2**40),
)
def test_scalar_round_trip(ni: tuple[int, int], seed: int, name: str, epoch: int) -> None:
    n, x = ni
    p = Permutation.for_epoch(n, seed, name, epoch)
    y = p(x)
    assert type(y) is int and 0 <= y < n
    assert p.inverse(y) == x
    assert p(p.inverse(x)) == x
    assert permute(n, seed, name, epoch, x) == y
    assert int(p(np.array([x], dtype=np.int64))[0]) == y


def reference(p: Permutation, x: int) -> int:
    """The documented algorithm in plain Python integers, one value at a time."""
    h = p.half_bits
    lo = (1 << h) - 1
    # Up to 16-bit halves the network runs on 32-bit words (murmur3 fmix32 constants).
    bits, c1, c2, s1, s2 = (
        (32, 0x85EBCA6B, 0xC2B2AE35, 16, 13)
        if h <= 16
        else (64, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 30, 27)
    )
    mask = (1 << bits) - 1

    def f(half: int, key: int) -> int:
        z = (half + (key & mask)) & mask
        z ^= z >> s1
        z = (z * c1) & mask
        z ^= z >> s2
        z = (z * c2) & mask
        return z >> (bits - h)

    def network(v: int) -> int:
        left, right = v >> h, v & lo
        for key in p.keys:
            left, right = right, left ^ f(right, key)
        return (left << h) | right

    y = network(x)
    while y >= p.n:
        y = network(y)
    return y


@settings(max_examples=200, deadline=None)
@given(domain_and_index(), st.integers(0, 2**64 - 1))
def test_matches_plain_python_reference(ni: tuple[int, int], seed: int) -> None:
    n, x = ni
    p = Permutation.for_epoch(n, seed, "ref", 0)
    assert p(x) == reference(p, x)


def test_keys_are_distinct_and_depend_on_every_field() -> None:
    base = (11, "web", 0)
    variants = [(12, "web", 0), (11, "Web", 0), (11, "web", 1), (11, "web ", 0), (-11, "web", 0)]
    n = 1_000_000
    first = Permutation.for_epoch(n, *base)(np.arange(1000))
    keys = round_keys(*base)
    assert len(keys) == ROUNDS and len(set(keys)) == ROUNDS
    assert all(0 <= k <= MASK64 for k in keys)
    for v in variants:
        assert round_keys(*v) != keys, v
        other = Permutation.for_epoch(n, *v)(np.arange(1000))
        assert np.count_nonzero(other == first) < 10, v


def test_key_encoding_is_unambiguous() -> None:
    # Concatenating the fields without lengths would make these tuples collide.
    tuples = [(1, "23", 4), (12, "3", 4), (123, "", 4), (1, "2", 34), (1, "", 234)]
    assert len({round_keys(*t) for t in tuples}) == len(tuples)


def test_bad_key_fields() -> None:
    with pytest.raises(ValueError):
        round_keys(0, "a", -1)
    with pytest.raises(ValueError):
        round_keys(0, "a", True)
    with pytest.raises(TypeError):
        round_keys(True, "a", 0)
    with pytest.raises(TypeError):
        round_keys(1.0, "a", 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        round_keys(0, b"a", 0)  # type: ignore[arg-type]


@pytest.mark.subprocess
def test_same_tuple_same_permutation_in_another_process() -> None:
    tuples = [(65_537, 3, "web", 0), (10**12 + 39, 2**63, "代码", 5)]
    here = [
        [
            list(round_keys(s, name, e)),
            Permutation.for_epoch(n, s, name, e)(np.arange(100)).tolist(),
        ]
        for n, s, name, e in tuples
    ]
    program = (
        "import json, sys, numpy as np\n"
        "from tokentape._src.tape.permutation import Permutation, round_keys\n"
        "tuples = json.loads(sys.argv[1])\n"
        "print(json.dumps([[list(round_keys(s, m, e)),"
        " Permutation.for_epoch(n, s, m, e)(np.arange(100)).tolist()] for n, s, m, e in tuples]))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    result = subprocess.run(
        [sys.executable, "-c", program, json.dumps(tuples)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert json.loads(result.stdout) == here


# Golden vectors: SHA-256 of the little-endian int64 bytes of perm(arange(10_000)). They freeze
# the algorithm (key derivation, rounds, round function, cycle walking). If one changes, every
# tape changes: bump ALGORITHM in permutation.py and the tape's algorithm version, then update.
GOLDEN = [
    ((65_537, 0, "web", 0), "792b73040b433049d8f1f17b6f58ee20e88a97c12c6d28d749b135a611d163bb"),
    (
        (10**9 + 7, 1234, "code/python", 3),
        "a88e3c42f102f956e7952ca385210a5e7bf272dd7f2291b604dc7e7783a3de01",
    ),
    (
        (2**61 + 1, 2**64 - 1, "wikipédia", 17),
        "810c242aedc78cae366f079df744dbf482c6d6dd6cb63da014e3ee4ad133ee59",
    ),
]


@pytest.mark.parametrize(("args", "digest"), GOLDEN)
def test_golden_vectors(args: tuple[int, int, str, int], digest: str) -> None:
    y = Permutation.for_epoch(*args)(np.arange(10_000))
    assert hashlib.sha256(y.astype("<i8").tobytes()).hexdigest() == digest


def test_not_close_to_identity_or_shift() -> None:
    n = 1_000_000
    x = np.arange(n)
    y = Permutation.for_epoch(n, 2024, "stats", 0)(x)
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.01
    # A random permutation moves neighbours n/3 apart on average; a shift keeps them at 1.
    assert np.abs(np.diff(y)).mean() > n / 4
    assert np.count_nonzero(y == x) < 20  # about 1 expected
    assert np.unique(np.diff(y)).size > n / 2  # no dominant stride
    # Where a decile of inputs lands: about 10,000 per (input decile, output decile) cell.
    cells = np.bincount((x * 10 // n) * 10 + (y * 10 // n), minlength=100)
    assert np.abs(cells - 10_000).max() < 600


def test_first_value_is_uniform_over_keys() -> None:
    # Over many seeds, where index 0 goes is close to uniform (expected 500 each, sd ~21).
    n, trials = 10, 5000
    counts = np.bincount(
        [Permutation.for_epoch(n, s, "u", 0)(0) for s in range(trials)], minlength=n
    )
    assert np.abs(counts - trials // n).max() < 100


def test_array_shapes_and_types() -> None:
    p = Permutation.for_epoch(1000, 1, "t", 0)
    x = np.arange(24).reshape(2, 3, 4)
    y = p(x)
    assert y.shape == (2, 3, 4) and y.dtype == np.int64
    assert np.array_equal(p.inverse(y), x)
    for dtype in (np.uint16, np.int32, np.uint64, np.int64):
        assert np.array_equal(p(x.astype(dtype)), y)
    assert np.array_equal(p([0, 1, 2]), y.reshape(-1)[:3])
    assert p(np.int64(5)) == int(y.reshape(-1)[5]) and type(p(np.int64(5))) is int
    empty = p(np.array([], dtype=np.int64))
    assert empty.shape == (0,) and empty.dtype == np.int64
    assert p(np.zeros((0, 3), dtype=np.int64)).shape == (0, 3)
    z = x.copy()
    p(z)
    assert np.array_equal(z, x), "the input was modified"
    py = p(np.array(5))
    assert isinstance(py, np.ndarray) and py.shape == () and int(py) == p(5)


def test_out_of_range_and_bad_inputs() -> None:
    n = 1000
    p = Permutation.for_epoch(n, 1, "t", 0)
    for f in (p, p.inverse):
        for bad in (-1, n, 2**64):
            with pytest.raises(ValueError):
                f(bad)
        with pytest.raises(ValueError):
            f(np.array([0, 5, n]))
        with pytest.raises(ValueError):
            f(np.array([3, -1]))
        with pytest.raises(ValueError):
            f(np.array([n], dtype=np.uint64))
        with pytest.raises(TypeError):
            f(np.array([1.0, 2.0]))
        with pytest.raises(TypeError):
            f(True)
        with pytest.raises(TypeError):
            f(np.array([True]))


def test_constructor_checks() -> None:
    keys = round_keys(0, "k", 0)
    assert Permutation(10, keys, 2) == Permutation.for_epoch(10, 0, "k", 0)
    with pytest.raises(ValueError):
        Permutation(0, keys, 1)
    with pytest.raises(ValueError):
        Permutation(MAX_N + 1, keys, 32)
    with pytest.raises(ValueError):
        Permutation(10, keys[:3], 2)
    with pytest.raises(ValueError):
        Permutation(10, (*keys[:-1], 2**64), 2)
    with pytest.raises(ValueError):
        Permutation(10, keys, 3)  # not the smallest domain: walks would be needlessly long
    with pytest.raises(ValueError):
        Permutation.for_epoch(0, 0, "k", 0)


def test_max_n() -> None:
    p = Permutation.for_epoch(MAX_N, 5, "max", 0)
    x = np.array([0, 1, MAX_N - 2, MAX_N - 1], dtype=np.uint64)
    y = p(x)
    assert y.dtype == np.int64 and int(y.min()) >= 0
    assert np.array_equal(p.inverse(y).astype(np.uint64), x)
    assert p.inverse(p(MAX_N - 1)) == MAX_N - 1


@given(
    st.integers(1, 2**63),
    st.integers(0, 2**64 - 1),
    st.integers(0, 50),
    st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=4),
)
def test_the_integer_path_equals_the_numpy_path(n: int, seed: int, epoch: int, xs: list[int]):
    """Up to SCALAR_MAX values run in Python integers; padded past it, the same values run in
    numpy: both ways, forward and inverse, they agree."""
    p = Permutation.for_epoch(n, seed, "web", epoch)
    x = np.array([v % n for v in xs], dtype=np.int64)
    padded = np.concatenate([x, np.zeros(SCALAR_MAX + 1, dtype=np.int64)])
    assert x.size <= SCALAR_MAX < padded.size
    assert np.array_equal(p(x), p(padded)[: x.size])
    assert np.array_equal(p.inverse(x), p.inverse(padded)[: x.size])
    assert np.array_equal(p.inverse(p(x)), x)


@given(
    st.integers(1, 2**63),
    st.integers(0, 2**64 - 1),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 2**63 - 1)), min_size=0, max_size=60),
)
def test_permute_epochs_equals_one_permutation_per_pass(n: int, seed: int, pairs) -> None:
    """Each value through its own pass's permutation, in one walk, forward and inverse."""
    epochs = np.array([e for e, _ in pairs], dtype=np.int64)
    x = np.array([v % n for _, v in pairs], dtype=np.int64)
    expected = np.array(
        [
            Permutation.for_epoch(n, seed, "code", int(e))(int(v))
            for e, v in zip(epochs, x, strict=True)
        ],
        dtype=np.int64,
    )
    got = permute_epochs(n, seed, "code", epochs, x)
    assert np.array_equal(got, expected)
    assert np.array_equal(permute_epochs(n, seed, "code", epochs, got, forward=False), x)


@pytest.mark.parametrize("n", [np.int64(10), "10", 2.5, None])
def test_for_epoch_names_a_sample_count_of_the_wrong_type(n):
    """It was an AttributeError ('numpy.int64' object has no attribute 'bit_length') or a
    TypeError from the arithmetic, not the ArgumentError naming n."""
    with pytest.raises(ArgumentError, match="permutation: n must be an int"):
        Permutation.for_epoch(n, 1, "web", 0)
