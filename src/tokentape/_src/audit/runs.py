"""What the audit commands share: a plan's sources and tape, and a run's batch schedule taken
from its step log or from flags (``--global-batch``, ``--dp/--micro/--accum``, ``--log``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import lru_cache

from tokentape._src.plan.plan import Plan
from tokentape._src.tape.resolve import Tape
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.steplog import StepLog, scan_step_log, short_hash
from tokentape._src.util.text import fmt_bytes
from tokentape.errors import ArgumentError, PlanError, TokentapeError


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
        raise ArgumentError(f"unknown source '{name}'; the plan has: {', '.join(names)}")
    return names.index(name)


def open_step_log(path: str, plan: Plan, steps: Iterable[int] = ()) -> StepLog:
    """A step log read in one pass (its schedule, and the records of ``steps``), refused when it
    was written for another tape."""
    log = scan_step_log(path, steps)
    if log.index_hash != plan.index_hash:
        raise PlanError(
            f"{path}: the step log's index hash {short_hash(log.index_hash)}… differs from the "
            f"plan's {plan.index_hash[:19]}…; it belongs to another plan"
        )
    return log


def log_schedule(path: str, plan: Plan) -> Schedule:
    """The schedule of a step log (see ``open_step_log``)."""
    return open_step_log(path, plan).schedule
