"""``tokentape convert``: a tokentape store to a Megatron indexed dataset, and back.

``--to megatron STORE OUT_PREFIX`` writes ``OUT_PREFIX.bin`` and ``OUT_PREFIX.idx``: one
Megatron sequence per document (EOD included), the document index ``0..n``, dtype ``uint16``
for at most 65,536 ids, else ``int32`` (or ``--dtype``). ``--from megatron PREFIX OUT_STORE``
writes a tokentape store with the same documents and tokens (``--append-eod`` adds the EOD id to
data made without it). Both stream: a bounded number of tokens is in memory at a time, every
file appears under its name only when complete, and the output is hashed as it is written (the
Megatron output's identity goes to its sidecar, so reading it in place needs no rehash).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokentape import __version__
from tokentape.errors import TokentapeError
from tokentape.report import fmt_bytes, fmt_int, key_values
from tokentape.store import megatron
from tokentape.store.atomic import write_atomic
from tokentape.store.format import MANIFEST_NAME, Manifest, choose_dtype, content_hash, numpy_dtype
from tokentape.store.megatron_identity import file_keys, sidecar_paths, write_sidecar
from tokentape.store.megatron_source import MEGATRON, MegatronSource
from tokentape.store.reader import Source, TokenStream
from tokentape.store.writer import ShardWriter
from tokentape.tokenize.job import canonical_hash, clear_out, is_store_file
from tokentape.tokenize.progress import bytes_progress
from tokentape.tokenize.tokenizers import Tokenizer, load_tokenizer, tokenizer_manifest

CHUNK_TOKENS = 2**24
"""Tokens converted at a time (a larger document is converted whole)."""

Progress = Callable[[int], None] | None


@dataclass(frozen=True)
class ConvertSummary:
    """What a conversion wrote (also what ``--json`` prints)."""

    direction: str  # "to megatron" or "from megatron"
    source: str
    out: str
    dtype: str
    vocab_size: int
    eod_id: int
    n_docs: int
    n_tokens: int
    bytes_read: int
    seconds: float
    content_hash: str
    """The output's content hash (a store's, or the Megatron prefix's identity)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"seconds": round(self.seconds, 3)}


def doc_chunks(stream: TokenStream, max_tokens: int) -> Iterator[tuple[int, int]]:
    """Runs of whole documents ``[first, stop)`` of at most ``max_tokens`` tokens (at least
    one document each), in order."""
    ends = np.append(stream.doc_starts[1:], stream.n_tokens)
    doc = 0
    while doc < stream.n_docs:
        start = int(stream.doc_starts[doc])
        stop = int(np.searchsorted(ends, start + max_tokens, side="right"))
        stop = max(stop, doc + 1)
        yield doc, stop
        doc = stop


def _span(stream: TokenStream, first: int, stop: int) -> tuple[int, int, np.ndarray]:
    """Token range of documents ``[first, stop)`` and their lengths."""
    start = int(stream.doc_starts[first])
    end = int(stream.doc_starts[stop]) if stop < stream.n_docs else stream.n_tokens
    bounds = np.append(stream.doc_starts[first:stop], end)
    return start, end, np.diff(bounds)


# --- tokentape → Megatron ---------------------------------------------------------------------


