"""`tokentape verify`: check stores and Megatron prefixes against their recorded hashes."""

from __future__ import annotations

import argparse
import json

from tokentape._src import api
from tokentape._src.cli.progress import add_progress_arg, progress_callback
from tokentape._src.cli.storage import add_storage_options
from tokentape._src.cli.wording import FLAGS
from tokentape._src.util.text import fmt_bytes, fmt_int
from tokentape._src.verify.stores import DEFAULT_QUICK_BLOCKS, StoreReport

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
  A prefix in object storage (s3://bucket/data/web_text_document) is read once with ranged
  GETs and its identity is written beside it as the object PREFIX.tokentape.json, with both
  objects' sizes and ETags: run this once so that plan, stage and the loader can use it
  without reading its tokens (a bucket you may only read: "identity not recorded").

examples:
  tokentape verify stores/web stores/code
  tokentape verify mix.json --quick --blocks 8
  tokentape verify stores/web --json
  tokentape verify data/web_text_document --vocab-size 50257 --eod-id 50256
  tokentape verify s3://corpora/megatron/web_text_document --vocab-size 50257 --eod-id 50256

Exit status: 0 when every store is intact, 1 when a problem was found (one line each),
2 when a path is not a store or plan, or a manifest cannot be read.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument(
        "paths",
        nargs="+",
        metavar="STORE_OR_PLAN",
        help="a store directory or Megatron prefix (local or s3://), or a PLAN.json",
    )
    p.add_argument("--quick", action="store_true", help="spot-check blocks, no full rehash")
    add_storage_options(p)
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
    add_progress_arg(p)
    p.set_defaults(func=cmd)


def _summary(r: StoreReport) -> str:
    counts = f"{r.n_shards} shards, {fmt_int(r.n_tokens)} tokens"
    hashed = f"{fmt_bytes(r.bytes_hashed)} hashed in {r.seconds:.2f} s"
    if r.quick:
        hashed = f"quick check: {r.blocks_checked} of {r.blocks_total} blocks, {hashed}"
    if r.ok:
        tail = "; run without --quick for a full rehash" if r.quick else ""
        return f"{r.path}: ok ({counts}, {hashed}){tail}"
    return f"{r.path}: FAILED, {len(r.problems)} problem(s) ({counts}, {hashed})"


def cmd(args: argparse.Namespace) -> int:
    reports = api.verify_stores(
        args.paths,
        args.quick,
        blocks=args.blocks,
        vocab_size=args.vocab_size,
        eod_id=args.eod_id,
        storage_options=args.storage_options,
        progress=progress_callback(args.progress, quiet=args.json),
        wording=FLAGS,
    )
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
