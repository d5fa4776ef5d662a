"""Where a document came from, as the input readers see it: its record and the user's id.

A reader of an input yields one ``Record`` per document: the text, the record's number in the
input (a jsonl line, counted from 1 within the part read; a parquet row, counted from 0 in the
file, and its row group; 0 for a ``.txt`` file, which is one record), and the user's own id
for it, taken from the field ``--id-key`` names (``ID_KEY_AUTO``: the first of
``AUTO_ID_FIELDS`` that the input's first record has; ``ID_KEY_NONE``: none).

An id key is a field name, dotted for a nested field (``meta.url``: field ``url`` of the
object in field ``meta``; in a parquet file, a field of a struct column). The id is the
field's value as text: a string as it is, a number or a boolean as JSON writes it, an object
or an array as compact JSON with sorted keys; a record without the field (or with null there)
has no id ("").
"""

from __future__ import annotations

import json
from typing import NamedTuple

from tokentape._src.store.provenance import MAX_ID_BYTES, cut
from tokentape.errors import ArgumentError

ID_KEY_AUTO = "auto"
ID_KEY_NONE = "none"
AUTO_ID_FIELDS = ("id", "doc_id", "url")
"""The fields an input's id is taken from by default, the first its first record has."""

IdPath = tuple[str, ...]
"""An id key split at its dots: the fields walked from the record down to the id."""


class Record(NamedTuple):
    """One document as read from its input."""

    text: str
    number: int
    """jsonl: the line within the part read (from 1); parquet: the row in the file (from 0);
    ``.txt``: 0."""
    group: int
    """parquet: the row group holding the row; otherwise -1."""
    id: str
    """The user's id of the record ("" when it has none, or no id key applies)."""


def id_path(key: str) -> IdPath:
    """``key`` (``meta.url``) as the fields it walks; an empty field is refused."""
    if not isinstance(key, str):
        raise ArgumentError(f"--id-key must be a field name, got {key!r}")
    parts = tuple(key.split("."))
    if not all(parts):
        raise ArgumentError(
            f"--id-key {key!r}: expected a field name, dotted for a nested field (meta.url), "
            f"'{ID_KEY_AUTO}' or '{ID_KEY_NONE}'"
        )
    return parts


def check_id_key(key: str) -> None:
    """``key`` is ``auto``, ``none`` or a (dotted) field name."""
    if key not in (ID_KEY_AUTO, ID_KEY_NONE):
        id_path(key)


def id_text(value: object, path: IdPath) -> str:
    """The id found at ``path`` inside ``value`` (a parsed record), as text; "" when absent."""
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return ""
        value = value[key]
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return cut(text)


def auto_id_key(fields: object) -> str | None:
    """The first of ``AUTO_ID_FIELDS`` among ``fields`` (a record's field names), or None."""
    if not isinstance(fields, dict | list | tuple):
        return None
    return next((name for name in AUTO_ID_FIELDS if name in fields), None)


__all__ = [
    "AUTO_ID_FIELDS",
    "ID_KEY_AUTO",
    "ID_KEY_NONE",
    "MAX_ID_BYTES",
    "IdPath",
    "Record",
    "auto_id_key",
    "check_id_key",
    "cut",
    "id_path",
    "id_text",
]
