"""Tokenizer adapters: one small interface over Hugging Face, tiktoken and raw UTF-8 bytes.

Every adapter maps a document's text to token ids in ``[0, vocab_size)`` and never emits the
end-of-document id for document text: the EOD id is only ever appended by the store writer.
Text that spells the EOD token (``"<|endoftext|>"``) is tokenized as ordinary text.

``encode_batch`` is single-threaded on purpose: parallelism belongs to the driver (one
tokenizer per worker process), and a tokenizer that starts its own thread pool would
oversubscribe the cores. The Hugging Face adapter loops over ``Tokenizer.encode`` unless
``TOKENIZERS_PARALLELISM`` is off, in which case it calls ``encode_batch_fast`` (single-threaded
then, and faster: it computes no character offsets); tokentape's worker processes switch it
off, while a process that imports this module keeps whatever setting it has. The tiktoken
adapter encodes one text at a time (``encode_ordinary_batch`` uses a thread pool), straight
into numpy buffers in ``encode_flat``.

Nothing here touches the network: tiktoken ranks files are parsed here rather than through
``tiktoken.load`` (which caches by path name in a temp directory), and a model name is looked up
only in the local Hugging Face cache (``huggingface_hub.try_to_load_from_cache``, which never
downloads).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import stat
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import tiktoken
import tokenizers

from tokentape._src.store.confine import open_inside
from tokentape._src.util.text import is_utf8
from tokentape.errors import ArgumentError, InputError, StoreError, TokentapeError

GPT2_SPLIT_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
"""The regular expression GPT-2 uses to split text into pieces before byte-pair merging."""

DEFAULT_TIKTOKEN_EOD = "<|endoftext|>"
"""Name of the end-of-document token added to a tiktoken ranks file when none is given."""

HF_EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
"""End-of-document tokens looked for, in order, in a Hugging Face tokenizer."""

BYTE_EOD_ID = 256
"""The byte tokenizer's end-of-document id (ids 0..255 are the UTF-8 bytes)."""

HF_CONFIG_NAME = "tokenizer_config.json"
"""Read beside a ``tokenizer.json`` given as a directory or model name: its ``eos_token`` is
the end-of-document token (unless ``--eod-token`` names one)."""

HF_CONFIG_MAX_BYTES = 16 * 1024 * 1024
"""The largest ``tokenizer_config.json`` read (real ones are a few KiB; a bigger one is refused
rather than read whole)."""

HF_STORED_NAME = "tokenizer.json"
TIKTOKEN_STORED_NAME = "tokenizer.tiktoken"
STORED_NAMES = (HF_STORED_NAME, TIKTOKEN_STORED_NAME)
"""The only names a tokenizer copy in a store may have."""

_FINGERPRINT_DOMAIN = b"tokentape-tokenizer-v1"


class Tokenizer(Protocol):
    """What the tokenize driver and the audit tools need from a tokenizer."""

    @property
    def kind(self) -> str:
        """``"hf"``, ``"tiktoken"`` or ``"bytes"``."""
        ...

    @property
    def spec(self) -> str:
        """The spec it was loaded from (as given on the command line)."""
        ...

    @property
    def vocab_size(self) -> int:
        """Every id, the EOD id included, is in ``[0, vocab_size)``."""
        ...

    @property
    def eod_id(self) -> int:
        """The id appended after each document."""
        ...

    @property
    def eod_token(self) -> str | None:
        """The EOD token's text; ``None`` for the byte tokenizer."""
        ...

    @property
    def fingerprint(self) -> str:
        """``"sha256:<hex>"`` over the kind, the tokenizer file's bytes and the EOD id."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of one document, without the EOD id."""
        ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]``, on the calling thread only."""
        ...

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids concatenated (``uint32``) and each text's id count (``int64``).

        Equal to ``encode_batch`` flattened; the fast path of the tokenize workers.
        """
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of a sequence of ids (invalid UTF-8 is replaced, not raised)."""
        ...

    def stored_file(self) -> tuple[str, bytes] | None:
        """``(file name, content)`` to copy into a store; ``None`` when there is no file."""
        ...


def _fingerprint(kind: str, eod_id: int, *parts: bytes) -> str:
    """A length-prefixed SHA-256 over the kind, the EOD id and the given byte strings."""
    digest = hashlib.sha256(_FINGERPRINT_DOMAIN)
    for part in (kind.encode(), str(eod_id).encode(), *parts):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return "sha256:" + digest.hexdigest()


def _valid_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (as tiktoken does), so it is UTF-8."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _valid_text(text).encode("utf-8")


def _flatten(id_lists: Iterable[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate id lists into ``uint32`` (converted at C speed) with their lengths."""
    flat = array("I")
    lengths = []
    for ids in id_lists:
        flat.extend(ids)
        lengths.append(len(ids))
    return np.frombuffer(flat, dtype=np.uint32), np.array(lengths, dtype=np.int64)


def _check_ids(ids: Sequence[int], vocab_size: int, what: str) -> list[int]:
    """``ids`` as a list, refusing any id outside ``[0, vocab_size)``."""
    id_list = [int(i) for i in ids]
    bad = [i for i in id_list if not 0 <= i < vocab_size]
    if bad:
        raise ArgumentError(
            f"{what}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})"
        )
    return id_list


