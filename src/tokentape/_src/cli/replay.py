"""`tokentape replay`: the exact batch of step N, its documents, and a hash to compare."""

from __future__ import annotations

import argparse
import json
from typing import Any, NamedTuple

import numpy as np

from tokentape._src.audit.replay import (
    DEFAULT_PREVIEW,
    DEFAULT_TOP,
    DocHits,
    Replayed,
    preview,
    replay,
    top_documents,
    window_hash,
)
from tokentape._src.cli.schedule import SCHEDULE_HELP, add_schedule_args, schedule_from_args
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import hash_dtype
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.steplog import StepRecord
from tokentape._src.util.text import fmt_int, key_values, table
from tokentape.errors import InputError

EPILOG = (
    SCHEDULE_HELP
    + """\
  (one is required; --rank needs --log or --dp/--micro/--accum)

examples:
  tokentape replay mix.json --step 41200 --log run/steps.jsonl
  tokentape replay mix.json --step 41200 --global-batch 1024 --top 20 --preview-chars 120
  tokentape replay mix.json --step 7 --dp 8 --micro 4 --accum 2 --rank 3
  tokentape replay mix.json --step 7 --log run/steps.jsonl --json > step7.json
"""
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="rebuild the exact batch of step N and show its documents",
        description="Rebuild the batch of optimizer step N offline from the plan (and the step\n"
        "log when the batch shape changed during the run), list the documents of its windows\n"
        "ranked by how many windows each fills, and check the rebuilt tokens against the hash\n"
        "the loader logged while training.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", metavar="PLAN.json", help="a resolved plan (tokentape plan --out)")
    p.add_argument("--step", type=int, required=True, metavar="N", help="the optimizer step")
    add_schedule_args(p)
    p.add_argument("--rank", type=int, metavar="R", help="only data-parallel rank R's share")
    p.add_argument("--top", type=int, default=DEFAULT_TOP, metavar="K", help="documents shown")
    p.add_argument(
        "--preview-chars",
        type=int,
        default=DEFAULT_PREVIEW,
        metavar="C",
        help=f"characters of each document's text shown (default {DEFAULT_PREVIEW})",
    )
    p.add_argument("--json", action="store_true", help="every position, its documents and hash")
    p.set_defaults(func=cmd)


def _schedule(args: argparse.Namespace, plan: Plan) -> tuple[Schedule, bool, StepRecord | None]:
    batching = schedule_from_args(args, plan, log_steps=(args.step,))
    schedule, ranks = batching.schedule, batching.ranks
    if schedule is None:
        raise InputError(
            "which positions make step N? give --log steps.jsonl (required when the batch "
            "shape ever changed), --global-batch B, or --dp/--micro/--accum"
        )
    if args.step < 0:
        raise InputError(f"--step must be >= 0, got {args.step}")
    record = None
    if batching.log is not None:
        if args.step >= batching.log.steps:
            raise InputError(
                f"--step {args.step}: beyond the step log {args.log}, which ends at step "
                f"{batching.log.steps - 1}"
            )
        record = batching.log.records[args.step]
    if args.rank is not None:
        if not ranks:
            raise InputError("--rank needs the ranks: give --log or --dp/--micro/--accum")
        dp = schedule.start(args.step)[1].dp_size
        if not 0 <= args.rank < dp:
            raise InputError(f"--rank {args.rank}: step {args.step} had dp ranks 0..{dp - 1}")
    for flag in ("top", "preview_chars"):
        if getattr(args, flag) < 0:
            raise InputError(f"--{flag.replace('_', '-')} must be >= 0")
    return schedule, ranks, record


