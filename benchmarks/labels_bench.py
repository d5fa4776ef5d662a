"""What the per-row source labels cost a torch trainer's loader: this tree against the last
commit without them.

Every micro-batch of ``to_torch`` (and so ``TapeDataset``/``collate``) carries each row's
``source`` since ``a42e3de``; its cost is measured against ``BASELINE`` (the commit before),
whose ``src`` is taken from this repository with ``git archive``. Each round runs, in a fresh
process per tree (the order swapped every round), ``Loader(prefetch=2)`` + ``to_torch(pin=False)``
over ``--steps`` steps of one micro-batch of B x (L + 1) int64 from the plan ``loader_bench.py``
builds (page-cached), after ``--warm`` steps. Prints samples/s per tree (best and median of
``--rounds``) and their ratios, and the median of each round's own ratio (the two trees run
back to back; aim: at least 0.97).

    python benchmarks/labels_bench.py [--micro 64] [--seq-len 2048] [--rounds 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = "a42e3de~1"
AIM = 0.97

CHILD = """
import json, sys, time
import numpy as np
import tokentape
from tokentape.torch import to_torch
plan = tokentape.load_plan(sys.argv[1])
micro, steps, warm = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with tokentape.Loader(plan, 0, tokentape.BatchConfig(1, micro), prefetch=2) as loader:
    def one():
        step = loader.step()
        for m in step.micro_batches:
            t = to_torch(m, pin=False)
        loader.commit()
        return t
    for _ in range(warm):
        t = one()
    started = time.perf_counter()
    for _ in range(steps):
        t = one()
    seconds = time.perf_counter() - started
print(json.dumps({"samples_per_s": steps * micro / seconds, "keys": sorted(t)}))
"""


def baseline_src(work: Path) -> Path:
    """``src`` of ``BASELINE``, extracted from this repository into ``work`` (once)."""
    if (work / "src" / "tokentape").is_dir():
        return work / "src"
    work.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BASELINE, "src"],
                             capture_output=True, check=True)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
    return work / "src"


def run(src: Path, plan: Path, micro: int, steps: int, warm: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-c", CHILD, str(plan), str(micro), str(steps), str(warm)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{src}: {done.stderr}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--micro", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warm", type=int, default=20)
    p.add_argument("--mb", type=float, default=64.0)
    p.add_argument("--out", type=Path, default=REPO / "bench-out" / "labels")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.path.insert(0, str(REPO / "src"))
    from loader_bench import build, page_in

    from tokentape._src.plan.plan import resolve_plan
    from tokentape._src.plan.spec import load_plan_spec
    from tokentape._src.train.batch import Batcher

    root = build(args.out / f"{args.mb:g}mb-{args.seq_len}", args.mb, args.seq_len, {})
    plan = resolve_plan(load_plan_spec(root))  # build() returns the plan file
    plan_path = args.out / "plan.json"
    plan.save(plan_path)
    page_in(Batcher(plan))
    trees = {"baseline": baseline_src(args.out / "baseline"), "this tree": REPO / "src"}
    rates: dict[str, list[float]] = {name: [] for name in trees}
    keys: dict[str, object] = {}
    started = time.perf_counter()
    for r in range(args.rounds):
        for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
            got = run(trees[name], plan_path, args.micro, args.steps, args.warm)
            rate = float(got["samples_per_s"])  # type: ignore[arg-type]
            rates[name].append(rate)
            keys[name] = got["keys"]
            print(f"round {r + 1}: {name:9s} {rate:10,.0f} samples/s", file=sys.stderr)
    best = {name: max(r) for name, r in rates.items()}
    median = {name: statistics.median(r) for name, r in rates.items()}
    ratio = best["this tree"] / best["baseline"]
    median_ratio = median["this tree"] / median["baseline"]
    # Each round runs the two trees back to back: its ratio compares them on the same state of
    # the machine, and the median of those ratios is the steadiest figure on a noisy VM.
    paired = statistics.median(
        t / b for t, b in zip(rates["this tree"], rates["baseline"], strict=True)
    )
    result = {
        "micro": args.micro, "seq_len": args.seq_len, "rounds": args.rounds,
        "samples_per_s": {k: round(v) for k, v in best.items()}, "ratio": round(ratio, 3),
        "median_samples_per_s": {k: round(v) for k, v in median.items()},
        "median_ratio": round(median_ratio, 3), "paired_median_ratio": round(paired, 3),
        "aim": AIM, "keys": keys, "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"Loader(prefetch=2) + to_torch, B = {args.micro} x {args.seq_len + 1} int64, best of "
          f"{args.rounds}: baseline {best['baseline']:,.0f} samples/s, this tree "
          f"{best['this tree']:,.0f}, ratio {ratio:.3f}; medians {median['baseline']:,.0f} / "
          f"{median['this tree']:,.0f}, ratio {median_ratio:.3f}; median of the rounds' own "
          f"ratios {paired:.3f} (aim >= {AIM}); keys this tree "
          f"{keys['this tree']}")  # fmt: skip


if __name__ == "__main__":
    main()
