"""``tokentape convert``: a tokentape store to a Megatron indexed dataset, and back.

``--to megatron STORE OUT_PREFIX`` writes ``OUT_PREFIX.bin`` and ``OUT_PREFIX.idx``: one
Megatron sequence per document (EOD included), the document index ``0..n``, dtype ``uint16``
for at most 65,536 ids, else ``int32`` (or ``--dtype``). ``--from megatron PREFIX OUT_STORE``
writes a tokentape store with the same documents and tokens (``--append-eod`` adds the EOD id to
data made without it). Both stream: a bounded number of tokens is in memory at a time, and the
output is hashed as it is written (the Megatron output's identity goes to its sidecar, so
reading it in place needs no rehash).

Nothing existing is touched until the new output is complete: it is written under temporary
names beside the output (``.NAME.tokentape-convert-HOST-PID-RANDOM``: a sibling directory for a
store, ``.bin``/``.idx`` files for a prefix) and only then swapped in, so an interruption, a full
disk or bad data mid-run leaves the old output as it was and no partial new one. ``--overwrite``
replaces only what is recognisably ours: a store directory holding nothing but files tokentape
can tell are its own (``store.output.survey``: not just its file names), or a prefix whose
``.idx`` is a Megatron index that its ``.bin`` matches.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from tokentape._src.megatron import format as megatron
from tokentape._src.megatron.identity import file_keys, sidecar_paths, write_sidecar
from tokentape._src.megatron.source import MEGATRON, MegatronSource
from tokentape._src.objects.client import StorageOptions, check_storage_options, is_url
from tokentape._src.store.atomic import fsync_dir, replace_directory, write_atomic
from tokentape._src.store.format import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    choose_dtype,
    content_hash,
    numpy_dtype,
    sha256_stream,
)
from tokentape._src.store.lock import output_lock
from tokentape._src.store.output import check_ours, discard_store, is_store_file
from tokentape._src.store.reader import Source, TokenStream, source_at_url
from tokentape._src.store.tokenizers import (
    Tokenizer,
    load_tokenizer,
    tokenizer_manifest,
)
from tokentape._src.store.writer import ShardWriter
from tokentape._src.util.checks import (
    as_parameter,
    check_count,
    check_mb,
    check_path,
    check_text,
    shown,
)
from tokentape._src.util.faults import crashpoint
from tokentape._src.util.hashing import canonical_hash
from tokentape._src.util.progress import ProgressCallback, check_callback, tally
from tokentape._src.util.version import __version__
from tokentape.errors import ArgumentError, InputError, OutputError, StoreError, TokentapeError

CHUNK_TOKENS = 2**24
"""Tokens converted at a time (a larger document is converted whole)."""


@dataclass(frozen=True)
class ConvertSummary:
    """What a conversion wrote (also what ``--json`` prints).

    Attributes:
        direction: ``"to megatron"`` or ``"from megatron"``.
        source: The input, as given: a store's directory or a Megatron prefix.
        out: The output: a Megatron prefix or a store's directory.
        dtype: The output's token dtype.
        vocab_size: The vocabulary size (the store's, or the one the prefix was read with).
        eod_id: The end-of-document id.
        n_docs: Documents written.
        n_tokens: Tokens written (with ``append_eod``, the EOD ids added included).
        bytes_read: Bytes of input tokens read.
        seconds: Wall-clock seconds the conversion took.
        content_hash: The output's content hash (a store's, or the Megatron prefix's
            identity).
    """

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

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON-friendly data (``seconds`` rounded to milliseconds).

        Returns:
            A dict of the fields.
        """
        return asdict(self) | {"seconds": round(self.seconds, 3)}


