"""A long document encoded in pieces, with the tokens of the whole document.

A tokenizer's encoding of a text is the concatenation of its encodings of the pre-tokens its
pre-tokenizer splits the text into. Cutting the text where the pre-tokenizer splits anyway,
whatever comes before or after, therefore changes no token. tokentape cuts a document longer
than ``PIECE_CHARS`` only at such places:

- the bytes tokenizer: anywhere between two characters (each is encoded alone);
- tiktoken (GPT-2's split pattern) and Hugging Face tokenizers whose pre-tokenizer splits at
  spaces (byte-level, whitespace, metaspace, a regex split) and whose normalizer works
  character by character: just before a space that follows a letter and precedes a letter,
  where every such pattern starts a new pre-token (`` ?\\p{L}+``) and ends the one before. A
  tokenizer whose added tokens contain whitespace, whose normalizer prepends or strips, or
  that has no pre-tokenizer is never cut.

Each cut is also checked on the text around it: the encoding of 2 x ``CHECK_CHARS`` characters
around the cut must equal the encodings of its two halves; a place that fails is skipped.
A document with no such place (no space between letters in a stretch) is encoded whole there.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from tokentape._src.store.tokenizers import Tokenizer

PIECE_CHARS = 1 << 20
"""Documents longer than this (characters) are encoded in pieces of about this size."""
CHECK_CHARS = 256
"""Characters on each side of a cut that the check encodes."""
PIECES_PER_CALL = 4
"""Pieces encoded per call: the tokenizer's own per-token objects stay small."""

_LOCAL_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "BertNormalizer"}
_SPLITTING = {
    "ByteLevel",
    "Whitespace",
    "WhitespaceSplit",
    "Metaspace",
    "BertPreTokenizer",
    "Split",
}


def can_cut(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` is one whose documents are cut (see the module docstring)."""
    if tokenizer.kind in ("bytes", "tiktoken"):
        return True
    if tokenizer.kind != "hf":
        return False
    try:
        config = json.loads(getattr(tokenizer, "file_bytes", b"") or b"null")
    except ValueError:
        return False
    if not isinstance(config, dict):
        return False
    added = config.get("added_tokens") or []
    if any(
        any(c.isspace() for c in str(t.get("content", ""))) for t in added if isinstance(t, dict)
    ):
        return False
    return _local(config.get("normalizer")) and _splits(config.get("pre_tokenizer"))


def _local(normalizer: Any) -> bool:
    """A normalizer that maps the text character by character (or none)."""
    if normalizer is None:
        return True
    if not isinstance(normalizer, dict):
        return False
    kind = normalizer.get("type")
    if kind == "Sequence":
        return all(_local(n) for n in normalizer.get("normalizers") or [])
    if kind == "Replace":  # a one-character pattern (e.g. " " -> "▁")
        pattern = normalizer.get("pattern")
        return isinstance(pattern, dict) and len(str(pattern.get("String", ""))) == 1
    return kind in _LOCAL_NORMALIZERS


def _splits(pre: Any) -> bool:
    """A pre-tokenizer that splits at spaces (all of a sequence's members pre-tokenize)."""
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "Sequence":
        members = pre.get("pretokenizers") or []
        return bool(members) and all(_splits(p) for p in members)
    return pre.get("type") in _SPLITTING


def iter_pieces(text: str, tokenizer: Tokenizer, piece_chars: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` cut into pieces of about ``piece_chars`` at safe places (itself if short, or
    if ``tokenizer`` is not one that is cut), one at a time (no second copy of the text)."""
    if len(text) <= piece_chars or not can_cut(tokenizer):
        yield text
        return
    anywhere = tokenizer.kind == "bytes"
    start = 0
    while len(text) - start > piece_chars:
        cut = start + piece_chars if anywhere else _safe_cut(text, start + piece_chars, tokenizer)
        if cut is None:
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


def _safe_cut(text: str, target: int, tokenizer: Tokenizer) -> int | None:
    """The first place at or after ``target``: a space after a letter and before a letter, that
    passes the check; None when there is none."""
    i = target
    while True:
        i = text.find(" ", i)
        if i < 0 or i + 1 >= len(text):
            return None
        if (
            i > 0
            and text[i - 1].isalpha()
            and text[i + 1].isalpha()
            and _checked(text, i, tokenizer)
        ):
            return i
        i += 1


def _checked(text: str, cut: int, tokenizer: Tokenizer) -> bool:
    a, b = max(0, cut - CHECK_CHARS), cut + CHECK_CHARS
    return tokenizer.encode(text[a:b]) == tokenizer.encode(text[a:cut]) + tokenizer.encode(
        text[cut:b]
    )


def encode_pieces(tokenizer: Tokenizer, parts: Iterable[str]) -> np.ndarray:
    """The concatenated encodings of ``parts``, a few at a time, in the narrowest unsigned
    type that holds every id of the vocabulary (uint16 up to 65,536 ids, else uint32)."""
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    arrays = []
    it = iter(parts)
    while group := list(itertools.islice(it, PIECES_PER_CALL)):
        flat, _ = tokenizer.encode_flat(group)
        arrays.append(flat.astype(dtype))
    return _joined(arrays, dtype)


def _joined(arrays: list[np.ndarray], dtype: type = np.uint32) -> np.ndarray:
    """One array of ``arrays`` in order (the array itself when there is one: no copy)."""
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def encode_documents(
    tokenizer: Tokenizer,
    texts: list[str],
    piece_chars: int = PIECE_CHARS,
    encoded: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``tokenizer.encode_flat(texts)``, with every document longer than ``piece_chars``
    encoded in pieces (the same tokens, bounded memory); ``encoded`` hears the characters
    encoded so far as a long document's pieces go (a heartbeat for progress)."""
    if all(len(t) <= piece_chars for t in texts):
        return tokenizer.encode_flat(texts)
    done = 0  # characters of ``texts`` encoded
    arrays: list[np.ndarray] = []
    lengths: list[int] = []
    short: list[str] = []  # short documents since the last long one, encoded together

    def flush() -> None:
        nonlocal done
        if short:
            flat, counts = tokenizer.encode_flat(short)
            arrays.append(flat.astype(np.uint32, copy=False))
            lengths.extend(counts.tolist())
            done += sum(len(t) for t in short)
            short.clear()

    def heard(piece: str) -> str:
        nonlocal done
        done += len(piece)
        if encoded is not None:
            encoded(done)
        return piece

    for text in texts:
        if len(text) <= piece_chars:
            short.append(text)
            continue
        flush()
        parts = (heard(p) for p in iter_pieces(text, tokenizer, piece_chars))
        tokens = encode_pieces(tokenizer, parts)
        arrays.append(tokens)
        lengths.append(len(tokens))
    flush()
    return _joined(arrays), np.asarray(lengths, dtype=np.int64)


__all__ = ["can_cut", "encode_documents", "encode_pieces", "iter_pieces"]
