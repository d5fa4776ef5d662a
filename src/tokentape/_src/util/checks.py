"""Argument checks shared by the library's entry points: one clear error naming the argument."""

from __future__ import annotations

import math
import numbers
import os

from tokentape.errors import ArgumentError


def is_int(value: object) -> bool:
    """An integer as JSON gives it: an ``int``, not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_parameter(name: str) -> str:
    """A parameter as a message names it to a Python caller: its own name."""
    return name


def as_flag(name: str) -> str:
    """A parameter as a message names it on the command line: ``dp_rank`` -> ``--dp-rank``."""
    return "--" + name.replace("_", "-")


def as_index(name: str, value: object) -> int:
    """An integer argument (a Python or numpy integer, not a ``bool``: a float is refused,
    never truncated), as an ``int``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentError(f"{name} must be an integer, got {value!r}")
    return int(value)


MAX_MB = float(2**20)
"""The largest ``--shard-mb`` / ``--unit-mb``: 1 TiB."""


def check_mb(flag: str, value: object) -> None:
    """A size in MiB: a finite number in (0, ``MAX_MB``]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(f"{flag} must be a number of MiB, got {value!r}")
    # typeshed's numbers.Real declares no comparison with an int; every Real has one at runtime
    if not (math.isfinite(value) and 0 < value <= MAX_MB):  # type: ignore[operator]
        raise ArgumentError(f"{flag} must be a number of MiB in (0, {MAX_MB:.0f}], got {value}")


def check_count(flag: str, value: object, low: int, high: int) -> None:
    """An integer in ``[low, high]``."""
    if not low <= as_index(flag, value) <= high:
        raise ArgumentError(f"{flag} must be between {low} and {high:,}, got {value}")


def check_text(flag: str, value: object) -> None:
    """A non-empty string without NUL or line breaks (it ends up in one-line messages)."""
    if not isinstance(value, str):
        raise ArgumentError(f"{flag} must be a string, got {value!r}")
    if not value:
        raise ArgumentError(f"{flag} must not be empty")
    if any(c in value for c in "\0\n\r"):
        raise ArgumentError(f"{flag} {value!r}: must not hold NUL or line breaks")


def check_path(flag: str, value: object) -> None:
    """A path (a string or ``os.PathLike``), not empty."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ArgumentError(f"{flag} must be a path, got {value!r}")
    if not value:
        raise ArgumentError(f"{flag} must not be empty")
    if "\0" in value:
        raise ArgumentError(f"{flag} {value!r}: a path cannot hold NUL")


def shown(value: object) -> str:
    """``value`` for a one-line message: its repr cut to 60 characters (huge integers by their
    size)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:59] + "…"


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """An ``int`` (not a ``bool``, a float or a numpy integer: a field recorded in JSON) in
    ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"{name} must be an integer, got {shown(value)}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ArgumentError(f"{name} must be an integer {bound}, got {shown(value)}")
    return value


def check_number(name: str, value: object, low: float, positive: bool = False) -> float:
    """A finite real number (an ``int`` or a ``float``, not a ``bool``) >= ``low`` (>
    ``low`` when ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentError(f"{name} must be a number, got {shown(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer beyond any float
        finite = False
    if not finite or value < low or (positive and value == low):
        bound = f"> {low:g}" if positive else f">= {low:g}"
        raise ArgumentError(f"{name} must be a finite number {bound}, got {shown(value)}")
    return value


def check_flag(name: str, value: object) -> bool:
    """``True`` or ``False`` (not 0, 1 or a string)."""
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True or False, got {shown(value)}")
    return value


def check_optional_text(name: str, value: object) -> None:
    """None, or what ``check_text`` accepts."""
    if value is not None:
        check_text(name, value)


__all__ = [
    "as_flag",
    "as_index",
    "as_parameter",
    "check_count",
    "check_flag",
    "check_int",
    "check_mb",
    "check_number",
    "check_optional_text",
    "check_path",
    "check_text",
    "is_int",
    "shown",
]
