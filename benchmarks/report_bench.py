"""``tokentape report`` on a long run: wall time of the command and page size, against the
issue's targets (a 10**6-step log renders in <= 10 s; the page stays <= 5 MB).

Builds (once, cached under ``bench-out/report/``) the demo's stores (``tokentape demo``, ~12 s)
and a plan over them (``plan-<samples>.toml`` resolved by ``tokentape plan``) whose horizon is
exactly the samples the run consumes, ``max_repeats`` raised to fit. Then writes a step log of
``--steps`` steps in the loader's format (global batch 4: dp 2 x micro 2 x accum 1, then from
midway dp 1 x micro 2 x accum 2; two resumes that redo 738 and 413 steps, the second at the
shape change) and a loss log beside it, one line per step line (a decaying curve plus noise,
three planted spikes). Times, each in a fresh process, best and median of ``--rounds``: the page
with the loss log, the page without it, and ``--json`` with it; then, in this process, the
parts: reading the step log (``scan_step_log(trace=True)``), reading the loss log,
``run_report`` as a whole and ``render_report``. Nothing is asserted.

    python benchmarks/report_bench.py [--steps 1000000] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import tokentape
from tokentape._src.audit.losslog import read_loss_log
from tokentape._src.audit.report import run_report
from tokentape._src.render.report import render_report
from tokentape._src.train.steplog import scan_step_log

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench-out" / "report"
WEIGHTS = {"prose": 50, "code": 40, "notes": 10}  # the demo's stores and weights
SEQ_LEN = 256
SHAPES = ((2, 2, 1), (1, 2, 2))  # (dp, micro, accum), both a global batch of 4
BATCH = 4
TARGET_SECONDS, TARGET_MB = 10.0, 5.0


def build_plan(root: Path, steps: int) -> Path:
    """The demo's stores (once) and a plan over them of horizon ``steps * BATCH`` samples."""
    demo = root / "demo"
    if not (demo / "plan.json").exists():
        print("building the demo's stores (tokentape demo, ~12 s) ...", flush=True)
        cmd = [sys.executable, "-m", "tokentape", "demo", "--out", str(demo)]
        subprocess.run(cmd, check=True, capture_output=True)
    samples = steps * BATCH
    plan = root / f"plan-{samples}.json"
    if plan.exists():
        return plan
    total = sum(WEIGHTS.values())
    blocks = []
    for name, w in WEIGHTS.items():
        n = tokentape.open_source(demo / "stores" / name).n_samples(SEQ_LEN)
        budget = math.ceil(samples * w / total / n) + 1  # the passes over the horizon, and some
        blocks.append(f'\n[[source]]\nname = "{name}"\npath = "demo/stores/{name}"\n'
                      f"weight = {w}\nmax_repeats = {budget}\n")  # fmt: skip
    toml = root / f"plan-{samples}.toml"
    head = f"seq_len = {SEQ_LEN}\nseed = 1234\ntotal_samples = {samples}\n"
    toml.write_text(head + "".join(blocks))
    cmd = [sys.executable, "-m", "tokentape", "plan", str(toml), "--out", str(plan)]
    subprocess.run(cmd, check=True, capture_output=True)
    return plan


def history(steps: int) -> list[tuple[int, int, int]]:
    """The run's stretches of logged lines, in file order: (first step, end step, shape)."""
    a, b = int(steps * 0.3), steps // 2
    return [(0, a + 738, 0), (a, b + 413, 0), (b, steps, 1)]  # two resumes, one shape change


