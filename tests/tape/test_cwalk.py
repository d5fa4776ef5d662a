"""The compiled loops (``_cwalk.c``) against the numpy path: the same permutation values, the
same resolved tape, forwards and back, on domains and batches chosen to reach every branch of
the kernel (one domain, a few, many; 32- and 64-bit words; blocks and stretches of values);
and every bad input refused in one error, never walked.

Skipped only where the kernel is not built in this install; CI sets
``TOKENTAPE_REQUIRE_COMPILED=1``, which makes its absence a failure instead."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape._src.tape import permutation
from tokentape._src.tape.permutation import Permutation, permute_many
from tokentape._src.tape.resolve import Tape
from tokentape.errors import ArgumentError, OutOfRangeError

COMPILED = permutation._kernel


def test_the_kernel_is_built_where_ci_requires_it():
    if os.environ.get("TOKENTAPE_REQUIRE_COMPILED") != "1":
        pytest.skip("TOKENTAPE_REQUIRE_COMPILED is not set (only CI requires the kernel)")
    assert permutation.kernel() == "compiled", "the compiled walk did not build or import"


needs_kernel = pytest.mark.skipif(COMPILED is None, reason="the compiled kernel is not built here")


def both(fn):
    """``fn()`` with the compiled walk, then with the numpy path."""
    try:
        permutation._kernel = COMPILED
        fast = fn()
        permutation._kernel = None
        slow = fn()
    finally:
        permutation._kernel = COMPILED
    return fast, slow


# Domain sizes at the kernel's edges: tiny, exact powers of 4 (no walk), the 32-bit word's
# largest domain 2**32 and its neighbours, 64-bit ones up to 2**63.
SIZES = st.one_of(
    st.integers(1, 70),
    st.sampled_from([4, 16, 4**8, 4**8 + 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40, 2**63]),
    st.integers(71, 2**63),
)


@settings(max_examples=60)
@given(
    sizes=st.lists(SIZES, min_size=1, max_size=300),
    count=st.sampled_from([1, 5, 40, 511, 513, 1500, 9000]),
    skew=st.floats(0, 3),
    seed=st.integers(0, 2**63 - 1),
    forward=st.booleans(),
)
@needs_kernel
def test_permute_many_compiled_equals_numpy(sizes, count, skew, seed, forward):
    rng = np.random.default_rng(seed % 2**32)
    domains = [(n, f"s{i % 7}", int(rng.integers(0, 50))) for i, n in enumerate(sizes)]
    # Skewed choice of domain: some domains get long stretches, others a value or two.
    weights = rng.random(len(domains)) ** (1 + 4 * skew)
    group = rng.choice(len(domains), size=count, p=weights / weights.sum())
    if rng.random() < 0.3:
        group = np.sort(group)  # long runs of one domain
    top = np.array([min(n, 2**63 - 1) for n, _, _ in domains], dtype=np.int64)
    x = rng.integers(0, 2**63 - 1, count, dtype=np.int64) % top[group]  # up to 2**63 - 2
    fast, slow = both(lambda: permute_many(seed, domains, group, x, forward))
    assert np.array_equal(fast, slow)
    back = permute_many(seed, domains, group, fast, not forward)
    assert np.array_equal(back, x)


@settings(max_examples=60)
@given(
    n=SIZES,
    epoch=st.integers(0, 1000),
    seed=st.integers(-(2**63), 2**63),
    size=st.integers(5, 3000),
)
@needs_kernel
def test_permutation_arrays_compiled_equal_numpy(n, epoch, seed, size):
    perm = Permutation.for_epoch(n, seed, "web", epoch)
    x = np.random.default_rng(epoch).integers(0, min(n, 2**62), size)
    fast, slow = both(lambda: (perm(x), perm.inverse(x)))
    assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1])
    assert np.array_equal(perm.inverse(fast[0]), x)


@needs_kernel
@pytest.mark.parametrize("domains", [1, 3, 40, 255, 256, 257, 2000])
@pytest.mark.parametrize("count", [600, 20_000])
def test_any_number_of_domains_compiled_equals_numpy(domains, count):
    rng = np.random.default_rng(domains * count)
    sizes = rng.choice([5, 300, 4**8, 2**32 + 3, 10**15], size=domains)
    table = [(int(n), "abc"[i % 3], i) for i, n in enumerate(sizes)]
    group = rng.integers(0, domains, count)
    x = rng.integers(0, 2**62, count) % sizes[group]
    fast, slow = both(lambda: permute_many(11, table, group, x, forward=domains % 2 == 0))
    assert np.array_equal(fast, slow)


@needs_kernel
@pytest.mark.parametrize("rounds", [4, 5, 7, 8, 9, 100])
@pytest.mark.parametrize("n", [1000, 2**32 + 5])
def test_any_number_of_rounds_compiled_equals_numpy(rounds, n):
    keys = tuple((0x9E3779B97F4A7C15 * (i + 1)) % 2**64 for i in range(rounds))
    perm = Permutation(n, keys, permutation.half_bits_for(n))
    x = np.random.default_rng(rounds).integers(0, min(n, 2**62), 700)
    fast, slow = both(lambda: (perm(x), perm.inverse(x)))
    assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1])


@needs_kernel
def test_a_whole_small_domain_is_a_bijection_through_the_kernel():
    for n in (1, 2, 3, 5, 17, 1000, 4**6, 4**6 + 1):
        out = Permutation.for_epoch(n, 7, "code", 3)(np.arange(n))
        assert np.array_equal(np.sort(out), np.arange(n))


@settings(max_examples=25)
@given(
    n_samples=st.lists(st.integers(1, 5000), min_size=1, max_size=5),
    seed=st.integers(0, 2**32),
    top=st.sampled_from([10**3, 10**6, 2**40, 2**62 - 1]),
)
@needs_kernel
def test_resolve_of_scattered_positions_compiled_equals_numpy(n_samples, seed, top):
    names = [f"s{i}" for i in range(len(n_samples))]
    weights = [1 + (seed >> (3 * i)) % 5 for i in range(len(n_samples))]
    tape = Tape.build(names, n_samples, weights, seed)
    positions = np.random.default_rng(seed).integers(0, top, 3000)
    fast, slow = both(lambda: tape.resolve(positions))
    for a, b in zip(
        (fast.source, fast.epoch, fast.sample), (slow.source, slow.epoch, slow.sample), strict=True
    ):
        assert np.array_equal(a, b)


@needs_kernel
def test_scattered_positions_over_many_passes_fall_back_and_agree():
    tape = Tape.build(["a", "b"], [3, 1000], [1, 1], 5)  # source a: a pass every 6 positions
    positions = np.random.default_rng(0).integers(0, 10**6, 5000)
    fast, slow = both(lambda: tape.resolve(positions))
    assert np.array_equal(fast.sample, slow.sample) and np.array_equal(fast.epoch, slow.epoch)


@needs_kernel
def test_a_non_contiguous_batch_resolves_like_a_copy():
    tape = Tape.build(["a", "b"], [300, 1000], [2, 1], 5)
    positions = np.random.default_rng(1).integers(0, 10**7, 4000)
    assert np.array_equal(
        tape.resolve(positions[::2]).sample, tape.resolve(positions[::2].copy()).sample
    )
    group = np.zeros(8000, dtype=np.intp)[::2]
    out = permute_many(1, [(300, "a", 0)], group, np.arange(4000) % 300)
    assert np.array_equal(out, Permutation.for_epoch(300, 1, "a", 0)(np.arange(4000) % 300))


# --- bad input: one clear error, nothing walked forever -----------------------------------


@needs_kernel
def test_an_index_outside_its_domain_is_refused_by_name():
    with pytest.raises(OutOfRangeError, match=r"index 300 is outside \[0, 300\)"):
        permute_many(
            1, [(300, "a", 0), (10, "b", 0)], np.array([0] * 9 + [0]), np.array([1] * 9 + [300])
        )
    with pytest.raises(OutOfRangeError):
        permute_many(1, [(300, "a", 0)], np.zeros(10, np.intp), np.array([-1] + [0] * 9))


@needs_kernel
def test_a_domain_index_outside_the_domains_is_refused():
    with pytest.raises(ArgumentError, match=r"domain indices must be in \[0, 2\)"):
        permute_many(
            1, [(300, "a", 0), (10, "b", 0)], np.array([0, 1, 2] * 3), np.zeros(9, np.int64)
        )


def _tables(n: int = 300):
    return permutation._tables([Permutation.for_epoch(n, 1, "a", 0)])


@needs_kernel
def test_the_kernel_refuses_what_the_wrappers_never_pass():
    walk = COMPILED.walk
    keys, halves, bounds = _tables()
    values = np.arange(10, dtype=np.int64)
    with pytest.raises(ValueError, match="8-byte"):
        walk(np.arange(10, dtype=np.int32), None, keys, halves, bounds, 8, True)
    with pytest.raises(ValueError, match="sizes disagree"):
        walk(values.copy(), None, keys[:-1], halves, bounds, 8, True)
    with pytest.raises(ValueError, match="sizes disagree"):
        walk(values.copy(), np.zeros(9, np.int64), keys, halves, bounds, 8, True)
    with pytest.raises(ValueError, match="rounds"):
        walk(values.copy(), None, keys, halves, bounds, 0, True)
    with pytest.raises(ValueError, match="half width"):  # 2 bits cannot hold 300: no bound
        walk(values.copy(), None, keys, np.array([2], np.int64), bounds, 8, True)
    with pytest.raises(ValueError, match="half width"):  # not the smallest width: refused too
        walk(values.copy(), None, keys, np.array([9], np.int64), bounds, 8, True)
    with pytest.raises(ValueError, match="outside"):  # it would never land below n
        walk(np.array([300], np.int64), None, keys, halves, bounds, 8, True)
    with pytest.raises(ValueError, match="names domain"):
        walk(values.copy(), np.array([0] * 9 + [1], np.int64), keys, halves, bounds, 8, True)
    with pytest.raises((ValueError, TypeError)):
        walk(values.copy(), None, keys, halves, bounds.astype(np.float32), 8, True)
    with pytest.raises(ValueError, match="share memory"):  # a write would change a bound
        big = np.array([*range(9), 300], np.int64)  # the last value is also the bound
        walk(big, None, keys, halves, big[9:].view(np.uint64), 8, True)
    with pytest.raises(ValueError, match="share memory"):
        walk(values, values, keys, halves, bounds, 8, True)
    readonly = values.copy()
    readonly.setflags(write=False)
    with pytest.raises((ValueError, BufferError)):
        walk(readonly, None, keys, halves, bounds, 8, True)


@needs_kernel
def test_split_refuses_bad_positions_and_tables():
    split = COMPILED.split
    table, rank = np.array([0, 1, 0], np.int16), np.array([0, 0, 1], np.int64)
    w, n = np.array([2, 1], np.int64), np.array([5, 7], np.int64)

    def outs(k: int = 3, sources: int = 2):
        return [np.empty(k, np.int64) for _ in range(3)] + [
            np.empty(sources, np.int64) for _ in range(2)
        ]

    got = outs()
    split(np.array([0, 1, 5, 12], np.int64), table, rank, w, n, *outs(4)[:3], *got[3:])
    assert got[3].tolist() == [0, 0] and got[4].tolist() == [1, 0]  # position 12: draw 8 of a
    with pytest.raises(ValueError, match="outside"):
        split(np.array([0, 2**62, 1], np.int64), table, rank, w, n, *outs())
    with pytest.raises(ValueError, match="outside"):
        split(np.array([0, -1, 1], np.int64), table, rank, w, n, *outs())
    with pytest.raises(ValueError, match="bad table slot"):
        split(np.array([0, 1, 2], np.int64), np.array([0, 2, 0], np.int16), rank, w, n, *outs())
    with pytest.raises(ValueError, match="sizes disagree"):
        split(np.array([0, 1, 2], np.int64), table, rank[:2], w, n, *outs())
    with pytest.raises(ValueError, match="sizes disagree"):
        split(np.array([0, 1, 2], np.int64), table, rank, w, n, *outs(2))
    with pytest.raises(ValueError, match="sizes disagree"):
        split(np.array([0, 1, 2], np.int64), table, rank, w, n, *outs(3, 1))
    with pytest.raises(ValueError, match="n and weight"):
        split(np.array([0, 1, 2], np.int64), table, rank, w, np.array([5, 0], np.int64), *outs())
    with pytest.raises(ValueError, match="source must not share memory with n"):
        shared = np.array([5, 7, 0], np.int64)  # n, and the source output written over it
        split(np.array([0, 1, 2], np.int64), table, rank, w, shared[:2], shared, *outs()[1:])
    with pytest.raises(ValueError, match="2-, 4- or 8-byte"):
        split(np.array([0, 1, 2], np.int64), table.astype(np.int8), rank, w, n, *outs())


@needs_kernel
@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64])
def test_split_reads_every_table_width_like_the_blend(dtype):
    tape = Tape.build(["a", "b", "c"], [7, 50, 1000], [3, 2, 5], 9)
    blend = tape.blend
    positions = np.random.default_rng(2).integers(0, 10**6, 2000)
    source, epoch, offset = (np.empty_like(positions) for _ in range(3))
    first, last = np.empty(3, np.int64), np.empty(3, np.int64)
    COMPILED.split(positions, blend.table.astype(dtype), blend.rank, blend.weight_array,
                   np.array(tape.n_samples), source, epoch, offset, first, last)  # fmt: skip
    want_source, draw = blend.source_and_draw(positions)
    want_epoch, want_offset = np.divmod(draw, np.array(tape.n_samples)[want_source])
    assert np.array_equal(source, want_source) and np.array_equal(epoch, want_epoch)
    assert np.array_equal(offset, want_offset)
    for d in range(3):
        assert (first[d], last[d]) == (want_epoch[source == d].min(), want_epoch[source == d].max())


@needs_kernel
def test_sources_far_apart_in_passes_still_walk_in_one_call(monkeypatch):
    # Late in a run: the small source is in pass ~20,000, the big one in pass 0-1; per source,
    # only the passes met count towards the dense numbering (not every pass in between).
    tape = Tape.build(["small", "big"], [50, 10**6], [1, 1], 4)
    positions = np.random.default_rng(3).integers(2 * 10**6, 2 * 10**6 + 1000, 3000)
    calls = []
    real = permutation.permute_many

    def spy(*args, **kwargs):
        calls.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr("tokentape._src.tape.resolve.permute_many", spy)
    fast, slow = both(lambda: tape.resolve(positions))
    assert np.array_equal(fast.sample, slow.sample) and np.array_equal(fast.epoch, slow.epoch)
    assert calls and calls[0] <= 40  # the compiled run: one call over ~22 domains


@needs_kernel
def test_a_position_past_2_62_among_scattered_ones_is_refused_by_the_blend():
    tape = Tape.build(["a", "b"], [300, 1000], [2, 1], 5)
    with pytest.raises(OutOfRangeError, match=r"2\*\*62"):
        tape.resolve(np.array([5, 2**62, 17], dtype=np.int64))


def test_version_says_which_walk_runs(capsys):
    from tokentape._src.program import main

    assert main(["--version"]) == 0
    walk = "compiled" if COMPILED is not None else f"numpy: {permutation.KERNEL_NOTE}"
    assert capsys.readouterr().out.strip().endswith(f"(permutation walk: {walk})")


STALE_OR_ABSENT = """
import sys, types, importlib.abc, importlib.machinery
class Replace(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "tokentape._src.tape._cwalk":
            if MODE == "absent":
                raise ImportError("not built")
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        old = types.ModuleType(spec.name)
        old.walk = old.split = None  # an older build: another interface
        return old
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, Replace())
import numpy as np
from tokentape._src.program import main
from tokentape._src.tape.resolve import Tape
main(["--version"])
tape = Tape.build(["a", "b"], [300, 10**6], [2, 1], 5)
r = tape.resolve(np.random.default_rng(0).integers(0, 10**7, 5000))
print(",".join(map(str, r.sample[:50].tolist())))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("absent", "the C loop is not built in this install"),
        ("stale", "the C loop was built for another version: reinstall (pip install -e .)"),
    ],
)
def test_without_a_current_kernel_the_numpy_path_runs_and_gives_the_same_tape(mode, says):
    # A process where the compiled module cannot be imported (an install without a C compiler)
    # or is an older build (an editable install not rebuilt after a pull): tokentape still
    # imports, says why in --version, warns once for a stale build, and resolves the same
    # samples.
    script = f"MODE = {mode!r}\n" + STALE_OR_ABSENT
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    version, samples = done.stdout.strip().splitlines()
    assert version.endswith(f"(permutation walk: numpy: {says})")
    assert ("reinstall" in done.stderr) == (mode == "stale")
    tape = Tape.build(["a", "b"], [300, 10**6], [2, 1], 5)
    here = tape.resolve(np.random.default_rng(0).integers(0, 10**7, 5000))
    assert samples == ",".join(map(str, here.sample[:50].tolist()))