def cmd(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    schedule, ranks, record = _schedule(args, plan)
    batcher = Batcher(plan, hash_dtype(plan))
    r = replay(plan, args.step, schedule, batcher)
    config = schedule.start(args.step)[1] if ranks else None
    hits = top_documents(r, batcher, args.rank)
    matches = None if record is None else record.tokens_hash == r.tokens_hash
    view = _View(r, plan, batcher, config, hits, args, matches)
    print(json.dumps(_json(view), indent=2) if args.json else _text(view))
    return 1 if matches is False else 0


class _View(NamedTuple):
    """What the command shows: the replayed step, and how to show it."""

    replayed: Replayed
    plan: Plan
    batcher: Batcher
    config: BatchConfig | None  # None when the ranks are unknown (--global-batch)
    hits: list[DocHits]
    args: argparse.Namespace
    matches: bool | None  # the logged tokens hash equals the rebuilt one (None: no log)


def _json(v: _View) -> dict[str, Any]:
    r, plan, batcher, config, hits, args, matches = v
    names = [s.name for s in plan.sources]
    positions = []
    for i in r.rows(args.rank).tolist():
        row: dict[str, Any] = {"position": int(r.batch.positions[i])}
        if config is not None:
            row |= {
                "dp_rank": int(r.placement.dp_rank[i]),
                "micro_step": int(r.placement.micro_step[i]),
                "row": int(r.placement.row[i]),
            }
        row |= {
            "source": names[int(r.batch.source[i])],
            "epoch": int(r.batch.epoch[i]),
            "sample": int(r.batch.sample[i]),
            "docs": list(range(int(r.doc_first[i]), int(r.doc_last[i]) + 1)),
            "tokens_hash": window_hash(r.batch.tokens[i], plan),
        }
        positions.append(row)
    return {
        "step": r.step,
        "consumed": r.consumed,
        "global_batch": r.global_batch,
        "dp": config.dp_size if config else None,
        "micro": config.micro if config else None,
        "accum": config.accum if config else None,
        "rank": args.rank,
        "index_hash": plan.index_hash,
        "tokens_hash": r.tokens_hash,
        "log_tokens_hash_matches": matches,
        "top": [_hit_dict(h, names, batcher, r, args) for h in hits[: args.top]],
        "positions": positions,
    }


def _hit_dict(
    h: DocHits, names: list[str], batcher: Batcher, r: Replayed, args: argparse.Namespace
) -> dict[str, Any]:
    n = r.rows(args.rank).size
    return {
        "source": names[h.source],
        "doc": h.doc,
        "windows": h.windows,
        "share": h.windows / n if n else 0.0,
        "tokens": h.tokens,
        "preview": preview(batcher, h.source, h.doc, args.preview_chars),
    }


def _text(v: _View) -> str:
    r, plan, batcher, config, hits, args, matches = v
    names = [s.name for s in plan.sources]
    rows = r.rows(args.rank)
    shape = (
        f"dp {config.dp_size} x micro {config.micro} x accum {config.accum}"
        if config is not None
        else "shape not given"
    )
    mix = np.bincount(r.batch.source[rows], minlength=len(names))
    share = ", ".join(f"{n} {c}" for n, c in zip(names, mix.tolist(), strict=True) if c)
    head = [
        ("step", fmt_int(r.step)),
        ("positions", f"{fmt_int(r.consumed)}..{fmt_int(r.consumed + r.global_batch - 1)}"),
        ("global batch", f"{fmt_int(r.global_batch)} ({shape})"),
    ]
    if args.rank is not None:
        first, last = r.batch.positions[rows[0]], r.batch.positions[rows[-1]]
        head.append(("rank", f"{args.rank}: positions {fmt_int(first)}..{fmt_int(last)}"))
    head += [
        ("windows by source", share),
        ("documents", fmt_int(len(hits))),
        ("tokens hash", r.tokens_hash),
    ]
    if matches is not None:
        head.append(
            (
                "step log",
                "tokens hash matches what the loader logged"
                if matches
                else "MISMATCH: these tokens are not what the loader logged for this step",
            )
        )
    n = rows.size
    body = [
        [
            names[h.source],
            h.doc,
            h.windows,
            f"{h.windows / n:.1%}",
            h.tokens,
            preview(batcher, h.source, h.doc, args.preview_chars),
        ]
        for h in hits[: args.top]
    ]
    header = ["source", "doc", "windows", "share", "doc tokens", "preview"]
    lines = [key_values(head), "", table(header, body)]
    if len(hits) > args.top:
        lines.append(f"  ... {fmt_int(len(hits) - args.top)} more documents (raise --top)")
    return "\n".join(lines)