def write_logs(out: Path, steps: int, index_hash: str, spikes: list[int]) -> tuple[Path, Path]:
    """The step log and the loss log (one line per step line) of a run of ``steps`` steps."""
    rng = np.random.default_rng(7)
    step = np.concatenate([np.arange(lo, hi) for lo, hi, _ in history(steps)])
    shape = np.concatenate([np.full(hi - lo, k) for lo, hi, k in history(steps)])
    n = step.size
    gaps = rng.uniform(0.30, 0.40, n)
    gaps[np.flatnonzero(step[1:] <= step[:-1]) + 1] = 900.0  # a restart before each resume
    t = 1.8e9 + np.cumsum(gaps)
    curve = 2.2 + 3.0 / np.sqrt(1 + step / 500)
    loss = curve + rng.normal(0, 0.02, n)
    offset = {"prose": 0.1, "code": -0.3, "notes": 0.4}
    by_source = {k: loss + v + rng.normal(0, 0.03, n) for k, v in offset.items()}
    for s in spikes:  # in effective stretches only (never in lines a resume supersedes)
        hit = step == s
        loss[hit] += 1.5
        by_source["notes"][hit] += 4.0
    rows = rng.multinomial(BATCH, [w / sum(WEIGHTS.values()) for w in WEIGHTS.values()], n)
    steps_path, loss_path = out / "steps.jsonl", out / "loss.jsonl"
    with steps_path.open("w") as f:
        for i, (s, k, ti) in enumerate(zip(step.tolist(), shape.tolist(), t.tolist(), strict=True)):
            dp, micro, accum = SHAPES[k]
            f.write(json.dumps({"accum": accum, "consumed": s * BATCH, "dp": dp,
                                "global_batch": BATCH, "index_hash": index_hash, "micro": micro,
                                "step": s, "time": round(ti, 3),
                                "tokens_hash": f"{(i * 0x9E3779B97F4A7C15) % 2**256:064x}"},
                               sort_keys=True) + "\n")  # fmt: skip
    names = list(WEIGHTS)
    per_source = np.stack([by_source[k] for k in names], axis=1).round(4).tolist()
    toks = (rows * SEQ_LEN).tolist()
    with loss_path.open("w") as f:
        for i, (s, v, ti) in enumerate(zip(step.tolist(), loss.tolist(), t.tolist(), strict=True)):
            f.write(json.dumps({"step": s, "consumed": s * BATCH, "loss": round(v, 4),
                                "loss_by_source": dict(zip(names, per_source[i], strict=True)),
                                "tokens_by_source": dict(zip(names, toks[i], strict=True)),
                                "time": round(ti, 3)}) + "\n")  # fmt: skip
    return steps_path, loss_path


def timed(call: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = call()
    return out, time.perf_counter() - t0


def command(args: list[str]) -> tuple[float, bytes]:
    """Wall seconds of ``python -m tokentape ARGS`` in a fresh process, and its stdout."""
    cmd = [sys.executable, "-m", "tokentape", *args]
    done, seconds = timed(lambda: subprocess.run(cmd, capture_output=True, check=False))
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr.decode()}")
    return seconds, done.stdout