def _read_file(path: Path, context: str) -> bytes:
    """The bytes of a tokenizer file, with a one-line error when it cannot be read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"tokenizer file '{path}': not found ({context})") from None
    except IsADirectoryError:
        raise InputError(f"tokenizer file '{path}': is a directory ({context})") from None
    except OSError as exc:
        raise InputError(f"tokenizer file '{path}': cannot read ({exc.strerror})") from None


# --------------------------------------------------------------------------------------------
# bytes


BYTES_FINGERPRINT = _fingerprint("bytes", BYTE_EOD_ID)


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 and EOD = 256; needs no file."""

    spec: str = "bytes"
    kind: str = field(default="bytes", init=False)
    vocab_size: int = field(default=BYTE_EOD_ID + 1, init=False)
    eod_id: int = field(default=BYTE_EOD_ID, init=False)
    eod_token: str | None = field(default=None, init=False)
    fingerprint: str = field(default=BYTES_FINGERPRINT, init=False)

    def encode(self, text: str) -> list[int]:
        """The document's UTF-8 bytes."""
        return list(_utf8(text))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Each document's UTF-8 bytes."""
        return [self.encode(text) for text in texts]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The documents' UTF-8 bytes, concatenated, as ids."""
        encoded = [_utf8(text) for text in texts]
        flat = np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(np.uint32)
        return flat, np.array([len(b) for b in encoded], dtype=np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        """The bytes decoded as UTF-8 (invalid sequences replaced); EOD ids are skipped."""
        id_list = _check_ids(ids, self.vocab_size, "byte tokenizer")
        return bytes(i for i in id_list if i != BYTE_EOD_ID).decode("utf-8", errors="replace")

    def stored_file(self) -> tuple[str, bytes] | None:
        """The byte tokenizer has no file."""
        return None


# --------------------------------------------------------------------------------------------
# tiktoken


def _ranks_error(path: Path, detail: str) -> InputError:
    return InputError(f"tiktoken ranks file '{path}': {detail}")


def parse_tiktoken_ranks(data: bytes, path: Path) -> dict[bytes, int]:
    """Parse a tiktoken ranks file (one ``<base64 token> <rank>`` per line) and check it."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        token: bytes | None = None
        rank = -1
        if len(parts) == 2 and parts[1].isdigit():
            try:
                token = base64.b64decode(parts[0], validate=True)
                rank = int(parts[1])
            except (binascii.Error, ValueError):
                token = None
        if not token:
            raise _ranks_error(path, f"line {lineno}: expected '<base64 token> <rank>'")
        if token in ranks:
            raise _ranks_error(path, f"line {lineno}: token listed twice")
        ranks[token] = rank
    if not ranks:
        raise _ranks_error(path, "no ranks; expected lines '<base64 token> <rank>'")
    if len(set(ranks.values())) != len(ranks):
        raise _ranks_error(path, "a rank is given to more than one token")
    missing = sum(1 for b in range(256) if bytes([b]) not in ranks)
    if missing:
        raise _ranks_error(path, f"{missing} of the 256 single bytes have no rank")
    return ranks


@dataclass(frozen=True)
class TiktokenTokenizer:
    """A tiktoken BPE ranks file with the GPT-2 split pattern and one EOD special token."""

    spec: str
    path: Path
    eod_token: str
    eod_id: int
    vocab_size: int
    fingerprint: str
    split_pattern: str = field(repr=False)
    file_bytes: bytes = field(repr=False, compare=False)
    encoding: tiktoken.Encoding = field(repr=False, compare=False)
    kind: str = field(default="tiktoken", init=False)

    @classmethod
    def from_bytes(
        cls, data: bytes, path: Path, spec: str, eod_token: str = DEFAULT_TIKTOKEN_EOD
    ) -> TiktokenTokenizer:
        """Build from the ranks file's content; EOD id = max rank + 1.

        A ranks file names no special token: the one tokentape adds, ``<|endoftext|>`` at max
        rank + 1, is the only EOD token it can have (another name would not be that token)."""
        if eod_token != DEFAULT_TIKTOKEN_EOD:
            raise InputError(
                f"tokenizer {spec!r}: --eod-token {eod_token!r} is not a token of this tiktoken "
                f"ranks file; accepted: {DEFAULT_TIKTOKEN_EOD!r} (the special token tokentape "
                "adds at max rank + 1), or leave --eod-token out"
            )
        ranks = parse_tiktoken_ranks(data, path)
        eod_id = max(ranks.values()) + 1
        encoding = tiktoken.Encoding(
            name=f"tokentape:{path.name}",
            pat_str=GPT2_SPLIT_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={eod_token: eod_id},
        )
        return cls(
            spec=spec,
            path=path,
            eod_token=eod_token,
            eod_id=eod_id,
            vocab_size=eod_id + 1,
            fingerprint=_fingerprint("tiktoken", eod_id, data, GPT2_SPLIT_PATTERN.encode()),
            split_pattern=GPT2_SPLIT_PATTERN,
            file_bytes=data,
            encoding=encoding,
        )

    def encode(self, text: str) -> list[int]:
        """Ordinary BPE ids; special-token text in the document stays plain text."""
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` of each text, on the calling thread."""
        encode_ordinary = self.encoding.encode_ordinary
        return [encode_ordinary(text) for text in texts]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``encode`` of each text straight into numpy buffers, concatenated."""
        arrays = [self._encode_array(text) for text in texts]
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)
        return flat.astype(np.uint32, copy=False), lengths

    def _encode_array(self, text: str) -> np.ndarray:
        # With no special token allowed, this is encode_ordinary without the list round trip.
        try:
            return self.encoding.encode_to_numpy(text, disallowed_special=())
        except UnicodeEncodeError:
            return self.encoding.encode_to_numpy(_valid_text(text), disallowed_special=())

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the ids; the EOD id decodes to its token text."""
        id_list = _check_ids(ids, self.vocab_size, f"tokenizer {self.spec!r}")
        try:
            return self.encoding.decode(id_list, errors="replace")
        except KeyError as exc:  # a gap in the ranks
            raise ArgumentError(
                f"tokenizer {self.spec!r}: token id {exc.args[0]} has no rank"
            ) from None

    def stored_file(self) -> tuple[str, bytes] | None:
        """The ranks file, to copy into a store."""
        return TIKTOKEN_STORED_NAME, self.file_bytes


# --------------------------------------------------------------------------------------------
# Hugging Face


def _one_line(message: object) -> str:
    text = " ".join(str(message).split())
    return text[:200]


def _hf_backend(data: bytes, path: Path) -> tokenizers.Tokenizer:
    """Parse a ``tokenizer.json`` with padding and truncation switched off."""
    try:
        json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            f"tokenizer file '{path}': not valid JSON ({_one_line(exc)}); "
            "expected a Hugging Face tokenizer.json"
        ) from None
    try:
        backend = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # the Rust library raises plain Exception
        raise InputError(
            f"tokenizer file '{path}': not a Hugging Face tokenizer.json ({_one_line(exc)})"
        ) from None
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = True
    return backend


