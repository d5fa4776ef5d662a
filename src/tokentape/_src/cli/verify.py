"""`tokentape verify`: check stores and Megatron prefixes against their recorded hashes."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from dataclasses import replace

from tokentape._src.audit.verify import (
    DEFAULT_QUICK_BLOCKS,
    Progress,
    StoreReport,
    Target,
    _chooser,
    bytes_to_hash,
    check_megatron_target,
    check_store,
    find_targets,
    load_manifest,
)
from tokentape._src.cli.progress import terminal_bar
from tokentape._src.megatron.source import MEGATRON
from tokentape._src.megatron.verify import planned_bytes
from tokentape._src.util.progress import tally
from tokentape._src.util.text import fmt_bytes, fmt_int
from tokentape.errors import InputError

EPILOG = """\
checks (every mode):
  file sizes against n_tokens x itemsize; shard files missing; .idx.npy sha256 and size,
  int64, starting at 0, strictly ascending, within the shard, one entry per document; the
  end-of-document id at every document end; manifest totals and content_hash; for a plan,
  that each store still has the content hash the plan recorded.
full mode (default):
  rehash every .bin (sha256 and each 64 MiB block) and check every token id < vocab_size.
--quick:
  hash and range-check only N blocks per shard (the first, the last, and N-2 picked by a
  seeded hash of the shard name: the same blocks every run).

Megatron prefixes (PREFIX.bin + PREFIX.idx, given directly or named by a plan):
  the .idx structure; both files rehashed against the identity recorded in the sidecar
  PREFIX.tokentape.json (--quick: the .idx and N blocks of .bin); the plan's content hash;
  ids in [0, vocab) and the EOD id at every document end, with the plan's vocabulary or
  --vocab-size/--eod-id.

examples:
  tokentape verify stores/web stores/code
  tokentape verify mix.json --quick --blocks 8
  tokentape verify stores/web --json
  tokentape verify data/web_text_document --vocab-size 50257 --eod-id 50256

Exit status: 0 when every store is intact, 1 when a problem was found (one line each),
2 when a path is not a store or plan, or a manifest cannot be read.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="rehash token stores against their manifests; check offsets and token ids",
        description=(
            "Verify token stores (directories, or every store of a resolved plan JSON)\n"
            "against their manifests: hashes, sizes, document index, token ids and\n"
            "end-of-document ids. Prints one line per problem."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="STORE_OR_PLAN", help="store dir or PLAN.json")
    p.add_argument("--quick", action="store_true", help="spot-check blocks, no full rehash")
    p.add_argument(
        "--blocks",
        type=int,
        metavar="N",
        help=f"blocks per shard hashed by --quick (default {DEFAULT_QUICK_BLOCKS})",
    )
    p.add_argument(
        "--vocab-size", type=int, metavar="V", help="Megatron prefix: check every id is below V"
    )
    p.add_argument(
        "--eod-id", type=int, metavar="E", help="Megatron prefix: check every document ends with E"
    )
    p.add_argument("--json", action="store_true", help="print a JSON report, no progress bar")
    p.set_defaults(func=cmd)


@contextlib.contextmanager
def _progress(total: int, quiet: bool) -> Iterator[Progress | None]:
    """The library's per-chunk callback, drawn as a bar on a terminal (not with --json)."""
    with tally(total, "verify", terminal_bar(quiet=quiet)) as counting:
        yield None if counting is None else counting.add


def _summary(r: StoreReport) -> str:
    counts = f"{r.n_shards} shards, {fmt_int(r.n_tokens)} tokens"
    hashed = f"{fmt_bytes(r.bytes_hashed)} hashed in {r.seconds:.2f} s"
    if r.quick:
        hashed = f"quick check: {r.blocks_checked} of {r.blocks_total} blocks, {hashed}"
    if r.ok:
        tail = "; run without --quick for a full rehash" if r.quick else ""
        return f"{r.path}: ok ({counts}, {hashed}){tail}"
    return f"{r.path}: FAILED, {len(r.problems)} problem(s) ({counts}, {hashed})"


def _with_vocabulary(target: Target, args: argparse.Namespace) -> Target:
    """A Megatron target with --vocab-size/--eod-id where its plan gave none."""
    if target.kind != MEGATRON:
        return target
    return replace(
        target,
        vocab_size=target.vocab_size if target.vocab_size is not None else args.vocab_size,
        eod_id=target.eod_id if target.eod_id is not None else args.eod_id,
    )


def _check_vocabulary_flags(vocab_size: int | None, eod_id: int | None) -> None:
    if vocab_size is not None and vocab_size <= 0:
        raise InputError(f"--vocab-size must be positive, got {vocab_size}")
    if eod_id is not None and eod_id < 0:
        raise InputError(f"--eod-id must be a token id (>= 0), got {eod_id}")
    if vocab_size is not None and eod_id is not None and eod_id >= vocab_size:
        raise InputError(f"--eod-id {eod_id} is not below --vocab-size {vocab_size}")


def cmd(args: argparse.Namespace) -> int:
    if args.blocks is not None and not args.quick:
        raise InputError("--blocks applies to --quick only")
    blocks = DEFAULT_QUICK_BLOCKS if args.blocks is None else args.blocks
    if blocks < 1:
        raise InputError(f"--blocks must be at least 1, got {blocks}")
    _check_vocabulary_flags(args.vocab_size, args.eod_id)
    targets = [_with_vocabulary(t, args) for t in find_targets(args.paths)]
    total = 0
    for t in targets:  # an unreadable manifest fails here, before any hashing
        if t.kind == MEGATRON:
            total += planned_bytes(t.path, args.quick, _chooser(t.path, blocks))
        else:
            total += bytes_to_hash(load_manifest(t.path)[0], args.quick, blocks)
    with _progress(total, args.json) as progress:
        reports = [
            check_megatron_target(t, args.quick, blocks, progress)
            if t.kind == MEGATRON
            else check_store(t.path, args.quick, blocks, progress, label=t.label, plans=t.plans)
            for t in targets
        ]
    ok = all(r.ok for r in reports)
    if args.json:
        data = {"ok": ok, "quick": args.quick, "stores": [r.to_json() for r in reports]}
        print(json.dumps(data, indent=2))
    else:
        for r in reports:
            for problem in r.problems:
                print(problem)
            print(_summary(r))
    return 0 if ok else 1
