"""`tokentape locate`: every step (and rank) where a document is trained on."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from tokentape._src import api
from tokentape._src.audit.locate import (
    DEFAULT_LIMIT,
    Located,
    locate,
)
from tokentape._src.cli.schedule import SCHEDULE_HELP, add_schedule_args, shape_args
from tokentape._src.cli.wording import FLAGS
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.render.text import origin_words
from tokentape._src.util.text import fmt_int, key_values, table
from tokentape.errors import InputError

EPILOG = (
    SCHEDULE_HELP
    + """\
  (optional: without one only positions are shown; with --log, the search goes to the
  horizon or the log's end, whichever is later, and positions past its last step are
  reported as not yet trained)

Name the document by SOURCE DOC, or as you know it (the store must record provenance,
as `tokentape tokenize` does): --id VALUE (the id field of its record), or --input PATH
--record N (a jsonl line from 1, a parquet row from 0, 0 for a .txt file). Every source of
the plan is searched, or SOURCE alone when given. No match, or several, is one line that
says so (listing the matches).

examples:
  tokentape locate mix.json web 1234
  tokentape locate mix.json --id doc-8812 --log run/steps.jsonl
  tokentape locate mix.json web --input corpora/web/part-003.jsonl --record 5121
  tokentape locate mix.json web 1234 --dp 8 --micro 4 --accum 2 --limit 20
  tokentape locate mix.json math 7 --log run/steps.jsonl --until-step 5000
  tokentape locate mix.json code 42 --global-batch 512 --json
"""
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("source", metavar="SOURCE", nargs="?", help="source name in the plan")
    p.add_argument("doc", type=int, metavar="DOC", nargs="?", help="document id within the source")
    handle = p.add_argument_group("name the document as you know it (instead of DOC)")
    handle.add_argument("--id", metavar="VALUE", help="the id of its record (tokenize --id-key)")
    handle.add_argument("--input", metavar="PATH", help="the input file or URL it was read from")
    handle.add_argument(
        "--record", type=int, metavar="N", help="its record in --input (line from 1, row from 0)"
    )
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
    steps: list[int] = found.placement.step[found.trained].tolist()
    return steps


def summary(found: Located, plan: Plan, ranks: bool) -> dict[str, Any]:
    """Everything the command prints, rows included, as JSON-friendly values."""
    steps = _steps(found)
    known = found.placement is not None
    return {
        "index_hash": plan.index_hash,
        "source": found.source,
        "doc": found.doc_id,
        "origin": None if found.origin is None else found.origin.to_json(),
        "excised_from": found.excised_from,
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
        ("from", origin_words(found.origin)),
        ("tokens", f"{fmt_int(s['tokens'])} (tokens {fmt_int(start)}..{fmt_int(end - 1)})"),
        ("samples", samples),
        ("searched", searched),
        ("positions", f"{fmt_int(s['count'])} in {passes} pass{'es' if passes != 1 else ''}"),
    ]
    if found.excised_from is not None:
        rows.append(
            ("excised", f"from consumed {fmt_int(found.excised_from)} on: never trained after")
        )
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
    cell: int | str = value
    return cell


def cmd(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    if args.limit < 0:
        raise InputError(f"--limit must be >= 0, got {args.limit}")
    shape = api.locate_shape(plan, **shape_args(args), until_step=args.until_step, wording=FLAGS)
    schedule = shape.schedule
    source, doc = api.named_document(
        plan, args.source, args.doc, args.id, args.input, args.record, FLAGS
    )
    found = locate(plan, source, doc, schedule, args.until_step)
    s = summary(found, plan, shape.ranks)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    log_steps = schedule.steps if schedule is not None else None
    print(_header(s, found, log_steps))
    print()
    print(_table(s["rows"], args.limit))
    return 0
