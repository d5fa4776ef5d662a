"""`tokentape replay`: the exact batch of step N, its documents, and a hash to compare."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, NamedTuple

import numpy as np

from tokentape._src import api
from tokentape._src.audit.replay import (
    DEFAULT_PREVIEW,
    DEFAULT_TEXT_CHARS,
    DEFAULT_TOP,
    EOD_MARK,
    EOD_MARK_ESCAPED,
    DocHits,
    Replayed,
    eod_offsets,
    preview,
    replay,
    top_documents,
    window_hash,
    window_text,
)
from tokentape._src.cli.schedule import SCHEDULE_HELP, add_schedule_args, shape_args
from tokentape._src.cli.wording import FLAGS
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.render.text import origin_words
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import hash_dtype
from tokentape._src.train.partition import BatchConfig
from tokentape._src.train.schedule import Schedule
from tokentape._src.train.steplog import StepRecord
from tokentape._src.util.text import escaped, fmt_int, key_values, table
from tokentape.errors import InputError

EPILOG = (
    SCHEDULE_HELP
    + """\
  (one is required; --rank, --micro-step and --row need --log or --dp/--micro/--accum)

the text trained on (--show-text):
  each window of the step (or of the chosen --rank/--micro-step/--row) is headed by where it
  is in the step and, one line per document in text order, where that document came from
  (input and record, and its id; "not recorded" for a store made before provenance), then
  decoded from its seq_len + 1 tokens; an end-of-document token is shown as the marker """
    + EOD_MARK
    + """, so the text
  between two markers is one document (a window starts and ends inside documents); a
  document's own text """
    + EOD_MARK
    + " is shown as "
    + EOD_MARK_ESCAPED
    + """. At most --text-chars characters
  are shown per window (0: the whole window), never cutting a marker. Control characters
  other than newline and tab are escaped (in the preview column too).

examples:
  tokentape replay mix.json --step 41200 --log run/steps.jsonl
  tokentape replay mix.json --step 41200 --global-batch 1024 --top 20 --preview-chars 120
  tokentape replay mix.json --step 7 --dp 8 --micro 4 --accum 2 --rank 3
  tokentape replay mix.json --step 7 --log run/steps.jsonl --json > step7.json
  tokentape replay mix.json --step 7 --log run/steps.jsonl --rank 0 --micro-step 1 --show-text
  tokentape replay mix.json --step 7 --log run/steps.jsonl --json --tokens --show-text
"""
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument(
        "--micro-step", type=int, metavar="M", help="only micro-step M's windows (0..accum-1)"
    )
    p.add_argument("--row", type=int, metavar="I", help="only row I of each micro-batch")
    p.add_argument(
        "--show-text",
        action="store_true",
        help=f"decode each window trained on, {EOD_MARK} marking each end-of-document token",
    )
    p.add_argument(
        "--text-chars",
        type=int,
        default=DEFAULT_TEXT_CHARS,
        metavar="C",
        help=f"characters of each window's text shown (default {DEFAULT_TEXT_CHARS}; 0: all)",
    )
    p.add_argument("--json", action="store_true", help="every position, its documents and hash")
    p.add_argument("--tokens", action="store_true", help="with --json: each window's token ids too")
    p.set_defaults(func=cmd)


def _schedule(args: argparse.Namespace, plan: Plan) -> tuple[Schedule, bool, StepRecord | None]:
    """The step's schedule, whether it names the ranks, and the step log's record of the step
    (None without --log). The batch shape and --step are checked by ``api.replay_shape``, as
    ``tokentape.replay`` checks them; the flags only the command has (which windows to show,
    and how) are checked here."""
    schedule, shape = api.replay_shape(plan, args.step, **shape_args(args), wording=FLAGS)
    ranks = shape.ranks
    record = None if shape.log is None else shape.log.records[args.step]
    config = schedule.start(args.step)[1]
    for flag, size, what in (
        ("rank", config.dp_size, "dp ranks"),
        ("micro_step", config.accum, "micro-steps"),
        ("row", config.micro, "rows per micro-batch"),
    ):
        value = getattr(args, flag)
        name = "--" + flag.replace("_", "-")
        if value is None:
            continue
        if not ranks:
            raise InputError(f"{name} needs the ranks: give --log or --dp/--micro/--accum")
        if not 0 <= value < size:
            raise InputError(f"{name} {value}: step {args.step} had {what} 0..{size - 1}")
    if args.tokens and not args.json:
        raise InputError("--tokens goes with --json (the text view shows --show-text)")
    for flag in ("top", "preview_chars", "text_chars"):
        if getattr(args, flag) < 0:
            raise InputError(f"--{flag.replace('_', '-')} must be >= 0")
    return schedule, ranks, record


