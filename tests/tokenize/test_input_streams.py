"""Reading the units of big compressed input files: each process keeps the streams it reads
open (``tokenize.streams``), so that the units of one file, read in any order and interleaved
with other files, each give their own documents; a unit abandoned midway, a bad line, a file
changed or rewritten behind the stream's back (even with its size and modification time kept)
never give another unit's text; no input file stays open after a job. Planning decompresses
each file once, and neither planning nor reading a unit holds a whole decompressed file."""

from __future__ import annotations

import contextlib
import gzip
import os
import random
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenize_helpers import (
    UNIT,
    _docs,
    _jsonl,
    _no_stream_left_over,  # noqa: F401 -- an autouse fixture: no stream left open
    _read,
    _read_or_error,
    _starts,
    _units,
    _write,
    _zst,
)

from tokentape._src.tokenize import inputs, streams
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.inputs import expand_inputs, plan_units, read_documents
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape.errors import InputError

# --- the per-process stream cache


@pytest.mark.parametrize("kind", ["gz", "zst-frames"])
def test_units_read_in_any_order_interleaved_with_other_files(kind, tmp_path):
    """One process reads the units of two compressed files and a split parquet file in a
    random order (more streams than it keeps open): each unit holds its own documents."""
    docs = _docs(600, seed=9)
    a = _write(tmp_path, "a", kind, _jsonl(docs[:200]))
    b = _write(tmp_path, "b", "zst", _jsonl(docs[200:400]))
    c = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": docs[400:]}), c, row_group_size=200)  # one row group
    units = plan_units(expand_inputs([str(a), str(b), str(c)]), UNIT)
    assert len(units) > 10
    want = {u.index: _read(u) for u in units}
    streams.forget()
    assert [t for u in units for t in want[u.index]] == docs
    order = list(units) * 2
    random.Random(5).shuffle(order)
    for u in order:
        assert _read(u) == want[u.index], u.index


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_a_bad_line_names_its_line_and_the_next_unit_reads_right(kind, tmp_path):
    """A bad JSON line in a later unit: the message names the file and its 1-based line in the
    whole decompressed text; the same process then reads the following unit (and the failed
    one again) right."""
    docs = _docs()
    lines = _jsonl(docs).split(b"\n")
    lines[200] = b'{"text": oops}'  # line 201
    path = _write(tmp_path, "bad", kind, b"\n".join(lines))
    units = _units(path)
    bad = next(i for i, u in enumerate(units) if _read_or_error(u) is not None)
    assert 0 < bad < len(units) - 1
    # Read in order in one process: the error, then the next unit.
    streams.forget()
    for u in units[:bad]:
        _read(u)
    err = _read_or_error(units[bad])
    assert err == f"{path}:201: invalid JSON (Expecting value at column 10)"
    after = _read(units[bad + 1])
    streams.forget()
    assert after == _read(units[bad + 1])
    assert _read_or_error(units[bad]) == err


def test_a_unit_abandoned_midway_does_not_disturb_the_next(tmp_path):
    """A reader dropped after a few documents (kept alive, then closed late) leaves the
    following units of the same file intact."""
    path = _write(tmp_path, "c", "zst", _jsonl(_docs()))
    units = _units(path)
    want = [_read(u) for u in units]
    streams.forget()
    it = read_documents(units[1].parts[0], "text")
    first = [next(it), next(it)]
    assert first == want[1][:2]
    assert _read(units[2]) == want[2]
    assert _read(units[1]) == want[1]
    it.close()
    assert _read(units[3]) == want[3]


def test_a_changed_file_is_read_anew(tmp_path):
    """The same path rewritten between two plans (a new modification time): the new text."""
    docs = _docs()
    path = _write(tmp_path, "c", "zst", _jsonl(docs))
    old = _units(path)
    _read(old[0])  # the stream is kept open after unit 0
    new_docs = [d.upper() for d in docs]
    path.write_bytes(_zst(_jsonl(new_docs)))
    new = _units(path)
    assert [t for u in new for t in _read(u)] == new_docs


def _same_size_same_mtime_rewrite(path: Path, new_text: bytes) -> None:
    """Rewrite ``path`` with other text of the same length, stored (gzip level 0: the file
    keeps its size), and its modification time put back as tar, rsync -a or cp -p would."""
    st = path.stat()
    path.write_bytes(gzip.compress(new_text, compresslevel=0, mtime=0))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


