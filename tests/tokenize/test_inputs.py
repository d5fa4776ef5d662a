"""Input expansion, unit planning and document reading of the offline tokenizer."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokentape._src.tokenize import inputs
from tokentape._src.tokenize.inputs import (
    SKIP_HINT,
    SUPPORTED_SUFFIXES,
    InputFile,
    Unit,
    UnitPart,
    expand_inputs,
    plan_units,
    read_documents,
)
from tokentape.errors import TokentapeError

# --- helpers


def jsonl_bytes(texts: list[str], *, ensure_ascii: bool = False) -> bytes:
    lines = [
        json.dumps({"id": i, "text": t}, ensure_ascii=ensure_ascii) for i, t in enumerate(texts)
    ]
    return "".join(line + "\n" for line in lines).encode("utf-8")


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def write_parquet(path: Path, texts: list[str | None], row_group_size: int = 1024) -> Path:
    table = pa.table({"id": list(range(len(texts))), "text": pa.array(texts, pa.string())})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def whole(path: Path) -> UnitPart:
    [file] = expand_inputs([str(path)])
    return UnitPart(file, 0, file.size)


def read_all(path: Path, text_key: str = "text") -> list[str]:
    """The documents of the file read whole: one unit (a compressed one: one unit per 1 MiB
    of its text)."""
    [file] = expand_inputs([str(path)])
    units = plan_units([file], max(file.size + 1, 1 << 20))
    return [t for u in units for part in u.parts for t in read_documents(part, text_key)]


def read_units(units: list[Unit], text_key: str = "text") -> list[str]:
    return [t for u in units for p in u.parts for t in read_documents(p, text_key)]


def error_of(fn, *args) -> str:
    with pytest.raises(TokentapeError) as info:
        result = fn(*args)
        if hasattr(result, "__next__"):
            list(result)
    message = str(info.value).removesuffix(SKIP_HINT)  # a bad record's way past: tested apart
    assert "\n" not in message
    return message


def paths(files: list[InputFile]) -> list[str]:
    return [f.path for f in files]


# --- expand_inputs: order


def test_directory_expands_recursively_sorted_by_posix_relative_path(tmp_path: Path) -> None:
    d = tmp_path / "data"
    for rel in ["b/a.jsonl", "a.jsonl", "a/z.txt", "B.parquet.txt", "ab.jsonl.zst", "a-b.jsonl"]:
        write(d / rel, "")
    write(d / "notes.csv", "x")
    write(d / "a/README.md", "x")
    write(d / "c.jsonl.bz2", "x")
    got = [os.path.relpath(p, d) for p in paths(expand_inputs([str(d)]))]
    # plain str order of POSIX relative paths: "-" < "." < "/" < uppercase < lowercase
    assert got == ["B.parquet.txt", "a-b.jsonl", "a.jsonl", "a/z.txt", "ab.jsonl.zst", "b/a.jsonl"]


def test_specs_keep_command_line_order(tmp_path: Path) -> None:
    z = write(tmp_path / "z.jsonl", "")
    a = write(tmp_path / "a.txt", "")
    m = write(tmp_path / "m" / "x.jsonl.gz", gzip.compress(b""))
    assert paths(expand_inputs([str(z), str(tmp_path / "m"), str(a)])) == [str(z), str(m), str(a)]


def test_glob_sorted_supported_only_and_directories_expand(tmp_path: Path) -> None:
    write(tmp_path / "s2.jsonl", "")
    write(tmp_path / "s1.jsonl", "")
    write(tmp_path / "s3.csv", "")
    write(tmp_path / "s0" / "inner.txt", "")
    got = paths(expand_inputs([str(tmp_path / "s*")]))
    assert got == [
        str(tmp_path / "s0" / "inner.txt"),
        str(tmp_path / "s1.jsonl"),
        str(tmp_path / "s2.jsonl"),
    ]


def test_recursive_glob(tmp_path: Path) -> None:
    write(tmp_path / "x" / "y" / "deep.jsonl", "")
    write(tmp_path / "top.jsonl", "")
    got = paths(expand_inputs([str(tmp_path / "**" / "*.jsonl")]))
    assert got == [str(tmp_path / "top.jsonl"), str(tmp_path / "x" / "y" / "deep.jsonl")]


def test_literal_path_with_glob_characters(tmp_path: Path) -> None:
    f = write(tmp_path / "shard[1].jsonl", "")
    assert paths(expand_inputs([str(f)])) == [str(f)]


def test_duplicates_keep_first_occurrence(tmp_path: Path) -> None:
    a = write(tmp_path / "d" / "a.jsonl", "")
    b = write(tmp_path / "d" / "b.jsonl", "")
    link = tmp_path / "link.jsonl"
    link.symlink_to(a)
    got = paths(expand_inputs([str(b), str(tmp_path / "d"), str(link), str(b)]))
    assert got == [str(b), str(a)]


def test_input_file_records_kind_size_mtime(tmp_path: Path) -> None:
    f = write(tmp_path / "x.jsonl.zst", b"12345")
    [got] = expand_inputs([str(f)])
    st_ = f.stat()
    assert got == InputFile(str(f), "jsonl.zst", 5, st_.st_mtime_ns)
    kinds = [
        expand_inputs([str(write(tmp_path / f"k{s}", ""))])[0].kind for s in SUPPORTED_SUFFIXES
    ]
    assert kinds == ["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "txt"]


# --- expand_inputs: errors


def test_unsupported_explicit_file(tmp_path: Path) -> None:
    f = write(tmp_path / "x.csv", "a,b")
    msg = error_of(expand_inputs, [str(f)])
    assert f"input '{f}': unsupported file type; expected one of .jsonl, .jsonl.gz" in msg


def test_missing_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    assert error_of(expand_inputs, [missing]) == f"input '{missing}': no such file or directory"


def test_glob_matching_nothing(tmp_path: Path) -> None:
    spec = str(tmp_path / "*.jsonl")
    assert "glob matched no files" in error_of(expand_inputs, [spec])


def test_glob_matching_only_unsupported_files(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "")
    msg = error_of(expand_inputs, [str(tmp_path / "*")])
    assert "no supported file" in msg and str(tmp_path) in msg


def test_directory_without_supported_files(tmp_path: Path) -> None:
    write(tmp_path / "d" / "a.csv", "")
    msg = error_of(expand_inputs, [str(tmp_path / "d")])
    assert msg.startswith(f"input '{tmp_path / 'd'}': directory holds no supported file")


def test_no_inputs_at_all() -> None:
    assert "no input files" in error_of(expand_inputs, [])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_unreadable_file(tmp_path: Path) -> None:
    f = write(tmp_path / "secret.jsonl", "{}\n")
    f.chmod(0)
    try:
        msg = error_of(expand_inputs, [str(f)])
    finally:
        f.chmod(0o644)
    assert f"input '{f}': permission denied" in msg


def test_permission_error_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = write(tmp_path / "secret.jsonl", "{}\n")

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(f))

    monkeypatch.setattr(inputs, "open", denied, raising=False)
    assert error_of(expand_inputs, [str(f)]) == (
        f"input '{f}': permission denied; cannot read the file"
    )


def test_unit_key_is_json_and_stable(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", jsonl_bytes(["x", "y"]))
    files = expand_inputs([str(f)])
    [u1] = plan_units(files, 1000)
    [u2] = plan_units(expand_inputs([str(f)]), 1000)
    assert u1.key() == u2.key()
    assert json.loads(u1.key()) == [
        {
            "path": str(f),
            "kind": "jsonl",
            "size": f.stat().st_size,
            "start": 0,
            "stop": f.stat().st_size,
        }
    ]


# --- plan_units


def test_small_files_grouped_while_total_fits(tmp_path: Path) -> None:
    files = [write(tmp_path / f"{i}.txt", "x" * n) for i, n in enumerate([40, 50, 10, 30, 100, 5])]
    units = plan_units(expand_inputs([str(f) for f in files]), 100)
    sizes = [[p.file.size for p in u.parts] for u in units]
    assert sizes == [[40, 50, 10], [30], [100], [5]]
    assert [u.index for u in units] == [0, 1, 2, 3]
    assert [u.n_bytes for u in units] == [100, 30, 100, 5]


def test_compressed_jsonl_is_cut_in_its_text_and_txt_never(tmp_path: Path) -> None:
    """A compressed jsonl file is cut like a plain one, at line starts of its decompressed
    text; a small one (its text within a unit) stays whole; a .txt file is never cut."""
    texts = [f"document {i} " * 20 for i in range(200)]
    data = jsonl_bytes(texts)
    gz = write(tmp_path / "a.jsonl.gz", gzip.compress(data, mtime=0))
    zs = write(tmp_path / "b.jsonl.zst", zstandard.ZstdCompressor().compress(data))
    tx = write(tmp_path / "c.txt", "y" * 5000)
    units = plan_units(expand_inputs([str(gz), str(zs), str(tx)]), 1000)
    for f in (gz, zs):
        parts = [u.parts[0] for u in units if u.parts[0].file.path == str(f)]
        assert len(parts) > 10 and all(p.total == len(data) for p in parts)
        assert parts[0].start == 0 and parts[-1].stop == len(data)
        for a, b in itertools.pairwise(parts):
            assert a.stop == b.start and data[b.start - 1 : b.start] == b"\n"
            assert b.start - a.start >= 1000
        assert sum(p.n_bytes for p in parts) <= f.stat().st_size
    assert [(p.start, p.stop) for p in units[-1].parts] == [(0, 5000)]
    assert read_units(units) == [*texts, *texts, "y" * 5000]
    small = plan_units(expand_inputs([str(gz), str(zs)]), len(data))
    assert [[(p.start, p.stop) for p in u.parts] for u in small] == [
        [(0, gz.stat().st_size), (0, zs.stat().st_size)]  # whole, and sharing a unit
    ]


def test_big_jsonl_cut_after_newlines(tmp_path: Path) -> None:
    texts = [f"doc {i}: " + "word " * (i % 37) for i in range(500)]
    data = jsonl_bytes(texts)
    f = write(tmp_path / "big.jsonl", data)
    units = plan_units(expand_inputs([str(f)]), 1000)
    assert len(units) > 10
    parts = [u.parts[0] for u in units]
    assert all(len(u.parts) == 1 for u in units)
    assert parts[0].start == 0 and parts[-1].stop == len(data)
    for a, b in itertools.pairwise(parts):
        assert a.stop == b.start
        assert data[b.start - 1 : b.start] == b"\n"
        assert b.start - a.start >= 1000
    assert read_units(units) == texts
    assert sum(u.n_bytes for u in units) == len(data)


def test_big_jsonl_between_small_files(tmp_path: Path) -> None:
    small1 = write(tmp_path / "1.txt", "a")
    big = write(tmp_path / "2.jsonl", jsonl_bytes(["b" * 50] * 10))
    small2 = write(tmp_path / "3.txt", "c")
    small3 = write(tmp_path / "4.txt", "d")
    units = plan_units(expand_inputs([str(small1), str(big), str(small2), str(small3)]), 200)
    owners = [[p.file.path for p in u.parts] for u in units]
    assert owners[0] == [str(small1)]
    assert all(o == [str(big)] for o in owners[1:-1])
    assert owners[-1] == [str(small2), str(small3)]
    assert read_units(units) == ["a", *["b" * 50] * 10, "c", "d"]


def test_plan_rejects_nonpositive_unit_size(tmp_path: Path) -> None:
    files = expand_inputs([str(write(tmp_path / "a.txt", "x"))])
    assert "expected a positive number of bytes" in error_of(plan_units, files, 0)


def test_parquet_split_by_row_groups(tmp_path: Path) -> None:
    texts = [f"row {i} " + "lorem ipsum " * (i % 11) for i in range(1000)]
    f = write_parquet(tmp_path / "t.parquet", texts, row_group_size=100)
    files = expand_inputs([str(f)])
    units = plan_units(files, files[0].size // 4)
    ranges = [(u.parts[0].start, u.parts[0].stop) for u in units]  # rows
    assert len(units) >= 3
    assert ranges[0][0] == 0 and ranges[-1][1] == 1000
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(ranges))
    assert all(a % 100 == 0 for a, _ in ranges)  # small row groups: cut between them
    assert read_units(units) == texts
    [whole_unit] = plan_units(files, files[0].size)
    assert [(p.start, p.stop) for p in whole_unit.parts] == [(0, 1000)]
    assert whole_unit.n_bytes == files[0].size


# --- read_documents: formats


def test_jsonl_blank_lines_crlf_bom_and_no_final_newline(tmp_path: Path) -> None:
    data = b'\xef\xbb\xbf{"text": "a"}\r\n\n   \n{"text": "b\\nc"}\r\n\t\n{"text": "\xc3\xa9"}'
    assert read_all(write(tmp_path / "x.jsonl", data)) == ["a", "b\nc", "é"]


def test_gzip_roundtrip(tmp_path: Path) -> None:
    texts = ["héllo", "wörld\n", "", "x" * 100_000]
    f = write(tmp_path / "a.jsonl.gz", gzip.compress(jsonl_bytes(texts)))
    assert read_all(f) == texts


def test_zstd_roundtrip_multiframe(tmp_path: Path) -> None:
    texts = [f"doc {i} ✓" * (i + 1) for i in range(300)]
    cctx = zstandard.ZstdCompressor()
    data = cctx.compress(jsonl_bytes(texts[:100])) + cctx.compress(jsonl_bytes(texts[100:]))
    assert read_all(write(tmp_path / "a.jsonl.zst", data)) == texts


def test_zstd_streamed_frame_without_content_size(tmp_path: Path) -> None:
    texts = [str(i) * 50 for i in range(5000)]
    f = tmp_path / "s.jsonl.zst"
    with open(f, "wb") as fh, zstandard.ZstdCompressor().stream_writer(fh) as w:
        w.write(jsonl_bytes(texts))
    assert read_all(f) == texts


def test_parquet_roundtrip_and_other_key(tmp_path: Path) -> None:
    table = pa.table({"body": ["a", "ü", ""], "n": [1, 2, 3]})
    pq.write_table(table, tmp_path / "p.parquet")
    assert read_all(tmp_path / "p.parquet", "body") == ["a", "ü", ""]


def test_parquet_large_string_column(tmp_path: Path) -> None:
    table = pa.table({"text": pa.array(["x", "y"], pa.large_string())})
    pq.write_table(table, tmp_path / "p.parquet")
    assert read_all(tmp_path / "p.parquet") == ["x", "y"]


def test_txt_is_one_document(tmp_path: Path) -> None:
    text = "line one\nline two\n\n{not json}\n"
    assert read_all(write(tmp_path / "a.txt", text)) == [text]
    assert read_all(write(tmp_path / "b.txt", b"\xef\xbb\xbfbom")) == ["bom"]


def test_other_text_key(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", b'{"content": "x", "text": 1}\n')
    assert read_all(f, "content") == ["x"]


# --- read_documents: errors


def jsonl_error(tmp_path: Path, data: bytes, text_key: str = "text") -> str:
    f = write(tmp_path / "bad.jsonl", data)
    return error_of(read_documents, whole(f), text_key)


def test_invalid_json_names_line(tmp_path: Path) -> None:
    msg = jsonl_error(tmp_path, b'{"text": "a"}\n\n{"text": "b",}\n')
    path = tmp_path / "bad.jsonl"
    assert msg.startswith(f"{path}:3: invalid JSON (")


def test_not_an_object(tmp_path: Path) -> None:
    msg = jsonl_error(tmp_path, b'{"text": "a"}\n["text"]\n')
    assert msg == f"{tmp_path / 'bad.jsonl'}:2: expected a JSON object, got array"


def test_missing_field_lists_fields(tmp_path: Path) -> None:
    msg = jsonl_error(tmp_path, b'{"a": 1, "b": "x"}\n')
    assert msg == (
        f"{tmp_path / 'bad.jsonl'}:1: no field 'text' (fields: a, b); "
        "choose the field with --text-key"
    )


def test_wrong_field_type(tmp_path: Path) -> None:
    msg = jsonl_error(tmp_path, b'{"text": "ok"}\n{"text": 5}\n')
    assert msg == f"{tmp_path / 'bad.jsonl'}:2: field 'text' is int, expected a string"
    assert "is null" in jsonl_error(tmp_path, b'{"text": null}\n')


def test_invalid_utf8(tmp_path: Path) -> None:
    msg = jsonl_error(tmp_path, b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    assert msg == f"{tmp_path / 'bad.jsonl'}:2: not valid UTF-8"


def test_encoded_surrogate_is_invalid_utf8(tmp_path: Path) -> None:
    msg = jsonl_error(tmp_path, b'{"text": "\xed\xa0\x80"}\n')
    assert msg.endswith(":1: not valid UTF-8")


def test_lone_surrogate_escape(tmp_path: Path) -> None:
    msg = jsonl_error(tmp_path, b'{"text": "ok \\ud83d\\ude00"}\n{"text": "bad \\ud800"}\n')
    assert msg.startswith(f"{tmp_path / 'bad.jsonl'}:2: field 'text' has a lone surrogate")


def test_error_line_number_in_later_byte_range_unit(tmp_path: Path) -> None:
    lines = [json.dumps({"text": f"document number {i}"}) for i in range(1000)]
    lines[876] = '{"text": "broken'
    f = write(tmp_path / "big.jsonl", "\n".join(lines) + "\n")
    units = plan_units(expand_inputs([str(f)]), 2000)
    assert len(units) > 5
    bad = [u for u in units if u.parts[0].start < f.read_bytes().index(b'"broken')][-1]
    assert bad.parts[0].start > 0
    msg = error_of(read_documents, bad.parts[0], "text")
    assert msg.startswith(f"{f}:877: invalid JSON")
    # earlier units read fine
    assert len(read_units([u for u in units if u.index < bad.index])) > 0


def test_line_numbers_across_read_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inputs, "READ_BLOCK", 50)
    lines = [json.dumps({"text": "x" * (i % 30)}) for i in range(300)]
    lines[250] = '{"text": 250}'
    data = "\n".join(lines).encode()
    for name, raw in [("p.jsonl", data), ("z.jsonl.zst", zstandard.compress(data))]:
        msg = error_of(read_documents, whole(write(tmp_path / name, raw)), "text")
        assert msg == f"{tmp_path / name}:251: field 'text' is int, expected a string"


def test_gzip_line_numbers(tmp_path: Path) -> None:
    f = write(tmp_path / "x.jsonl.gz", gzip.compress(b'{"text": "a"}\n\n{"text": 3}\n'))
    assert error_of(read_documents, whole(f), "text").startswith(f"{f}:3: field 'text' is int")


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(jsonl_bytes(["x" * 1000] * 100))
    f = write(tmp_path / "t.jsonl.gz", data[: len(data) // 2])
    msg = error_of(read_documents, whole(f), "text")
    assert msg.startswith(f"{f}: corrupt or truncated gzip file")


def test_not_gzip(tmp_path: Path) -> None:
    f = write(tmp_path / "t.jsonl.gz", b'{"text": "plain"}\n')
    assert error_of(read_documents, whole(f), "text").startswith(f"{f}: corrupt or truncated gzip")


def test_truncated_zstd(tmp_path: Path) -> None:
    data = zstandard.ZstdCompressor().compress(jsonl_bytes([f"{i} " * 100 for i in range(500)]))
    f = write(tmp_path / "t.jsonl.zst", data[: len(data) // 2])
    assert error_of(read_documents, whole(f), "text") == (
        f"{f}: truncated zstandard file (last frame incomplete)"
    )


def test_corrupt_zstd(tmp_path: Path) -> None:
    f = write(tmp_path / "t.jsonl.zst", b"definitely not zstandard data")
    assert error_of(read_documents, whole(f), "text").startswith(f"{f}: corrupt zstandard file")


def test_corrupt_parquet(tmp_path: Path) -> None:
    f = write(tmp_path / "t.parquet", b"PAR1 this is not parquet")
    [file] = expand_inputs([str(f)])
    assert error_of(plan_units, [file], 1000).startswith(f"{f}: not a readable parquet file")
    msg = error_of(read_documents, UnitPart(file, 0, 1, 1), "text")
    assert msg.startswith(f"{f}: not a readable parquet file")


def test_parquet_missing_column(tmp_path: Path) -> None:
    pq.write_table(pa.table({"body": ["a"], "id": [1]}), tmp_path / "p.parquet")
    msg = error_of(read_documents, whole(tmp_path / "p.parquet"), "text")
    assert msg == (
        f"{tmp_path / 'p.parquet'}: no column 'text' (columns: body, id); "
        "choose the column with --text-key"
    )


def test_parquet_non_string_column(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "p.parquet")
    msg = error_of(read_documents, whole(tmp_path / "p.parquet"), "text")
    assert msg == f"{tmp_path / 'p.parquet'}: column 'text' is int64, expected a string"


def test_parquet_null_names_row(tmp_path: Path) -> None:
    texts: list[str | None] = [f"r{i}" for i in range(25)]
    texts[17] = None
    f = write_parquet(tmp_path / "p.parquet", texts, row_group_size=5)
    files = expand_inputs([str(f)])
    units = plan_units(files, 1)  # every row group is bigger: cut into its rows
    assert len(units) == 25
    assert read_units(units[:17]) == texts[:17]
    assert (
        error_of(read_documents, units[17].parts[0], "text") == f"{f}: row 17: field 'text' is null"
    )
    whole_groups = plan_units(files, files[0].size // 5)
    null_unit = next(u for u in whole_groups if u.parts[0].start <= 17 < u.parts[0].stop)
    assert error_of(read_documents, null_unit.parts[0], "text") == (
        f"{f}: row 17: field 'text' is null"
    )


def test_txt_invalid_utf8(tmp_path: Path) -> None:
    f = write(tmp_path / "a.txt", b"ok\n\xff")
    assert error_of(read_documents, whole(f), "text").startswith(
        f"{f}: not valid UTF-8 (byte offset 3)"
    )


def test_file_changed_since_planning(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", jsonl_bytes(["x"]))
    part = whole(f)
    write(f, jsonl_bytes(["x", "y"]))
    assert "size changed since the inputs were planned" in error_of(read_documents, part, "text")


# --- the partition property


doc_text = st.text(st.characters(blacklist_categories=("Cs",), max_codepoint=0x1F600), max_size=40)
file_spec = st.tuples(
    st.sampled_from(["jsonl", "jsonl", "jsonl", "jsonl.gz", "jsonl.zst", "parquet", "txt"]),
    st.lists(doc_text, max_size=12),
    st.integers(0, 2**32 - 1),  # formatting choices
)


def write_random_file(path: Path, kind: str, texts: list[str], style: int) -> list[str]:
    """Write ``texts`` in ``kind`` with varied formatting; return the documents it holds."""
    if kind == "txt":
        text = "".join(texts).lstrip("\ufeff")
        write(path, text)
        return [text]
    if kind == "parquet":
        write_parquet(path, list(texts), row_group_size=1 + style % 4)
        return texts
    lines = [
        json.dumps({"text": t, "n": i}, ensure_ascii=bool(style & 1)) for i, t in enumerate(texts)
    ]
    if style & 2:
        lines = [line + ("\r" if (style >> 5) % 3 == 0 else "") for line in lines]
    if style & 4 and lines:
        lines.insert((style >> 8) % len(lines), "   ")
    data = "\n".join(lines) + ("\n" if style & 8 else "")
    raw = data.encode("utf-8")
    if kind == "jsonl.gz":
        raw = gzip.compress(raw, mtime=0)
    elif kind == "jsonl.zst":
        raw = zstandard.ZstdCompressor().compress(raw)
    write(path, raw)
    return texts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(file_spec, min_size=1, max_size=5),
    unit_bytes=st.integers(1, 600),
    block=st.sampled_from([1, 7, 64, 1 << 20]),
)
def test_units_partition_documents_exactly(specs: list, unit_bytes: int, block: int) -> None:
    saved = inputs.READ_BLOCK, inputs.ZSTD_INPUT_BLOCK, inputs.SCAN_BLOCK
    inputs.READ_BLOCK = inputs.ZSTD_INPUT_BLOCK = inputs.SCAN_BLOCK = block
    try:
        check_partition(specs, unit_bytes)
    finally:
        inputs.READ_BLOCK, inputs.ZSTD_INPUT_BLOCK, inputs.SCAN_BLOCK = saved


def check_partition(specs: list, unit_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        expected: list[str] = []
        for i, (kind, texts, style) in enumerate(specs):
            expected += write_random_file(Path(tmp) / f"f{i:02d}.{kind}", kind, texts, style)
        files = expand_inputs([tmp])
        units = plan_units(files, unit_bytes)
        assert [u.index for u in units] == list(range(len(units)))
        assert plan_units(files, unit_bytes) == units
        assert read_units(units) == expected
        # in any order (a resumed run, a process given later units first): the same documents
        backwards = [read_units([u]) for u in reversed(units)]
        assert [t for docs in reversed(backwards) for t in docs] == expected
        # every file is covered exactly once, in order, by contiguous parts
        parts = [p for u in units for p in u.parts]
        for file in files:
            mine = [p for p in parts if p.file == file]
            assert mine[0].start == 0
            assert all(a.stop == b.start for a, b in itertools.pairwise(mine))
            cut_in_text = file.kind in ("jsonl.gz", "jsonl.zst") and len(mine) > 1
            if file.kind == "parquet" or cut_in_text:  # rows, or decompressed bytes
                assert mine[-1].stop == mine[-1].total
            else:
                assert mine[-1].stop == file.size
            if len(mine) > 1:
                assert file.kind != "txt" and (cut_in_text or file.size > unit_bytes)
        for u in units:
            if len(u.parts) > 1:
                assert sum(p.file.size for p in u.parts) <= unit_bytes
