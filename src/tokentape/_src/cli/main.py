"""The ``tokentape`` program: thin sub-commands over the library.

Bad input prints one line ``tokentape: error: ...`` and exits with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, NoReturn

from tokentape._src.audit import locate, replay, verify
from tokentape._src.demo.corpora import describe_builtin_corpora, write_builtin_corpora
from tokentape._src.megatron import convert
from tokentape._src.plan.plan import check_budgets, load_plan_spec, resolve_plan
from tokentape._src.render.text import (
    dropped_text,
    fmt_bytes,
    fmt_int,
    key_values,
    manifest_text,
    plan_text,
)
from tokentape._src.store.atomic import write_atomic
from tokentape._src.store.format import read_manifest
from tokentape._src.tokenize.driver import TokenizeSummary, tokenize
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.train.partition import BatchConfig
from tokentape._src.util.version import __version__
from tokentape.errors import TokentapeError

EXIT_USAGE = 2
MAX_SMOKE_PROCESSES = 64
"""Most processes ``smoke`` starts (``tokentape._src.train.smoke.MAX_PROCESSES``, without torch)."""

TOKENIZE_EPILOG = """\
inputs:
  .jsonl, .jsonl.gz, .jsonl.zst  one JSON object per line, text in --text-key
  .parquet                       text in the --text-key column
  .txt                           the whole file is one document
  directories expand to the supported files below them, sorted by relative path; globs
  expand sorted; inputs keep command-line order.

tokenizers (--tokenizer):
  bytes                 built-in: 256 byte ids + end-of-document id 256
  tiktoken:PATH         a tiktoken BPE ranks file (GPT-2 split pattern; <|endoftext|> = EOD)
  PATH                  a Hugging Face tokenizer.json

filters (--filter, repeatable):
  unique-lines[:min_lines=20,min_ratio=0.3]   drop repetitive documents (log dumps)
  min-tokens:N / max-tokens:N                 drop documents by token count