EOD_NAMED = "named by --eod-token"
EOD_FROM_CANDIDATES = "the first of " + ", ".join(HF_EOD_CANDIDATES) + " in its vocabulary"


def _first_in_vocabulary(
    backend: tokenizers.Tokenizer, candidates: Sequence[str]
) -> tuple[str, int] | None:
    """The first of ``candidates`` that is a token of ``backend``, and its id."""
    for candidate in candidates:
        found = backend.token_to_id(candidate)
        if found is not None:
            return candidate, int(found)
    return None


def _hf_eod(
    backend: tokenizers.Tokenizer, spec: str, eod_token: str | None, config_eos: str | None
) -> tuple[str, int, str]:
    """The EOD token, its id and how it was chosen: the one named, else the ``eos_token`` of
    ``tokenizer_config.json`` (``config_eos``), else the first known candidate present."""
    if eod_token is not None:
        if not is_utf8(eod_token):
            raise InputError(
                f"tokenizer {spec!r}: --eod-token {eod_token!r} is not valid text (not UTF-8), "
                "so it is not in its vocabulary"
            )
        eod_id = backend.token_to_id(eod_token)
        if eod_id is None:
            raise InputError(
                f"tokenizer {spec!r}: --eod-token {eod_token!r} is not in its vocabulary"
            )
        return eod_token, eod_id, EOD_NAMED
    if config_eos is not None:
        if not is_utf8(config_eos):
            raise InputError(
                f"tokenizer {spec!r}: the eos_token {config_eos!r} of its {HF_CONFIG_NAME} is "
                "not valid text (not UTF-8); name the end-of-document token with --eod-token"
            )
        eod_id = backend.token_to_id(config_eos)
        if eod_id is None:
            raise InputError(
                f"tokenizer {spec!r}: the eos_token {config_eos!r} of its {HF_CONFIG_NAME} is "
                f"not in its {HF_STORED_NAME} vocabulary; name one with --eod-token"
            )
        return config_eos, eod_id, f"the eos_token of {HF_CONFIG_NAME}"
    known = _first_in_vocabulary(backend, HF_EOD_CANDIDATES)
    if known is not None:
        return *known, EOD_FROM_CANDIDATES
    raise InputError(
        f"tokenizer {spec!r}: no end-of-document token among "
        f"{', '.join(HF_EOD_CANDIDATES)}; name one with --eod-token"
    )


