"""Locate: every position, step and rank at which a document is (or will be) trained on.

The inverse of replay, in closed form, without scanning the run:

    document d ─doc_span→ tokens [s, e) ─→ samples k with kL < e and s <= kL + L
      ─for each pass─→ position_of(source, k, pass) ─keep < limit─→ Schedule.place

Sample k is the window of tokens [kL, kL + L] (L + 1 tokens), so it overlaps the document iff
kL < e and s <= kL + L: exactly the documents ``Source.docs_in(k)`` lists. Each pass of the
source holds every sample once, so a document spanning m samples appears m times per pass; the
passes that matter are those whose draws fall below the limit (the plan's horizon, or the end
of step N).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokentape._src.audit.runs import (
    SCHEDULE_HELP,
    add_schedule_args,
    check_fits,
    schedule_from_args,
    source_index,
    tape_of,
)
from tokentape._src.plan.plan import Plan, load_plan
from tokentape._src.render.text import fmt_int, key_values, table
from tokentape._src.store.reader import TokenStream
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.tape.permutation import Permutation
from tokentape._src.tape.resolve import Tape
from tokentape._src.train.batch import check_planned, open_planned
from tokentape._src.train.schedule import Placement, Schedule
from tokentape.errors import OutOfRangeError, TokentapeError

DEFAULT_LIMIT = 50
_BYTES_PER_ROW = 120
"""Memory per position found: position, pass, sample, placement (int64 each) and sorting."""


@dataclass(frozen=True)
class Located:
    """Where one document is trained on: one entry per position, in ascending position order."""

    source: str
    source_index: int  # index of the source in the plan
    doc_id: int
    span: tuple[int, int]
    """The document's token range [start, end), its end-of-document token included."""
    samples: range
    """The samples whose L+1-token windows overlap the document (empty for a tail document)."""
    limit: int
    """Positions below this were searched: the end of ``until_step``; else the horizon, or the
    end of a step log that goes past it."""
    until_step: int | None
    position: np.ndarray  # int64, ascending
    epoch: np.ndarray  # int64: the pass over the source
    sample: np.ndarray  # int64: the sample (window) of the source
    placement: Placement | None
    """Step, DP rank, micro-step and row of each position (None without a schedule); step −1
    marks a position beyond the step log's last step: not yet trained."""

    @property
    def n_tokens(self) -> int:
        return self.span[1] - self.span[0]

    @property
    def trained(self) -> np.ndarray:
        """Which positions fall within the schedule (all of them when it is open-ended)."""
        if self.placement is None:
            return np.ones(self.position.shape, dtype=bool)
        return self.placement.step >= 0

    @property
    def seen(self) -> bool:
        """Whether any window of the document was trained on within the searched range."""
        return bool(self.trained.any())


# --- the closed form ------------------------------------------------------------------------


