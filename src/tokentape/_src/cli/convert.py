"""`tokentape convert`: a tokentape store to a Megatron prefix and back."""

from __future__ import annotations

import argparse
import json

from tokentape._src.cli.progress import add_progress_arg, progress_callback
from tokentape._src.cli.storage import add_storage_options, local_only
from tokentape._src.megatron.convert import (
    ConvertSummary,
    FromMegatron,
    check_from_megatron,
    from_megatron,
    to_megatron,
)
from tokentape._src.megatron.source import MEGATRON
from tokentape._src.util.checks import as_flag, check_path
from tokentape._src.util.text import fmt_bytes, fmt_int, key_values
from tokentape.errors import InputError

EPILOG = """\
directions:
  --to megatron STORE OUT_PREFIX
      writes OUT_PREFIX.bin and OUT_PREFIX.idx: one sequence per document (its end-of-document
      id included), document index 0..n, dtype uint16 for at most 65,536 ids, else int32
      (--dtype picks another integer dtype that holds the vocabulary). Megatron-LM reads it
      as it reads the output of its own preprocess_data.py --append-eod.
  --from megatron PREFIX OUT_STORE (--vocab-size V --eod-id E | --tokenizer SPEC)
      writes a tokentape store with the same documents and tokens. Megatron's .idx records no
      vocabulary: give the vocabulary size and end-of-document id, or the tokenizer the data
      was made with (copied into the store, so replay can show text). Every document must
      end with the EOD id, unless --append-eod adds it.

examples:
  tokentape convert --to megatron stores/web data/web_text_document
  tokentape convert --from megatron data/web_text_document stores/web \\
      --tokenizer tokenizer.json
  tokentape convert --from megatron data/code_document stores/code \\
      --vocab-size 50257 --eod-id 50256 --append-eod --json

Both directions stream (a bounded number of tokens in memory), write under temporary names
beside the output and rename when complete, and show a progress bar on a terminal. An existing
output is replaced only with --overwrite, only once the new one is complete (an interrupted
run leaves it as it was), and only if it is a tokentape store or a Megatron dataset: a
directory holding other files, or an OUT_PREFIX.bin that its .idx does not describe, is
refused. See docs/megatron.md.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a token store to a Megatron .bin/.idx dataset, or back",
        description="Convert between tokentape stores and Megatron-LM indexed datasets\n"
        "(PREFIX.bin + PREFIX.idx), keeping documents and tokens identical.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--to", choices=[MEGATRON], help="from a tokentape store to this format")
    way.add_argument(
        "--from", dest="from_", choices=[MEGATRON], help="from this format to a tokentape store"
    )
    p.add_argument(
        "source",
        metavar="SRC",
        help="a store directory or s3:// store (--to), or a prefix (--from)",
    )
    p.add_argument("out", metavar="OUT", help="an output prefix (--to) or store directory (--from)")
    p.add_argument("--vocab-size", type=int, metavar="V", help="--from: ids are below V")
    p.add_argument("--eod-id", type=int, metavar="E", help="--from: the end-of-document id")
    p.add_argument("--tokenizer", metavar="SPEC", help="--from: the data's tokenizer")
    p.add_argument("--eod-token", metavar="TOKEN", help="--from: the tokenizer's EOD token")
    p.add_argument(
        "--append-eod", action="store_true", help="--from: add the EOD id after every document"
    )
    p.add_argument(
        "--shard-mb", type=float, metavar="MB", help="--from: shard size in MiB (default 256)"
    )
    p.add_argument(
        "--dtype",
        default="auto",
        metavar="DTYPE",
        help="output dtype: --to: uint8, int8, int16, uint16, int32, int64; --from: uint16, "
        "uint32 (default auto: the smallest that holds the vocabulary)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    add_storage_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON summary, no progress bar")
    add_progress_arg(p)
    p.set_defaults(func=cmd)


_FROM_ONLY = ("vocab_size", "eod_id", "tokenizer", "eod_token", "append_eod")
_ARGUMENTS = {"prefix": "PREFIX", "out": "OUT_STORE"}
"""The ``FromMegatron`` fields given as positional arguments, by their names in the help."""


def _named(field: str) -> str:
    """A ``FromMegatron`` field as the command line spells it: an argument or a flag."""
    return _ARGUMENTS.get(field) or as_flag(field)


def cmd(args: argparse.Namespace) -> int:
    bar = progress_callback(args.progress, quiet=args.json)
    if args.to:
        given = [f for f in _FROM_ONLY if getattr(args, f) not in (None, False)]
        if args.shard_mb is not None:
            given.append("shard_mb")
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise InputError(f"{flag} applies to --from megatron only")
        check_path("STORE", args.source)  # to_megatron names its parameters: store, prefix
        check_path("OUT_PREFIX", args.out)
        local_only("OUT_PREFIX", args.out, "the .bin and .idx are written")
        summary = to_megatron(
            args.source, args.out, args.dtype, args.overwrite, bar, args.storage_options
        )
    else:
        local_only("STORE", args.out, "the store is written")
        settings = {
            "prefix": args.source,
            "out": args.out,
            "vocab_size": args.vocab_size,
            "eod_id": args.eod_id,
            "tokenizer": args.tokenizer,
            "eod_token": args.eod_token,
            "append_eod": args.append_eod,
            "dtype": args.dtype,
            "shard_mb": 256.0 if args.shard_mb is None else args.shard_mb,
            "overwrite": args.overwrite,
        }
        check_from_megatron(settings, named=_named)  # FromMegatron names its fields
        summary = from_megatron(FromMegatron(**settings), bar)
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        print(summary_text(summary))
    return 0


def summary_text(s: ConvertSummary) -> str:
    rate = s.bytes_read / s.seconds if s.seconds > 0 else 0.0
    return key_values(
        [
            ("converted", f"{s.source} → {s.out} ({s.direction})"),
            ("documents", fmt_int(s.n_docs)),
            ("tokens", f"{fmt_int(s.n_tokens)} ({s.dtype})"),
            ("vocabulary", f"{fmt_int(s.vocab_size)} ids, end-of-document id {s.eod_id}"),
            ("time", f"{s.seconds:.2f} s ({fmt_bytes(rate)}/s)"),
            ("content hash", s.content_hash),
        ]
    )