def to_megatron(
    store: str | os.PathLike[str],
    prefix: str | os.PathLike[str],
    dtype: str = "auto",
    overwrite: bool = False,
    show_progress: bool = True,
) -> ConvertSummary:
    """Write the store's documents as ``PREFIX.bin``/``PREFIX.idx``, one sequence each."""
    started = time.monotonic()
    src = Source(store)
    m = src.manifest
    name = megatron.choose_dtype(m.vocab_size) if dtype == "auto" else dtype
    megatron.dtype_code(name)
    if not megatron.holds(name, m.vocab_size):
        raise TokentapeError(
            f"--dtype {name} cannot hold the store's ids (vocabulary of {m.vocab_size}); "
            f"use {megatron.choose_dtype(m.vocab_size)}"
        )
    out = Path(prefix)
    _clear_prefix(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = megatron.MegatronWriter(out, name)
    total = src.n_tokens * src.dtype.itemsize
    try:
        with _progress(total, "convert", show_progress) as progress:
            for first, stop in doc_chunks(src, CHUNK_TOKENS):
                start, end, lengths = _span(src, first, stop)
                tokens = src.tokens(start, end)
                writer.add(tokens, lengths)
                if progress is not None:
                    progress(tokens.nbytes)
        identity = writer.finish()
    except BaseException:
        writer.abort()
        raise
    write_sidecar(out, identity, file_keys(out), writer=True)
    return ConvertSummary(
        direction="to megatron",
        source=str(store),
        out=str(out),
        dtype=name,
        vocab_size=m.vocab_size,
        eod_id=m.eod_id,
        n_docs=identity.n_docs,
        n_tokens=identity.n_tokens,
        bytes_read=total,
        seconds=time.monotonic() - started,
        content_hash=identity.content_hash,
    )


def _clear_prefix(out: Path, overwrite: bool) -> None:
    """Refuse to replace an existing dataset unless ``overwrite``; then remove its ``.idx``
    first (a ``.bin`` alone is never mistaken for a complete dataset) and its sidecars."""
    existing = [p for p in (megatron.bin_path(out), megatron.idx_path(out)) if p.exists()]
    if not existing:
        return
    if not overwrite:
        raise TokentapeError(f"'{existing[0]}' exists; pass --overwrite to replace it")
    for path in (megatron.idx_path(out), megatron.bin_path(out), *sidecar_paths(out)):
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _progress(total: int, label: str, show: bool) -> Iterator[Progress]:
    if not show:
        yield None
        return
    with bytes_progress(total, label) as progress:
        yield progress


# --- Megatron → tokentape ---------------------------------------------------------------------


@dataclass(frozen=True)
class FromMegatron:
    """The settings of a conversion from a Megatron prefix to a tokentape store."""

    prefix: str
    out: str
    vocab_size: int | None = None
    eod_id: int | None = None
    tokenizer: str | None = None
    """A tokenizer spec (``bytes``, ``tiktoken:PATH``, a tokenizer.json): copied into the store
    and recorded in its manifest; it gives vocab_size and eod_id when they are not given."""
    eod_token: str | None = None
    """The tokenizer's end-of-document token, when it is not the one found by default."""
    append_eod: bool = False
    """Append the EOD id to every document (data made without ``--append-eod``)."""
    dtype: str = "auto"
    """``auto`` (uint16 for at most 65,536 ids, else uint32), ``uint16`` or ``uint32``."""
    shard_mb: float = 256.0
    """Target shard size in MiB of tokens."""
    overwrite: bool = False


def from_megatron(config: FromMegatron, show_progress: bool = True) -> ConvertSummary:
    """Write a tokentape store with the documents and tokens of a Megatron prefix."""
    started = time.monotonic()
    tokenizer = _tokenizer(config)
    src = MegatronSource(
        config.prefix,
        config.vocab_size,
        config.eod_id,
        tokenizer,
        check_eod=not config.append_eod,
        identify=False,
    )
    vocab, eod = src.vocab_size, src.eod_id
    dtype = choose_dtype(vocab) if config.dtype == "auto" else config.dtype
    itemsize = numpy_dtype(dtype).itemsize
    id_limit = min(vocab, 2 ** (8 * itemsize))
    if eod >= id_limit:
        raise TokentapeError(f"--dtype {dtype} cannot hold the end-of-document id {eod}")
    if config.shard_mb <= 0:
        raise TokentapeError(f"--shard-mb must be positive, got {config.shard_mb}")
    shard_tokens = max(1, int(config.shard_mb * 2**20) // itemsize)
    out = Path(config.out)
    created = _prepare_out(out, config.overwrite)
    writer = ShardWriter(out, dtype, shard_tokens)
    bin_hash = hashlib.sha256()
    total = src.n_tokens * src.dtype.itemsize
    try:
        with _progress(total, "convert", show_progress) as progress:
            for first, stop in doc_chunks(src, CHUNK_TOKENS):
                start, end, lengths = _span(src, first, stop)
                tokens = src.tokens(start, end)
                bin_hash.update(memoryview(np.ascontiguousarray(tokens)).cast("B"))
                _check_ids(tokens, vocab, id_limit, start, config.prefix)
                if config.append_eod:
                    tokens = np.insert(tokens, np.cumsum(lengths), eod)
                    lengths = lengths + 1
                writer.add(tokens, lengths)
                if progress is not None:
                    progress((end - start) * src.dtype.itemsize)
        shards = writer.finish()
        n_tokens = sum(s.n_tokens for s in shards)
        if n_tokens == 0:
            raise TokentapeError(f"Megatron prefix '{config.prefix}': holds no tokens")
        idx_sha = hashlib.sha256(megatron.idx_path(config.prefix).read_bytes()).hexdigest()
        stored = src.tokenizer.stored_file()
        if stored is not None:
            write_atomic(out / stored[0], stored[1])
        manifest = _manifest(config, src, dtype, shards, bin_hash.hexdigest(), idx_sha)
        write_atomic(out / MANIFEST_NAME, manifest.to_json().encode())
    except BaseException:
        writer.abort()
        _discard(out, created)
        raise
    return ConvertSummary(
        direction="from megatron",
        source=config.prefix,
        out=str(out),
        dtype=dtype,
        vocab_size=vocab,
        eod_id=eod,
        n_docs=manifest.n_docs,
        n_tokens=manifest.n_tokens,
        bytes_read=total,
        seconds=time.monotonic() - started,
        content_hash=manifest.content_hash,
    )


def _tokenizer(config: FromMegatron) -> Tokenizer | None:
    if config.tokenizer is None:
        if config.eod_token is not None:
            raise TokentapeError("--eod-token needs --tokenizer")
        return None
    return load_tokenizer(config.tokenizer, config.eod_token)


def _check_ids(tokens: np.ndarray, vocab: int, limit: int, start: int, prefix: str) -> None:
    """Refuse an id that is negative, not below ``vocab`` or ``limit`` (what the store's dtype
    holds), naming its position."""
    if not tokens.size:
        return
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo >= 0 and hi < limit:
        return
    i = int(np.flatnonzero((tokens < 0) | (tokens >= limit))[0])
    value, where = int(tokens[i]), f"{megatron.bin_path(prefix)}: token {start + i}"
    if value < 0:
        raise TokentapeError(f"{where} has the negative id {value}")
    if value >= vocab:
        raise TokentapeError(f"{where} has id {value}, not below vocab_size {vocab}")
    raise TokentapeError(f"{where} has id {value}, which the store's dtype cannot hold")


def _prepare_out(out: Path, overwrite: bool) -> bool:
    """Check the output directory; clear a store there with ``overwrite``. Whether this
    conversion creates it."""
    if out.exists() and not out.is_dir():
        raise TokentapeError(f"'{out}': exists and is not a directory")
    if not out.exists():
        out.mkdir(parents=True)
        return True
    names = sorted(os.listdir(out))
    foreign = [n for n in names if not is_store_file(n)]
    if foreign:
        raise TokentapeError(
            f"'{out}': not empty and not a tokentape store (found '{foreign[0]}'); choose a new "
            "or empty directory"
        )
    if MANIFEST_NAME in names and not overwrite:
        raise TokentapeError(f"'{out}': holds a store; pass --overwrite to replace it")
    clear_out(out)
    return False


def _discard(out: Path, created: bool) -> None:
    if not out.exists():
        return
    if created:
        shutil.rmtree(out, ignore_errors=True)
    else:
        clear_out(out)


def _manifest(
    config: FromMegatron, src: MegatronSource, dtype: str, shards: list, bin_sha: str, idx_sha: str
) -> Manifest:
    prefix = os.path.abspath(config.prefix)
    tok = tokenizer_manifest(src.tokenizer)
    inputs = {
        "converted_from": MEGATRON,
        "prefix": prefix,
        "dtype": src.index.dtype_name,
        "n_sequences": src.n_sequences,
        "bin_sha256": bin_sha,
        "idx_sha256": idx_sha,
        "append_eod": config.append_eod,
        "files": [
            {
                "path": str(megatron.bin_path(prefix)),
                "kind": "megatron-bin",
                "size": src.n_tokens * src.dtype.itemsize,
            },
            {
                "path": str(megatron.idx_path(prefix)),
                "kind": "megatron-idx",
                "size": src.index.idx_bytes,
            },
        ],
    }
    job = canonical_hash(
        {
            "convert": MEGATRON,
            "bin_sha256": bin_sha,
            "idx_sha256": idx_sha,
            "tokenizer": tok["fingerprint"],
            "vocab_size": src.vocab_size,
            "eod_id": src.eod_id,
            "append_eod": config.append_eod,
            "dtype": dtype,
            "shard_mb": config.shard_mb,
        }
    )
    n_tokens = sum(s.n_tokens for s in shards)
    return Manifest(
        dtype=dtype,
        vocab_size=src.vocab_size,
        eod_id=src.eod_id,
        tokenizer=tok,
        shards=tuple(shards),
        n_tokens=n_tokens,
        n_docs=sum(s.n_docs for s in shards),
        content_hash=content_hash(shards, dtype),
        filters={
            "config": [],
            "docs_in": src.n_docs,
            "text_bytes": 0,
            "dropped_docs": {},
            "dropped_tokens": {},
        },
        inputs=inputs,
        job=job,
        created_by=f"tokentape {__version__}",
    )


# --- command line -----------------------------------------------------------------------------

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
and rename when complete, and show a progress bar on a terminal. See docs/megatron.md.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("source", metavar="SRC", help="a store directory (--to) or a prefix (--from)")
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
    p.add_argument("--json", action="store_true", help="print a JSON summary, no progress bar")
    p.set_defaults(func=cmd)


_FROM_ONLY = ("vocab_size", "eod_id", "tokenizer", "eod_token", "append_eod")


def cmd(args: argparse.Namespace) -> int:
    show = not args.json
    if args.to:
        given = [f for f in _FROM_ONLY if getattr(args, f) not in (None, False)]
        if args.shard_mb is not None:
            given.append("shard_mb")
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise TokentapeError(f"{flag} applies to --from megatron only")
        summary = to_megatron(args.source, args.out, args.dtype, args.overwrite, show)
    else:
        if args.dtype not in ("auto", "uint16", "uint32"):
            raise TokentapeError(
                f"--dtype {args.dtype}: a tokentape store is uint16 or uint32 (or auto)"
            )
        config = FromMegatron(
            prefix=args.source,
            out=args.out,
            vocab_size=args.vocab_size,
            eod_id=args.eod_id,
            tokenizer=args.tokenizer,
            eod_token=args.eod_token,
            append_eod=args.append_eod,
            dtype=args.dtype,
            shard_mb=256.0 if args.shard_mb is None else args.shard_mb,
            overwrite=args.overwrite,
        )
        summary = from_megatron(config, show)
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