def cmd(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    schedule, ranks, record = _schedule(args, plan)
    batcher = Batcher(plan, hash_dtype(plan))
    r = replay(plan, args.step, schedule, batcher)
    config = schedule.start(args.step)[1] if ranks else None
    hits = top_documents(r, batcher, rows=_rows(r, args))
    matches = None if record is None else record.tokens_hash == r.tokens_hash
    view = _View(r, plan, batcher, config, hits, args, matches)
    print(_dumps(_json(view)) if args.json else _text(view))
    return 1 if matches is False else 0


def _rows(r: Replayed, args: argparse.Namespace) -> np.ndarray:
    """The windows chosen by --rank, --micro-step and --row."""
    return r.rows(args.rank, args.micro_step, args.row)


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
    for i in _rows(r, args).tolist():
        source = int(r.batch.source[i])
        docs = list(range(int(r.doc_first[i]), int(r.doc_last[i]) + 1))
        row: dict[str, Any] = {"position": int(r.batch.positions[i])}
        if config is not None:
            row |= {
                "dp_rank": int(r.placement.dp_rank[i]),
                "micro_step": int(r.placement.micro_step[i]),
                "row": int(r.placement.row[i]),
            }
        row |= {
            "source": names[source],
            "epoch": int(r.batch.epoch[i]),
            "sample": int(r.batch.sample[i]),
            "docs": docs,
            "origins": [_origin_json(batcher, source, doc) for doc in docs],
            "tokens_hash": window_hash(r.batch.tokens[i], plan),
        }
        if args.tokens:
            row["tokens"] = r.batch.tokens[i].tolist()
        if args.show_text:
            text = window_text(r, batcher, i, args.text_chars)
            row |= {"eod_at": text.eod_at, "text": text.text, "text_truncated": text.truncated}
        elif args.tokens:
            row["eod_at"] = eod_offsets(r, batcher, i)
        positions.append(row)
    return {
        "step": r.step,
        "consumed": r.consumed,
        "global_batch": r.global_batch,
        "dp": config.dp_size if config else None,
        "micro": config.micro if config else None,
        "accum": config.accum if config else None,
        "rank": args.rank,
        "micro_step": args.micro_step,
        "row": args.row,
        "index_hash": plan.index_hash,
        "tokens_hash": r.tokens_hash,
        "log_tokens_hash_matches": matches,
        "top": [_hit_dict(h, names, batcher, r, args) for h in hits[: args.top]],
        "positions": positions,
    }


def _dumps(data: dict[str, Any]) -> str:
    """``data`` as indented JSON, each window's token ids on one line (not one per line)."""
    lists = []
    for row in data["positions"]:
        if "tokens" in row:
            lists.append(json.dumps(row["tokens"]))
            row["tokens"] = f"\0{len(lists) - 1}\0"
    # A key is matched only outside strings: inside one, its quotes would be escaped.
    pattern = r'"tokens": "\\u0000(\d+)\\u0000"'
    return re.sub(pattern, lambda m: '"tokens": ' + lists[int(m[1])], json.dumps(data, indent=2))


def _hit_dict(
    h: DocHits, names: list[str], batcher: Batcher, r: Replayed, args: argparse.Namespace
) -> dict[str, Any]:
    n = _rows(r, args).size
    return {
        "source": names[h.source],
        "doc": h.doc,
        "windows": h.windows,
        "share": h.windows / n if n else 0.0,
        "tokens": h.tokens,
        "origin": _origin_json(batcher, h.source, h.doc),
        "preview": preview(batcher, h.source, h.doc, args.preview_chars),
    }


def _origin_json(batcher: Batcher, source: int, doc: int) -> dict[str, Any] | None:
    """Where a document came from (``Origin.to_json``); None where the store records none."""
    origin = batcher.sources[source].provenance(doc)
    return None if origin is None else origin.to_json()


def _origin_cells(batcher: Batcher, source: int, doc: int) -> tuple[str, str]:
    """Where a document came from (``a.jsonl:17``) and its id, as the table shows them; ``-``
    where the store records none."""
    origin = batcher.sources[source].provenance(doc)
    if origin is None:
        return "-", "-"
    return _printable(origin.where), _printable(origin.id or "-")


def _text(v: _View) -> str:
    r, plan, batcher, config, hits, args, matches = v
    names = [s.name for s in plan.sources]
    rows = _rows(r, args)
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
    if args.rank is not None and args.micro_step is None and args.row is None:
        first, last = r.batch.positions[rows[0]], r.batch.positions[rows[-1]]
        head.append(("rank", f"{args.rank}: positions {fmt_int(first)}..{fmt_int(last)}"))
    elif (args.rank, args.micro_step, args.row) != (None, None, None):
        chosen = ", ".join(
            f"{name} {value}"
            for name, value in (
                ("rank", args.rank),
                ("micro-step", args.micro_step),
                ("row", args.row),
            )
            if value is not None
        )
        head.append(("windows", f"{chosen}: {fmt_int(rows.size)} of {fmt_int(r.global_batch)}"))
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
            *_origin_cells(batcher, h.source, h.doc),
            _printable(preview(batcher, h.source, h.doc, args.preview_chars)),
        ]
        for h in hits[: args.top]
    ]
    header = ["source", "doc", "windows", "share", "doc tokens", "origin", "id", "preview"]
    lines = [key_values(head), "", table(header, body)]
    if len(hits) > args.top:
        lines.append(f"  ... {fmt_int(len(hits) - args.top)} more documents (raise --top)")
    if args.show_text:
        lines += ["", f"windows trained on ({EOD_MARK}: end of a document)"]
        lines += [_window_block(v, i) for i in rows.tolist()]
    return "\n".join(lines)


