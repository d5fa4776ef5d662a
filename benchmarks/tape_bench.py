"""The tape: resolve throughput and index build, against the article's straightforward reference.

The reference is the method of the article's "Mixtures: a deterministic blend" section, written
out here: a per-position Python loop that gives each global position to the source furthest
behind its (float) target share, storing two arrays of length ``horizon`` (source as int16, draw
as int64); one materialised ``np.random.default_rng([seed, d, epoch]).permutation(n_d)`` for each
(source, epoch) pair the horizon touches; and a per-position ``resolve`` that reads both arrays,
splits the draw into (epoch, offset) and indexes the cached permutation.

tokentape's index build is ``Tape.build`` (the blend table of one period: the plan's default
since algorithm version 2, the stated weights exactly, which is 20 entries for this mixture;
65,536 before); it takes no horizon. Its resolve is ``Tape.resolve`` on a numpy array of positions.

Measured side by side in one run, on one core (the process is pinned to one CPU):

- **build time and peak memory** for horizons 10**6, 10**7, 10**8. Peak memory is measured with
  ``tracemalloc`` (numpy reports its buffers to it), in separate runs from the timed ones.
  Parts of the reference that would take minutes are extrapolated linearly from measured
  per-unit costs, and its memory at large horizons is computed from the array sizes; every row
  says which.
- **resolve throughput** in positions/s: the same positions through tokentape (one vectorised
  call) and the reference (a Python loop of single lookups), and tokentape alone on batches far
  beyond any horizon the reference could build; the inverse ``position_of`` too.

Ratios are what matter: the machine is noisy and nothing here asserts an absolute time.

    python benchmarks/tape_bench.py [--quick] [--rounds 5] [--json] [--profile] [--cpu N]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from tokentape._src.tape import permutation
from tokentape._src.tape.blend import Blend, exact_weights
from tokentape._src.tape.resolve import Tape
from tokentape._src.train.ahead import CHUNK, ResolveAhead, StepShape

SEED = 1234
SEQ_LEN = 4096
# (name, weight in percent, samples of SEQ_LEN tokens): about 2.0T, 410B, 123B, 123B, 8.2B tokens.
MIXTURE = (
    ("web", 60, 500_000_000),
    ("code", 15, 100_000_000),
    ("books", 10, 30_000_000),
    ("academic", 10, 30_000_000),
    ("math", 5, 2_000_000),
)
HORIZONS = (10**6, 10**7, 10**8)
BATCH = 2**20  # positions per resolve call in the tokentape-only rows
SAME_N = 100_000  # positions looked up one by one by the reference
SMALL = 1024  # positions per call in the small-batch rows (4 calls)
AHEAD_STEPS = 4 * (CHUNK // SMALL)  # steps through ResolveAhead (its chunks grow first)
TRACE_HORIZON = 10**5  # the reference loop is ~7x slower under tracemalloc: trace it here only
AIM_RESOLVE = 10e6  # positions/s, one core, vectorised
AIM_CALL_MS = 0.3  # one direct call of SMALL positions (issue 15)
AIM_AHEAD_MS = 0.1  # a step of SMALL positions resolved through the loader's chunks (issue 15)
AIM_RANDOM = 30e6  # positions/s, one large call of random positions (issue 15)
AIM_FLAT = 1.5  # tokentape's build at 10**8 over its build at 10**6, time and memory
MB = 1e6


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the reference, as the article describes it -------------------------------------------


def reference_blend(percent: Sequence[float], horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Per position, the source furthest behind its share (ties: lowest index), and its draw."""
    target = np.array(percent, dtype=np.float64)
    target /= target.sum()
    used = np.zeros(len(target), dtype=np.int64)
    source_of = np.empty(horizon, dtype=np.int16)
    draw_of = np.empty(horizon, dtype=np.int64)
    for p in range(horizon):
        d = int(np.argmax(target * (p + 1) - used))
        source_of[p] = d
        draw_of[p] = used[d]
        used[d] += 1
    return source_of, draw_of


