"""`tokentape megatron replay|locate`: audit a Megatron-LM run from its data cache."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

from tokentape._src.audit.megatron_locate import Landing, dataset_map, landings
from tokentape._src.audit.megatron_replay import Iteration, Shape, check_shape, replay_iteration
from tokentape._src.audit.replay import EOD_MARK
from tokentape._src.cli.storage import local_only
from tokentape._src.megatron.iterations import (
    BatchSchedule,
    LoggedSchedule,
    Rampup,
    parse_steps,
    read_megatron_log,
)
from tokentape._src.megatron.run import MegatronRun
from tokentape._src.megatron.select import RunQuery, open_run
from tokentape._src.store.tokenizers import Tokenizer, load_tokenizer
from tokentape._src.util.text import fmt_int, table
from tokentape.errors import InputError

DEFAULT_TOP = 10
DEFAULT_PREVIEW = 60

RUN_HELP = """\
the run (docs/megatron.md, "Replay a Megatron-LM run"):
  CACHE_DIR is the run's --data-cache-path; without one, megatron-core kept each prefix's
  arrays in PREFIX/cache/GPTDataset_indices (searched too) and never saved the blend: give
  --weights and --samples to rebuild it. --prefix repeats the run's --data-path prefixes in
  its order (moved data is matched by file name). A document is a sequence of the .idx, as
  megatron-core's GPTDataset counts them.

the schedule (one of):
  --global-batch B [--rampup START INCREMENT SAMPLES] [--decrease-batch-size-if-needed]
  --step-batch-size-schedule "0:768 250B:1536"  Megatron-LM's steps (thresholds in tokens)
  --log FILE      the run's training log (its 'consumed samples' column)
  --consumed C    samples consumed before the iteration (replay; with --global-batch)
  iterations count from 1, as the log prints them; --micro-batch and --dp place each sample
  on its data-parallel rank (micro-batch m of rank r: C + m*mbs*dp + r*mbs + [0, mbs)).
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "megatron",
        help="replay and locate a Megatron-LM run from its data cache",
        description="Audit a Megatron-LM run that never used tokentape, from what it left on\n"
        "disk: its data cache (--data-cache-path) and its .bin/.idx prefixes, read in place.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    replay = actions.add_parser(
        "replay",
        help="the samples and documents of iteration N",
        description="Rebuild the global batch of iteration N (or one rank's share) from the\n"
        "run's data cache and list its documents, most samples first.",
        epilog=RUN_HELP
        + """
examples:
  tokentape megatron replay cache/ --prefix data/web_text_document --prefix data/code \\
      --iteration 1200 --global-batch 512
  tokentape megatron replay cache/ --prefix data/web --prefix data/code --iteration 1200 \\
      --log train.log --micro-batch 4 --dp 64 --rank 3 --tokenizer tokenizer.json --show-text
  tokentape megatron replay cache/ --prefix data/web --iteration 7 --global-batch 32 --json
""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _run_args(replay)
    replay.add_argument("--iteration", type=int, required=True, metavar="N", help="from 1")
    replay.add_argument("--consumed", type=int, metavar="C", help="samples consumed before it")
    replay.add_argument("--rank", type=int, metavar="R", help="only data-parallel rank R's share")
    replay.add_argument("--top", type=int, default=DEFAULT_TOP, metavar="K", help="documents shown")
    replay.add_argument(
        "--preview-chars",
        type=int,
        default=DEFAULT_PREVIEW,
        metavar="C",
        help=f"characters of each document shown, with --tokenizer (default {DEFAULT_PREVIEW})",
    )
    replay.add_argument(
        "--show-text",
        action="store_true",
        help=f"decode each sample (needs --tokenizer), {EOD_MARK} at each document's end",
    )
    replay.add_argument("--tokens", action="store_true", help="with --json: each sample's tokens")
    replay.set_defaults(func=cmd_replay)

    locate = actions.add_parser(
        "locate",
        help="every iteration (and rank) a document lands in",
        description="List every sample of the cache's horizon that reads a document, with its\n"
        "iteration and rank, through an inverted map of the cache built once (kept in\n"
        "--map-dir when given: nothing is written elsewhere).",
        epilog=RUN_HELP
        + """
