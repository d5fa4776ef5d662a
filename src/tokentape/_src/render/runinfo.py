"""Plain-text views of a resolved plan and of a run, for ``tokentape info``."""

from __future__ import annotations

from datetime import UTC, datetime

from tokentape._src.audit.runinfo import RunInfo, store_location
from tokentape._src.plan.plan import Plan
from tokentape._src.render.text import plan_text
from tokentape._src.util.text import fmt_int, key_values, table

SHOWN_REDOS = 10
"""Redone steps listed one by one (the rest are counted)."""


def plan_info_text(path: str, plan: Plan) -> str:
    """``tokentape info PLAN.json``: what the plan is, its shares and phases (as ``tokentape
    plan`` shows them), and where each source's store lives."""
    head = key_values(
        [
            ("plan", path),
            ("sources", fmt_int(len(plan.sources))),
            ("vocabulary", f"{fmt_int(plan.vocab_size)} ids, end-of-document id {plan.eod_id}"),
            ("algorithm", f"version {plan.algorithm_version}"),
        ]
    )
    rows = []
    for s in plan.sources:
        _where, present = store_location(s.path, s.format)
        status = "object storage" if present is None else "present" if present else "MISSING"
        rows.append([s.name, s.format, status, s.content_hash[:23] + "…", s.path])
    stores = table(["source", "format", "store", "content hash", "where"], rows)
    return f"{head}\n\n{plan_text(plan)}\n\n  stores\n{stores}"


def _when(t: float | None) -> str:
    """A logged time (seconds since the epoch) as a UTC date, or the number itself when no
    date has it."""
    if t is None:
        return "?"
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):
        return f"{t:g} s (not a date)"


def _span(first: float, last: float) -> str:
    span = last - first
    seconds = f"{abs(span):.0f}" if abs(span) < 1e15 else f"{abs(span):g}"
    if span < 0:
        return f"{seconds} s backwards: the last line's time is before the first's"
    return f"{seconds} s"


def _restarts(n: int) -> str:
    return f"{n} restart" + ("s" if n != 1 else "")


def run_info_text(info: RunInfo) -> str:
    """``tokentape info --log steps.jsonl``: the run's steps, shapes, plans, redone steps."""
    lines, log, last = info.lines, info.log, info.last
    redone = sum(r.superseded for r in lines.redos)
    line_note = [f"{fmt_int(lines.lines)} step lines"]
    if lines.redos:
        line_note.append(f"{fmt_int(redone)} superseded by {len(lines.redos)} redone")
    if lines.torn_tail:
        line_note.append("a torn last line ignored")
    rows: list[tuple[str, str]] = [("step log", info.path)]
    if log is not None and last is not None:
        rows += [
            ("steps", f"{fmt_int(log.steps)} (0..{fmt_int(log.steps - 1)})"),
            ("consumed", f"{fmt_int(log.end)} samples"),
        ]
    rows.append(("lines", "; ".join(line_note)))
    if lines.first_time is not None and lines.last_time is not None:
        span = _span(lines.first_time, lines.last_time)
        rows.append(("time", f"{_when(lines.first_time)} .. {_when(lines.last_time)} ({span})"))
    if log is not None and last is not None:
        rows += [
            (
                "last step",
                f"{fmt_int(last.step)}: samples {fmt_int(last.consumed)}.."
                f"{fmt_int(last.consumed + last.global_batch - 1)}, dp {last.dp} x micro "
                f"{last.micro} x accum {last.accum}",
            ),
            ("tokens hash", last.tokens_hash),
            ("index hash", last.index_hash if len(log.plans) == 1 else "plans (below)"),
        ]
    rows += [
        (
            "redone steps",
            f"{fmt_int(redone)} ({_restarts(len(lines.redos))})" if redone else "none",
        ),
        ("gaps", f"{len(lines.gaps)}: steps missing (below)" if lines.gaps else "none"),
    ]
    parts = [key_values(rows)]
    if info.refused is not None:
        parts.append(f"  refused by replay, locate and resume: {info.refused}")
    shapes = info.shape_changes
    body: list[list[object]]
    if shapes:
        body = [[c.step, c.consumed, c.dp_size, c.micro, c.accum,
                 c.dp_size * c.micro * c.accum] for c in shapes]  # fmt: skip
        title = "batch shape" if len(shapes) == 1 else f"batch shapes ({_changes(len(shapes) - 1)})"
        header = ["from step", "consumed", "dp", "micro", "accum", "global batch"]
        parts.append(f"  {title}\n" + table(header, body))
    if log is not None and len(log.plans) > 1:
        body = [[step, h] for step, h in log.plans]
        parts.append(
            f"  plans ({_changes(len(log.plans) - 1)})\n" + table(["from step", "index hash"], body)
        )
    if lines.redos:
        body = [[r.line, r.step, r.superseded] for r in lines.redos[:SHOWN_REDOS]]
        more = len(lines.redos) - SHOWN_REDOS
        tail = f"\n  ... {more} more" if more > 0 else ""
        parts.append(
            "  redone (a line re-logs steps from an earlier checkpoint; it supersedes them)\n"
            + table(["line", "step", "steps superseded"], body)
            + tail
        )
    if lines.gaps:
        body = [[g.line, g.step, g.expected] for g in lines.gaps]
        parts.append("  gaps\n" + table(["line", "step", "expected step"], body))
    return "\n\n".join(parts)


def _changes(n: int) -> str:
    return f"{n} change" + ("" if n == 1 else "s")


__all__ = ["plan_info_text", "run_info_text"]
