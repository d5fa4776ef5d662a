"""`tokentape tokenize`: tokenize text corpora into a token store."""

from __future__ import annotations

import argparse
import json

from tokentape._src import api
from tokentape._src.cli.progress import add_progress_arg, progress_callback
from tokentape._src.cli.storage import add_storage_options, local_only
from tokentape._src.cli.wording import FLAGS
from tokentape._src.render.text import bad_records_rows, dropped_text
from tokentape._src.store.tokenizers import BOS_CANDIDATES, HF_EOD_CANDIDATES
from tokentape._src.tokenize.driver import TokenizeSummary, tokenize
from tokentape._src.util.text import fmt_bytes, fmt_int, key_values

TOKENIZE_EPILOG = f"""\
inputs:
  .jsonl, .jsonl.gz, .jsonl.zst  one JSON object per line, text in --text-key
  .parquet                       text in the --text-key column
  .txt                           the whole file is one document
  directories expand to the supported files below them, sorted by relative path; globs
  expand sorted; inputs keep command-line order.

tokenizers (--tokenizer) and their end-of-document (EOD) token:
  bytes              built-in: the 256 byte ids; EOD = id 256
  tiktoken:PATH      a tiktoken BPE ranks file (GPT-2 split pattern); EOD = <|endoftext|>,
                     added at max rank + 1 (the only --eod-token it accepts)
  PATH               a Hugging Face tokenizer.json, or a directory holding one (what
                     save_pretrained writes), e.g. mytok/
  NAME, hf:NAME      a model in the local Hugging Face cache, e.g. gpt2 or org/name
                     ($HF_HUB_CACHE, default ~/.cache/huggingface/hub); never downloaded:
                     fetch it first with `hf download NAME tokenizer.json tokenizer_config.json`
  Hugging Face EOD: --eod-token if given; else, for a directory or NAME, the eos_token of
  its tokenizer_config.json; else the first in the vocabulary of
  {", ".join(HF_EOD_CANDIDATES)}. For every kind, --eod-token must name
  a token of the vocabulary. Documents are encoded as plain text (special-token text in them
  stays text); the EOD id follows each one. The summary prints the tokenizer file and the EOD
  id and token used.

beginning of document (BOS), Hugging Face tokenizers only:
  by default each document gets the BOS the tokenizer itself adds to a text: where its
  tokenizer_config.json has add_bos_token, that decides (the token is its bos_token); else
  the special token its tokenizer.json post-processor puts first (Llama 3), if any. --bos
  adds one anyway (the bos_token, the post-processor's, else the first of
  {", ".join(BOS_CANDIDATES)}), --bos-token TOKEN names it, --no-bos adds none.
  The BOS is stored as each document's first token (the manifest records it; a plan refuses
  to blend stores that differ unless it says mixed_bos = true).

filters (--filter, repeatable):
  unique-lines[:min_lines=20,min_ratio=0.3]   drop repetitive documents (log dumps)
  min-tokens:N / max-tokens:N                 drop documents by token count

examples:
  tokentape tokenize data/web/*.jsonl.zst --out stores/web --tokenizer tok.json \\
      --filter unique-lines --workers 8
  tokentape tokenize books/ --out stores/books --tokenizer tiktoken:gpt2.tiktoken --json
  tokentape tokenize s3://corpus/web/ --out s3://stores/web --tokenizer /opt/tok.json \\
      --executor ray --ray-address head:6379 --workers 256

The output is byte-identical for any --workers and either executor. With a cluster (needs
the ray extra: pip install 'tokentape[ray]'), every node needs the tokenizer at the same path,
and the inputs: object URLs (read with the node's own credentials) or paths every node sees
at the same place; the nodes return their units to this command, which writes --out
(docs/cluster.md). Interrupted (even by kill -9), the same command resumes where it stopped.

object storage (needs the s3 extra: pip install 'tokentape[s3]'):
  tokentape tokenize data/web/ --out s3://bucket/stores/web --tokenizer tok.json
--out s3://... builds the store in a local directory (--work-dir; default
~/.cache/tokentape/uploads/<hash of the URL>), then uploads it, manifest.json last: a reader
never sees an incomplete store. A rerun uploads only objects missing or different (size and
sha256 metadata); the local copy is removed after the upload. The writer lock is the work
directory's: it keeps out a second writer on this machine, not one on another machine.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tokenize",
        help="tokenize text corpora into a token store",
        description="Tokenize text corpora into a memory-mappable token store (one source).",
        epilog=TOKENIZE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, directories or globs")
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output store directory, or an object URL (s3://bucket/prefix)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="SPEC",
        help="default: bytes (a byte-level store: UTF-8 bytes as ids 0-255, EOD 256; the "
        "summary says so)",
    )
    p.add_argument(
        "--eod-token",
        metavar="TOKEN",
        help="end-of-document token, one of the tokenizer's vocabulary (default: see below)",
    )
    bos = p.add_mutually_exclusive_group()
    bos.add_argument(
        "--bos",
        action="store_true",
        default=None,
        help="put a beginning-of-document token before every document (default: as the "
        "tokenizer does on a text; see below)",
    )
    bos.add_argument(
        "--no-bos", dest="bos", action="store_false", help="put none, whatever the tokenizer does"
    )
    p.add_argument(
        "--bos-token",
        metavar="TOKEN",
        help="the beginning-of-document token (implies --bos)",
    )
    p.add_argument("--text-key", default="text", metavar="KEY", help="default: text")
    p.add_argument(
        "--id-key",
        default="auto",
        metavar="KEY",
        help=(
            "the field (dotted for a nested one: meta.url) holding each record's own id, "
            "recorded with its document; default auto: the first of id, doc_id, url in each "
            "input's first record; none: no ids"
        ),
    )
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
    p.add_argument(
        "--on-bad-record",
        choices=("fail", "skip"),
        default="fail",
        help="a record that is not JSON, not UTF-8, or whose text is missing, null or not a "
        "string: fail (stop, naming it; the default) or skip (count it per input and reason "
        "in the manifest and summary, and go on)",
    )
    p.add_argument(
        "--max-bad-fraction",
        type=float,
        default=0.01,
        metavar="F",
        help="with skip: refuse the store at the end when more than F of the records were bad "
        "(default 0.01)",
    )
    add_storage_options(p)
    p.add_argument(
        "--work-dir",
        metavar="DIR",
        help="with an object URL as --out: the local directory the store is built in before "
        "upload (default ~/.cache/tokentape/uploads/<hash of --out>)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary, no progress bar")
    add_progress_arg(p)
    p.set_defaults(func=cmd)


def _id_keys_text(id_keys: dict[str, int]) -> str:
    """Where the records' ids came from: ``field 'id' (3 inputs), none (1 input)``."""
    if not id_keys:
        return "not recorded"

    def inputs(n: int) -> str:
        return f"{n} input" + ("" if n == 1 else "s")

    words = [f"field '{k}' ({inputs(n)})" for k, n in id_keys.items() if k]
    if "" in id_keys:
        words.append(f"none ({inputs(id_keys[''])})")
    return ", ".join(words)