examples:
  tokentape megatron locate cache/ --prefix data/web --prefix data/code --doc web:3325 \\
      --global-batch 512 --map-dir maps/
  tokentape megatron locate cache/ --prefix data/web --doc 0:17 --log train.log --json
""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _run_args(locate)
    locate.add_argument(
        "--doc",
        required=True,
        metavar="PREFIX:N",
        help="sequence N of a prefix (its path, file name, or position among --prefix)",
    )
    locate.add_argument("--map-dir", metavar="DIR", help="keep the inverted map here (a folder)")
    locate.set_defaults(func=cmd_locate)


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("cache", metavar="CACHE_DIR", help="the run's --data-cache-path")
    p.add_argument(
        "--prefix",
        action="append",
        required=True,
        metavar="PREFIX",
        help="a .bin/.idx prefix of the run, in its --data-path order (repeat)",
    )
    p.add_argument("--split", default="train", choices=("train", "valid", "test"))
    p.add_argument(
        "--no-extra-token",
        action="store_true",
        help="the run turned add_extra_token_to_sequence off (samples of L tokens, not L + 1)",
    )
    p.add_argument(
        "--cache-id", metavar="MD5", help="the run's blend, when the cache holds several"
    )
    p.add_argument("--weights", metavar="W,W,...", help="the blend's weights (to rebuild it)")
    p.add_argument("--samples", type=int, metavar="T", help="the samples the run asked for")
    p.add_argument("--global-batch", type=int, metavar="B", help="--global-batch-size")
    p.add_argument(
        "--rampup",
        type=int,
        nargs=3,
        metavar=("START", "INCREMENT", "SAMPLES"),
        help="--rampup-batch-size",
    )
    p.add_argument(
        "--step-batch-size-schedule",
        dest="steps",
        metavar="SPEC",
        help='Megatron-LM\'s "0:768 250B:1536 ..." (token thresholds: global batch)',
    )
    p.add_argument(
        "--decrease-batch-size-if-needed",
        action="store_true",
        help="the run rounded its batch down to a multiple of --micro-batch x --dp",
    )
    p.add_argument("--micro-batch", type=int, metavar="M", help="--micro-batch-size")
    p.add_argument("--dp", type=int, metavar="D", help="the data-parallel size")
    p.add_argument("--log", metavar="FILE", help="the run's training log")
    p.add_argument("--tokenizer", metavar="SPEC", help="to decode previews (tokenizer.json, ...)")
    p.add_argument("--json", action="store_true", help="the same, as JSON")


