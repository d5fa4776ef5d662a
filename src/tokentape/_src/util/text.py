"""Numbers and plain-text tables for messages and reports (no terminal library needed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: it holds no lone surrogate (which JSON escapes and
    Python strings can carry, and tokenizer libraries refuse)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escaped(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable (and not in ``keep``) written as its
    escape (``\\x1b``): safe in a one-line message or on a terminal."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c in keep else c.encode("unicode_escape").decode() for c in text
    )


def fmt_int(n: int) -> str:
    return f"{n:,}"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def key_values(rows: Sequence[tuple[str, Any]], indent: str = "  ") -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{indent}{k:<{width}}  {v}" for k, v in rows)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> str:
    """Columns left-aligned for text, right-aligned for numbers."""
    cells = [[str(c) for c in header]] + [[_cell(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    numeric = [all(_is_number(r[i]) for r in rows) and rows for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        cols = zip(r, widths, numeric, strict=True)
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in cols]
        return indent + "  ".join(parts).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def _cell(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


__all__ = ["escaped", "fmt_bytes", "fmt_int", "is_utf8", "key_values", "table"]