@dataclass(frozen=True)
class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (no special tokens added, no truncation, no padding)."""

    spec: str
    path: Path
    eod_token: str
    eod_id: int
    vocab_size: int
    fingerprint: str
    eod_is_special: bool = field(repr=False)
    """False when the EOD is a plain or non-special token that document text can produce."""
    file_bytes: bytes = field(repr=False, compare=False)
    backend: tokenizers.Tokenizer = field(repr=False, compare=False)
    eod_reason: str = field(default=EOD_NAMED, repr=False, compare=False)
    """How the EOD token was chosen (for the tokenize summary)."""
    directory: Path | None = field(default=None, repr=False, compare=False)
    """The directory it was loaded from (its ``tokenizer_config.json`` is there); None: a
    ``tokenizer.json`` given as a file, or a store's copy."""
    kind: str = field(default="hf", init=False)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        path: Path,
        spec: str,
        eod_token: str | None = None,
        config_eos: str | None = None,
    ) -> HFTokenizer:
        """Build from the file's content (the bytes that are fingerprinted are the ones used).

        The EOD is ``eod_token``, else ``config_eos`` (the ``eos_token`` of the
        ``tokenizer_config.json`` beside it), else the first of ``HF_EOD_CANDIDATES`` present.
        """
        backend = _hf_backend(data, path)
        eod_token, eod_id, reason = _hf_eod(backend, spec, eod_token, config_eos)
        vocab = backend.get_vocab(with_added_tokens=True)
        max_id = max(vocab.values(), default=-1)
        vocab_size = max(backend.get_vocab_size(with_added_tokens=True), max_id + 1)
        added = backend.get_added_tokens_decoder().get(eod_id)
        return cls(
            spec=spec,
            path=path,
            eod_token=eod_token,
            eod_id=eod_id,
            vocab_size=vocab_size,
            fingerprint=_fingerprint("hf", eod_id, data),
            eod_is_special=added is not None and added.special,
            file_bytes=data,
            backend=backend,
            eod_reason=reason,
        )

    def encode(self, text: str) -> list[int]:
        """``backend.encode(text, add_special_tokens=False).ids``, never holding the EOD id."""
        try:
            ids = self.backend.encode(text, add_special_tokens=False).ids
        except (TypeError, UnicodeEncodeError):  # lone surrogates are refused as "not str"
            if not isinstance(text, str):
                raise
            ids = self.backend.encode(_valid_text(text), add_special_tokens=False).ids
        return self._checked(ids)

    def _checked(self, ids: list[int]) -> list[int]:
        if not self.eod_is_special and self.eod_id in ids:
            raise InputError(
                f"tokenizer {self.spec!r}: document text encodes to the end-of-document id "
                f"{self.eod_id} ({self.eod_token!r} is not a special token); "
                "name a special token with --eod-token"
            )
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` of each text, on the calling thread (no rayon pool).

        Where ``TOKENIZERS_PARALLELISM`` is off (as in tokentape's worker processes), the
        library's ``encode_batch_fast`` runs on the calling thread too, and skips computing
        character offsets; it gives the same ids.
        """
        if os.environ.get("TOKENIZERS_PARALLELISM", "").lower() not in ("false", "0", "off"):
            return [self.encode(text) for text in texts]
        try:
            encodings = self.backend.encode_batch_fast(texts, add_special_tokens=False)
        except (TypeError, UnicodeEncodeError):  # a lone surrogate somewhere in the batch
            return [self.encode(text) for text in texts]
        return [self._checked(e.ids) for e in encodings]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``encode_batch``, concatenated."""
        return _flatten(self.encode_batch(texts))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the ids, special tokens (the EOD) included."""
        id_list = _check_ids(ids, self.vocab_size, f"tokenizer {self.spec!r}")
        return self.backend.decode(id_list, skip_special_tokens=False)

    def stored_file(self) -> tuple[str, bytes] | None:
        """The ``tokenizer.json``, to copy into a store."""
        return HF_STORED_NAME, self.file_bytes


# --------------------------------------------------------------------------------------------
# none


NO_TOKENIZER_FINGERPRINT = "none"
"""The fingerprint of data whose tokenizer is unknown: compared with nothing."""


@dataclass(frozen=True)
class NoTokenizer:
    """Stands in for the unknown tokenizer of converted or in-place Megatron data: it knows
    the vocabulary size and EOD id only, and "decodes" to the ids themselves."""

    vocab_size: int
    eod_id: int
    spec: str = "none"
    kind: str = field(default="none", init=False)
    eod_token: str | None = field(default=None, init=False)
    fingerprint: str = field(default=NO_TOKENIZER_FINGERPRINT, init=False)

    def _refuse(self) -> TokentapeError:
        return TokentapeError("no tokenizer is known for this data; it cannot encode text")

    def encode(self, text: str) -> list[int]:
        raise self._refuse()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        raise self._refuse()

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        raise self._refuse()

    def decode(self, ids: Sequence[int]) -> str:
        """The ids as text (``ids: 17 4 99``): there is no tokenizer to decode them with."""
        id_list = _check_ids(ids, self.vocab_size, "token ids")
        return "ids: " + " ".join(str(i) for i in id_list)

    def stored_file(self) -> tuple[str, bytes] | None:
        return None


# --------------------------------------------------------------------------------------------
# loading


SPECS_EXPECTED = (
    "expected 'bytes', 'tiktoken:PATH', a Hugging Face tokenizer.json or a directory holding "
    "one, or a model name in the local Hugging Face cache ([hf:]NAME)"
)

_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
"""A Hugging Face model id: ``name`` or ``org/name``."""

_RANKS_LINE = re.compile(rb"\s*[A-Za-z0-9+/]+={0,2} \d+\s*")


def _is_model_name(name: str) -> bool:
    """Whether ``name`` reads as a model id rather than a file name (``gpt2``, ``org/name``)."""
    return (
        _MODEL_NAME.fullmatch(name) is not None
        and ".." not in name
        and "--" not in name
        and not name.endswith((".json", ".tiktoken", ".model", ".txt"))
    )


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now as ``huggingface_hub`` reads
    it at import: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = env.get("HF_HOME") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
            "huggingface",
        )
        cache = os.path.join(home, "hub")
    return Path(os.path.expanduser(os.path.expandvars(cache)))


def _from_hf_cache(name: str, lead: str) -> Path:
    """The snapshot directory holding model ``name``'s ``tokenizer.json`` in the local cache
    (revision ``main``); never downloads. ``lead`` starts the error message."""
    # Imported here: it costs 0.1 s at startup, and only a model name needs it. It parses its
    # HF_HUB_* environment variables at import, and raises ValueError on a malformed one
    # (imported from its module: the package's lazy loader would also print that to stdout).
    try:
        from huggingface_hub.file_download import try_to_load_from_cache
    except ValueError as exc:
        raise InputError(
            f"{lead}huggingface_hub cannot start: one of its environment variables is "
            f"malformed ({_one_line(exc)}); check the HF_HUB_* and HF_* variables"
        ) from None

    cache = hf_cache_dir()
    try:
        found = try_to_load_from_cache(name, HF_STORED_NAME, cache_dir=cache)
    except ValueError as exc:  # huggingface_hub's HFValidationError: not a valid model id
        raise InputError(f"{lead}not a Hugging Face model id ({_one_line(exc)})") from None
    if not isinstance(found, str):
        raise InputError(
            f"{lead}no {HF_STORED_NAME} of model {name!r} in the local Hugging Face cache "
            f"{cache} (tokentape never downloads); make it available with "
            f"`hf download {name} {HF_STORED_NAME} {HF_CONFIG_NAME}` (or point HF_HUB_CACHE "
            "at a cache that has it), or give the directory holding its tokenizer.json"
        )
    return Path(found).parent


EOD_HINT = "name the end-of-document token with --eod-token"
BOS_HINT = "choose with --bos-token TOKEN or --no-bos"


def _config_error(path: Path, detail: str, hint: str = EOD_HINT) -> InputError:
    return InputError(f"tokenizer config '{path}': {detail}; fix or remove it, or {hint}")


def _read_config(path: Path, hint: str) -> bytes:
    """The bytes of a ``tokenizer_config.json`` that exists as a path: it must be a readable
    regular file (links are followed: a cache snapshot links into its blobs) of at most
    ``HF_CONFIG_MAX_BYTES``. Opened without blocking, so a FIFO is refused, not waited on."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        gone = "a dangling link (its target is missing)" if path.is_symlink() else "not found"
        raise _config_error(path, gone, hint) from None
    except OSError as exc:
        raise _config_error(path, f"cannot read ({exc.strerror})", hint) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise _config_error(path, "is a directory", hint)
        if not stat.S_ISREG(mode):
            raise _config_error(path, "not a regular file", hint)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(HF_CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise _config_error(path, f"cannot read ({exc.strerror})", hint) from None
    finally:
        os.close(fd)
    if len(data) > HF_CONFIG_MAX_BYTES:
        raise _config_error(path, f"larger than {HF_CONFIG_MAX_BYTES // (1024 * 1024)} MiB", hint)
    return data


def _config(directory: Path, hint: str) -> dict[str, Any] | None:
    """``directory/tokenizer_config.json`` as a JSON object; None without that file.

    A path of that name that is not a readable regular file (a dangling link, a directory) is
    refused, not ignored: ignoring it would silently change the tokens a document gets."""
    path = directory / HF_CONFIG_NAME
    if not os.path.lexists(path):
        return None
    data = _read_config(path, hint)
    try:
        config = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"tokenizer config '{path}': not valid JSON ({_one_line(exc)})") from None
    if not isinstance(config, dict):
        raise InputError(f"tokenizer config '{path}': expected a JSON object")
    return config


def _config_token(config: dict[str, Any], key: str, path: Path, hint: str) -> str | None:
    """The token named by ``config[key]`` (``eos_token``, ``bos_token``): a string, or a
    serialized AddedToken (``{"content": "</s>", ...}``); None where the key is absent or null."""
    token = config.get(key)
    if isinstance(token, dict):
        if token.get("content") is None:  # not "no token": refused, not ignored
            raise InputError(
                f"tokenizer config '{path}': {key} is an added token without a 'content' "
                f"({_one_line(repr(token))}); expected a token string (or {hint})"
            )
        token = token["content"]  # a content that is not a string is refused below
    if token is not None and (not isinstance(token, str) or not token):
        raise InputError(
            f"tokenizer config '{path}': {key} is {_one_line(repr(token))}; expected a token "
            f"string (or leave it out, or {hint})"
        )
    return token


def _config_eos(directory: Path) -> str | None:
    """The ``eos_token`` of ``directory/tokenizer_config.json``; None without that file or key."""
    config = _config(directory, EOD_HINT)
    if config is None:
        return None
    return _config_token(config, "eos_token", directory / HF_CONFIG_NAME, EOD_HINT)


def _hf_directory(directory: Path, spec: str, eod_token: str | None) -> HFTokenizer:
    """A directory as ``save_pretrained`` writes it: ``tokenizer.json``, and the end of
    document from ``tokenizer_config.json`` where it names an ``eos_token``."""
    path = directory / HF_STORED_NAME
    if not path.is_file():
        ranks = sorted(directory.glob("*.tiktoken"))
        hint = f"; for a tiktoken ranks file use --tokenizer tiktoken:{ranks[0]}" if ranks else ""
        raise InputError(
            f"tokenizer directory '{directory}': no {HF_STORED_NAME} in it (what a Hugging Face "
            f"fast tokenizer's save_pretrained writes){hint}"
        )
    data = _read_file(path, f"from tokenizer spec {spec!r}")
    config_eos = None if eod_token is not None else _config_eos(directory)
    tok = HFTokenizer.from_bytes(data, path, spec, eod_token, config_eos)
    return replace(tok, directory=directory)


def _hf_file(path: Path, spec: str, eod_token: str | None) -> HFTokenizer:
    """A ``tokenizer.json`` file given by path (no config is read beside it)."""
    data = _read_file(path, f"from tokenizer spec {spec!r}")
    first = next((line for line in data.splitlines() if line.strip()), b"")
    if path.suffix == ".tiktoken" or _RANKS_LINE.fullmatch(first):
        raise InputError(
            f"tokenizer file '{path}': a tiktoken ranks file, not a Hugging Face tokenizer.json; "
            f"use --tokenizer tiktoken:{path}"
        )
    return HFTokenizer.from_bytes(data, path, spec, eod_token)


def load_tokenizer(spec: str, eod_token: str | None = None) -> Tokenizer:
    """Load a tokenizer from its spec.

    ``bytes``; ``tiktoken:PATH`` (a ranks file); ``[hf:]PATH`` to a Hugging Face
    ``tokenizer.json`` or to a directory holding one (its ``tokenizer_config.json`` names the
    end-of-document token); ``[hf:]NAME`` (``gpt2``, ``org/name``), a model in the local
    Hugging Face cache, never downloaded. A path that exists wins over a model name.
    """
    if spec == "bytes":
        if eod_token is not None:
            raise InputError(
                f"--eod-token {eod_token!r}: the bytes tokenizer has no named tokens "
                f"(its end-of-document id is {BYTE_EOD_ID})"
            )
        return ByteTokenizer()
    prefix, colon, rest = spec.partition(":")
    if colon and prefix in ("tiktoken", "hf") and not rest:
        expected = "tiktoken:PATH" if prefix == "tiktoken" else "hf:PATH or hf:NAME"
        raise InputError(f"tokenizer spec {spec!r}: expected {expected}")
    if spec.startswith("tiktoken:"):
        path = Path(spec.removeprefix("tiktoken:"))
        data = _read_file(path, f"from tokenizer spec {spec!r}")
        if data.lstrip().startswith(b"{"):
            raise _ranks_error(
                path,
                "a JSON file, not a ranks file; for a Hugging Face tokenizer.json drop the "
                "'tiktoken:' prefix",
            )
        eod = DEFAULT_TIKTOKEN_EOD if eod_token is None else eod_token
        return TiktokenTokenizer.from_bytes(data, path, spec, eod)
    name = spec.removeprefix("hf:")
    path = Path(name)
    if path.is_dir():
        return _hf_directory(path, spec, eod_token)
    if path.is_file() or (spec.startswith("hf:") and not _is_model_name(name)):
        return _hf_file(path, spec, eod_token)  # a missing hf:PATH: "not found"
    if _is_model_name(name):
        lead = f"tokenizer {spec!r}: "
        if not spec.startswith("hf:"):
            lead = f"unknown tokenizer spec {spec!r}: no such file or directory, and "
        return _hf_directory(_from_hf_cache(name, lead), spec, eod_token)
    raise InputError(
        f"unknown tokenizer spec {spec!r}: no such file or directory; {SPECS_EXPECTED}"
    )


# --------------------------------------------------------------------------------------------
# beginning of document


BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")
"""Beginning-of-document tokens looked for, in order, when ``--bos`` names none and the
tokenizer's files do not either."""


@dataclass(frozen=True)
class Bos:
    """The id put before every document of a store, its token and how it was chosen."""

    id: int
    token: str
    reason: str


BOS_NAMED = "named by --bos-token"
BOS_FROM_CONFIG = f"add_bos_token and bos_token of {HF_CONFIG_NAME}"
BOS_FROM_TEMPLATE = f"what the post-processor of its {HF_STORED_NAME} puts first"


def _template_bos(tok: HFTokenizer) -> int | None:
    """The special token the tokenizer's post-processor puts before a document's own ids
    (what ``tokenizer(text)`` adds, e.g. Llama 3's ``<|begin_of_text|>``); None if none."""
    try:
        bare = tok.backend.encode("a", add_special_tokens=False).ids
        full = tok.backend.encode("a", add_special_tokens=True).ids
    except Exception:  # the Rust library raises plain Exception
        return None
    if len(full) <= len(bare) or full[1 : 1 + len(bare)] != bare:
        return None
    added = tok.backend.get_added_tokens_decoder().get(full[0])
    return full[0] if added is not None and added.special else None


def _bos_id(tok: HFTokenizer, token: str, what: str) -> int:
    """The id of ``token`` in ``tok``'s vocabulary; ``what`` says where the name came from."""
    found = tok.backend.token_to_id(token) if is_utf8(token) else None
    if found is None:
        raise InputError(
            f"tokenizer {tok.spec!r}: {what} {token!r} is not in its vocabulary; "
            "name one with --bos-token, or give --no-bos"
        )
    return int(found)


def choose_bos(tok: Tokenizer, bos: bool | None, bos_token: str | None) -> Bos | None:
    """The beginning-of-document token of a tokenize job, or None for none.

    ``bos`` False: none. ``bos_token``: that token. ``bos`` None (the default) does what the
    tokenizer does when called as ``tokenizer(text)``: where ``tokenizer_config.json`` has
    ``add_bos_token``, it decides (the token is its ``bos_token``); else the token the
    ``tokenizer.json`` post-processor puts first, if any. ``bos`` True: the config's
    ``bos_token``, else that post-processor's token, else the first of ``BOS_CANDIDATES``
    in the vocabulary. Only a Hugging Face tokenizer has one."""
    if bos is False:
        return None
    if not isinstance(tok, HFTokenizer):
        if bos is None and bos_token is None:
            return None
        flag = "--bos-token" if bos_token is not None else "--bos"
        raise InputError(
            f"{flag}: the {tok.kind} tokenizer {tok.spec!r} has no beginning-of-document "
            "token; only a Hugging Face tokenizer has one (leave out --bos)"
        )
    if bos_token is not None:
        return Bos(_bos_id(tok, bos_token, "--bos-token"), bos_token, BOS_NAMED)
    config = None if tok.directory is None else _config(tok.directory, BOS_HINT)
    path = Path(tok.directory or ".", HF_CONFIG_NAME)
    add = None if config is None else config.get("add_bos_token")
    if add is not None and not isinstance(add, bool):
        raise _config_error(path, f"add_bos_token is {_one_line(repr(add))}, not true or false",
                            BOS_HINT)  # fmt: skip
    named = None if config is None else _config_token(config, "bos_token", path, BOS_HINT)
    if bos is None and add is False:
        return None
    if named is not None and (add or bos):
        reason = BOS_FROM_CONFIG if add else f"--bos: the bos_token of {HF_CONFIG_NAME}"
        return Bos(_bos_id(tok, named, f"the bos_token of {path}:"), named, reason)
    if add:
        raise _config_error(path, "add_bos_token is true but it names no bos_token", BOS_HINT)
    template = _template_bos(tok)
    if template is not None:
        token = tok.backend.id_to_token(template) or str(template)
        reason = BOS_FROM_TEMPLATE if bos is None else f"--bos: {BOS_FROM_TEMPLATE}"
        return Bos(template, token, reason)
    if bos is None:
        return None
    known = _first_in_vocabulary(tok.backend, BOS_CANDIDATES)
    if known is not None:
        return Bos(known[1], known[0], "--bos: the first of " + ", ".join(BOS_CANDIDATES))
    raise InputError(
        f"--bos: tokenizer {tok.spec!r} names no beginning-of-document token (no bos_token in "
        f"a {HF_CONFIG_NAME}, none put first by its post-processor, none of "
        f"{', '.join(BOS_CANDIDATES)} in its vocabulary); name one with --bos-token"
    )


def bos_choice(bos: Bos | None) -> str:
    """The beginning-of-document id, its token and how it was chosen (for the tokenize
    summary): ``1 '<s>' (add_bos_token and bos_token of tokenizer_config.json)``."""
    if bos is None:
        return "none"
    return f"{bos.id} {bos.token!r} ({bos.reason})"


def tokenizer_manifest(tok: Tokenizer) -> dict[str, Any]:
    """The tokenizer block of a store manifest (JSON-ready)."""
    stored = tok.stored_file()
    return {
        "kind": tok.kind,
        "spec": tok.spec,
        "vocab_size": tok.vocab_size,
        "eod_id": tok.eod_id,
        "eod_token": tok.eod_token,
        "fingerprint": tok.fingerprint,
        "file": None if stored is None else stored[0],
    }


def eod_choice(tok: Tokenizer) -> str:
    """The end-of-document id, its token and how it was chosen (for the tokenize summary):
    ``50256 '<|endoftext|>' (the eos_token of tokenizer_config.json)``."""
    if isinstance(tok, HFTokenizer):
        why = tok.eod_reason
    elif isinstance(tok, TiktokenTokenizer):
        why = "the special token tokentape adds to a ranks file, at max rank + 1"
    elif isinstance(tok, ByteTokenizer):
        why = "the byte tokenizer's, after the 256 byte ids"
    else:
        why = "recorded with the data"
    token = "" if tok.eod_token is None else f" {tok.eod_token!r}"
    return f"{tok.eod_id}{token} ({why})"


def tokenizer_source(tok: Tokenizer) -> str:
    """The tokenizer's kind and the file it was read from: ``hf /path/to/tokenizer.json``."""
    if isinstance(tok, HFTokenizer | TiktokenTokenizer):
        return f"{tok.kind} {tok.path}"
    return tok.kind


def tokenizer_report(tok: Tokenizer) -> dict[str, object]:
    """Where a tokenizer was read and how its EOD was chosen, JSON-ready (a tokenize run's
    summary holds it)."""
    return {
        "kind": tok.kind,
        "spec": tok.spec,
        "source": tokenizer_source(tok),
        "eod_id": tok.eod_id,
        "eod_token": tok.eod_token,
        "eod_choice": eod_choice(tok),
    }


_MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "spec": (str,),
    "vocab_size": (int,),
    "eod_id": (int,),
    "eod_token": (str, type(None)),
    "fingerprint": (str,),
    "file": (str, type(None)),
}


def _check_manifest_fields(info: dict[str, Any], where: str) -> None:
    for name, types in _MANIFEST_FIELDS.items():
        value = info.get(name, ...)
        if value is ... or not isinstance(value, types) or isinstance(value, bool):
            expected = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise StoreError(f"{where}: field tokenizer.{name} missing or not {expected}")


def _check_copy(data: bytes, kind: str, info: dict[str, Any], where: str) -> None:
    """Refuse a tokenizer copy whose bytes are not the ones fingerprinted (with the recorded
    EOD id) before parsing them: a changed copy is never parsed."""
    parts = (data, GPT2_SPLIT_PATTERN.encode()) if kind == "tiktoken" else (data,)
    found = _fingerprint(kind, info["eod_id"], *parts)
    if found != info["fingerprint"]:
        raise StoreError(
            f"{where}: tokenizer fingerprint {info['fingerprint']} does not match the stored "
            f"tokenizer ({found}); the store's tokenizer file was changed"
        )


def tokenizer_from_manifest(
    info: dict[str, Any], store_dir: Path | str, data: bytes | None = None
) -> Tokenizer:
    """Reload the tokenizer a store was written with, from the copy stored in ``store_dir``
    (or from ``data``, that copy's bytes as the caller read them).

    The reloaded tokenizer must have the recorded fingerprint, EOD id and vocabulary size.
    """
    where = f"{str(store_dir).rstrip('/')}/manifest.json"
    _check_manifest_fields(info, where)
    kind, spec, name = info["kind"], info["spec"], info["file"]
    tok: Tokenizer
    if kind in ("bytes", "none") and name is not None:
        raise StoreError(f"{where}: field tokenizer.file is {name!r}; expected null")
    if kind == "bytes":
        tok = ByteTokenizer(spec=spec)
    elif kind == "none":
        tok = NoTokenizer(info["vocab_size"], info["eod_id"], spec)
    elif kind in ("hf", "tiktoken"):
        expected_name = HF_STORED_NAME if kind == "hf" else TIKTOKEN_STORED_NAME
        if name != expected_name:
            raise StoreError(
                f"{where}: field tokenizer.file is {name!r}; expected {expected_name!r}"
            )
        path = Path(store_dir) / name  # names the copy (a URL's copy came as ``data``)
        if data is None:  # read here, from a local store directory
            if not os.path.lexists(path):
                data = _read_file(path, f"the tokenizer copy named in {where}")  # not found
            else:  # the store's own file: never through a link (store.confine)
                with open(open_inside(Path(store_dir), name, "tokenizer copy"), "rb") as f:
                    data = f.read()
        _check_copy(data, kind, info, where)
        if kind == "hf":
            tok = HFTokenizer.from_bytes(data, path, spec, info["eod_token"])
        else:
            if info["eod_token"] != DEFAULT_TIKTOKEN_EOD:
                raise StoreError(
                    f"{where}: field tokenizer.eod_token is {info['eod_token']!r}; a tiktoken "
                    f"store's end-of-document token is {DEFAULT_TIKTOKEN_EOD!r}"
                )
            tok = TiktokenTokenizer.from_bytes(data, path, spec)
    else:
        raise StoreError(
            f"{where}: field tokenizer.kind is {kind!r}; expected 'hf', 'tiktoken', 'bytes' or "
            "'none'"
        )
    if tok.fingerprint != info["fingerprint"]:
        raise StoreError(
            f"{where}: tokenizer fingerprint {info['fingerprint']} does not match the stored "
            f"tokenizer ({tok.fingerprint}); the store's tokenizer file was changed"
        )
    if (tok.eod_id, tok.vocab_size) != (info["eod_id"], info["vocab_size"]):
        raise StoreError(
            f"{where}: tokenizer eod_id/vocab_size {info['eod_id']}/{info['vocab_size']} do "
            f"not match the stored tokenizer ({tok.eod_id}/{tok.vocab_size})"
        )
    return tok


__all__ = [
    "BOS_CANDIDATES",
    "GPT2_SPLIT_PATTERN",
    "HF_CONFIG_MAX_BYTES",
    "HF_EOD_CANDIDATES",
    "STORED_NAMES",
    "Bos",
    "ByteTokenizer",
    "HFTokenizer",
    "NoTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "bos_choice",
    "choose_bos",
    "eod_choice",
    "hf_cache_dir",
    "load_tokenizer",
    "tokenizer_from_manifest",
    "tokenizer_manifest",
    "tokenizer_report",
]
