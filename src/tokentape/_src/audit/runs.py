"""What the audit commands share: a plan's sources and tape, and a run's batch schedule taken
from its step log or from flags (``--global-batch``, ``--dp/--micro/--accum``, ``--log``)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from tokentape._src.plan.plan import Plan
from tokentape._src.render.text import fmt_bytes
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.tape.resolve import Tape
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.steplog import StepLog, scan_step_log, short_hash
from tokentape.errors import TokentapeError

SCHEDULE_HELP = """\
batch configuration:
  --global-batch B              steps only (B samples per optimizer step, never changed)
  --dp D --micro M [--accum A]  steps, data-parallel ranks and micro-steps
  --log steps.jsonl             the run's step log (needed when the batch shape changed)
"""


def memory_bytes() -> int:
    """This machine's physical memory (2**40 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


def check_fits(n_bytes: int, what: str) -> None:
    """Refuse work whose arrays cannot fit in memory, in one line (rather than a numpy
    allocation error of hundreds of GiB)."""
    limit = memory_bytes()
    if n_bytes > limit:
        raise TokentapeError(
            f"{what} needs about {fmt_bytes(n_bytes)} of memory, more than this machine's "
            f"{fmt_bytes(limit)}"
        )


@lru_cache(maxsize=8)
def tape_of(plan: Plan) -> Tape:
    """The plan's tape, built once per plan (the blend table takes a moment)."""
    return plan.tape()


def source_index(plan: Plan, name: str) -> int:
    """The index of source ``name`` in the plan, or an error listing the known names."""
    names = [s.name for s in plan.sources]
    if name not in names:
        raise TokentapeError(f"unknown source '{name}'; the plan has: {', '.join(names)}")
    return names.index(name)


def open_step_log(path: str, plan: Plan, steps: Iterable[int] = ()) -> StepLog:
    """A step log read in one pass (its schedule, and the records of ``steps``), refused when it
    was written for another tape."""
    log = scan_step_log(path, steps)
    if log.index_hash != plan.index_hash:
        raise TokentapeError(
            f"{path}: the step log's index hash {short_hash(log.index_hash)}… differs from the "
            f"plan's {plan.index_hash[:19]}…; it belongs to another plan"
        )
    return log


def log_schedule(path: str, plan: Plan) -> Schedule:
    """The schedule of a step log (see ``open_step_log``)."""
    return open_step_log(path, plan).schedule


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
            raise TokentapeError(f"{name} must be a positive integer, got {value}")
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
        raise TokentapeError(
            "give one of --global-batch, --dp/--micro/--accum or --log, not " + " and ".join(given)
        )
    for flag in ("global_batch", "dp", "micro", "accum"):
        value = getattr(args, flag)
        if value is not None and value > MAX_POSITION:
            name = "--" + flag.replace("_", "-")
            raise TokentapeError(f"{name} must be at most 2**62, got {value}")
    if shape and (args.dp is None or args.micro is None):
        raise TokentapeError(f"{'/'.join(shape)} given: --dp and --micro go together")
    if shape and args.dp * args.micro * (args.accum or 1) > MAX_POSITION:
        raise TokentapeError(
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
