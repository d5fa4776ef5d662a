"""Replay: the exact batch of optimizer step N, and the documents it was made of.

Every batch is a pure function of the plan and a position, so step N is rebuilt offline:

    step N ─schedule (step log, or B)→ positions [consumed, consumed + B)
      ─tape.resolve→ (source, epoch, sample) ─store→ token windows, and the documents each
      window overlaps (the same rule as ``Source.docs_in``)

The documents are then ranked by how many of the step's windows they appear in. With the step
log, the rebuilt step's tokens hash is checked against the one the loader logged while training.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tokentape._src.audit.runs import (
    SCHEDULE_HELP,
    add_schedule_args,
    check_fits,
    schedule_from_args,
)
from tokentape._src.plan.plan import Plan, load_plan
from tokentape._src.render.text import fmt_int, key_values, table
from tokentape._src.tape.blend import MAX_POSITION
from tokentape._src.train.batch import Batch, Batcher
from tokentape._src.train.loader import hash_dtype, step_tokens_hash
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Placement, Schedule
from tokentape._src.train.steplog import StepRecord
from tokentape.errors import TokentapeError

DEFAULT_TOP = 10
_BYTES_PER_WINDOW = 160
"""Memory per window besides its tokens: position, source, pass, sample, placement, documents
(int64 each) and the temporaries of ranking them."""
DEFAULT_PREVIEW = 80


@dataclass(frozen=True)
class DocHits:
    """One document of the step: in how many of the step's windows it appears."""

    source: int
    doc: int
    windows: int
    tokens: int  # the document's length in tokens (its end-of-document token included)


@dataclass(frozen=True)
class Replayed:
    """Step ``step``: its positions, where each went, the batch, and each window's documents."""

    step: int
    consumed: int
    global_batch: int
    config: BatchConfig  # the step's shape (dp 1 x B when only the global batch is known)
    batch: Batch  # whole step, in position order
    placement: Placement
    doc_first: np.ndarray  # per window: the first document it overlaps
    doc_last: np.ndarray  # per window: the last document it overlaps (inclusive)
    tokens_hash: str  # the step log's hash of this rebuilt step

    def rows(self, rank: int | None = None) -> np.ndarray:
        """Indices of the step's windows (all, or one DP rank's)."""
        if rank is None:
            return np.arange(self.batch.positions.size)
        return np.flatnonzero(self.placement.dp_rank == rank)


def _doc_ranges(batcher: Batcher, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """Per window, the first and last document overlapping tokens [kL, kL + L]."""
    seq_len = batcher.plan.seq_len
    first = np.empty(batch.positions.size, dtype=np.int64)
    last = np.empty(batch.positions.size, dtype=np.int64)
    for d in np.unique(batch.source).tolist():
        rows = np.flatnonzero(batch.source == d)
        starts = batcher.sources[d].doc_starts
        lo = batch.sample[rows] * seq_len
        first[rows] = np.searchsorted(starts, lo, side="right") - 1
        last[rows] = np.searchsorted(starts, lo + seq_len, side="right") - 1
    return first, last


def replay(plan: Plan, step: int, schedule: Schedule, batcher: Batcher | None = None) -> Replayed:
    """Rebuild step ``step`` of a run with ``schedule``."""
    consumed, config = schedule.start(step)
    if schedule.steps is not None and step >= schedule.steps:
        raise TokentapeError(
            f"step {step} is beyond the step log, which ends at step {schedule.steps - 1}"
        )
    if consumed + config.global_batch > MAX_POSITION:
        raise TokentapeError(f"step {step}: the step ends beyond position 2**62")
    itemsize = batcher.dtype.itemsize if batcher is not None else hash_dtype(plan).itemsize
    per_window = (plan.seq_len + 1) * itemsize + _BYTES_PER_WINDOW
    check_fits(
        config.global_batch * per_window,
        f"step {step} ({fmt_int(config.global_batch)} windows of {fmt_int(plan.seq_len + 1)} "
        "tokens)",
    )
    batcher = batcher if batcher is not None else Batcher(plan, hash_dtype(plan))
    positions = np.arange(consumed, consumed + config.global_batch, dtype=np.int64)
    batch = batcher.batch(positions)
    first, last = _doc_ranges(batcher, batch)
    return Replayed(
        step,
        consumed,
        config.global_batch,
        config,
        batch,
        schedule.place(positions),
        first,
        last,
        step_tokens_hash(batch, plan),
    )


def top_documents(r: Replayed, batcher: Batcher, rank: int | None = None) -> list[DocHits]:
    """The documents of the step (or of one rank's share), most windows first."""
    rows = r.rows(rank)
    counts = r.doc_last[rows] - r.doc_first[rows] + 1
    source = np.repeat(r.batch.source[rows], counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    doc = np.repeat(r.doc_first[rows], counts) + offsets
    pairs, windows = np.unique(np.stack([source, doc], axis=1), axis=0, return_counts=True)
    order = np.lexsort((pairs[:, 1], pairs[:, 0], -windows))  # most windows, then by id
    hits = []
    for i in order.tolist():
        d, k = int(pairs[i, 0]), int(pairs[i, 1])
        lo, hi = batcher.sources[d].doc_span(k)
        hits.append(DocHits(d, k, int(windows[i]), hi - lo))
    return hits


def preview(batcher: Batcher, source: int, doc: int, chars: int) -> str:
    """The first ``chars`` characters of a document's text, on one line."""
    src = batcher.sources[source]
    lo, hi = src.doc_span(doc)
    text = src.decode(src.tokens(lo, min(hi, lo + chars + 8)))  # a token is at least a char
    one_line = " ".join(text.split())
    return one_line[:chars] + ("…" if len(one_line) > chars else "")


def window_hash(tokens: np.ndarray, plan: Plan) -> str:
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype=hash_dtype(plan))).hexdigest()


# --- the command ----------------------------------------------------------------------------

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
        raise TokentapeError(
            "which positions make step N? give --log steps.jsonl (required when the batch "
            "shape ever changed), --global-batch B, or --dp/--micro/--accum"
        )
    if args.step < 0:
        raise TokentapeError(f"--step must be >= 0, got {args.step}")
    record = None
    if batching.log is not None:
        if args.step >= batching.log.steps:
            raise TokentapeError(
                f"--step {args.step}: beyond the step log {args.log}, which ends at step "
                f"{batching.log.steps - 1}"
            )
        record = batching.log.records[args.step]
    if args.rank is not None:
        if not ranks:
            raise TokentapeError("--rank needs the ranks: give --log or --dp/--micro/--accum")
        dp = schedule.start(args.step)[1].dp_size
        if not 0 <= args.rank < dp:
            raise TokentapeError(f"--rank {args.rank}: step {args.step} had dp ranks 0..{dp - 1}")
    for flag in ("top", "preview_chars"):
        if getattr(args, flag) < 0:
            raise TokentapeError(f"--{flag.replace('_', '-')} must be >= 0")
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
