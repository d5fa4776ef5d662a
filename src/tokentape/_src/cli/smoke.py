"""`tokentape smoke`: rank partitioning checked in real torch.distributed processes."""

from __future__ import annotations

import argparse
import importlib

from tokentape._src.train.partition import BatchConfig
from tokentape.errors import InputError, TokentapeError

MAX_SMOKE_PROCESSES = 64
"""Most processes ``smoke`` starts (``tokentape._src.torch.smoke.MAX_PROCESSES``, without torch)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "smoke",
        help="check rank partitioning in real torch.distributed (gloo or nccl) processes",
        description="Launch dp x tp processes on this machine (gloo on CPU, or nccl with one "
        "CUDA device per rank); each builds its steps with "
        "the loader, they all-gather a fixed-size record of what they read (no pickling), and "
        "every rank checks: tensor-parallel peers must get identical inputs, each data-parallel "
        "rank its own slice, disjoint, whose union is the whole step. Exit 1 on any violation, "
        "2 on bad arguments, a bad plan or store, or a failed worker. Needs the torch extra.",
    )
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--dp", type=int, default=2, help="data-parallel size (default 2)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    p.add_argument("--micro", type=int, default=2, help="micro-batch (default 2)")
    p.add_argument("--accum", type=int, default=2, help="accumulation steps (default 2)")
    p.add_argument("--steps", type=int, default=3, help="steps to check (default 3)")
    p.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="the process group's backend (default gloo, on CPU); nccl puts rank r on CUDA "
        "device r and needs dp x tp devices",
    )
    p.set_defaults(func=cmd)


def cmd(args: argparse.Namespace) -> int:
    for name in ("dp", "tp", "micro", "accum", "steps"):  # before importing torch: fast, one line
        value = getattr(args, name)
        if value < 1:
            raise InputError(f"--{name} must be at least 1, got {value}")
    if args.dp * args.tp > MAX_SMOKE_PROCESSES:  # before importing torch: fast, one line
        raise InputError(
            f"--dp {args.dp} x --tp {args.tp} = {args.dp * args.tp} processes: smoke runs every "
            f"rank on this machine, at most {MAX_SMOKE_PROCESSES}"
        )
    try:  # torch is an optional extra: imported only by the command that needs it
        smoke = importlib.import_module("tokentape._src.torch.smoke")
    except ImportError as exc:
        raise TokentapeError(f"smoke needs torch: pip install 'tokentape[torch]' ({exc})") from None
    config = BatchConfig(args.dp, args.micro, args.accum)
    table = smoke.run_smoke(args.plan, args.dp, args.tp, config, args.steps, args.backend)
    print("step\tconsumed\trank\tdp\ttp\tpositions\tinputs sha256")
    print(table, end="")
    problems = [line for line in table.splitlines() if line.startswith("PROBLEM")]
    verdict = "FAIL" if problems else "OK"
    print(
        f"{verdict}: dp={args.dp} tp={args.tp} ({args.backend}), {args.steps} steps, "
        f"{len(problems)} problems"
    )
    return 1 if problems else 0
