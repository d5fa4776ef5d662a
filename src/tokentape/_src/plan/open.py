"""Open any kind of source: a tokentape store directory or a Megatron prefix.

``open_source`` returns a ``reader.Source`` or a ``megatron.source.MegatronSource`` (on disk, or
at an object URL: the same two formats over another byte reader), typed as their interface
``reader.TokenStream`` (whose ``manifest`` is a ``reader.SourceManifest``).
"""

from __future__ import annotations

import os
from pathlib import Path

from tokentape._src.megatron.format import is_prefix
from tokentape._src.megatron.source import MEGATRON, MegatronSource, megatron_at_url
from tokentape._src.objects.client import (
    StorageOptions,
    check_storage_options,
    is_url,
    join,
    object_store,
    redact,
)
from tokentape._src.objects.ranged import FetchConfig
from tokentape._src.store.format import MANIFEST_NAME
from tokentape._src.store.reader import Source, TokenStream, source_at_url
from tokentape._src.util.checks import check_int, check_optional_text, check_path, shown
from tokentape._src.util.progress import ProgressCallback, check_callback
from tokentape.errors import ArgumentError, InputError, StoreError

TOKENTAPE = "tokentape"
FORMATS = (TOKENTAPE, MEGATRON)


def detect_format(path: str | os.PathLike[str]) -> str:
    """``tokentape`` for a directory with ``manifest.json``, ``megatron`` for a prefix with
    ``.bin`` and ``.idx``; otherwise an error saying what was looked for."""
    p = Path(path)
    if os.path.lexists(p / MANIFEST_NAME):  # a link or a directory there: refused at open
        return TOKENTAPE
    if is_prefix(p):
        return MEGATRON
    if p.suffix in (".bin", ".idx") and is_prefix(p.with_suffix("")):
        raise InputError(
            f"'{path}': give the Megatron prefix without {p.suffix} ('{p.with_suffix('')}')"
        )
    if p.exists() and not p.is_dir():
        raise StoreError(
            f"store '{path}': not a directory (a store is a directory with {MANIFEST_NAME}; a "
            f"Megatron prefix is PREFIX of PREFIX.bin and PREFIX.idx)"
        )
    if p.is_dir():
        raise StoreError(
            f"store '{path}': no {MANIFEST_NAME}; not a complete tokentape store (nor a Megatron "
            "prefix: no .bin/.idx)"
        )
    raise StoreError(
        f"store '{path}': no such directory, nor a Megatron prefix ({p.name}.bin and {p.name}.idx)"
    )


def detect_remote_format(url: str, storage_options: StorageOptions | None = None) -> str:
    """``detect_format`` for an object URL: ``tokentape`` when ``URL/manifest.json`` exists
    (or nothing else fits: reading the manifest then says what is missing), ``megatron`` when
    ``URL.bin`` and ``URL.idx`` do."""
    objects = object_store(url, storage_options)
    url = url.rstrip("/")

    def exists(where: str) -> bool:
        try:
            return objects.info(where) is not None
        except PermissionError as exc:
            raise StoreError(f"{where}: access denied ({redact(str(exc))})") from None

    if exists(join(url, MANIFEST_NAME)):
        return TOKENTAPE
    has_bin, has_idx = exists(f"{url}.bin"), exists(f"{url}.idx")
    if has_bin and has_idx:
        return MEGATRON
    if has_bin or has_idx:
        missing = f"{url}.idx" if has_bin else f"{url}.bin"
        raise StoreError(f"{missing}: no such object (a Megatron prefix needs .bin and .idx)")
    for suffix in (".bin", ".idx"):
        stem = url[: -len(suffix)]
        if url.endswith(suffix) and exists(f"{stem}.bin") and exists(f"{stem}.idx"):
            raise InputError(f"'{url}': give the Megatron prefix without {suffix} ('{stem}')")
    return TOKENTAPE