def verdict(value: float, target: float) -> str:
    return "within" if value <= target else "over"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1_000_000, help="effective steps of the log")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each command")
    ap.add_argument("--profile", action="store_true", help="cProfile run_report: top 15")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="work folder (cached)")
    args, unknown = ap.parse_known_args(argv)
    if unknown:  # run.py passes the same extra arguments to every benchmark
        print(f"report_bench: ignoring {' '.join(unknown)}", file=sys.stderr)
    N = args.steps
    if N < 10_000:
        ap.error("--steps must be at least 10,000 (the history's resumes need room)")
    args.out.mkdir(parents=True, exist_ok=True)
    plan_path = build_plan(args.out, N)
    plan = tokentape.load_plan(plan_path)
    run = args.out / f"run-{N}"
    run.mkdir(exist_ok=True)
    spikes = [int(N * f) + k for f, k in ((0.12, 17), (0.42, 29), (0.81, 43))]
    (steps_path, loss_path), t_write = timed(lambda: write_logs(run, N, plan.index_hash, spikes))
    lines = {p.name: sum(1 for _ in p.open("rb")) for p in (steps_path, loss_path)}
    mb = {p.name: p.stat().st_size / 1e6 for p in (steps_path, loss_path)}
    print(f"plan {plan_path.name}: horizon {plan.horizon_samples:,} samples of {SEQ_LEN} tokens, "
          f"passes {', '.join(f'{s.name} {s.passes:,.0f}' for s in plan.sources)}")  # fmt: skip
    print(
        f"logs ({t_write:.1f} s to write): {N:,} steps; "
        + "; ".join(f"{k} {lines[k]:,} lines, {mb[k]:.0f} MB" for k in lines)
    )
    print(f"planted spikes at steps {', '.join(f'{s:,}' for s in spikes)}\n")

    page, bare = run / "report.html", run / "report-noloss.html"
    base = ["report", str(steps_path), "--plan", str(plan_path)]
    variants = {
        "page, with loss log": [*base, "--loss", str(loss_path), "--out", str(page)],
        "page, no loss log": [*base, "--out", str(bare)],
        "--json, with loss log": [*base, "--loss", str(loss_path), "--json"],
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    stdout = b""
    for _ in range(args.rounds):
        for name, cmd in variants.items():
            seconds, out = command(cmd)
            times[name].append(seconds)
            stdout = out if name.startswith("--json") else stdout
    sizes = {"page, with loss log": page.stat().st_size / 1e6,
             "page, no loss log": bare.stat().st_size / 1e6,
             "--json, with loss log": len(stdout) / 1e6}  # fmt: skip
    print(f"python -m tokentape report (fresh process each, {args.rounds} rounds, interleaved)")
    print(f"  {'variant':<22} {'best s':>7} {'median s':>9}  {'target':>14}  "
          f"{'size MB':>8}  {'target':>13}")  # fmt: skip
    for name, ts in times.items():
        best = min(ts)
        size = sizes[name]
        size_v = f"<= {TARGET_MB:g}: {verdict(size, TARGET_MB)}" if "page" in name else ""
        print(f"  {name:<22} {best:7.2f} {statistics.median(ts):9.2f}  "
              f"<= {TARGET_SECONDS:g}: {verdict(best, TARGET_SECONDS):<6}  {size:8.2f}  "
              f"{size_v:>13}")  # fmt: skip
    floor = min(command(["--version"])[0] for _ in range(args.rounds))
    print(f"  {'start-up (--version)':<22} {floor:7.2f}  (in each of the above)")
    data = json.loads(stdout)
    flagged = data["loss"]["flagged_steps"]
    caught = [s for s in spikes if s in flagged]
    print(
        f"  spikes: {data['loss']['flagged']:,} steps flagged ({len(flagged):,} listed); "
        f"planted {len(caught)}/{len(spikes)} flagged"
        + ("" if len(caught) == len(spikes) else f" (missed {set(spikes) - set(caught)})")
    )
    print(
        f"  run: {data['run']['steps']:,} steps, {data['run']['lines']:,} lines, "
        f"{data['run']['resumes']} resumes, {data['run']['superseded_steps']:,} steps redone"
    )

    names = [s.name for s in plan.sources]
    log, t_scan = timed(lambda: scan_step_log(steps_path, trace=True))
    _, t_loss = timed(lambda: read_loss_log(loss_path, names, log.steps))
    report = lambda: run_report(plan, str(plan_path), str(steps_path), str(loss_path))  # noqa: E731
    data, t_run = timed(report)
    _, t_render = timed(lambda: render_report(data))
    _, t_dump = timed(lambda: json.dumps(data, indent=1, allow_nan=False))
    print(f"\nin-process breakdown (one run each, {N:,} steps)")
    parts = {"scan_step_log(trace=True)": t_scan, "read_loss_log (here)": t_loss,
             "run_report (all of it)": t_run, "render_report": t_render,
             "json.dumps (--json)": t_dump}  # fmt: skip
    for name, seconds in parts.items():
        print(f"  {name:<28} {seconds:7.2f} s")
    # run_report reads a big loss log in a second process while it reads the step log
    rest = t_run - max(t_scan, t_loss)
    print(f"  {'run_report less the longer':<28} {rest:7.2f} s  (the logs are read side by side)")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(report)
        print("\ncProfile of run_report, top 15 by cumulative time")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