examples:
  tokentape tokenize data/web/*.jsonl.zst --out stores/web --tokenizer tok.json \\
      --filter unique-lines --workers 8
  tokentape tokenize books/ --out stores/books --tokenizer tiktoken:gpt2.tiktoken --json
  tokentape tokenize /shared/web/ --out /shared/stores/web --tokenizer /shared/tok.json \\
      --executor ray --ray-address head:6379 --workers 256

The output is byte-identical for any --workers and either executor. With a cluster, the
inputs, the tokenizer and --out must be on storage every node sees at the same path (needs
the ray extra: pip install 'tokentape[ray]'). Interrupted (even by kill -9), the same command
resumes where it stopped.
"""


PLAN_EPILOG = """\
plan file:
  seq_len = 4096
  seed = 1234
  total_tokens = "2T"          # or total_samples = 488_281_250: the horizon
  [[source]]
  name = "web"
  path = "stores/web"          # a store directory, relative to the plan file
  weight = 60                  # any positive numbers; normalised
  max_repeats = 1.0            # repeat budget: planned passes over this source

example:
  tokentape plan mix.toml --out mix.json --plot mix.png
"""


def _add_tokenize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tokenize",
        help="tokenize text corpora into a token store",
        description="Tokenize text corpora into a memory-mappable token store (one source).",
        epilog=TOKENIZE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, directories or globs")
    p.add_argument("--out", required=True, metavar="DIR", help="output store directory")
    p.add_argument("--tokenizer", default="bytes", metavar="SPEC", help="default: bytes")
    p.add_argument("--eod-token", metavar="TOKEN", help="end-of-document token to use")
    p.add_argument("--text-key", default="text", metavar="KEY", help="default: text")
    p.add_argument(
        "--filter",
        action="append",
        default=[],
        dest="filters",
        metavar="SPEC",
        help="drop documents (repeatable; see filters below)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes, or Ray tasks in flight with --executor ray (default 1)",
    )
    p.add_argument(
        "--executor",
        default="local",
        choices=["local", "ray"],
        help="local: a process pool on this machine (default); ray: Ray tasks, on a private "
        "local Ray or on the cluster at --ray-address (see docs/cluster.md)",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="Ray cluster to run on: HOST:PORT of the head node, ray://HOST:10001 or auto "
        "(default: start a local Ray with --workers CPUs)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "uint16", "uint32"],
        help="token dtype (auto: uint16 iff the vocabulary has at most 65,536 ids)",
    )
    p.add_argument(
        "--shard-mb",
        type=float,
        default=256.0,
        metavar="MB",
        help="target shard size in MiB of tokens (default 256)",
    )
    p.add_argument(
        "--unit-mb",
        type=float,
        default=None,
        metavar="MB",
        help="input MiB per unit of work (default: 1/32 of the input, within 1-8)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a store or unfinished run with other settings in --out",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary, no progress bar")
    p.set_defaults(func=cmd_tokenize)


def summary_text(s: TokenizeSummary) -> str:
    rate = s.text_bytes / s.seconds / 1e6 if s.seconds > 0 else 0.0
    rows = [
        ("store", f"{s.out} ({s.status})"),
        ("documents read", fmt_int(s.docs_in)),
        ("documents kept", fmt_int(s.n_docs)),
        ("tokens", f"{fmt_int(s.n_tokens)} ({s.dtype}, vocabulary {fmt_int(s.vocab_size)})"),
        ("shards", fmt_int(s.n_shards)),
        ("dropped by filter", dropped_text(s.dropped_docs, s.dropped_tokens)),
        ("input text", fmt_bytes(s.text_bytes)),
        ("units", f"{s.units} ({s.units_reused} reused from an earlier run)"),
        ("time", f"{s.seconds:.2f} s ({rate:.2f} MB/s of text)"),
        ("content hash", s.content_hash),
    ]
    return key_values(rows)


def cmd_tokenize(args: argparse.Namespace) -> int:
    names = {f.name for f in fields(TokenizeConfig)}
    config = TokenizeConfig(
        **{k: v for k, v in vars(args).items() if k in names}
        | {"inputs": tuple(args.inputs), "filters": tuple(args.filters)}
    )
    summary = tokenize(config, show_progress=not args.json)
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        print(summary_text(summary))
    return 0


def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="show a token store's manifest",
        description="Show a token store's manifest in human form (or as JSON).",
    )
    p.add_argument("store", metavar="DIR")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    manifest = read_manifest(args.store)
    if args.json:
        print(manifest.to_json(), end="")
    else:
        print(manifest_text(args.store, manifest))
    return 0


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="resolve a mixture plan: repeat table, index hash, PLAN.json",
        description="Resolve a plan file (TOML): open its stores, turn the weights into exact "
        "rationals, print the repeat table and the index hash, and refuse a plan that repeats a "
        "source beyond its max_repeats. See docs/plan.md.",
        epilog=PLAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", metavar="PLAN.toml")
    p.add_argument("--out", metavar="PLAN.json", help="write the resolved plan (for the loader)")
    p.add_argument("--json", action="store_true", help="print the resolved plan as JSON")
    p.add_argument("--plot", metavar="PNG", help="draw shares and repeats (needs matplotlib)")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    plan = resolve_plan(load_plan_spec(args.plan), args.plan)
    check_budgets(plan, args.plan)
    for path in (args.out, args.plot):
        _check_output_file(path)  # both, before either is written
    drawing = None
    if args.plot:  # drawn before anything is written: a bad --plot writes nothing
        from tokentape._src.render.plot import draw_plan  # matplotlib: imported only when drawing

        drawing = draw_plan(plan, args.plot)
    if args.out:
        write_atomic(args.out, plan.to_json().encode())
    if drawing is not None:
        write_atomic(args.plot, drawing)
    print(plan.to_json() if args.json else plan_text(plan), end="" if args.json else "\n")
    return 0


def _check_output_file(path: str | None) -> None:
    """Refuse an output file that cannot be written (no directory, or a directory there), in
    the words the atomic writer would use."""
    if path is None:
        return
    if os.path.isdir(path):
        raise TokentapeError(f"'{path}': Is a directory")
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise TokentapeError(f"'{path}': No such file or directory")


def _add_smoke(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "smoke",
        help="check rank partitioning in real torch.distributed (gloo) processes",
        description="Launch dp x tp gloo processes on this machine; each builds its steps with "
        "the loader, they all-gather a fixed-size record of what they read (no pickling), and "
        "every rank checks: tensor-parallel peers must get identical inputs, each data-parallel "
        "rank its own slice, disjoint, whose union is the whole step. Exit 1 on any violation, "
        "2 on bad arguments, a bad plan or store, or a failed worker. Needs the torch extra.",
    )
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--dp", type=int, default=2, help="data-parallel size (default 2)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    p.add_argument("--micro", type=int, default=2, help="micro-batch (default 2)")
    p.add_argument("--accum", type=int, default=2, help="accumulation steps (default 2)")
    p.add_argument("--steps", type=int, default=3, help="steps to check (default 3)")
    p.set_defaults(func=cmd_smoke)


def cmd_smoke(args: argparse.Namespace) -> int:
    for name in ("dp", "tp", "micro", "accum", "steps"):  # before importing torch: fast, one line
        value = getattr(args, name)
        if value < 1:
            raise TokentapeError(f"--{name} must be at least 1, got {value}")
    if args.dp * args.tp > MAX_SMOKE_PROCESSES:  # before importing torch: fast, one line
        raise TokentapeError(
            f"--dp {args.dp} x --tp {args.tp} = {args.dp * args.tp} processes: smoke runs every "
            f"rank on this machine, at most {MAX_SMOKE_PROCESSES}"
        )
    try:  # torch is an optional extra: imported only by the command that needs it
        smoke = importlib.import_module("tokentape._src.train.smoke")
    except ImportError as exc:
        raise TokentapeError(f"smoke needs torch: pip install 'tokentape[torch]' ({exc})") from None
    config = BatchConfig(args.dp, args.micro, args.accum)
    table = smoke.run_smoke(args.plan, args.dp, args.tp, config, args.steps)
    print("step\tconsumed\trank\tdp\ttp\tpositions\tinputs sha256")
    print(table, end="")
    problems = [line for line in table.splitlines() if line.startswith("PROBLEM")]
    verdict = "FAIL" if problems else "OK"
    print(f"{verdict}: dp={args.dp} tp={args.tp}, {args.steps} steps, {len(problems)} problems")
    return 1 if problems else 0


def _add_corpora(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "corpora",
        help="write the built-in corpora (made from Python's own docs and sources)",
        description="Write the built-in demo corpora to DIR: one directory per source.",
        epilog=describe_builtin_corpora(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_corpora)


def cmd_corpora(args: argparse.Namespace) -> int:
    written = write_builtin_corpora(args.out)
    if args.json:
        print(json.dumps({name: str(path) for name, path in written.items()}, indent=2))
    else:
        print(key_values([(name, str(path)) for name, path in written.items()]))
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the end-to-end demo on the built-in corpora",
        description="Build the built-in corpora, train a small BPE tokenizer on them, tokenize "
        "each source into a store and show what is inside.",
    )
    p.add_argument("--out", default="demo-out", metavar="DIR", help="default: demo-out")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="default: 2")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise TokentapeError(f"--workers must be at least 1, got {args.workers}")
    from tokentape._src.demo.run import run_demo  # the demo pulls in matplotlib and the BPE trainer

    return run_demo(args.out, args.workers)


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors in the program's one-line form (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("tokentape").strip()
        where = f"{command}: " if command else ""
        self.exit(EXIT_USAGE, f"tokentape: error: {where}{message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tokentape",
        description="A deterministic, replayable data pipeline for LLM pretraining.",
    )
    parser.add_argument("--version", action="version", version=f"tokentape {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_tokenize(sub)
    _add_info(sub)
    _add_plan(sub)
    _add_smoke(sub)
    replay.add_parser(sub)
    verify.add_parser(sub)
    locate.add_parser(sub)
    convert.add_parser(sub)
    _add_corpora(sub)
    _add_demo(sub)
    return parser


def _one_line(message: str) -> str:
    """A message kept on one line, whatever a file or field name in it holds."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args: Any = build_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (one line, above), --help or --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE if exc.code else 0
    try:
        return args.func(args)
    except TokentapeError as exc:
        print(f"tokentape: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except OSError as exc:  # a file system error the command did not anticipate: one line
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"tokentape: error: {_one_line(f'{where}{exc.strerror or exc}')}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        again = "; run the same command again to resume" if args.command == "tokenize" else ""
        print(f"tokentape: interrupted{again}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
