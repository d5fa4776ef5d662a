"""`tokentape demo`: the end-to-end demo on the built-in corpora."""

from __future__ import annotations

import argparse

from tokentape._src.cli.storage import local_only
from tokentape.errors import InputError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="run the end-to-end demo on the built-in corpora",
        description="Build the built-in corpora, train a small BPE tokenizer on them, tokenize "
        "each source into a store and show what is inside.",
    )
    p.add_argument("--out", default="demo-out", metavar="DIR", help="default: demo-out")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="default: 2")
    p.set_defaults(func=cmd)


def cmd(args: argparse.Namespace) -> int:
    local_only("--out", args.out, "the demo writes its stores, plans and runs")
    local_only("--out", args.out, "the demo writes its stores, plans and runs")
    if args.workers < 1:
        raise InputError(f"--workers must be at least 1, got {args.workers}")
    from tokentape._src.demo.run import run_demo  # the demo pulls in matplotlib and the BPE trainer

    return run_demo(args.out, args.workers)


__all__ = ["add_parser", "cmd"]
