"""`tokentape info`: a store's manifest, in human form or as JSON."""

from __future__ import annotations

import argparse

from tokentape._src.render.text import manifest_text
from tokentape._src.store.format import read_manifest


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="show a token store's manifest",
        description="Show a token store's manifest in human form (or as JSON).",
    )
    p.add_argument("store", metavar="DIR")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(func=cmd)


def cmd(args: argparse.Namespace) -> int:
    manifest = read_manifest(args.store)
    if args.json:
        print(manifest.to_json(), end="")
    else:
        print(manifest_text(args.store, manifest))
    return 0
