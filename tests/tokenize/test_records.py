"""What the input readers say of each document: its record (a jsonl line, a parquet row and
its row group, a ``.txt`` file) and the user's own id, for every input format and however the
file is cut into units. Expected values are read independently of the readers: lines by
splitting the file's text, rows and row groups from parquet's metadata, ids with ``json``."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenize_helpers import COMPRESSORS, _no_stream_left_over  # noqa: F401 - autouse fixture

from tokentape._src.tokenize.inputs import (
    ReadPosition,
    expand_inputs,
    plan_units,
    read_records,
    with_id_keys,
)
from tokentape._src.tokenize.records import MAX_ID_BYTES, cut, id_path, id_text
from tokentape.errors import ArgumentError


def _lines(n: int, seed: int) -> list[str]:
    """jsonl lines: blank lines between some, ids of several types, some records without."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        record: dict[str, object] = {"text": f"doc {i} " + "w" * rnd.randrange(1, 90)}
        kind = rnd.randrange(5)
        if kind == 0:
            record["id"] = f"id-{i}-ü"
        elif kind == 1:
            record["id"] = 10_000 + i
        elif kind == 2:
            record["id"] = {"b": i, "a": [1, None]}
        elif kind == 3:
            record["id"] = None
        record["meta"] = {"url": f"https://example.org/{i}"}
        out.append(json.dumps(record))
        if rnd.random() < 0.1:
            out.append("   ")
    return out


def _expected_ids(lines: list[str], path: tuple[str, ...]) -> list[tuple[int, str]]:
    """(1-based line, id) of every non-blank line, the id found with ``json`` directly."""
    found = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        value = json.loads(line)
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            text = ""
        elif isinstance(value, str):
            text = value
        else:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        found.append((number, text))
    return found


def _read_all(path: Path, id_key: str, unit_bytes: int) -> list[tuple[int, int, str]]:
    """(record number in the file, row group, id) of every document, unit by unit, the line
    numbers of a jsonl part offset by the lines of the parts before it (as assembly does)."""
    files = with_id_keys(expand_inputs([str(path)]), id_key, "text")
    units = plan_units(files, unit_bytes)
    out, lines_before = [], 0
    for unit in units:
        for part in unit.parts:
            position = ReadPosition()
            for r in read_records(part, "text", None, position):
                out.append((r.number + lines_before, r.group, r.id))
            lines_before += position.lines
    return out


@pytest.mark.parametrize("kind", ["plain", *COMPRESSORS])
@pytest.mark.parametrize("id_key", ["id", "meta.url"])
def test_jsonl_records_are_file_lines_and_ids_however_the_file_is_cut(tmp_path, kind, id_key):
    lines = _lines(300, seed=len(kind))
    text = ("\n".join(lines) + "\n").encode()
    if kind == "plain":
        path = tmp_path / "in.jsonl"
        path.write_bytes(text)
    else:
        suffix, compress = COMPRESSORS[kind]
        path = tmp_path / f"in{suffix}"
        path.write_bytes(compress(text))
    want = [(n, -1, i) for n, i in _expected_ids(lines, id_path(id_key))]
    whole = _read_all(path, id_key, 10**9)
    pieces = _read_all(path, id_key, 1500)
    assert len(plan_units(expand_inputs([str(path)]), 1500)) > 3  # really cut
    assert whole == want
    assert pieces == want


def test_parquet_records_are_rows_with_their_row_group(tmp_path):
    n = 1000
    ids = [f"row-{i}" if i % 7 else None for i in range(n)]
    table = pa.table(
        {
            "text": [f"doc {i} " + "x" * (i % 50) for i in range(n)],
            "id": ids,
            "meta": [{"url": f"u{i}", "n": i} for i in range(n)],
        }
    )
    path = tmp_path / "in.parquet"
    pq.write_table(table, path, row_group_size=137)
    meta = pq.ParquetFile(path).metadata
    group_of = []
    for g in range(meta.num_row_groups):
        group_of += [g] * meta.row_group(g).num_rows
    for id_key, want_ids in (
        ("id", [i or "" for i in ids]),
        ("meta.url", [f"u{i}" for i in range(n)]),
    ):
        want = [(row, group_of[row], want_ids[row]) for row in range(n)]
        assert _read_all(path, id_key, 10**9) == want
        assert _read_all(path, id_key, 900) == want  # row groups cut into pieces too
    assert _read_all(path, "none", 900) == [(row, group_of[row], "") for row in range(n)]


def test_a_txt_file_is_one_record_without_an_id(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("the whole file")
    assert _read_all(path, "id", 10**9) == [(0, -1, "")]


def test_auto_takes_the_first_id_field_of_each_inputs_first_record(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        '\n\n{"text": "t", "url": "u", "doc_id": 3}\n{"text": "s", "id": 1}\n'
    )
    (tmp_path / "b.jsonl").write_text('{"text": "t", "title": "x"}\n')
    pq.write_table(pa.table({"text": ["t"], "url": ["u"]}), tmp_path / "c.parquet")
    (tmp_path / "d.txt").write_text("text")
    files = expand_inputs([str(tmp_path)])
    keys = {Path(f.path).name: f.id_key for f in with_id_keys(files, "auto", "text")}
    assert keys == {"a.jsonl": "doc_id", "b.jsonl": "", "c.parquet": "url", "d.txt": ""}
    assert {f.id_key for f in with_id_keys(files, "none", "text")} == {""}
    given_key = {Path(f.path).name: f.id_key for f in with_id_keys(files, "meta.id", "text")}
    assert given_key == {
        "a.jsonl": "meta.id",
        "b.jsonl": "meta.id",
        "c.parquet": "meta.id",
        "d.txt": "",
    }


@pytest.mark.parametrize("key", ["", ".", "a.", ".b", "a..b"])
def test_an_id_key_with_an_empty_field_is_refused_naming_the_flag(key):
    with pytest.raises(ArgumentError, match="--id-key"):
        id_path(key)


def test_id_text_of_each_kind_of_value():
    record = {"id": "x", "n": 5, "f": 1.5, "b": True, "o": {"z": 1, "a": [2]}, "nul": None}
    assert [id_text(record, (k,)) for k in ("id", "n", "f", "b", "o", "nul", "gone")] == [
        "x", "5", "1.5", "true", '{"a":[2],"z":1}', "", "",
    ]  # fmt: skip
    assert id_text({"a": {"b": "deep"}}, ("a", "b")) == "deep"
    assert id_text({"a": "flat"}, ("a", "b")) == ""


@given(st.text(max_size=3 * MAX_ID_BYTES))
def test_an_id_is_valid_utf8_cut_at_a_character_within_the_limit(text):
    got = cut(text)
    data = got.encode("utf-8")  # strict: no lone surrogate is left
    assert len(data) <= MAX_ID_BYTES
    full = text.encode("utf-8", "replace")
    assert full.startswith(data)
    if len(full) <= MAX_ID_BYTES:
        assert data == full
    else:  # the longest prefix at a character boundary: a character is at most 4 bytes
        assert len(data) > MAX_ID_BYTES - 4