BYTES_DEFAULT = (
    "bytes, the default: a byte-level store (UTF-8 bytes as ids); --tokenizer tokenizer.json "
    "(or tiktoken:PATH) tokenizes for a model's vocabulary"
)
"""The summary's tokenizer row when ``--tokenizer`` was not given."""


def _bos_text(s: TokenizeSummary) -> str:
    if s.bos_id is None:
        return "no BOS token (--bos adds the tokenizer's)"
    return f"id {s.tokenizer.get('bos_choice')}"


def _ray_rows(nodes: dict[str, int]) -> list[tuple[str, str]]:
    """The units each Ray node tokenized, when the run had Ray tasks."""
    if not nodes:
        return []
    each = ", ".join(f"{node} {n}" for node, n in nodes.items())
    return [("Ray nodes", f"{len(nodes)} ({each} units)")]


def summary_text(s: TokenizeSummary, default_tokenizer: bool = False) -> str:
    rate = s.text_bytes / s.seconds / 1e6 if s.seconds > 0 else 0.0
    rows = [
        ("store", f"{s.out} ({s.status})"),
        ("tokenizer", BYTES_DEFAULT if default_tokenizer else str(s.tokenizer["source"])),
        ("end of document", f"id {s.tokenizer['eod_choice']}"),
        ("start of document", _bos_text(s)),
        ("documents read", fmt_int(s.docs_in)),
        ("documents kept", fmt_int(s.n_docs)),
        ("tokens", f"{fmt_int(s.n_tokens)} ({s.dtype}, vocabulary {fmt_int(s.vocab_size)})"),
        ("shards", fmt_int(s.n_shards)),
        ("dropped by filter", dropped_text(s.dropped_docs, s.dropped_tokens)),
        ("input text", fmt_bytes(s.text_bytes)),
        ("ids", _id_keys_text(s.id_keys)),
        *bad_records_rows(s.bad_records),
        ("units", f"{s.units} ({s.units_reused} reused from an earlier run)"),
        *_ray_rows(s.ray_nodes),
        ("time", f"{s.seconds:.2f} s ({rate:.2f} MB/s of text)"),
        ("content hash", s.content_hash),
    ]
    return key_values(rows)


def cmd(args: argparse.Namespace) -> int:
    local_only("--work-dir", args.work_dir, "the store is built")
    config = api.tokenize_config(
        args.inputs,
        args.out,
        tokenizer="bytes" if args.tokenizer is None else args.tokenizer,
        eod_token=args.eod_token,
        text_key=args.text_key,
        id_key=args.id_key,
        filters=args.filters,
        workers=args.workers,
        executor=args.executor,
        ray_address=args.ray_address,
        dtype=args.dtype,
        shard_mb=args.shard_mb,
        unit_mb=args.unit_mb,
        overwrite=args.overwrite,
        storage_options=args.storage_options,
        work_dir=args.work_dir,
        on_bad_record=args.on_bad_record,
        max_bad_fraction=args.max_bad_fraction,
        bos=args.bos,
        bos_token=args.bos_token,
        wording=FLAGS,
    )
    summary = tokenize(config, progress=progress_callback(args.progress, quiet=args.json))
    default = args.tokenizer is None
    print(json.dumps(summary.to_json(), indent=2) if args.json else summary_text(summary, default))
    return 0
