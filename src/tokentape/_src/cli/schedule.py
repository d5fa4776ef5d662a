"""The batch-shape flags of the audit commands (--global-batch, --dp/--micro/--accum, --log)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass

from tokentape._src.audit.runs import (
    open_step_log,
)
from tokentape._src.plan.plan import Plan
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.steplog import StepLog
from tokentape.errors import InputError

SCHEDULE_HELP = """\
batch configuration:
  --global-batch B              steps only (B samples per optimizer step, never changed)
  --dp D --micro M [--accum A]  steps, data-parallel ranks and micro-steps
  --log steps.jsonl             the run's step log (needed when the batch shape changed)
"""


def add_schedule_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--global-batch", type=int, metavar="B", help="samples per optimizer step")
    p.add_argument("--dp", type=int, metavar="D", help="data-parallel ranks")
    p.add_argument("--micro", type=int, metavar="M", help="micro-batch per rank")
    p.add_argument("--accum", type=int, metavar="A", help="accumulation steps (default 1)")
    p.add_argument("--log", metavar="steps.jsonl", help="the run's step log")


@dataclass(frozen=True)
class Batching:
    """The batch configuration the flags describe."""

    schedule: Schedule | None  # None when no flag was given
    ranks: bool  # whether it knows the ranks (not --global-batch)
    log: StepLog | None  # with --log: the log, read once


def schedule_from_args(
    args: argparse.Namespace, plan: Plan, log_steps: Iterable[int] = ()
) -> Batching:
    """The schedule the flags describe; with --log the log is read once, keeping the records of
    ``log_steps``."""
    for flag in ("global_batch", "dp", "micro", "accum"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            name = "--" + flag.replace("_", "-")
            raise InputError(f"{name} must be a positive integer, got {value}")
    shape = [f"--{f}" for f in ("dp", "micro", "accum") if getattr(args, f) is not None]
    given = [
        kind
        for kind, on in (
            ("--global-batch", args.global_batch is not None),
            ("/".join(shape), bool(shape)),
            ("--log", args.log is not None),
        )
        if on
    ]
    if len(given) > 1:
        raise InputError(
            "give one of --global-batch, --dp/--micro/--accum or --log, not " + " and ".join(given)
        )
    for flag in ("global_batch", "dp", "micro", "accum"):
        value = getattr(args, flag)
        if value is not None and value > MAX_POSITION:
            name = "--" + flag.replace("_", "-")
            raise InputError(f"{name} must be at most 2**62, got {value}")
    if shape and (args.dp is None or args.micro is None):
        raise InputError(f"{'/'.join(shape)} given: --dp and --micro go together")
    if shape and args.dp * args.micro * (args.accum or 1) > MAX_POSITION:
        raise InputError(
            f"--dp {args.dp} x --micro {args.micro} x --accum {args.accum or 1}: a step of more "
            "than 2**62 samples"
        )
    if args.global_batch is not None:
        return Batching(Schedule.uniform(BatchConfig(1, args.global_batch, 1)), False, None)
    if shape:
        config = BatchConfig(args.dp, args.micro, args.accum or 1)
        return Batching(Schedule.uniform(config), True, None)
    if args.log is not None:
        log = open_step_log(args.log, plan, log_steps)
        return Batching(log.schedule, True, log)
    return Batching(None, False, None)
