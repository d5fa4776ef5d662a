"""One JSON value per line, parsed at the C scanner's speed.

``json.loads`` wraps the scanner in two Python calls and a regular expression, which is most of
its cost on a short line. ``loads_line`` calls the scanner directly on a line that starts with
its value and holds only whitespace after it (every line the loader and trainers write), and
hands anything else to ``json.loads``, so the values and the errors are exactly its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads_line(text: str) -> Any:
    """``json.loads(text)``, faster on the usual line."""
    try:
        value, end = _scan_once(text, 0)
    except (StopIteration, ValueError):  # not a value at the first character, or malformed
        return json.loads(text)
    if end != len(text) and text[end:].strip(" \t\n\r"):  # JSON's whitespace, no other
        return json.loads(text)  # what follows the value: json.loads says what is wrong
    return value


__all__ = ["loads_line"]
