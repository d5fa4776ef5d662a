"""What the audit commands share: a plan's sources and tape, and a run's batch schedule taken
from its step log or from flags (``--global-batch``, ``--dp/--micro/--accum``, ``--log``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

from tokentape._src.audit.runinfo import step_log_path
from tokentape._src.objects.client import is_url
from tokentape._src.plan.plan import Plan
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.tape.resolve import Tape
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.steplog import StepLog, scan_step_log, short_hash
from tokentape._src.util.checks import as_parameter, is_int
from tokentape._src.util.text import fmt_bytes
from tokentape.errors import ArgumentError, PlanError, TokentapeError, _reworded


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
        raise ArgumentError(f"unknown source {name!r}; the plan has: {', '.join(names)}")
    return names.index(name)


def open_step_log(
    path: str, plan: Plan, steps: Iterable[int] = (), *, trace: bool = False
) -> StepLog:
    """A step log read in one pass (its schedule, the records of ``steps``, and with ``trace``
    every line's step and time), refused when it was written for another tape. ``path`` may
    be an object URL (the log, or its run's "directory")."""
    local = str(step_log_path(path)) if is_url(path) else path
    try:
        log = scan_step_log(local, steps, trace=trace)
    except TokentapeError as exc:
        if local == path:
            raise
        raise _reworded(exc, str(exc).replace(local, path)) from None
    earlier = [step for step, h in log.plans if h == plan.index_hash]
    if earlier and log.index_hash != plan.index_hash:
        later = next(step for step, h in log.plans if step > earlier[-1])
        raise PlanError(
            f"{path}: from step {later} on, the run went on under a later plan (index hash "
            f"{short_hash(log.index_hash)}…); give the plan it ended under, which answers "
            "for every step of the log"
        )
    if log.index_hash != plan.index_hash:
        raise PlanError(
            f"{path}: the step log's index hash {short_hash(log.index_hash)}… differs from the "
            f"plan's {plan.index_hash[:19]}…; it belongs to another plan"
        )
    return log


def log_schedule(path: str, plan: Plan) -> Schedule:
    """The schedule of a step log (see ``open_step_log``)."""
    return open_step_log(path, plan).schedule


@dataclass(frozen=True)
class Batching:
    """A run's batch shape, as the caller gave it."""

    schedule: Schedule | None
    """None when no shape was given."""
    ranks: bool
    """Whether the shape names the ranks (not a bare global batch)."""
    log: StepLog | None
    """The step log, read once, when the shape came from it."""


def batching(
    plan: Plan,
    *,
    global_batch: int | None = None,
    dp: int | None = None,
    micro: int | None = None,
    accum: int | None = None,
    log: str | None = None,
    log_steps: Iterable[int] = (),
    named: Callable[[str], str] = as_parameter,
) -> Batching:
    """The schedule one of ``global_batch``, ``dp``/``micro``/``accum`` or ``log`` describes
    (at most one; none gives no schedule); a log is read once, keeping the records of
    ``log_steps``. ``named`` spells a parameter in messages (the command line: its flag)."""
    sizes = {"global_batch": global_batch, "dp": dp, "micro": micro, "accum": accum}
    for name, value in sizes.items():
        if value is not None and (not is_int(value) or value < 1):
            raise ArgumentError(f"{named(name)} must be a positive integer, got {value!r}")
    shape = [named(f) for f in ("dp", "micro", "accum") if sizes[f] is not None]
    given = [
        kind
        for kind, on in (
            (named("global_batch"), global_batch is not None),
            ("/".join(shape), bool(shape)),
            (named("log"), log is not None),
        )
        if on
    ]
    if len(given) > 1:
        shapes = f"{named('dp')}/{named('micro')}/{named('accum')}"
        raise ArgumentError(
            f"give one of {named('global_batch')}, {shapes} or {named('log')}, not "
            + " and ".join(given)
        )
    for name, value in sizes.items():
        if value is not None and value > MAX_POSITION:
            raise ArgumentError(f"{named(name)} must be at most 2**62, got {value}")
    if shape and (dp is None or micro is None):
        raise ArgumentError(
            f"{'/'.join(shape)} given: {named('dp')} and {named('micro')} go together"
        )
    if dp is not None and micro is not None:
        if dp * micro * (accum or 1) > MAX_POSITION:
            raise ArgumentError(
                f"{named('dp')} {dp} x {named('micro')} {micro} x {named('accum')} {accum or 1}: "
                "a step of more than 2**62 samples"
            )
        return Batching(Schedule.uniform(BatchConfig(dp, micro, accum or 1)), True, None)
    if global_batch is not None:
        return Batching(Schedule.uniform(BatchConfig(1, global_batch, 1)), False, None)
    if log is not None:
        found = open_step_log(log, plan, log_steps)
        return Batching(found.schedule, True, found)
    return Batching(None, False, None)


__all__ = [
    "Batching",
    "batching",
    "check_fits",
    "log_schedule",
    "memory_bytes",
    "open_step_log",
    "source_index",
    "tape_of",
]