def test_a_file_rewritten_with_the_same_size_and_mtime_is_not_read_from_a_stale_stream(
    tmp_path,
):
    docs = _docs()
    text = _jsonl(docs)
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(text, compresslevel=0, mtime=0))
    old = _units(path)
    assert len(old) > 3
    _read(old[0])  # this process keeps the stream open after unit 0
    new_docs = [d.swapcase() for d in docs]  # same byte length, same line breaks
    _same_size_same_mtime_rewrite(path, _jsonl(new_docs))
    new = _units(path)  # planning reads the new text: same cuts
    assert _starts(new) == _starts(old)
    got = _read(new[1])  # through the stream this process kept open
    assert got == _read_fresh(new[1])


@pytest.mark.parametrize("kept_open", [True, False])
def test_a_file_rewritten_during_a_job_is_refused(kept_open, tmp_path):
    docs = _docs()
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(_jsonl(docs), compresslevel=0, mtime=0))
    units = _units(path)
    if kept_open:
        _read(units[0])  # this process keeps the stream open after unit 0
    st = path.stat()
    path.write_bytes(gzip.compress(_jsonl([d.swapcase() for d in docs]), compresslevel=0))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # however coarse the clock
    assert path.stat().st_size == st.st_size
    with pytest.raises(InputError, match="changed since"):
        _read(units[1])


def _read_fresh(unit) -> list[str]:
    streams.forget()
    return _read(unit)


def _open_paths() -> list[str]:
    """What this process has open (Linux: /proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor of the listing itself
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return found


def test_no_input_file_stays_open_after_a_job(tmp_path):
    path = _write(tmp_path, "c", "gz", _jsonl(_docs()))
    config = TokenizeConfig(inputs=(str(path),), out=str(tmp_path / "out"),
                            unit_mb=UNIT / 2**20, shard_mb=0.01)  # fmt: skip
    assert tokenize(config).to_json()["units"] > 3
    assert str(path) not in _open_paths()


# --- memory


def _peak_mb(work) -> float:
    """Peak Python allocations (MiB) while ``work()`` runs."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", ["gz", "zst-realistic"])
def test_planning_and_reading_a_unit_hold_no_whole_decompressed_file(kind, tmp_path):
    """~24 MiB of text cut into 4 MiB units: planning and reading a unit hold a few MiB."""
    rng = random.Random(0)
    words = ["alpha", "beta", "GET", "/api/v1/items", "200", "ms", "INFO", "δέλτα", "日本"]
    line_docs = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(2000)]
    text = _jsonl(line_docs) * 40
    path = _write(tmp_path, "big", "gz" if kind == "gz" else "zst", text)
    files = expand_inputs([str(path)])
    units: list = []
    assert _peak_mb(lambda: units.extend(plan_units(files, 4 * 2**20))) < 8
    assert len(units) >= 5
    assert _peak_mb(lambda: _read(units[2])) < 16


def test_a_highly_repetitive_zst_is_not_held_whole(tmp_path):
    text = _jsonl(["the same log line, over and over " * 10]) * 80_000  # ~30 MiB
    path = _write(tmp_path, "rep", "zst", text)
    assert path.stat().st_size < 10_000
    files = expand_inputs([str(path)])
    units: list = []
    assert _peak_mb(lambda: units.extend(plan_units(files, 4 * 2**20))) < 8
    assert len(units) >= 5
    assert _peak_mb(lambda: _read(units[2])) < 16


# --- planning cost


def test_planning_decompresses_each_compressed_file_once(tmp_path, monkeypatch):
    """Counted by wrapping the real decompressor (it still does the work)."""
    calls: list[str] = []
    real = inputs._decompressed

    def counting(file):
        calls.append(file.path)
        return real(file)

    monkeypatch.setattr(inputs, "_decompressed", counting)
    docs = _docs()
    a = _write(tmp_path, "a", "gz", _jsonl(docs[:200]))
    b = _write(tmp_path, "b", "zst", _jsonl(docs[200:]))
    small = _write(tmp_path, "s", "zst", _jsonl(docs[:2]))
    units = plan_units(expand_inputs([str(a), str(b), str(small)]), UNIT)
    assert sorted(calls) == sorted([str(a), str(b), str(small)])
    calls.clear()
    assert [t for u in units for t in _read(u)] == docs + docs[:2]
    assert sorted(calls) == sorted([str(a), str(b), str(small)])  # once each, read in order
