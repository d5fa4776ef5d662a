"""`tokentape corpora`: write the built-in corpora."""

from __future__ import annotations

import argparse
import json

from tokentape._src.cli.storage import local_only
from tokentape._src.corpora import describe_builtin_corpora, write_builtin_corpora
from tokentape._src.util.text import key_values


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "corpora",
        help="write the built-in corpora (made from Python's own docs and sources)",
        description="Write the built-in demo corpora to DIR: one directory per source.",
        epilog=describe_builtin_corpora(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd)


def cmd(args: argparse.Namespace) -> int:
    local_only("--out", args.out, "the corpora are written as files")
    written = write_builtin_corpora(args.out)
    if args.json:
        print(json.dumps({name: str(path) for name, path in written.items()}, indent=2))
    else:
        print(key_values([(name, str(path)) for name, path in written.items()]))
    return 0