def doc_chunks(stream: TokenStream, max_tokens: int) -> Iterator[tuple[int, int]]:
    """Runs of whole documents ``[first, stop)`` of at most ``max_tokens`` tokens (at least
    one document each), in order."""
    starts, n_docs = stream.doc_starts, stream.n_docs
    doc = 0
    while doc < n_docs:
        limit = int(starts[doc]) + max_tokens
        if limit >= stream.n_tokens:
            stop = n_docs
        else:  # documents 0..stop-1 end at or before the limit: the next one starts there
            stop = int(np.searchsorted(starts, limit, side="right")) - 1
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
    progress: ProgressCallback | None = None,
    storage_options: StorageOptions | None = None,
) -> ConvertSummary:
    """Write the store's documents as ``PREFIX.bin``/``PREFIX.idx``, one sequence each.

    The files are written under temporary names beside the prefix and renamed into place only
    when complete; the output's identity goes to its sidecar, so reading it in place needs no
    rehash.

    Args:
        store: The tokentape store's directory, or its object URL (``s3://...``: read in
            sequential ranged GETs, never copied to disk first).
        prefix: The output prefix: ``PREFIX`` of ``PREFIX.bin`` and ``PREFIX.idx``.
        dtype: ``"auto"`` (the default: ``uint16`` for at most 65,536 ids, else ``int32``) or
            a Megatron integer dtype name that holds the store's ids.
        overwrite: Replace an existing ``PREFIX.bin``/``PREFIX.idx``, and only if they are
            recognisably one Megatron dataset.
        progress: Receives the bytes converted as it goes; None: no reports.
        storage_options: fsspec options for a store at an object URL.

    Returns:
        What was written.

    Raises:
        ArgumentError: ``store`` or ``prefix`` is not a non-empty path, ``overwrite`` is not a
            bool, ``dtype`` is not a Megatron integer dtype, ``storage_options`` is not a
            mapping of option names, or the vocabulary does not fit int32.
        InputError: ``dtype`` cannot hold the store's ids.
        StoreError: The store is missing or damaged.
        OutputError: The output exists (without ``overwrite``, or not recognisably a
            Megatron dataset), another process is writing it, or it cannot be written.
    """
    check_callback(progress)
    started = time.monotonic()
    check_path("store", store)
    check_path("prefix", prefix)
    if not isinstance(dtype, str):
        raise ArgumentError(f"dtype must be a string, got {shown(dtype)}")
    if not isinstance(overwrite, bool):
        raise ArgumentError(f"overwrite: expected True or False, got {overwrite!r}")
    options = None
    if storage_options is not None:
        options = check_storage_options(storage_options, "storage_options")
    src = source_at_url(str(store), options) if is_url(store) else Source(store)
    try:
        m = src.manifest
        name = megatron.choose_dtype(m.vocab_size) if dtype == "auto" else dtype
        megatron.dtype_code(name)
        if not megatron.holds(name, m.vocab_size):
            raise InputError(
                f"--dtype {name} cannot hold the store's ids (vocabulary of {m.vocab_size}); "
                f"use {megatron.choose_dtype(m.vocab_size)}"
            )
        out = Path(prefix)
        with _output_errors(megatron.bin_path(out)), output_lock(out, "convert"):
            _finish_install(out)
            _check_prefix_out(out, overwrite)
            _check_sidecar_names(out)
            _remove_stale_temps(out)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = _temp_path(out, TEMP_NEW)
            writer = None
            try:
                writer = megatron.MegatronWriter(tmp, name)
                total = src.n_tokens * src.dtype.itemsize
                with tally(total, "convert", progress) as counting:
                    for first, stop in doc_chunks(src, CHUNK_TOKENS):
                        start, end, lengths = _span(src, first, stop)
                        tokens = src.tokens(start, end)
                        writer.add(tokens, lengths)
                        if counting is not None:
                            counting.add(tokens.nbytes)
                identity = writer.finish()
                writer = None
                _install_prefix(tmp, out, overwrite)
            except BaseException:
                if writer is not None:
                    with contextlib.suppress(OSError):
                        writer.abort()
                _remove_temps(out.parent, tmp.name)
                raise
            for path in sidecar_paths(out):  # the old output's identity, if any
                path.unlink(missing_ok=True)
            write_sidecar(out, identity, file_keys(out), writer=True)
    finally:
        src.close()  # a store in a bucket: its fetch threads
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