def _window_block(v: _View, i: int) -> str:
    """One window: where it came from, then its text, indented."""
    r, plan, batcher, config, _hits, args, _matches = v
    where = [f"position {fmt_int(int(r.batch.positions[i]))}"]
    if config is not None:
        where.append(
            f"rank {int(r.placement.dp_rank[i])} micro-step {int(r.placement.micro_step[i])} "
            f"row {int(r.placement.row[i])}"
        )
    first, last = int(r.doc_first[i]), int(r.doc_last[i])
    where.append(
        f"{plan.sources[int(r.batch.source[i])].name} sample {fmt_int(int(r.batch.sample[i]))} "
        f"(pass {int(r.batch.epoch[i])}), docs {first}" + (f"..{last}" if last > first else "")
    )
    text = window_text(r, batcher, i, args.text_chars, whole_marks=True)
    body = "\n".join("    " + line for line in _printable(text.text).split("\n"))
    tail = (
        "\n    … (more of this window not shown: raise --text-chars, 0 for all)"
        if text.truncated
        else ""
    )
    head = ["  " + " · ".join(where), *_origin_lines(batcher, int(r.batch.source[i]), first, last)]
    return "\n" + "\n".join(head) + "\n" + body + tail


def _origin_lines(batcher: Batcher, source: int, first: int, last: int) -> list[str]:
    """Where each of documents ``first..last`` of a window came from, one line each in the
    order their text follows (``  doc 3: data/web.jsonl:17, id a-17``); one line for them all
    where the store records none."""
    origins = [batcher.sources[source].provenance(doc) for doc in range(first, last + 1)]
    if origins[0] is None:
        docs = f"doc {first}" if last == first else f"docs {first}..{last}"
        return [f"  {docs}: {origin_words(None)}"]
    return [f"  doc {o.doc}: {origin_words(o)}" for o in origins if o is not None]


def _printable(text: str) -> str:
    """``text`` with control characters other than newline and tab escaped (safe on a
    terminal)."""
    return escaped(text, keep="\n\t")