def reference_permutation(n: int, seed: int, d: int, epoch: int) -> np.ndarray:
    """The materialised shuffle of source ``d`` in pass ``epoch``: n int64 values."""
    return np.random.default_rng([seed, d, epoch]).permutation(n)


def reference_resolve(
    p: int,
    source_of: np.ndarray,
    draw_of: np.ndarray,
    n_samples: Sequence[int],
    perms: dict[tuple[int, int], np.ndarray],
) -> tuple[int, int]:
    """One position -> (source, sample), reading the prebuilt arrays and a cached shuffle."""
    d = int(source_of[p])
    epoch, offset = divmod(int(draw_of[p]), n_samples[d])
    return d, int(perms[d, epoch][offset])


def reference_gather(
    positions: np.ndarray,
    source_of: np.ndarray,
    draw_of: np.ndarray,
    n_samples: np.ndarray,
    perms: dict[tuple[int, int], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """The same lookup vectorised over the arrays (not in the article; shown for context)."""
    d = source_of[positions].astype(np.int64)
    epoch, offset = np.divmod(draw_of[positions], n_samples[d])
    sample = np.empty_like(offset)
    for s in np.unique(d):
        in_s = d == s
        for e in np.unique(epoch[in_s]):
            where = in_s & (epoch == e)
            sample[where] = perms[int(s), int(e)][offset[where]]
    return d, sample


# --- measuring ----------------------------------------------------------------------------


def pin_to_one_cpu(cpu: int | None) -> int | None:
    """Pin this process to one CPU (by default the highest one it may use); None if unsupported."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[-1] if cpu is None else cpu
    os.sched_setaffinity(0, {chosen})
    return chosen


def timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    """(wall seconds, cpu seconds, result) of one call."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def traced_peak(fn: Callable[[], object]) -> float:
    """Peak bytes allocated (Python objects and numpy buffers) while ``fn`` runs, by tracemalloc."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return float(peak - base)


class Best:
    """The best (smallest) wall time per key over interleaved rounds, and the cpu/wall of it."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def run(self, key: str, fn: Callable[[], object]) -> object:
        wall, cpu, result = timed(fn)
        if wall < self.wall.get(key, float("inf")):
            self.wall[key], self.cpu[key] = wall, cpu
        return result

    def rate(self, key: str, count: int) -> float:
        return count / self.wall[key]


@dataclass
class Row:
    section: str
    measure: str
    at: str
    unit: str
    tokentape: float | None
    reference: float | None
    ratio: float | None  # how many times better tokentape is (x)
    aim: str = ""
    result: str = ""  # PASS / MISS where an aim exists
    basis: str = "measured"


def _mark(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _pow10(n: int) -> str:
    exponent = len(str(n)) - 1
    return f"10^{exponent}" if n == 10**exponent else f"{n:,}"


# --- the benchmark ------------------------------------------------------------------------


@dataclass
class Setup:
    names: list[str]
    percent: list[int]
    n_samples: list[int]
    weights: tuple[int, ...]

    @classmethod
    def default(cls) -> Setup:
        names = [m[0] for m in MIXTURE]
        percent = [m[1] for m in MIXTURE]
        weights = exact_weights(percent, names)[0]  # what a plan of these weights resolves to
        return cls(names, percent, [m[2] for m in MIXTURE], weights)

    def build(self) -> Tape:
        """tokentape's whole index build: the blend table of one period."""
        return Tape.build(self.names, self.n_samples, self.weights, SEED)

    def touched(self, horizon: int) -> list[tuple[int, int]]:
        """(source, epochs) the reference must materialise for ``horizon`` positions.

        Draws per source come from the exact blend (within one draw of the reference's).
        """
        blend = Blend.build(self.weights)
        out = []
        for d, n in enumerate(self.n_samples):
            draws = int(blend.count(d, horizon))
            out.append((d, (draws - 1) // n + 1 if draws else 0))
        return out


def bench_build(setup: Setup, quick: bool, rounds: int) -> tuple[list[Row], dict]:
    """Index build time and peak memory for each horizon; returns rows and the 10**6 arrays."""
    rows: list[Row] = []
    best = Best()
    for _ in range(rounds):  # interleaved: the same call at each horizon
        for h in HORIZONS:
            best.run(f"tt {h}", setup.build)
    tt_peak = {h: traced_peak(setup.build) for h in HORIZONS}

    # The reference blend loop: measured where affordable, then per-position cost x horizon.
    blend_measured = (10**6,) if quick else (10**6, 10**7)
    blend_time: dict[int, float] = {}
    arrays: dict = {}
    for h in blend_measured:
        note(f"reference blend loop over {h:,} positions ...")
        wall, _, result = timed(lambda h=h: reference_blend(setup.percent, h))
        blend_time[h] = wall
        if h == 10**6:
            arrays["source_of"], arrays["draw_of"] = result
        del result
    per_position = blend_time[blend_measured[-1]] / blend_measured[-1]
    note(f"reference blend loop under tracemalloc over {TRACE_HORIZON:,} positions ...")
    traced_blend = traced_peak(lambda: reference_blend(setup.percent, TRACE_HORIZON))
    array_bytes = np.dtype(np.int16).itemsize + np.dtype(np.int64).itemsize  # per position
    overhead = traced_blend - array_bytes * TRACE_HORIZON

    # The reference's permutations: each distinct n measured up to a cap, larger n extrapolated
    # linearly from the per-element cost of the largest measured one (optimistic for the
    # reference: a bigger shuffle misses the caches more).
    cap = 2_000_000 if quick else 100_000_000
    perm_time: dict[int, float] = {}
    perm_peak: dict[int, float] = {}
    for n in sorted(set(setup.n_samples)):
        if n > cap:
            continue
        note(f"reference permutation of {n:,} ...")
        perm_time[n] = timed(lambda n=n: reference_permutation(n, SEED, 0, 0))[0]
        perm_peak[n] = traced_peak(lambda n=n: reference_permutation(n, SEED, 0, 0))
    largest = max(perm_time)
    per_element = perm_time[largest] / largest
    per_element_bytes = perm_peak[largest] / largest

    def perm_cost(n: int) -> tuple[float, float, bool]:
        if n in perm_time:
            return perm_time[n], perm_peak[n], True
        return per_element * n, per_element_bytes * n, False

    detail = {}
    for h in HORIZONS:
        at = _pow10(h)
        tt_time = best.wall[f"tt {h}"]
        if h in blend_time:
            b_time, b_basis = blend_time[h], "measured"
        else:
            b_time = per_position * h
            b_basis = f"extrapolated from {_pow10(blend_measured[-1])}"
        if h == TRACE_HORIZON:
            b_mem, m_basis = traced_blend, "measured"
        else:
            b_mem = array_bytes * h + overhead
            m_basis = f"computed: 10 B/position (traced {_pow10(TRACE_HORIZON)})"
        p_time = p_mem = 0.0
        extrapolated = []
        pairs = 0
        for d, epochs in setup.touched(h):
            t, m, real = perm_cost(setup.n_samples[d])
            p_time += t * epochs
            p_mem += m * epochs  # all kept: resolve needs every touched pass
            pairs += epochs
            if not real:
                extrapolated.append(setup.names[d])
        guessed = ", ".join(extrapolated)
        p_basis = f"{pairs} (source, epoch) pairs; " + (
            f"{guessed} extrapolated linearly from n={largest:,}" if extrapolated else "measured"
        )
        pm_basis = f"{pairs} (source, epoch) pairs; " + (
            f"{guessed} computed at {per_element_bytes:.2f} B/element, rest tracemalloc"
            if extrapolated
            else "tracemalloc"
        )
        total_time = b_time + p_time
        total_mem = b_mem + p_mem
        parts = (["blend loop"] if b_basis != "measured" else []) + (
            ["permutations"] if extrapolated else []
        )
        total_basis = f"partly extrapolated ({', '.join(parts)})" if parts else "measured"
        rows += [
            Row(
                "build",
                "build time",
                at,
                "s",
                tt_time,
                total_time,
                total_time / tt_time,
                basis=total_basis,
            ),
            Row("build", "  reference blend loop", at, "s", None, b_time, None, basis=b_basis),
            Row("build", "  reference permutations", at, "s", None, p_time, None, basis=p_basis),
            Row(
                "build",
                "build peak memory",
                at,
                "MB",
                tt_peak[h] / MB,
                total_mem / MB,
                total_mem / tt_peak[h],
                basis="tokentape tracemalloc; reference partly computed (rows below)",
            ),
            Row(
                "build", "  reference blend arrays", at, "MB", None, b_mem / MB, None, basis=m_basis
            ),
            Row(
                "build",
                "  reference permutations",
                at,
                "MB",
                None,
                p_mem / MB,
                None,
                basis=pm_basis,
            ),
        ]
        detail[h] = {"reference_time_s": total_time, "reference_bytes": total_mem}
    lo, hi = HORIZONS[0], HORIZONS[-1]
    flat_time = best.wall[f"tt {hi}"] / best.wall[f"tt {lo}"]
    flat_mem = tt_peak[hi] / tt_peak[lo]
    ref_growth_time = detail[hi]["reference_time_s"] / detail[lo]["reference_time_s"]
    ref_growth_mem = detail[hi]["reference_bytes"] / detail[lo]["reference_bytes"]
    span = f"{_pow10(hi)} / {_pow10(lo)}"
    aim = f"flat (<= {AIM_FLAT}x)"
    rows += [
        Row(
            "build",
            "build time growth",
            span,
            "x",
            flat_time,
            ref_growth_time,
            None,
            aim,
            _mark(flat_time <= AIM_FLAT),
            "Tape.build takes no horizon",
        ),
        Row(
            "build",
            "build memory growth",
            span,
            "x",
            flat_mem,
            ref_growth_mem,
            None,
            aim,
            _mark(flat_mem <= AIM_FLAT),
            "tracemalloc",
        ),
    ]
    info = {
        "reference_blend_s_per_position": per_position,
        "reference_perm_s_per_element": per_element,
        "reference_perm_bytes_per_element": per_element_bytes,
        "tokentape_build_cpu_over_wall": best.cpu[f"tt {lo}"] / best.wall[f"tt {lo}"],
    }
    return rows, {"arrays": arrays, "info": info}


def stand_in_perms(
    setup: Setup, source_of: np.ndarray, draw_of: np.ndarray
) -> dict[tuple[int, int], np.ndarray]:
    """For the lookup timing: per touched (source, epoch), an int64 array covering the offsets the
    built horizon reads, with random values in [0, n). A lookup reads only those entries (the
    offsets of one pass are drawn in order), so it costs the same as on the full materialised
    shuffle; building the real ones is charged in the build rows.
    """
    rng = np.random.default_rng(0)
    perms = {}
    for d, n in enumerate(setup.n_samples):
        draws = int(draw_of[source_of == d].max()) + 1
        for epoch in range((draws - 1) // n + 1):
            length = min(n, draws - epoch * n)
            perms[d, epoch] = rng.integers(0, n, size=length, dtype=np.int64)
    return perms


def bench_resolve(setup: Setup, arrays: dict, quick: bool, rounds: int) -> tuple[list[Row], dict]:
    tape = setup.build()
    source_of, draw_of = arrays["source_of"], arrays["draw_of"]
    horizon = len(source_of)
    perms = stand_in_perms(setup, source_of, draw_of)
    n_py = list(setup.n_samples)
    n_np = np.asarray(setup.n_samples, dtype=np.int64)
    rng = np.random.default_rng(SEED)

    # How the two blends compare over the reference's horizon (reported, not asserted).
    tt_source, _ = tape.blend.source_and_draw(np.arange(horizon, dtype=np.int64))
    checks = {
        "blend_agreement_first_1e6": float(np.mean(tt_source == source_of)),
        "max_prefix_error_reference": _prefix_error(source_of, setup.percent),
        "max_prefix_error_tokentape": _prefix_error(tt_source, setup.weights),
    }

    same = {
        "contiguous": np.arange(SAME_N, dtype=np.int64),
        "random": rng.integers(0, horizon, SAME_N),
    }
    same_lists = {k: v.tolist() for k, v in same.items()}
    small_ref = [rng.integers(0, horizon, SMALL) for _ in range(4)]
    small_step = [np.arange(i * SMALL, (i + 1) * SMALL, dtype=np.int64) for i in range(4)]
    small_lists = {
        "random": [b.tolist() for b in small_ref],
        "step": [b.tolist() for b in small_step],
    }
    small_far = [rng.integers(0, 2**40, SMALL) for _ in range(4)]
    whole = np.arange(horizon, dtype=np.int64)
    batches = {o: np.arange(o, o + BATCH, dtype=np.int64) for o in (0, 10**9, 2**40)}
    random_1m = rng.integers(0, 10**9, BATCH)

    inverse_inputs = {}
    for o in (0, 2**40):
        r = tape.resolve(batches[o])
        inverse_inputs[o] = [
            (d, r.sample[r.source == d], r.epoch[r.source == d], batches[o][r.source == d])
            for d in range(len(setup.names))
        ]
        for d, samples, epochs, positions in inverse_inputs[o]:  # the inverse must round-trip
            if not np.array_equal(tape.position_of(d, samples, epochs), positions):
                raise SystemExit(f"position_of does not invert resolve (source {d}, offset {o})")

    def ref_loop(positions: list[int]) -> list[tuple[int, int]]:
        return [reference_resolve(p, source_of, draw_of, n_py, perms) for p in positions]

    def small_calls(batches_: list[np.ndarray]) -> None:
        for b in batches_:
            tape.resolve(b)

    def one_call(count: int) -> None:
        tape.resolve(np.arange(10**9, 10**9 + count, dtype=np.int64))

    def through_ahead() -> None:
        """A fresh rank (dp 8, rank 3) reading AHEAD_STEPS steps of SMALL positions."""
        ahead, shape = ResolveAhead(tape), StepShape(8 * SMALL, 3 * SMALL, SMALL)
        for i in range(AHEAD_STEPS):
            ahead.resolved(10**9 + i * 8 * SMALL, shape)

    def inverse(o: int) -> None:
        for d, samples, epochs, _ in inverse_inputs[o]:
            tape.position_of(d, samples, epochs)

    best = Best()
    tape.resolve(batches[0])  # warm the permutation cache, as a training loop would be
    for r in range(rounds):
        note(f"resolve round {r + 1}/{rounds} ...")
        for kind in same:
            best.run(f"tt {kind}", lambda kind=kind: tape.resolve(same[kind]))
            best.run(f"ref {kind}", lambda kind=kind: ref_loop(same_lists[kind]))
        best.run("tt small", lambda: small_calls(small_ref))
        best.run("ref small", lambda: [ref_loop(b) for b in small_lists["random"]])
        best.run("tt step", lambda: small_calls(small_step))
        best.run("ref step", lambda: [ref_loop(b) for b in small_lists["step"]])
        best.run("tt whole", lambda: tape.resolve(whole))
        best.run("ref gather", lambda: reference_gather(whole, source_of, draw_of, n_np, perms))
        for o, b in batches.items():
            best.run(f"tt {o}", lambda b=b: tape.resolve(b))
        best.run("tt random 1m", lambda: tape.resolve(random_1m))
        best.run("tt small far", lambda: small_calls(small_far))
        for count in (8, 64, SMALL):
            best.run(f"tt call {count}", lambda count=count: [one_call(count) for _ in range(20)])
        best.run("tt ahead", through_ahead)
        for o in inverse_inputs:
            best.run(f"inv {o}", lambda o=o: inverse(o))
    if not quick:
        note(f"tokentape resolve of {BATCH:,} random positions in [0, 2^40) (one round) ...")
        best.run("tt random far", lambda: tape.resolve(rng.integers(0, 2**40, BATCH)))

    def aimed(rate: float) -> tuple[str, str]:
        return f">= {AIM_RESOLVE / 1e6:.0f} M/s", _mark(rate >= AIM_RESOLVE)

    rows = []
    unit = "M pos/s"
    same_at = {
        "contiguous": f"{SAME_N:,} contiguous from 0",
        "random": f"{SAME_N:,} random in [0, {_pow10(horizon)})",
    }
    small_at = {
        "step": f"4 calls x {SMALL:,} contiguous from 0",
        "small": f"4 calls x {SMALL:,} random in [0, {_pow10(horizon)})",
    }
    compared = [(k, at, SAME_N) for k, at in same_at.items()]
    compared += [(k, at, 4 * SMALL) for k, at in small_at.items()]
    for kind, at, count in compared:
        tt = best.rate(f"tt {kind}", count)
        ref = best.rate(f"ref {kind}", count)
        rows.append(
            Row(
                "resolve",
                "resolve, same positions",
                at,
                unit,
                tt / 1e6,
                ref / 1e6,
                tt / ref,
                basis="reference: per-position loop, cached permutations",
            )
        )
    tt = best.rate("tt whole", horizon)
    ref = best.rate("ref gather", horizon)
    rows.append(
        Row(
            "resolve",
            "resolve vs vectorised gather",
            f"{horizon:,} contiguous from 0",
            unit,
            tt / 1e6,
            ref / 1e6,
            tt / ref,
            basis="reference vectorised over its arrays (not the article's; for context)",
        )
    )
    for o in batches:
        rate = best.rate(f"tt {o}", BATCH)
        start = "0" if o == 0 else ("2^40" if o == 2**40 else _pow10(o))
        rows.append(
            Row(
                "resolve",
                "resolve",
                f"{BATCH:,} contiguous from {start}",
                unit,
                rate / 1e6,
                None,
                None,
                *aimed(rate),
                basis="reference: beyond its horizon",
            )
        )
    rate = best.rate("tt random 1m", BATCH)
    rows.append(
        Row(
            "resolve",
            "resolve",
            f"{BATCH:,} random in [0, 10^9)",
            unit,
            rate / 1e6,
            None,
            None,
            f">= {AIM_RANDOM / 1e6:.0f} M/s",
            _mark(rate >= AIM_RANDOM),
        )
    )
    if "tt random far" in best.wall:
        rate = best.rate("tt random far", BATCH)
        rows.append(
            Row(
                "resolve",
                "resolve",
                f"{BATCH:,} random in [0, 2^40)",
                unit,
                rate / 1e6,
                None,
                None,
                *aimed(rate),
                basis="one round",
            )
        )
    rate = best.rate("tt small far", 4 * SMALL)
    rows.append(
        Row(
            "resolve",
            "resolve",
            f"4 calls x {SMALL:,} random in [0, 2^40)",
            unit,
            rate / 1e6,
            None,
            None,
        )
    )
    for count in (8, 64, SMALL):
        ms = best.wall[f"tt call {count}"] / 20 * 1e3
        aimed_call = count == SMALL
        rows.append(
            Row(
                "resolve",
                "one call, latency",
                f"{count:,} contiguous from 10^9",
                "ms",
                ms,
                None,
                None,
                f"<= {AIM_CALL_MS} ms" if aimed_call else "",
                _mark(ms <= AIM_CALL_MS) if aimed_call else "",
                basis="best of 20 calls",
            )
        )
    ms = best.wall["tt ahead"] / AHEAD_STEPS * 1e3
    rows.append(
        Row(
            "resolve",
            "a step in the loader (chunks), latency",
            f"{AHEAD_STEPS} steps x {SMALL:,}, rank 3 of 8",
            "ms",
            ms,
            None,
            None,
            f"<= {AIM_AHEAD_MS} ms",
            _mark(ms <= AIM_AHEAD_MS),
            basis="ResolveAhead, chunk cost included",
        )
    )
    for o in inverse_inputs:
        rate = best.rate(f"inv {o}", BATCH)
        start = "0" if o == 0 else "2^40"
        rows.append(
            Row(
                "resolve",
                "position_of (inverse)",
                f"{BATCH:,} from {start}, 5 calls",
                unit,
                rate / 1e6,
                None,
                None,
                basis="reference: no inverse",
            )
        )
    checks["tokentape_resolve_cpu_over_wall"] = best.cpu["tt 0"] / best.wall["tt 0"]
    return rows, checks


def bench_kernel(setup: Setup, rounds: int) -> list[Row]:
    """The same resolve calls with the compiled walk and with the numpy path, interleaved."""
    compiled = permutation._kernel
    if compiled is None:
        note("the compiled kernel is not built in this install: no side-by-side rows")
        return []
    tape = setup.build()
    rng = np.random.default_rng(SEED + 1)
    calls = {
        f"one call of {SMALL:,} contiguous from 10^9": (
            np.arange(10**9, 10**9 + SMALL, dtype=np.int64), 50),
        f"{BATCH:,} contiguous from 10^9": (np.arange(10**9, 10**9 + BATCH, dtype=np.int64), 1),
        f"{BATCH:,} random in [0, 10^9)": (rng.integers(0, 10**9, BATCH), 1),
    }  # fmt: skip
    best = Best()
    try:
        for r in range(rounds):
            note(f"compiled vs numpy round {r + 1}/{rounds} ...")
            for kind, kernel in (("compiled", compiled), ("numpy", None)):
                permutation._kernel = kernel
                for at, (positions, repeat) in calls.items():
                    tape.resolve(positions)  # the permutation cache warm, as in training
                    best.run(f"{kind} {at}", lambda p=positions, k=repeat: [
                        tape.resolve(p) for _ in range(k)])  # fmt: skip
    finally:
        permutation._kernel = compiled
    rows = []
    for at, (positions, repeat) in calls.items():
        fast, slow = best.wall[f"compiled {at}"], best.wall[f"numpy {at}"]
        if repeat > 1:  # a latency
            value, ref, unit = fast / repeat * 1e3, slow / repeat * 1e3, "ms"
        else:
            value, ref, unit = positions.size / fast / 1e6, positions.size / slow / 1e6, "M pos/s"
        rows.append(
            Row(
                "kernel",
                "resolve, compiled walk",
                at,
                unit,
                value,
                ref,
                slow / fast,
                basis="reference: the numpy path (identical results)",
            )
        )
    return rows


def _prefix_error(sources: np.ndarray, weights: Sequence[int]) -> float:
    """max over prefixes n and sources d of |count_d(n) - n * share_d|."""
    share = np.asarray(weights, dtype=np.float64) / float(sum(weights))
    n = np.arange(1, len(sources) + 1, dtype=np.float64)
    worst = 0.0
    for d in range(len(share)):
        counts = np.cumsum(sources == d)
        worst = max(worst, float(np.max(np.abs(counts - n * share[d]))))
    return worst


def profile_resolve(setup: Setup) -> str:
    """cProfile of one ``tape.resolve`` of BATCH contiguous positions from 0 (cache warm)."""
    tape = setup.build()
    positions = np.arange(BATCH, dtype=np.int64)
    tape.resolve(positions)
    profiler = cProfile.Profile()
    profiler.runcall(tape.resolve, positions)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
    return text.getvalue()


# --- output -------------------------------------------------------------------------------


def _num(x: float | None, unit: str = "") -> str:
    """Three significant figures, thousands separated; growth factors get an "x"."""
    if x is None:
        return "—"
    suffix = "x" if unit == "x" else ""
    if abs(x) >= 100:
        return f"{x:,.0f}{suffix}"
    if abs(x) >= 10:
        return f"{x:.1f}{suffix}"
    return f"{x:.2f}x" if suffix else f"{x:.3g}"


def render(rows: list[Row]) -> str:
    head = ["measure", "horizon / batch", "unit", "tokentape", "reference", "ratio", "aim", "basis"]
    body = []
    for r in rows:
        aim = f"{r.aim} {r.result}".strip()
        ratio = "—" if r.ratio is None else f"{_num(r.ratio)}x"
        body.append(
            [
                r.measure,
                r.at,
                r.unit,
                _num(r.tokentape, r.unit),
                _num(r.reference, r.unit),
                ratio,
                aim or "—",
                r.basis,
            ]
        )
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(head), rule, *(line(b) for b in body)])


def mixture_table(setup: Setup) -> str:
    lines = [
        f"| source | weight | W/{sum(setup.weights)} | samples | tokens "
        "| epochs touched at 10^6 / 10^7 / 10^8 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    touched = {h: dict(setup.touched(h)) for h in HORIZONS}
    for d, name in enumerate(setup.names):
        tokens = setup.n_samples[d] * SEQ_LEN
        epochs = " / ".join(str(touched[h][d]) for h in HORIZONS)
        lines.append(
            f"| {name} | {setup.percent[d]}% | {setup.weights[d]} | {setup.n_samples[d]:,} "
            f"| {tokens / 1e9:,.1f}B | {epochs} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer measured sizes (about 30 s)")
    p.add_argument("--rounds", type=int, help="interleaved rounds, best kept (default 5, quick 3)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--profile", action="store_true", help="also cProfile one tape.resolve")
    p.add_argument("--cpu", type=int, help="the CPU to pin to (default: the highest allowed)")
    args, unknown = p.parse_known_args(argv)
    if unknown:  # run.py passes the same extra arguments to every benchmark
        note(f"tape_bench: ignoring arguments meant for other benchmarks: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    cpu = pin_to_one_cpu(args.cpu)
    started = time.perf_counter()
    setup = Setup.default()
    build_rows, built = bench_build(setup, args.quick, rounds)
    resolve_rows, checks = bench_resolve(setup, built["arrays"], args.quick, rounds)
    kernel_rows = bench_kernel(setup, rounds)
    rows = build_rows + resolve_rows + kernel_rows
    profile = profile_resolve(setup) if args.profile else None
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "quick": args.quick,
        "rounds": rounds,
        "pinned_cpu": cpu,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "kernel": permutation.kernel(),
        "seed": SEED,
        "seq_len": SEQ_LEN,
        "mixture": [
            {"name": n, "percent": w, "samples": s, "weight": W}
            for (n, w, s), W in zip(MIXTURE, setup.weights, strict=True)
        ],
        "memory": "tracemalloc peak (numpy buffers included), in runs separate from the timed ones",
        "seconds": time.perf_counter() - started,
        **built["info"],
        **checks,
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2))
        return 0
    print(
        f"tokentape tape benchmark, {meta['date']}, seed {SEED}, seq_len {SEQ_LEN}, "
        f"pinned to CPU {cpu}, {rounds} rounds{' (quick)' if args.quick else ''}, "
        f"permutation walk: {permutation.kernel()}\n"
    )
    print(mixture_table(setup) + "\n")
    print(render(rows) + "\n")
    print("Ratio: how many times tokentape is better (faster, or smaller). Reference memory is")
    print("its blend arrays plus every touched permutation, all kept for resolve. Peak memory is")
    print("tracemalloc's, in runs separate from the timed ones.")
    print(
        f"- reference blend loop: {meta['reference_blend_s_per_position'] * 1e6:.2f} us/position;"
        f" permutation: {meta['reference_perm_s_per_element'] * 1e9:.1f} ns and "
        f"{meta['reference_perm_bytes_per_element']:.2f} B per element"
    )
    print(
        f"- the two blends agree on {checks['blend_agreement_first_1e6']:.2%} of the first 10^6 "
        f"positions; worst prefix error (samples): reference "
        f"{checks['max_prefix_error_reference']:.5f}, tokentape "
        f"{checks['max_prefix_error_tokentape']:.5f}"
    )
    print(
        f"- cpu/wall: tokentape build {meta['tokentape_build_cpu_over_wall']:.2f}, "
        f"resolve {checks['tokentape_resolve_cpu_over_wall']:.2f}"
    )
    print(f"- whole run {meta['seconds']:.0f} s")
    if profile:
        print("\ncProfile of tape.resolve on 1,048,576 contiguous positions from 0:\n" + profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