def _finish_install(out: Path) -> None:
    """Make whole a prefix whose install (``_install_prefix``) a convert on this host did not
    finish (killed between its renames): no ``OUT.idx``, and that dead convert's old index
    aside and/or its new files under temporary names. If its new ``.bin`` is still under its
    temporary name, the ``.bin`` in place is the old one: the old index goes back. Otherwise
    the new ``.bin`` is in place: its new index follows it. Either only if that index
    describes the ``.bin`` in place (its size); anything else is left alone."""
    idx_file = megatron.idx_path(out)
    if os.name != "posix" or os.path.lexists(idx_file) or not out.parent.is_dir():
        return
    name_re = re.escape(f".{out.name}.tokentape-")
    stem = rf"{name_re}(convert|old)-{re.escape(_host())}-(\d+)-[0-9a-f]{{8}}"
    found: dict[int, dict[str, str]] = {}
    for name in os.listdir(out.parent):
        match = re.fullmatch(stem + r"\.(bin|idx)", name)
        if match is not None:
            kind = "old" if match.group(1) == TEMP_OLD else f"new {match.group(3)}"
            found.setdefault(int(match.group(2)), {})[kind] = name
    bin_file = megatron.bin_path(out)
    for pid, names in sorted(found.items()):
        if _running(pid):
            continue
        in_place = "new idx" if "new bin" not in names else "old"  # the .bin's own index
        index = out.parent / names.get(in_place, "")
        if in_place not in names or not _describes(index, bin_file):
            continue
        os.rename(index, idx_file)
        if "old" in names and in_place != "old":
            (out.parent / names["old"]).unlink(missing_ok=True)
        fsync_dir(out.parent)
        return


def _describes(idx_file: Path, bin_file: Path) -> bool:
    """Whether the Megatron index ``idx_file`` describes the ``.bin`` ``bin_file`` (its size)."""
    try:
        return bin_file.is_file() and _implied_bin_bytes(idx_file, "") == bin_file.stat().st_size
    except (TokentapeError, OSError, ValueError):
        return False


def _check_sidecar_names(out: Path) -> None:
    """Refuse, before anything is written, a directory where the output's sidecar goes (beside
    it or in the cache): it could not be replaced once the prefix is in place."""
    for path in sidecar_paths(out):
        if path.is_dir() and not path.is_symlink():
            raise OutputError(f"'{path}': a directory where the sidecar of '{out}' goes; remove it")


def _check_prefix_out(out: Path, overwrite: bool) -> None:
    """Refuse to replace an existing ``OUT.bin``/``OUT.idx`` unless they are recognisably a
    Megatron dataset (even with ``overwrite``): the ``.idx`` starts with Megatron's magic, its
    size agrees with its header, and the ``.bin`` (if any) has the size the index implies; and
    one that is, unless ``overwrite``. An unrelated ``model.bin`` is never replaced by tokens,
    and never told to pass ``--overwrite``."""
    bin_file, idx_file = megatron.bin_path(out), megatron.idx_path(out)
    existing = [p for p in (bin_file, idx_file) if os.path.lexists(p)]
    if not existing:
        return
    keep = "; refusing to replace it (remove it yourself or choose another output prefix)"
    if os.path.lexists(idx_file) and not idx_file.is_file():
        raise OutputError(f"'{idx_file}' is not a regular file{keep}")
    if not idx_file.is_file():
        raise OutputError(
            f"'{bin_file}' exists without a Megatron index '{idx_file.name}' beside it{keep}"
        )
    implied = _implied_bin_bytes(idx_file, keep)
    if os.path.lexists(bin_file):
        found = bin_file.stat().st_size if bin_file.is_file() else None
        if found != implied:
            what = "is not a regular file" if found is None else f"holds {found} bytes"
            raise OutputError(
                f"'{bin_file}' {what}, but '{idx_file.name}' describes {implied} bytes of "
                f"tokens: not one Megatron dataset{keep}"
            )
    if not overwrite:
        raise OutputError(f"'{existing[0]}' exists; pass --overwrite to replace it")