def open_source(
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    tokenizer: str | None = None,
    progress: ProgressCallback | None = None,
    storage_options: StorageOptions | None = None,
    fetch: FetchConfig | None = None,
) -> TokenStream:
    """Open any source: a tokentape store or a Megatron prefix, local or at an object URL.

    The one way to open a source (what a plan does for each of its sources). A Megatron
    prefix needs ``vocab_size`` and ``eod_id``, or a ``tokenizer`` spec that has
    them; for a store they are checked against its manifest when given.

    Args:
        path: A store's directory, an object URL of one (``s3://bucket/stores/web``), or a
            Megatron prefix (``PREFIX`` of ``PREFIX.bin`` and ``PREFIX.idx``).
        format: ``"tokentape"``, ``"megatron"``, or None (the default: detected from the
            files).
        vocab_size: The vocabulary size: required for a Megatron prefix without a tokenizer;
            for a store, checked against its manifest when given.
        eod_id: The end-of-document id, as ``vocab_size``.
        tokenizer: A tokenizer spec (as for ``tokentape tokenize``) for a Megatron prefix; it
            gives the vocabulary size and EOD id when they are not given. Refused for a store,
            which records its own.
        progress: Receives the progress of hashing a Megatron prefix opened for the first
            time (one without a current identity); None: no reports.
        storage_options: fsspec options for a store at an object URL (``s3://...``), which
            is read in place: its manifest at once, byte ranges of its shards when read.
        fetch: How such a store is read (requests in flight, bytes cached).

    Returns:
        A ``Source`` for a store, a ``MegatronSource`` for a Megatron prefix (wherever it
        is: at an object URL, its token files are read in byte ranges).

    Raises:
        ArgumentError: An argument of the wrong type, an unknown ``format``, a ``tokenizer``
            for a store, or a Megatron prefix's vocabulary missing or inconsistent (``eod_id``
            not below ``vocab_size``, values that differ from the tokenizer's).
        InputError: ``path`` names a ``.bin`` or ``.idx`` file instead of its prefix, or the
            tokenizer spec cannot be loaded.
        StoreError: Nothing at ``path`` is a store or prefix; the store or prefix is damaged;
            a store's manifest disagrees with ``vocab_size`` or ``eod_id``; or a Megatron
            document does not end with the EOD id or holds an id outside the vocabulary.
    """
    check_path("path", path)
    if format is not None and format not in FORMATS:
        raise ArgumentError(
            f"format must be one of {', '.join(FORMATS)} or None, got {shown(format)}"
        )
    for name, value in (("vocab_size", vocab_size), ("eod_id", eod_id)):
        if value is not None:
            check_int(name, value, 0)
    check_optional_text("tokenizer", tokenizer)
    check_callback(progress)
    if storage_options is not None:
        storage_options = check_storage_options(storage_options, "storage_options")
    if fetch is not None and not isinstance(fetch, FetchConfig):
        raise ArgumentError(f"fetch must be a FetchConfig or None, got {shown(fetch)}")
    if is_url(path):
        url = str(path)
        kind = detect_remote_format(url, storage_options) if format is None else format
        if kind == MEGATRON:
            return megatron_at_url(
                url, vocab_size, eod_id, tokenizer, storage_options=storage_options, fetch=fetch
            )
        if kind != TOKENTAPE:
            raise ArgumentError(
                f"'{path}': unknown format '{kind}'; expected one of {', '.join(FORMATS)}"
            )
        if tokenizer is not None:
            raise ArgumentError(f"store '{path}': a tokenizer applies to a Megatron source only")
        return vocabulary_checked(
            source_at_url(url, storage_options, fetch), path, vocab_size, eod_id
        )
    kind = detect_format(path) if format is None else format
    if kind == TOKENTAPE:
        if tokenizer is not None:
            raise ArgumentError(
                f"store '{path}': a tokenizer applies to a Megatron source only; a tokentape "
                "store records its own"
            )
        return vocabulary_checked(Source(path), path, vocab_size, eod_id)
    if kind == MEGATRON:
        return MegatronSource(path, vocab_size, eod_id, tokenizer, progress=progress)
    raise ArgumentError(f"'{path}': unknown format '{kind}'; expected one of {', '.join(FORMATS)}")


def vocabulary_checked(
    store: Source,
    path: str | os.PathLike[str],
    vocab_size: int | None,
    eod_id: int | None,
) -> TokenStream:
    """``store`` when its manifest has the ``vocab_size`` and ``eod_id`` given (if given)."""
    for key, given in (("vocab_size", vocab_size), ("eod_id", eod_id)):
        if given is not None and given != getattr(store.manifest, key):
            raise StoreError(
                f"store '{path}': {key} {given} was expected, its manifest says "
                f"{getattr(store.manifest, key)}"
            )
    return store


__all__ = [
    "FORMATS",
    "MEGATRON",
    "TOKENTAPE",
    "TokenStream",
    "detect_format",
    "detect_remote_format",
    "open_source",
    "vocabulary_checked",
]
