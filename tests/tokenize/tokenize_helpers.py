"""Shared setup of the tests of big input files cut into units: documents, the same text
compressed every way (gzip, zstd, several gzip members, several zstd frames), the units a file
is cut into and what each reads, and an autouse fixture that leaves no stream open in this
process between tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import zstandard
from helpers import make_documents

from tokentape._src.tokenize import streams
from tokentape._src.tokenize.inputs import SKIP_HINT, expand_inputs, plan_units, read_documents
from tokentape.errors import InputError

UNIT = 2000  # bytes of decompressed text (or row-group bytes) per unit


def _jsonl(docs: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in docs).encode()


def _docs(n: int = 400, seed: int = 3) -> list[str]:
    return [f"doc {i}: {t[:80]}" for i, t in enumerate(make_documents(n, seed=seed))]


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


def _multi_frame_zst(data: bytes, frame: int = 999) -> bytes:
    c = zstandard.ZstdCompressor(level=1)
    return b"".join(c.compress(data[i : i + frame]) for i in range(0, len(data), frame))


def _multi_member_gz(data: bytes, member: int = 777) -> bytes:
    return b"".join(_gz(data[i : i + member]) for i in range(0, len(data), member))


COMPRESSORS = {
    "gz": (".jsonl.gz", _gz),
    "zst": (".jsonl.zst", _zst),
    "zst-frames": (".jsonl.zst", _multi_frame_zst),
    "gz-members": (".jsonl.gz", _multi_member_gz),
}


def _write(tmp_path: Path, name: str, kind: str, text: bytes) -> Path:
    suffix, compress = COMPRESSORS[kind]
    path = tmp_path / f"{name}{suffix}"
    path.write_bytes(compress(text))
    return path


def _units(path: Path, unit_bytes: int = UNIT) -> list:
    return plan_units(expand_inputs([str(path)]), unit_bytes)


def _read(unit) -> list[str]:
    return [t for part in unit.parts for t in read_documents(part, "text")]


def _starts(units) -> list[tuple[int, int]]:
    return [(u.parts[0].start, u.parts[0].stop) for u in units]


def _read_or_error(unit) -> str | None:
    """The error reading ``unit`` gives (less the way past a bad record, which
    test_bad_records.py tests), or None."""
    try:
        _read(unit)
    except InputError as exc:
        return str(exc).removesuffix(SKIP_HINT)
    return None


@pytest.fixture(autouse=True)
def _no_stream_left_over():
    """Each test starts and ends with no stream kept open in this process."""
    streams.forget()
    yield
    streams.forget()