def _implied_bin_bytes(idx_file: Path, keep: str) -> int:
    """The ``.bin`` size a Megatron ``.idx`` describes (after checking its magic and size)."""
    size = idx_file.stat().st_size
    with open(idx_file, "rb") as f:
        head = f.read(megatron.HEADER.size)
        if head[: len(megatron.MAGIC)] != megatron.MAGIC:
            raise OutputError(f"'{idx_file}' is not a Megatron index (no MMIDIDX magic){keep}")
        if len(head) < megatron.HEADER.size:
            raise OutputError(f"'{idx_file}': a truncated Megatron index{keep}")
        _, _, code, n_seq, n_entries = megatron.HEADER.unpack(head)
        expected = megatron.HEADER.size + 12 * n_seq + 8 * n_entries
        if code not in megatron.DTYPES or size not in (expected, expected + n_seq):
            raise OutputError(
                f"'{idx_file}': a Megatron index whose header does not match its size or "
                f"dtype{keep}"
            )
        if n_seq == 0:
            return 0
        f.seek(megatron.HEADER.size + 4 * (n_seq - 1))
        (length,) = np.frombuffer(f.read(4), dtype="<i4")
        f.seek(megatron.HEADER.size + 4 * n_seq + 8 * (n_seq - 1))
        (pointer,) = np.frombuffer(f.read(8), dtype="<i8")
    return int(pointer) + int(length) * megatron.DTYPES[code].itemsize


def _install_prefix(tmp: Path, out: Path, overwrite: bool) -> None:
    """Move the complete ``TMP.bin``/``TMP.idx`` to ``OUT.bin``/``OUT.idx``.

    The old ``.idx`` is first renamed aside, so at every moment a reader finds either the old
    pair, no dataset (a ``.bin`` without ``.idx``: refused, never misread), or the new pair;
    never a new ``.bin`` under an old ``.idx`` whose sizes happen to agree. An exception in the
    middle (Ctrl-C) rolls back before the ``.bin`` is replaced and forward after it."""
    _check_prefix_out(out, overwrite)  # again: the files may have changed while converting
    bin_file, idx_file = megatron.bin_path(out), megatron.idx_path(out)
    new_bin, new_idx = megatron.bin_path(tmp), megatron.idx_path(tmp)
    aside = megatron.idx_path(_temp_path(out, TEMP_OLD))
    try:
        if os.path.lexists(idx_file):
            os.rename(idx_file, aside)
        crashpoint("prefix-idx-aside")
        os.replace(new_bin, bin_file)
        crashpoint("prefix-bin-in")
        os.replace(new_idx, idx_file)
    except BaseException:
        with contextlib.suppress(OSError):
            if os.path.lexists(new_bin):  # .bin not replaced yet: put the old .idx back
                if os.path.lexists(aside) and not os.path.lexists(idx_file):
                    os.rename(aside, idx_file)
            elif os.path.lexists(new_idx):  # the new .bin is in: finish with its .idx
                os.replace(new_idx, idx_file)
            if not os.path.lexists(new_bin):
                aside.unlink(missing_ok=True)
        raise
    aside.unlink(missing_ok=True)
    fsync_dir(out.parent)


# --- temporary names and I/O errors -----------------------------------------------------------

TEMP_NEW = "convert"
"""The new output being written."""
TEMP_OLD = "old"
"""An old output moved aside while the new one takes its place."""


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"


def _temp_path(out: Path, kind: str) -> Path:
    """A hidden name beside ``out``, unique to this host, process and call."""
    tag = f"{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
    return out.parent / f".{out.name}.tokentape-{kind}-{tag}"


def _temp_pattern(out_name: str) -> re.Pattern[str]:
    """Names of the new outputs of ``out_name`` that converts on this host were writing: the
    sibling store directory or prefix files, and the writer's own temporaries inside them.
    The process id is group 1."""
    stem = re.escape(f"{out_name}.tokentape-{TEMP_NEW}-{_host()}-")
    return re.compile(rf"\.{{1,2}}{stem}(\d+)-[0-9a-f]{{8}}(?:\.bin|\.idx)?(?:\.tmp-[\w.-]+)?")