def samples_overlapping(span: tuple[int, int], seq_len: int, n_samples: int) -> range:
    """Samples k in [0, n_samples) whose window [kL, kL + L] meets tokens [start, end)."""
    start, end = span
    first = max(0, -(-start // seq_len) - 1)  # smallest k with start <= kL + L
    stop = min(n_samples, (end - 1) // seq_len + 1)  # largest k with kL < end, plus one
    return range(first, max(first, stop))


def positions_of_samples(
    tape: Tape, source: int, samples: range, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position, epoch, sample) of every draw of ``samples`` of ``source`` below ``limit``,
    sorted by position."""
    n = tape.n_samples[source]
    draws = int(tape.blend.count(source, limit))  # draws of the source at positions < limit
    full, partial = divmod(draws, n)
    rows = (full + (partial > 0)) * len(samples)
    check_fits(rows * _BYTES_PER_ROW, f"the {fmt_int(rows)} positions of {len(samples)} samples")
    ks = np.arange(samples.start, samples.stop, dtype=np.int64)
    epochs = np.repeat(np.arange(full, dtype=np.int64), ks.size)
    picked = np.tile(ks, full)
    if partial and ks.size:  # the last, unfinished pass: only samples drawn before the limit
        perm = Permutation.for_epoch(n, tape.seed, tape.names[source], full)
        drawn = ks[np.asarray(perm.inverse(ks)) < partial]
        picked = np.concatenate([picked, drawn])
        epochs = np.concatenate([epochs, np.full(drawn.size, full, dtype=np.int64)])
    if not picked.size:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    position = tape.position_of(source, picked, epochs)
    order = np.argsort(position, kind="stable")
    return position[order], epochs[order], picked[order]


def search_limit(plan: Plan, schedule: Schedule | None, until_step: int | None) -> int:
    """Positions below this are searched: the end of ``until_step``; else the horizon, or the
    end of a bounded schedule (a step log) when the run went past the horizon."""
    if until_step is None:
        end = schedule.end if schedule is not None else None
        if end is None or end <= plan.horizon_samples:
            return plan.horizon_samples
        if end > MAX_POSITION:
            raise TokentapeError("the step log ends beyond position 2**62")
        return end
    if schedule is None:
        raise TokentapeError(f"until step {until_step}: steps need a batch schedule")
    if until_step < 0:
        raise TokentapeError(f"until step {until_step}: expected a step >= 0")
    if schedule.steps is not None and until_step >= schedule.steps:
        raise TokentapeError(
            f"until step {until_step}: beyond the step log, which ends at step {schedule.steps - 1}"
        )
    consumed, config = schedule.start(until_step)
    end = consumed + config.global_batch
    if end > MAX_POSITION:
        raise TokentapeError(f"until step {until_step}: the step ends beyond position 2**62")
    return end


def locate(
    plan: Plan,
    source: str,
    doc_id: int,
    schedule: Schedule | None = None,
    until_step: int | None = None,
    store: TokenStream | None = None,
) -> Located:
    """Every position (through ``until_step``; else below the horizon, or below the end of a
    bounded ``schedule`` past it) at which a window of document ``doc_id`` of ``source`` is
    drawn, placed on ``schedule`` when given.

    ``store`` is the source's opened store (opened from the plan's path when None)."""
    d = source_index(plan, source)
    store = open_planned(plan, d) if store is None else check_planned(plan, d, store)
    if not 0 <= doc_id < store.n_docs:
        raise OutOfRangeError(
            f"source '{source}': document {doc_id} out of range; it has documents "
            f"0..{store.n_docs - 1}"
        )
    span = store.doc_span(doc_id)
    samples = samples_overlapping(span, plan.seq_len, plan.sources[d].n_samples)
    limit = search_limit(plan, schedule, until_step)
    position, epoch, sample = positions_of_samples(tape_of(plan), d, samples, limit)
    placement = schedule.place(position) if schedule is not None else None
    return Located(
        source, d, doc_id, span, samples, limit, until_step, position, epoch, sample, placement
    )


# --- the command ----------------------------------------------------------------------------

EPILOG = (
    SCHEDULE_HELP
    + """\
  (optional: without one only positions are shown; with --log, the search goes to the
  horizon or the log's end, whichever is later, and positions past its last step are
  reported as not yet trained)

examples:
  tokentape locate mix.json web 1234
  tokentape locate mix.json web 1234 --dp 8 --micro 4 --accum 2 --limit 20
  tokentape locate mix.json math 7 --log run/steps.jsonl --until-step 5000
  tokentape locate mix.json code 42 --global-batch 512 --json
"""
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "locate",
        help="every position/step/rank at which a document is trained on",
        description="Find every position at which any window of a document is (or will be)\n"
        "trained on, up to the plan's horizon (or the end of --log past it, or through\n"
        "--until-step N), with its pass, sample, step, data-parallel rank and micro-step.\n"
        "Computed in closed form from the plan: nothing is scanned. See docs/locate.md.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", metavar="PLAN.json", help="a resolved plan (tokentape plan --out)")
    p.add_argument("source", metavar="SOURCE", help="source name in the plan")
    p.add_argument("doc", type=int, metavar="DOC", help="document id within the source")
    add_schedule_args(p)
    p.add_argument("--until-step", type=int, metavar="N", help="search through step N only")
    p.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"rows to print (default {DEFAULT_LIMIT}; --json prints all)",
    )
    p.add_argument("--json", action="store_true", help="print every row as JSON")
    p.set_defaults(func=cmd)


def _rows(found: Located, ranks: bool) -> list[dict[str, Any]]:
    """One JSON-friendly dict per position; step and rank are None where not yet trained."""
    always = {"position": found.position, "epoch": found.epoch, "sample": found.sample}
    placed: dict[str, np.ndarray] = {}
    if found.placement is not None:
        p = found.placement
        placed["step"] = p.step
        if ranks:
            placed |= {"dp_rank": p.dp_rank, "micro_step": p.micro_step, "row": p.row}
    columns = {name: v.tolist() for name, v in (always | placed).items()}
    rows = []
    for i, trained in enumerate(found.trained.tolist()):
        row = {name: columns[name][i] for name in always}
        row |= {name: columns[name][i] if trained else None for name in placed}
        rows.append(row)
    return rows


def _steps(found: Located) -> list[int]:
    if found.placement is None:
        return []
    return found.placement.step[found.trained].tolist()


def summary(found: Located, plan: Plan, ranks: bool) -> dict[str, Any]:
    """Everything the command prints, rows included, as JSON-friendly values."""
    steps = _steps(found)
    known = found.placement is not None
    return {
        "index_hash": plan.index_hash,
        "source": found.source,
        "doc": found.doc_id,
        "span": list(found.span),
        "tokens": found.n_tokens,
        "seq_len": plan.seq_len,
        "samples": [found.samples.start, found.samples.stop],
        "horizon": plan.horizon_samples,
        "until_step": found.until_step,
        "limit": found.limit,
        "count": int(found.position.size),
        "trained": int(found.trained.sum()) if known else None,
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
        "seen": found.seen if found.until_step is not None else None,
        "rows": _rows(found, ranks),
    }


def _header(s: dict[str, Any], found: Located, log_steps: int | None) -> str:
    first, stop = s["samples"]
    samples = (
        f"{fmt_int(stop - first)} (samples {fmt_int(first)}..{fmt_int(stop - 1)}, "
        f"seq_len {s['seq_len']})"
        if stop > first
        else "none (the document lies past the last full window)"
    )
    if s["until_step"] is not None:
        why = f"through step {fmt_int(s['until_step'])}"
    elif s["limit"] > s["horizon"]:
        why = "to the end of the step log, past the plan's horizon"
    else:
        why = "the plan's horizon"
    searched = f"positions 0..{fmt_int(s['limit'] - 1)} ({why})"
    passes = len(np.unique(found.epoch))
    start, end = s["span"]
    rows = [
        ("document", f"{s['doc']} of source '{s['source']}'"),
        ("tokens", f"{fmt_int(s['tokens'])} (tokens {fmt_int(start)}..{fmt_int(end - 1)})"),
        ("samples", samples),
        ("searched", searched),
        ("positions", f"{fmt_int(s['count'])} in {passes} pass{'es' if passes != 1 else ''}"),
    ]
    if found.placement is not None:
        rows += [("first step", _opt(s["first_step"])), ("last step", _opt(s["last_step"]))]
    if log_steps is not None and s["until_step"] is None:
        rows.append(
            (
                "trained so far",
                f"{fmt_int(s['trained'])} of {fmt_int(s['count'])} "
                f"(the log ends at step {fmt_int(log_steps - 1)})",
            )
        )
    if s["until_step"] is not None:
        rows.append((f"seen by step {fmt_int(s['until_step'])}", "yes" if s["seen"] else "no"))
    return key_values(rows)


def _opt(value: int | None) -> str:
    return "-" if value is None else fmt_int(value)


def _table(rows: list[dict[str, Any]], limit: int) -> str:
    if not rows:
        return "  (no positions)"
    names = [
        n for n in ("position", "step", "dp_rank", "micro_step", "epoch", "sample") if n in rows[0]
    ]
    header = [{"dp_rank": "dp rank", "micro_step": "micro"}.get(n, n) for n in names]
    cells = [[_cell(r, n) for n in names] for r in rows[:limit]]
    lines = [table(header, cells)] if cells else []
    if len(rows) > len(cells):
        more = len(rows) - len(cells)
        lines.append(f"  ... {fmt_int(more)} more (raise --limit, or --json for all)")
    return "\n".join(lines)


def _cell(row: dict[str, Any], name: str) -> int | str:
    value = row[name]
    if value is None:
        return "not yet trained" if name == "step" else "-"
    return value


def cmd(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    if args.limit < 0:
        raise TokentapeError(f"--limit must be >= 0, got {args.limit}")
    batching = schedule_from_args(args, plan)
    schedule, ranks = batching.schedule, batching.ranks
    if args.until_step is not None and schedule is None:
        raise TokentapeError(
            "--until-step needs the batch configuration: --global-batch, --dp/--micro/--accum "
            "or --log"
        )
    found = locate(plan, args.source, args.doc, schedule, args.until_step)
    s = summary(found, plan, ranks)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    log_steps = schedule.steps if schedule is not None else None
    print(_header(s, found, log_steps))
    print()
    print(_table(s["rows"], args.limit))
    return 0
