"""Document filters applied while tokenizing: one text filter and two token-count filters.

A filter is a small frozen value with a name and JSON-friendly parameters. ``FilterSet``
holds the filters of one run in the order given and answers, per document, the name of the
first filter that drops it (``None`` keeps it). Text filters run before tokenizing, so a
dropped document is never tokenized; token filters see the document's token count without
the end-of-document token.

Command-line specs: ``unique-lines``, ``unique-lines:min_lines=8,min_ratio=0.5``,
``min-tokens:16``, ``max-tokens:100000``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tokentape.errors import ArgumentError, InputError, TokentapeError

_FILTER_USAGE = "expected unique-lines[:min_lines=N,min_ratio=R], min-tokens:N or max-tokens:N"
_INT_RE = re.compile(r"[0-9]+")
MAX_COUNT = 2**62
"""The largest count a filter takes (a token or line count beyond any real document)."""


@dataclass(frozen=True)
class UniqueLines:
    """Drop repetitive documents: many non-empty lines, few of them distinct.

    Lines are ``text.split("\\n")``, each stripped; empty ones are ignored. A document with at
    least ``min_lines`` such lines whose distinct/total ratio is below ``min_ratio`` is dropped.
    """

    min_lines: int = 20
    """Documents with fewer non-empty lines are always kept (>= 1)."""
    min_ratio: float = 0.3
    """Smallest distinct/total line ratio kept, in (0, 1]."""

    name: ClassVar[str] = "unique-lines"
    stage: ClassVar[str] = "text"

    def __post_init__(self) -> None:
        if isinstance(self.min_lines, bool) or not isinstance(self.min_lines, int):
            raise InputError(f"{self.name}: min_lines must be an integer")
        if self.min_lines < 1:
            raise InputError(f"{self.name}: min_lines must be >= 1, got {self.min_lines}")
        if self.min_lines > MAX_COUNT:
            raise InputError(f"{self.name}: min_lines must be at most 2**62, got {self.min_lines}")
        ratio = self.min_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float):
            raise InputError(f"{self.name}: min_ratio must be a number")
        if not (math.isfinite(ratio) and 0 < ratio <= 1):
            raise InputError(f"{self.name}: min_ratio must be in (0, 1], got {ratio}")
        object.__setattr__(self, "min_ratio", float(ratio))

    def drops(self, text: str) -> bool:
        """Whether the document is too repetitive."""
        # Fewer than min_lines lines in all: cannot have min_lines non-empty ones.
        if text.count("\n") + 1 < self.min_lines:
            return False
        lines = [line for line in map(str.strip, text.split("\n")) if line]
        total = len(lines)
        if total < self.min_lines:
            return False
        return len(set(lines)) / total < self.min_ratio

    def to_json(self) -> dict[str, Any]:
        """``{"name": "unique-lines", "min_lines": ..., "min_ratio": ...}``."""
        return {"name": self.name, "min_lines": self.min_lines, "min_ratio": self.min_ratio}


def _check_count(name: str, n: object, minimum: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise InputError(f"{name}: N must be an integer")
    if n < minimum:
        raise InputError(f"{name}: N must be >= {minimum}, got {n}")
    if n > MAX_COUNT:
        raise InputError(f"{name}: N must be at most 2**62, got {n}")


@dataclass(frozen=True)
class MinTokens:
    """Drop documents with fewer than ``n`` tokens (EOD not counted)."""

    n: int
    """Smallest token count kept (>= 0)."""

    name: ClassVar[str] = "min-tokens"
    stage: ClassVar[str] = "tokens"

    def __post_init__(self) -> None:
        _check_count(self.name, self.n, 0)

    def drops(self, n_tokens: int) -> bool:
        """Whether the document is too short."""
        return n_tokens < self.n

    def to_json(self) -> dict[str, Any]:
        """``{"name": "min-tokens", "n": ...}``."""
        return {"name": self.name, "n": self.n}


@dataclass(frozen=True)
class MaxTokens:
    """Drop documents with more than ``n`` tokens (EOD not counted)."""

    n: int
    """Largest token count kept (>= 1)."""

    name: ClassVar[str] = "max-tokens"
    stage: ClassVar[str] = "tokens"

    def __post_init__(self) -> None:
        _check_count(self.name, self.n, 1)

    def drops(self, n_tokens: int) -> bool:
        """Whether the document is too long."""
        return n_tokens > self.n

    def to_json(self) -> dict[str, Any]:
        """``{"name": "max-tokens", "n": ...}``."""
        return {"name": self.name, "n": self.n}


Filter = UniqueLines | MinTokens | MaxTokens
TokenFilter = MinTokens | MaxTokens


@dataclass(frozen=True)
class FilterSet:
    """The filters of one tokenize run, in the order given (names are unique)."""

    filters: tuple[Filter, ...] = ()
    _text: tuple[UniqueLines, ...] = field(init=False, repr=False, compare=False)
    _tokens: tuple[TokenFilter, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        filters = tuple(self.filters)
        seen: set[str] = set()
        for f in filters:
            if not isinstance(f, UniqueLines | MinTokens | MaxTokens):
                raise ArgumentError(f"not a filter: {f!r}")
            if f.name in seen:
                raise InputError(f"--filter: {f.name!r} is given more than once")
            seen.add(f.name)
        lo = next((f.n for f in filters if isinstance(f, MinTokens)), 0)
        hi = next((f.n for f in filters if isinstance(f, MaxTokens)), None)
        if hi is not None and lo > hi:
            raise InputError(
                f"--filter: min-tokens:{lo} is above max-tokens:{hi}; every document would be "
                "dropped"
            )
        object.__setattr__(self, "filters", filters)
        text = tuple(f for f in filters if isinstance(f, UniqueLines))
        tokens = tuple(f for f in filters if isinstance(f, MinTokens | MaxTokens))
        object.__setattr__(self, "_text", text)
        object.__setattr__(self, "_tokens", tokens)

    @property
    def names(self) -> list[str]:
        """Filter names in order."""
        return [f.name for f in self.filters]

    def text_reason(self, text: str) -> str | None:
        """Name of the first text filter that drops the document, else ``None``."""
        for f in self._text:
            if f.drops(text):
                return f.name
        return None

    def token_reason(self, n_tokens: int) -> str | None:
        """Name of the first token filter that drops a document of ``n_tokens`` tokens."""
        for f in self._tokens:
            if f.drops(n_tokens):
                return f.name
        return None

    def to_json(self) -> list[dict[str, Any]]:
        """One dict per filter, in order, for the store manifest."""
        return [f.to_json() for f in self.filters]

    @classmethod
    def from_json(cls, items: Sequence[dict[str, Any]]) -> FilterSet:
        """Inverse of ``to_json`` (e.g. to compare with a manifest's filters)."""
        filters: list[Filter] = []
        for item in items:
            params = {k: v for k, v in item.items() if k != "name"}
            kind = _FILTER_TYPES.get(item.get("name", ""))  # no name: no filter
            if kind is None:
                raise InputError(f"filter {item!r}: unknown filter; {_FILTER_USAGE}")
            try:
                filters.append(kind(**params))
            except TypeError:
                raise InputError(f"filter {item!r}: unexpected parameters") from None
            except TokentapeError as exc:
                raise InputError(f"filter {item!r}: {exc}") from None
        return cls(tuple(filters))


_FILTER_TYPES: dict[str, type[UniqueLines] | type[MinTokens] | type[MaxTokens]] = {
    UniqueLines.name: UniqueLines,
    MinTokens.name: MinTokens,
    MaxTokens.name: MaxTokens,
}


def _parse_int(spec: str, what: str, text: str) -> int:
    if not _INT_RE.fullmatch(text):
        raise InputError(f"--filter {spec!r}: {what} must be a non-negative integer")
    return int(text)


def _parse_ratio(spec: str, text: str) -> float:
    try:
        ratio = float(text)
    except ValueError:
        ratio = math.nan
    if not (math.isfinite(ratio) and 0 < ratio <= 1):
        raise InputError(f"--filter {spec!r}: min_ratio must be a number in (0, 1]")
    return ratio


def _parse_unique_lines(spec: str, args: str | None) -> UniqueLines:
    if args is None:
        return UniqueLines()
    params: dict[str, Any] = {}
    for item in args.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(f"--filter {spec!r}: expected unique-lines:min_lines=N,min_ratio=R")
        if key in params:
            raise InputError(f"--filter {spec!r}: parameter {key!r} given twice")
        if key == "min_lines":
            params[key] = _parse_int(spec, "min_lines", value.strip())
        elif key == "min_ratio":
            params[key] = _parse_ratio(spec, value.strip())
        else:
            raise InputError(
                f"--filter {spec!r}: unknown parameter {key!r}; expected min_lines or min_ratio"
            )
    return UniqueLines(**params)


def parse_filter(spec: str) -> Filter:
    """Parse one ``--filter`` value."""
    if not isinstance(spec, str):
        raise InputError(f"--filter {spec!r}: expected a string such as 'min-tokens:16'")
    name, colon, rest = spec.strip().partition(":")
    args = rest if colon else None
    try:
        if name == UniqueLines.name:
            return _parse_unique_lines(spec, args)
        if name in (MinTokens.name, MaxTokens.name):
            if args is None:
                raise InputError(f"--filter {spec!r}: expected {name}:N")
            n = _parse_int(spec, "N", args.strip())
            return MinTokens(n) if name == MinTokens.name else MaxTokens(n)
    except TokentapeError as exc:
        message = str(exc)
        if message.startswith("--filter"):
            raise
        message = message.removeprefix(f"{name}: ")
        raise InputError(f"--filter {spec!r}: {message}") from None
    raise InputError(f"--filter {spec!r}: unknown filter; {_FILTER_USAGE}")


def parse_filters(specs: Sequence[str]) -> FilterSet:
    """Parse the ``--filter`` values of one run; a filter named twice is an error."""
    filters = tuple(parse_filter(spec) for spec in specs)
    seen: dict[str, str] = {}
    for spec, f in zip(specs, filters, strict=True):
        if f.name in seen:
            raise InputError(
                f"--filter {spec!r}: {f.name} is already given by --filter {seen[f.name]!r}"
            )
        seen[f.name] = spec
    return FilterSet(filters)


__all__ = ["FilterSet", "MaxTokens", "MinTokens", "UniqueLines", "parse_filter", "parse_filters"]