def _weights(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        weights = tuple(float(w) for w in text.split(","))
    except ValueError:
        raise InputError(f"--weights {text!r}: expected numbers separated by commas") from None
    if not all(0 < w < math.inf for w in weights):
        raise InputError(f"--weights {text!r}: expected positive finite numbers")
    return weights


def _open(args: argparse.Namespace) -> MegatronRun:
    local_only("--map-dir", getattr(args, "map_dir", None), "the inverted map is kept")
    local_only("CACHE_DIR", args.cache, "the run's data cache", read=True)
    for prefix in args.prefix:
        local_only("--prefix", prefix, "a prefix's .bin and .idx", read=True)
    query = RunQuery(
        cache_dirs=(Path(args.cache),),
        prefixes=tuple(Path(p) for p in args.prefix),
        split=args.split,
        extra_token=not args.no_extra_token,
        cache_id=args.cache_id,
        weights=_weights(args.weights),
        samples=args.samples,
    )
    if (query.weights is None) != (query.samples is None):
        raise InputError("--weights and --samples go together (to rebuild a blend never saved)")
    if query.samples is not None and query.samples < 1:
        raise InputError("--samples must be >= 1")
    if args.cache_id is not None and not re.fullmatch(r"[0-9a-f]{1,32}", args.cache_id):
        raise InputError(f"--cache-id {args.cache_id!r}: expected the start of an md5 (hex)")
    run = open_run(query)
    if query.weights is not None and not run.rebuilt:
        raise InputError(
            "--weights and --samples rebuild a blend never saved; the cache holds this run's "
            "blend: drop them"
        )
    return run


def _schedule(args: argparse.Namespace, seq_len: int) -> BatchSchedule | LoggedSchedule:
    """The run's batch schedule from the flags (``seq_len``: the run's, for the token
    thresholds of ``--step-batch-size-schedule``)."""
    given = [args.global_batch is not None, args.rampup is not None, args.steps is not None]
    if args.log is not None:
        if any(given):
            raise InputError(
                "--log gives the batch sizes: drop --global-batch, --rampup and "
                "--step-batch-size-schedule"
            )
        return read_megatron_log(args.log)
    if args.steps is not None:
        if args.global_batch is not None:
            raise InputError(
                "--step-batch-size-schedule sets the batch sizes: drop --global-batch (Megatron-LM "
                "ignores --global-batch-size with it)"
            )
        steps = parse_steps(args.steps, seq_len)
        return BatchSchedule(
            steps[-1][1], None, args.decrease_batch_size_if_needed, args.micro_batch, args.dp, steps
        )
    if args.global_batch is None:
        raise InputError(
            "the schedule: give --global-batch B, --step-batch-size-schedule or --log FILE"
        )
    rampup = None if args.rampup is None else Rampup(*args.rampup)
    return BatchSchedule(
        args.global_batch, rampup, args.decrease_batch_size_if_needed, args.micro_batch, args.dp
    )


def _tokenizer(args: argparse.Namespace) -> Tokenizer | None:
    return None if args.tokenizer is None else load_tokenizer(args.tokenizer)


def _run_json(run: MegatronRun) -> dict[str, Any]:
    return {
        "cache_id": run.description.md5 if run.description else None,
        "blend_rebuilt": run.rebuilt,
        "split": run.datasets[0].description.split,
        "sequence_length": run.seq_len,
        "add_extra_token_to_sequence": run.extra_token,
        "samples": len(run),
        "datasets": [str(d.prefix.prefix) for d in run.datasets],
    }


def _run_line(run: MegatronRun) -> str:
    ds = run.datasets[0]
    if run.description is None:
        blend = "blend rebuilt with megatron-core's rule (never saved)"
    else:
        blend = f"{'blend' if run.dataset_index is not None else 'dataset'} {run.description.md5}"
    return (
        f"{blend}, {ds.description.split} split: {len(run.datasets)} dataset(s), "
        f"{fmt_int(len(run))} samples of {run.seq_len}"
        f"{' + 1' if run.extra_token else ''} tokens, seed {ds.description.settings['random_seed']}"
    )


def _preview(run: MegatronRun, tok: Tokenizer | None, d: int, doc: int, chars: int) -> str:
    prefix = run.datasets[d].prefix
    n = int(prefix.index.sequence_lengths[doc])
    ids = prefix.read(doc, 0, min(n, chars + 8))
    if tok is None:
        shown = " ".join(str(i) for i in ids[:8].tolist())
        return f"[{shown}{' …' if n > 8 else ''}]"
    text = " ".join(tok.decode(ids.tolist()).split())
    return text[:chars] + ("…" if len(text) > chars else "")


def _doc_name(run: MegatronRun, d: int, doc: int) -> str:
    return f"{run.datasets[d].prefix.prefix.name}:{doc}"


def _sample_text(run: MegatronRun, tok: Tokenizer, s: Any) -> str:
    """A sample decoded, EOD_MARK after each document it reads to the end."""
    prefix = run.datasets[s.dataset].prefix
    out = []
    for p in s.pieces:
        ids = prefix.read(p.doc, p.start, p.stop).tolist()
        ends = p.stop == int(prefix.index.sequence_lengths[p.doc])
        body = ids[:-1] if ends and ids else ids
        out.append(tok.decode(body) + (EOD_MARK if ends else ""))
    return "".join(out)


def cmd_replay(args: argparse.Namespace) -> int:
    for flag in ("top", "preview_chars"):
        if getattr(args, flag) < 0:
            raise InputError(f"--{flag.replace('_', '-')} must be >= 0")
    if args.tokens and not args.json:
        raise InputError("--tokens goes with --json")
    if args.show_text and args.tokenizer is None:
        raise InputError("--show-text needs --tokenizer (the .idx records no vocabulary)")
    shape = Shape(args.micro_batch, args.dp)
    if args.consumed is not None:
        if args.log is not None or args.global_batch is None:
            raise InputError("--consumed goes with --global-batch (not --log)")
        if args.consumed < 0:
            raise InputError("--consumed must be >= 0")
        if args.global_batch < 1:
            raise InputError("--global-batch: expected a positive batch size")
    tok = _tokenizer(args)
    run = _open(args)
    if args.consumed is not None:
        consumed, batch = args.consumed, args.global_batch
    else:
        consumed, batch = _schedule(args, run.seq_len).consumed_before(args.iteration)
    check_shape(shape, batch, args.iteration)
    it = replay_iteration(run, args.iteration, consumed, batch, shape, args.rank)
    print(
        json.dumps(_replay_json(run, it, tok, args), indent=2)
        if args.json
        else _replay_text(run, it, tok, args)
    )
    return 0


def _replay_json(
    run: MegatronRun, it: Iteration, tok: Tokenizer | None, args: argparse.Namespace
) -> dict[str, Any]:
    samples = []
    for s in it.samples:
        row: dict[str, Any] = {"sample": s.g}
        if s.place is not None:
            row |= {"rank": s.place[0], "micro_batch": s.place[1], "row": s.place[2]}
        row |= {
            "dataset": s.dataset,
            "dataset_sample": s.sample,
            "documents": [
                {"doc": p.doc, "start": p.start, "stop": p.stop}
                for p in s.pieces
                if p.stop > p.start
            ],
        }
        if args.tokens:
            row["tokens"] = s.tokens.tolist()
        if args.show_text and tok is not None:
            row["text"] = _sample_text(run, tok, s)
        samples.append(row)
    top = [
        {
            "dataset": h.dataset,
            "prefix": str(run.datasets[h.dataset].prefix.prefix),
            "doc": h.doc,
            "samples": h.samples,
            "tokens": h.tokens,
            "length": int(run.datasets[h.dataset].prefix.index.sequence_lengths[h.doc]),
        }
        for h in it.documents()[: args.top]
    ]
    return {
        "iteration": it.iteration,
        "consumed": it.consumed,
        "global_batch": it.global_batch,
        "micro_batch": it.shape.micro_batch,
        "dp": it.shape.dp,
        "rank": args.rank,
        "run": _run_json(run),
        "top": top,
        "samples": samples,
    }


def _replay_text(
    run: MegatronRun, it: Iteration, tok: Tokenizer | None, args: argparse.Namespace
) -> str:
    last = it.consumed + it.global_batch - 1
    lines = [
        f"iteration {fmt_int(it.iteration)}: samples {fmt_int(it.consumed)}..{fmt_int(last)} "
        f"(global batch {fmt_int(it.global_batch)})"
        + (f", rank {args.rank}'s {len(it.samples)}" if args.rank is not None else ""),
        _run_line(run),
        "",
    ]
    docs = it.documents()
    rows = [
        [
            str(h.samples),
            fmt_int(h.tokens),
            _doc_name(run, h.dataset, h.doc),
            fmt_int(int(run.datasets[h.dataset].prefix.index.sequence_lengths[h.doc])),
            _preview(run, tok, h.dataset, h.doc, args.preview_chars),
        ]
        for h in docs[: args.top]
    ]
    lines.append(
        f"documents ({fmt_int(len(docs))}; top {min(args.top, len(docs))}, most samples first):"
    )
    lines.append(table(["samples", "tokens", "document", "length", "preview"], rows))
    lines.append("")
    head = (
        ["sample"]
        + (["rank", "micro", "row"] if it.shape.known() else [])
        + ["dataset", "its sample", "documents (tokens)"]
    )
    body = []
    for s in it.samples:
        place = [str(x) for x in s.place] if s.place is not None else []
        docs_of = ", ".join(f"{p.doc} ({p.stop - p.start})" for p in s.pieces if p.stop > p.start)
        body.append(
            [
                fmt_int(s.g),
                *place,
                run.datasets[s.dataset].prefix.prefix.name,
                fmt_int(s.sample),
                docs_of,
            ]
        )
    lines.append(table(head, body))
    if args.show_text and tok is not None:
        for s in it.samples:
            lines += ["", f"--- sample {fmt_int(s.g)} ---", _sample_text(run, tok, s)]
    return "\n".join(lines)


def _doc_arg(run: MegatronRun, text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(.*):([0-9]{1,18})", text)
    if match is None:
        raise InputError(f"--doc {text!r}: expected PREFIX:N (a prefix and a sequence number)")
    name, doc = match.group(1), int(match.group(2))
    for d, ds in enumerate(run.datasets):
        p = ds.prefix.prefix
        if name in (str(p), p.name, str(d)):
            n = ds.prefix.index.n_sequences
            if doc >= n:
                raise InputError(f"--doc {text!r}: {p} has sequences 0..{n - 1}")
            return d, doc
    names = ", ".join(ds.prefix.prefix.name for ds in run.datasets)
    raise InputError(f"--doc {text!r}: no prefix {name!r} among {names}")


def cmd_locate(args: argparse.Namespace) -> int:
    run = _open(args)
    schedule = _schedule(args, run.seq_len)
    shape = Shape(args.micro_batch, args.dp)
    if isinstance(schedule, BatchSchedule) and schedule.rampup is None and not schedule.steps:
        check_shape(shape, schedule.batch_at(0), 1)
    d, doc = _doc_arg(run, args.doc)
    map_dir = None if args.map_dir is None else Path(args.map_dir)
    m, built = dataset_map(run, d, map_dir)
    ds = run.datasets[d]
    hits = [_landing(h, schedule, shape) for h in landings(run, d, doc, m)]
    in_run = [h for h in hits if h["sample"] is not None]
    later = [h for h in in_run if h.get("iteration") is None]
    length = int(ds.prefix.index.sequence_lengths[doc])
    if args.json:
        out = {
            "doc": {"prefix": str(ds.prefix.prefix), "dataset": d, "doc": doc, "length": length},
            "run": _run_json(run),
            "map": {"built": built, "dir": args.map_dir},
            "landings": in_run,
            "surplus": [h for h in hits if h["sample"] is None],
        }
        print(json.dumps(out, indent=2))
        return 0
    lines = [
        f"{_doc_name(run, d, doc)} ({fmt_int(length)} tokens): in {fmt_int(len(in_run))} "
        f"sample(s) of the {fmt_int(len(run))} the cache holds",
        _run_line(run),
        f"map: {'built now' if built else 'read from ' + str(args.map_dir)}"
        + ("" if args.map_dir else " (not kept: --map-dir DIR keeps it)"),
        "",
    ]
    logged = [h for h in in_run if h.get("iteration") is not None]
    if logged:
        ranks = shape.known()
        head = (
            ["iteration", "sample"]
            + (["rank", "micro", "row"] if ranks else [])
            + ["pass", "tokens"]
        )
        body = [
            [fmt_int(h["iteration"]), fmt_int(h["sample"])]
            + ([str(h["rank"]), str(h["micro_batch"]), str(h["row"])] if ranks else [])
            + [str(h["pass"]), str(h["tokens"])]
            for h in logged
        ]
        lines.append(table(head, body))
    if later:
        samples = ", ".join(fmt_int(h["sample"]) for h in later[:10])
        more = f" and {len(later) - 10} more" if len(later) > 10 else ""
        lines.append(f"(and samples {samples}{more}, past the log's last line: not trained yet)")
    surplus = len(hits) - len(in_run)
    if surplus:
        lines.append(
            f"(and {surplus} of its dataset's surplus samples, which the blend never draws)"
        )
    print("\n".join(lines))
    return 0


def _landing(h: Landing, schedule: BatchSchedule | LoggedSchedule, shape: Shape) -> dict[str, Any]:
    """One landing as a row: its sample, pass, tokens and, where the schedule knows it, its
    iteration and rank (a landing past a log's last line has no iteration yet: null)."""
    row: dict[str, Any] = {
        "sample": h.g,
        "dataset_sample": h.sample,
        "pass": h.occurrence,
        "tokens": h.tokens,
    }
    if h.g is None:
        return row
    if isinstance(schedule, LoggedSchedule) and not schedule.covers(h.g):
        row["iteration"] = None
        return row
    iteration, consumed, batch = schedule.iteration_of(h.g)
    row["iteration"] = iteration
    if shape.known():
        check_shape(shape, batch, iteration)
        place = shape.place(h.g - consumed)
        assert place is not None
        row |= {"rank": place[0], "micro_batch": place[1], "row": place[2]}
    return row