def _remove_temps(parent: Path, tmp_name: str) -> None:
    """Remove what this call wrote under its temporary name (files and a directory)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            if name.startswith((tmp_name, f".{tmp_name}")):
                _remove(parent / name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _remove_stale_temps(out: Path) -> None:
    """Remove the temporaries a convert of the same output on this host left when it was
    killed (its process no longer runs). A directory is removed only if it holds nothing but
    store files. Anything else is left alone."""
    if os.name != "posix":
        return
    pattern = _temp_pattern(out.name)
    with contextlib.suppress(OSError):
        for name in os.listdir(out.parent):
            match = pattern.fullmatch(name)
            if match is None or _running(int(match.group(1))):
                continue
            path = out.parent / name
            if path.is_dir() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    if not all(is_store_file(n) for n in os.listdir(path)):
                        continue
            _remove(path)


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


@contextlib.contextmanager
def _output_errors(output: Path) -> Iterator[None]:
    """Turn an ``OSError`` while writing the output (a full disk, a path through a file, no
    permission) into one line naming the path: the one the error names, or ``output`` when it
    names none or one of our temporary names."""
    try:
        yield
    except OSError as exc:
        path = exc.filename
        if path is None or ".tokentape-" in os.path.basename(os.fspath(path)):
            path = output
        reason = exc.strerror or str(exc) or type(exc).__name__
        where = "" if os.fspath(path) == os.fspath(output) else f" (writing '{output}')"
        raise OutputError(f"'{path}': {reason}{where}") from None


# --- Megatron → tokentape ---------------------------------------------------------------------


@dataclass(frozen=True)
class FromMegatron:
    """The settings of a conversion from a Megatron prefix to a tokentape store.

    Attributes:
        prefix: The Megatron prefix to read: ``PREFIX`` of ``PREFIX.bin`` and ``PREFIX.idx``.
        out: The store directory to write.
        vocab_size: The vocabulary size (the ``.idx`` records none); None: the tokenizer's.
        eod_id: The end-of-document id; None: the tokenizer's.
        tokenizer: A tokenizer spec (``bytes``, ``tiktoken:PATH``, a tokenizer.json): copied
            into the store and recorded in its manifest; it gives vocab_size and eod_id when
            they are not given. None: the store records no tokenizer.
        eod_token: The tokenizer's end-of-document token, when it is not the one found by
            default (needs ``tokenizer``).
        append_eod: Append the EOD id to every document (data made without
            ``--append-eod``); False: every document must already end with it.
        dtype: ``auto`` (uint16 for at most 65,536 ids, else uint32), ``uint16`` or
            ``uint32``.
        shard_mb: Target shard size in MiB of tokens.
        overwrite: Replace an existing store (or an unfinished one) at ``out``; a directory
            holding anything else is never replaced.

    Raises:
        ArgumentError: A field of the wrong type or out of range (an ``eod_id`` not below
            ``vocab_size``, an unknown ``dtype``, an empty path, ...).
    """

    prefix: str
    out: str
    vocab_size: int | None = None
    eod_id: int | None = None
    tokenizer: str | None = None
    eod_token: str | None = None
    append_eod: bool = False
    dtype: str = "auto"
    shard_mb: float = 256.0
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_from_megatron({f.name: getattr(self, f.name) for f in fields(self)})


def check_from_megatron(
    settings: Mapping[str, Any], named: Callable[[str], str] = as_parameter
) -> None:
    """Refuse bad ``FromMegatron`` settings (every field, by name). ``named`` spells a field
    in messages: ``FromMegatron`` gives the fields' own names, the command line its arguments
    and flags (``PREFIX``, ``--vocab-size``), checking them before it builds the settings."""
    s = settings
    prefix, vocab_size, eod_id = s["prefix"], s["vocab_size"], s["eod_id"]
    check_path(named("prefix"), prefix)
    check_path(named("out"), s["out"])
    if is_url(prefix):
        raise InputError(
            f"'{prefix}': convert --from megatron reads a prefix on local disk; one in "
            "object storage is read in place by a plan once `tokentape verify URL` has "
            "recorded its identity (see docs/object-storage.md)"
        )
    if vocab_size is not None:
        check_count(named("vocab_size"), vocab_size, 1, 2**32)
    if eod_id is not None:
        check_count(named("eod_id"), eod_id, 0, 2**32 - 1)
        if vocab_size is not None and eod_id >= vocab_size:
            raise ArgumentError(
                f"{named('eod_id')} {eod_id} is not below {named('vocab_size')} {vocab_size}"
            )
    for name in ("tokenizer", "eod_token"):
        if s[name] is not None:
            check_text(named(name), s[name])
    if not isinstance(s["dtype"], str) or s["dtype"] not in ("auto", "uint16", "uint32"):
        raise ArgumentError(
            f"{named('dtype')} {shown(s['dtype'])}: a tokentape store is uint16 or uint32 (or auto)"
        )
    check_mb(named("shard_mb"), s["shard_mb"])
    for name in ("append_eod", "overwrite"):
        if not isinstance(s[name], bool):
            raise ArgumentError(f"{named(name)}: expected True or False, got {s[name]!r}")


def from_megatron(config: FromMegatron, progress: ProgressCallback | None = None) -> ConvertSummary:
    """Write a tokentape store with the documents and tokens of a Megatron prefix.

    The store is built under a temporary name beside ``config.out`` and swapped in only when
    complete, holding the output's writer lock throughout.

    Args:
        config: What to convert, and how.
        progress: Receives the bytes converted as it goes; None: no reports.

    Returns:
        What was written.

    Raises:
        ArgumentError: ``config`` is not a ``FromMegatron``, or the prefix's vocabulary is
            missing or inconsistent (``vocab_size`` or ``eod_id`` not given and no tokenizer,
            or different from the tokenizer's).
        InputError: ``eod_token`` without ``tokenizer``, a tokenizer spec that cannot be
            loaded, or a ``dtype`` that cannot hold the EOD id.
        StoreError: The prefix is missing or damaged, holds no tokens, has a document that
            does not end with the EOD id (without ``append_eod``) or an id that is negative,
            not below ``vocab_size`` or too large for ``dtype``, or its ``.idx`` changed while
            it was converted.
        OutputError: ``out`` exists and is not a store (or holds one, without
            ``overwrite``), another process is writing it, or it cannot be written.
    """
    if not isinstance(config, FromMegatron):
        raise ArgumentError(f"config must be a FromMegatron, got {shown(config)}")
    check_callback(progress)
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
        raise InputError(f"--dtype {dtype} cannot hold the end-of-document id {eod}")
    shard_tokens = max(1, int(config.shard_mb * 2**20) // itemsize)
    out = _store_dir(config.out)
    total = src.n_tokens * src.dtype.itemsize
    with _output_errors(out), output_lock(out, "convert"):
        _check_store_out(out, config.overwrite)
        _remove_stale_temps(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_path(out, TEMP_NEW)
        writer = None
        try:
            tmp.mkdir()
            writer = ShardWriter(tmp, dtype, shard_tokens)
            bin_hash = hashlib.sha256()
            with tally(total, "convert", progress) as counting:
                for first, stop in doc_chunks(src, CHUNK_TOKENS):
                    start, end, lengths = _span(src, first, stop)
                    tokens = src.tokens(start, end)
                    bin_hash.update(np.ascontiguousarray(tokens).data.cast("B"))
                    _check_ids(tokens, vocab, id_limit, start, config.prefix)
                    if config.append_eod:
                        tokens = np.insert(tokens, np.cumsum(lengths), eod)
                        lengths = lengths + 1
                    writer.add(tokens, lengths)
                    if counting is not None:
                        counting.add((end - start) * src.dtype.itemsize)
            shards = writer.finish()
            writer = None
            n_tokens = sum(s.n_tokens for s in shards)
            if n_tokens == 0:
                raise StoreError(f"Megatron prefix '{config.prefix}': holds no tokens")
            idx_sha = _index_sha256(src, config.prefix)
            stored = src.tokenizer.stored_file()
            if stored is not None:
                write_atomic(tmp / stored[0], stored[1])
            manifest = _manifest(config, src, dtype, shards, bin_hash.hexdigest(), idx_sha)
            write_atomic(tmp / MANIFEST_NAME, manifest.to_json().encode())
            _install_store(tmp, out, config.overwrite)
        except BaseException:
            if writer is not None:
                with contextlib.suppress(OSError):
                    writer.abort()
            _remove_temps(out.parent, tmp.name)
            raise
    return ConvertSummary(
        direction="from megatron",
        source=config.prefix,
        out=str(Path(config.out)),
        dtype=dtype,
        vocab_size=vocab,
        eod_id=eod,
        n_docs=manifest.n_docs,
        n_tokens=manifest.n_tokens,
        bytes_read=total,
        seconds=time.monotonic() - started,
        content_hash=manifest.content_hash,
    )


def _index_sha256(src: MegatronSource, prefix: str, chunk_bytes: int = 8 * 2**20) -> str:
    """sha256 of the ``.idx`` the conversion read, a chunk at a time. The file is opened by
    name again: if it is no longer the one the source opened (replaced or rewritten since,
    as its size, mtime and ctime show), the conversion is refused rather than record the
    hash of another index."""
    path = megatron.idx_path(prefix)
    with megatron.open_for_reading(path) as f:
        before = megatron.FileKey.of(os.fstat(f.fileno()))
        digest = sha256_stream(f, chunk_bytes)
        after = megatron.FileKey.of(os.fstat(f.fileno()))
    read = src.index.keys.idx if src.index.keys is not None else before
    if not before == after == read:
        raise StoreError(
            f"'{path}': changed while it was being converted; nothing was written, run the "
            "command again"
        )
    return digest


def _tokenizer(config: FromMegatron) -> Tokenizer | None:
    if config.tokenizer is None:
        if config.eod_token is not None:
            raise InputError("--eod-token needs --tokenizer")
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
        raise StoreError(f"{where} has the negative id {value}")
    if value >= vocab:
        raise StoreError(f"{where} has id {value}, not below vocab_size {vocab}")
    raise StoreError(f"{where} has id {value}, which the store's dtype cannot hold")


def _store_dir(out: str) -> Path:
    """The directory to replace for ``out``: absolute (``.`` has a name), a symbolic link's
    target rather than the link."""
    path = Path(os.path.abspath(out))
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if not path.name:
        raise OutputError(f"'{out}': a store cannot be written at the file system's root")
    return path


def _check_store_out(out: Path, overwrite: bool) -> None:
    """Refuse an output that is a file, a directory holding anything tokentape cannot tell is
    its own (even with ``overwrite``: ``store.output.survey``), or one holding a store or part
    of one without ``overwrite``. Nothing is removed here: an old store is replaced only once
    the new one is complete, and then only what is tokentape's (``discard_store``)."""
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise OutputError(f"'{out}': exists and is not a directory")
    names = check_ours(out, f"'{out}'", "move it away or choose another output directory").ours
    if names and not overwrite:
        if MANIFEST_NAME in names:
            raise OutputError(f"'{out}': holds a store; pass --overwrite to replace it")
        raise OutputError(
            f"'{out}': holds an unfinished tokentape store (found '{names[0]}'); pass "
            "--overwrite to replace it"
        )


def _install_store(tmp: Path, out: Path, overwrite: bool) -> None:
    """Put the complete store ``tmp`` at ``out``: in one atomic exchange of the two names where
    the file system supports it (a reader opening ``out`` finds the old store or the new one),
    then the old one is removed; elsewhere, see ``store.atomic.replace_directory``."""
    _check_store_out(out, overwrite)  # again: the directory may have changed while converting
    replace_directory(tmp, out, discard_store)


def _manifest(
    config: FromMegatron,
    src: MegatronSource,
    dtype: str,
    shards: list[ShardInfo],
    bin_sha: str,
    idx_sha: str,
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


__all__ = [
    "ConvertSummary",
    "FromMegatron",
    "check_from_megatron",
    "from_megatron",
    "to_megatron",
]
