"""Phases and mid-run plan changes: what they cost, side by side in one run.

1. **The resume check.** When a run resumes on another plan, ``past_change`` decides whether
   every position below ``consumed`` keeps its sample, from the two plans' blends (bounded
   work: at most the two periods summed per stretch between phase starts). The reference does
   what the contract says literally: resolve every position below ``consumed`` under both
   plans and compare (measured to 10**7 positions, extrapolated linearly beyond). Both for an
   accepted change (a phase appended at ``consumed``) and a refused one (a phase moved before
   it), with the stated weights exact (period 10) and rounded over 2**16.
2. **Resolve.** The same ranges of positions through a tape in one phase and a tape in two
   phases (the range straddling no start and straddling one), for the loader's batch sizes.

Ratios are what matter: the machine is noisy and nothing here asserts an absolute time.

    python benchmarks/phase_bench.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tokentape._src.tape.resolve import Tape
from tokentape._src.train.identity import identity_tape, past_change

NAMES = ["web", "code", "math"]
SIZES = [10**9, 10**8, 10**7]  # tokens per source (seq_len 4096)
SEQ = 4096


def identity(units: list[int], phases: list[tuple[int, list[int]]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "algorithm_version": 2,
        "seq_len": SEQ,
        "seed": 1234,
        "denominator": sum(units),
        "sources": [
            {"name": n, "weight_units": u, "n_tokens": t, "dtype": "uint32", "content_hash": n}
            for n, u, t in zip(NAMES, units, SIZES, strict=True)
        ],
    }
    if phases:
        out["phases"] = [{"start": a, "weight_units": w} for a, w in phases]
    return out


def best(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def brute(old: dict[str, Any], new: dict[str, Any], consumed: int) -> bool:
    """The reference: resolve every position below ``consumed`` under both plans, compare."""
    a, b = identity_tape(old), identity_tape(new)
    chunk = 1 << 20
    for lo in range(0, consumed, chunk):
        p = np.arange(lo, min(lo + chunk, consumed))
        x, y = a.resolve_range(lo, p.size), b.resolve_range(lo, p.size)
        if not (np.array_equal(x.source, y.source) and np.array_equal(x.sample, y.sample)):
            return False
    return True


def resume_rows(quick: bool) -> list[dict[str, Any]]:
    rows = []
    exact, rounded = [6, 3, 1], [39322, 19661, 6553]
    anneal = {10: [1, 3, 6], 65536: [6554, 19661, 39321]}
    measured = [10**6] if quick else [10**6, 10**7]
    for units in (exact, rounded):
        period = sum(units)
        per_position = None
        for consumed in (10**6, 10**7, 10**9, 10**12):
            old = identity(units, [])
            for kind, start in (("accepted", consumed), ("refused", consumed // 2)):
                new = identity(units, [(start, anneal[period])])
                ours = best(lambda o=old, n=new, c=consumed: past_change(o, n, c), 3)
                verdict = past_change(old, new, consumed)
                assert (verdict is None) == (kind == "accepted"), (kind, verdict)
                if consumed in measured and kind == "accepted":
                    ref = best(lambda o=old, n=new, c=consumed: brute(o, n, c), 1)
                    per_position = ref / consumed
                    how = "measured"
                else:  # an accepted change scans the whole prefix, a refused one up to start
                    assert per_position is not None
                    ref = per_position * (consumed if kind == "accepted" else start)
                    how = "extrapolated"
                rows.append(
                    {
                        "period": period,
                        "consumed": consumed,
                        "change": kind,
                        "past_change_s": ours,
                        "brute_force_s": ref,
                        "brute_force": how,
                        "ratio": ref / ours,
                    }
                )
    return rows


def walk(tape: Tape, first: int, batch: int, k: int) -> None:
    """``k`` consecutive batches of ``batch`` positions from ``first``, as a loader reads."""
    for i in range(k):
        tape.resolve_range(first + i * batch, batch)


def resolve_rows(quick: bool) -> list[dict[str, Any]]:
    n_samples = [s // SEQ for s in SIZES]
    one = Tape.build(NAMES, n_samples, [6, 3, 1], 1234)
    boundary = 10**9
    two = Tape.build_phased(NAMES, n_samples, [0, boundary], [[6, 3, 1], [1, 3, 6]], 1234)
    rows = []
    for batch in (8, 1024, 65536):
        k = 20 if quick else 100
        for where, start in (("inside a phase", boundary + 10**6), ("across a start", None)):
            first = boundary - batch // 2 if start is None else start
            base = best(lambda t=one, b=batch, f=first, n=k: walk(t, f, b, n), 3)
            phased = best(lambda t=two, b=batch, f=first, n=k: walk(t, f, b, n), 3)
            rows.append(
                {
                    "batch": batch,
                    "range": where,
                    "one_phase_us": base / k * 1e6,
                    "two_phases_us": phased / k * 1e6,
                    "ratio": phased / base,
                }
            )
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller reference")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    resume, resolve = resume_rows(args.quick), resolve_rows(args.quick)
    if args.json:
        print(json.dumps({"resume": resume, "resolve": resolve}, indent=2))
        return 0
    print("resume check: past_change vs resolving every position below consumed")
    head = f"{'period':>6} {'consumed':>17} {'change':>9} {'past_change':>12} {'brute force':>14}"
    print(f"  {head}  ratio")
    for r in resume:
        mark = " " if r["brute_force"] == "measured" else "*"
        print(
            f"  {r['period']:>6} {r['consumed']:>17,} {r['change']:>9} "
            f"{r['past_change_s'] * 1e3:>9.2f} ms {r['brute_force_s']:>10.3g} s{mark} "
            f" {r['ratio']:,.0f}x"
        )
    print("  (* extrapolated from the measured cost per position)")
    print("\nresolve_range: a tape in two phases vs one phase, same positions")
    print(f"  {'batch':>6} {'range':>15} {'one phase':>12} {'two phases':>12}  ratio")
    for r in resolve:
        print(
            f"  {r['batch']:>6} {r['range']:>15} {r['one_phase_us']:>9.0f} us "
            f"{r['two_phases_us']:>9.0f} us  {r['ratio']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
