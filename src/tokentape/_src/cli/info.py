"""`tokentape info`: a store's manifest, a resolved plan, or a run's step log, in human form
or as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokentape._src.audit.prefix_info import prefix_info
from tokentape._src.audit.runinfo import STEP_LOG_NAME, plan_json, run_info, run_json
from tokentape._src.megatron.format import is_prefix
from tokentape._src.megatron.remote import idx_url
from tokentape._src.objects.client import basename, is_url, join, object_store
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.plan import Plan
from tokentape._src.render.runinfo import plan_info_text, run_info_text
from tokentape._src.render.text import manifest_text, prefix_text
from tokentape._src.store.format import MANIFEST_NAME, read_manifest
from tokentape._src.store.reader import Source, source_at_url
from tokentape.errors import InputError, PlanError

EPILOG = f"""\
what PATH is:
  a store directory (holds {MANIFEST_NAME})   its manifest: tokens, documents, tokenizer, shards,
                                            and its inputs with the documents each gave, kept
                                            and dropped (--json: the manifest's fields and
                                            "inputs_table", null for a store without provenance)
  a resolved plan (PLAN.json)               sources, shares, phases, horizon, index hash, and
                                            where each store lives (path or object URL)
  a run directory (holds {STEP_LOG_NAME}) or a step log (*.jsonl; or --log FILE)
                                            the run: steps, samples consumed, batch-shape and
                                            plan changes, the last step's tokens hash, redone
                                            steps (lines a resumed run superseded) and gaps
  a Megatron prefix (PREFIX.bin + PREFIX.idx)  documents, sequences, tokens, dtype, sizes,
                                            and its identity (content hash, id range) if
                                            `tokentape verify` recorded one (nothing is hashed)
  each of them may be an object URL (s3://bucket/stores/web, s3://bucket/plans/PLAN.json,
  s3://bucket/runs/r1/), read in place (credentials and endpoint from the environment)

exit status: 0; 1 when a step log has steps missing (replay, locate and resume refuse it);
  2 with one line on bad input

examples:
  tokentape info stores/web
  tokentape info mix.json
  tokentape info --log run/steps.jsonl --json
  tokentape info run/
  tokentape info /data/megatron/code_text_document
  tokentape info s3://bucket/runs/r1/steps.jsonl
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "info",
        help="show a store's manifest, a plan's summary, a Megatron prefix or a run's step log",
        description="Show a token store's manifest, a resolved plan's summary, or a run's\n"
        "history from its step log, in human form (or as JSON).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "store",
        metavar="PATH",
        nargs="?",
        help="a store, PLAN.json, a Megatron prefix or a run directory (or an s3:// URL of one)",
    )
    p.add_argument("--log", metavar="steps.jsonl", help="a run's step log (or its directory)")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p.set_defaults(func=cmd)


def _kind(path: str) -> str:
    """``store``, ``plan``, ``run`` or ``megatron``: what ``path`` holds."""
    if is_url(path):
        return _remote_kind(path)
    p = Path(path)
    if p.is_dir():
        if not (p / MANIFEST_NAME).exists() and (p / STEP_LOG_NAME).exists():
            return "run"
        return "store"  # reading the manifest says what is missing
    if is_prefix(p):
        return "megatron"
    if p.suffix == ".jsonl":
        return "run"
    return "plan" if p.is_file() or p.suffix in (".json", ".toml") else "store"


def _remote_kind(url: str) -> str:
    """What an object URL holds: by its name where that says, else by the objects there."""
    name = basename(url)
    if name.endswith(".jsonl"):
        return "run"
    if name.endswith((".json", ".toml")):
        return "plan"
    objects = object_store(url)
    for kind, found in (
        ("store", join(url, MANIFEST_NAME)),
        ("run", join(url, STEP_LOG_NAME)),
        ("megatron", idx_url(url.rstrip("/"))),
    ):
        if objects.info(found) is not None:
            return kind
    return "store"  # reading the manifest says what is missing


def _load_plan(path: str) -> Plan:
    """The plan at ``path``; a store's manifest given instead is refused naming its store."""
    try:
        return load_plan(path)
    except (InputError, PlanError):
        p = Path(path)
        if p.name != MANIFEST_NAME:
            raise
        raise InputError(
            f"{path}: not a resolved plan but a store's manifest: `tokentape info "
            f"{p.parent}` shows the store"
        ) from None


def cmd(args: argparse.Namespace) -> int:
    if (args.store is None) == (args.log is None):
        raise InputError(
            "give one of PATH (a store, PLAN.json, a Megatron prefix or a run directory) or "
            "--log FILE"
        )
    kind = "run" if args.log is not None else _kind(args.store)
    if kind == "run":
        info = run_info(args.log if args.log is not None else args.store)
        print(json.dumps(run_json(info), indent=2) if args.json else run_info_text(info))
        return 0 if info.refused is None else 1
    if kind == "megatron":
        prefix = prefix_info(args.store)
        print(json.dumps(prefix.to_json(), indent=2) if args.json else prefix_text(prefix))
        return 0
    if kind == "plan":
        plan = _load_plan(args.store)
        print(
            json.dumps(plan_json(args.store, plan), indent=2)
            if args.json
            else plan_info_text(args.store, plan)
        )
        return 0
    if is_url(args.store):  # a store in a bucket: its manifest and inputs table, read there
        remote = source_at_url(args.store)
        manifest, inputs = remote.manifest, remote.inputs()
    else:
        manifest = read_manifest(args.store)
        inputs = Source(args.store).inputs()
    if args.json:
        data = manifest.to_dict() | {"inputs_table": inputs}
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(manifest_text(args.store, manifest, inputs))
    return 0
