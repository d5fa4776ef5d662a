"""`tokentape stage`: download a plan's object-storage stores to node-local disk, verified."""

from __future__ import annotations

import argparse
import json

from tokentape._src.cli.progress import add_progress_arg, progress_callback
from tokentape._src.cli.storage import add_storage_options, local_only
from tokentape._src.plan.load import load_plan
from tokentape._src.stage.stage import (
    DEFAULT_WAIT_S,
    DEFAULT_WORKERS,
    MAX_WORKERS,
    StagedStore,
    stage_sources,
)
from tokentape._src.util.text import fmt_bytes
from tokentape.errors import InputError

EPILOG = f"""\
what it does:
  Every source of the plan whose path is an object URL (s3://...) is downloaded into
  CACHE/KEY-NAME/ (KEY: a hash of the URL) with parallel ranged GETs, each block checked
  against the block hashes its manifest (a Megatron prefix: its sidecar object, written by
  `tokentape verify URL`) records as it arrives; a Megatron prefix is staged as
  CACHE/KEY-NAME/NAME.bin and .idx. Local sources are left where they are. A store already
  staged with the plan's content hash is reused (nothing is read from the bucket);
  another version of it is replaced.
  A killed stage resumes: run the same command again, verified blocks are kept.
  A staged copy is trusted while its files keep the size, mtime and ctime they had when
  verified; a file changed on disk is hashed again (and fetched again if it no longer
  matches). --verify hashes every file of a staged copy again before reusing it.
  The cache must be a directory only you (or root) can change; tokentape follows no
  symbolic link inside it, and refuses a link, FIFO or another user's file at a name it
  uses (one line naming it: remove it, or use another cache directory).
  One process per node stages a store; others (the node's other ranks) wait for it
  (--wait), then use its copy. The staged copy is a normal store read with memory maps.

cluster use:
  put CACHE on each node's local disk and stage once per node before training, e.g. in
  the job script:  srun --ntasks-per-node=1 tokentape stage mix.json --cache /local/tt
  (or give the loader cache_dir=, which stages the same way from every rank).

examples:
  tokentape stage mix.json --cache /local/tokentape
  tokentape stage mix.json --cache /local/tokentape --out mix.staged.json
  tokentape stage mix.json --cache /tmp/tt --workers 32 \\
      --storage-options '{{"endpoint_url": "http://minio:9000"}}'

Exit status: 0 when every store is staged; 2 with one line on any error (a store that
changed since the plan was made; an object whose block does not match its hash after
the retries, named with the block; a bucket that kept failing; the wait ran out).
Default --workers {DEFAULT_WORKERS}, --wait {DEFAULT_WAIT_S:.0f} s; without --storage-options, the
plan's storage_options (from its plan file) apply.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "stage",
        help="download a plan's s3:// sources to local disk, verified block by block",
        description=(
            "Stage the object-storage sources of a resolved plan (stores and Megatron\n"
            "prefixes) to a node-local cache directory, verifying every block against the\n"
            "hashes recorded with it, and print where each is staged and how many bytes\n"
            "were downloaded or reused."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", metavar="PLAN.json", help="a resolved plan (tokentape plan --out)")
    p.add_argument("--cache", required=True, metavar="DIR", help="node-local cache directory")
    p.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, metavar="N", help="concurrent GETs"
    )
    p.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="how long to wait for another process staging the same store",
    )
    p.add_argument(
        "--out", metavar="FILE", help="also write the plan with the staged paths (PLAN.json)"
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash every file of an already staged copy again before reusing it (one read of "
        "the copy), not only the files changed on disk since they were verified",
    )
    add_storage_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON report, no progress bar")
    add_progress_arg(p)
    p.set_defaults(func=cmd)


def _row(name: str, path: str, staged: StagedStore | None) -> dict[str, object]:
    if staged is None:
        return {"name": name, "url": None, "path": path, "staged": False}
    return {
        "name": name,
        "url": staged.url,
        "path": str(staged.path),
        "staged": True,
        "cached": staged.cached,
        "content_hash": staged.content_hash,
        "total_bytes": staged.total_bytes,
        "downloaded_bytes": staged.downloaded_bytes,
        "reused_bytes": staged.reused_bytes,
        "rehashed_bytes": staged.rehashed_bytes,
    }


def _line(name: str, path: str, s: StagedStore | None) -> str:
    if s is None:
        return f"{name}: {path} (not an object URL: read in place)"
    how = "already staged" if s.cached else f"downloaded {fmt_bytes(s.downloaded_bytes)}"
    if s.rehashed_bytes:
        how += f", hashed again {fmt_bytes(s.rehashed_bytes)}"
    return f"{name}: {s.url} -> {s.path} ({how}, reused {fmt_bytes(s.reused_bytes)})"


def cmd(args: argparse.Namespace) -> int:
    if not 1 <= args.workers <= MAX_WORKERS:
        raise InputError(f"--workers must be between 1 and {MAX_WORKERS}, got {args.workers}")
    if not args.wait >= 0:
        raise InputError(f"--wait must be a number of seconds >= 0, got {args.wait}")
    local_only("--cache", args.cache, "the staging cache is a directory")
    plan = load_plan(args.plan)
    staged_plan, staged = stage_sources(
        plan,
        args.cache,
        args.storage_options or None,  # none given: the plan's own storage_options
        progress_callback(args.progress, quiet=args.json),
        args.workers,
        args.wait,
        verify=args.verify,
    )
    if args.out:
        staged_plan.save(args.out)
    rows = [(s.name, s.path, staged.get(s.name)) for s in staged_plan.sources]
    if args.json:
        data = {
            "index_hash": staged_plan.index_hash,
            "cache": args.cache,
            "out": args.out,
            "sources": [_row(*row) for row in rows],
        }
        print(json.dumps(data, indent=2))
    else:
        for row in rows:
            print(_line(*row))
    return 0
