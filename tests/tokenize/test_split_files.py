"""One big input file is many units of work (issue 14, item 1), whose progress moves as it is
read (item 3): a .jsonl.zst or .jsonl.gz cut in its decompressed text (however it is
compressed: several gzip members, several zstd frames, skippable frames; the same cuts as the
plain .jsonl of the same text), a parquet file with row groups of any size cut into rows. The
store is byte-identical for 1 and 2 workers, on Ray and from object storage, holds every
document in order, and a run killed after a unit of such a file resumes to the same bytes;
the input bytes reported add up exactly. A corrupt, truncated or bad line is one error naming
its file and line (or row)."""

from __future__ import annotations

import gzip
import json
import random
import signal
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import RecordingCounters, make_documents, run_cli, tree_bytes
from tokenize_helpers import (
    COMPRESSORS,
    UNIT,
    _docs,
    _jsonl,
    _no_stream_left_over,  # noqa: F401 -- an autouse fixture: no stream left open
    _read,
    _read_or_error,
    _starts,
    _units,
    _write,
)

from tokentape import open_source
from tokentape._src.store.tokenizers import load_tokenizer
from tokentape._src.tokenize import streams
from tokentape._src.tokenize.driver import tokenize
from tokentape._src.tokenize.filters import parse_filters
from tokentape._src.tokenize.inputs import expand_inputs, plan_units
from tokentape._src.tokenize.job import TokenizeConfig
from tokentape._src.tokenize.worker import WorkerSettings, tokenize_unit
from tokentape.errors import InputError

UNIT_MB = "0.004"  # about 4 KB of input (text or row-group bytes) per unit


@pytest.fixture(scope="module", params=["zst", "gz", "parquet"])
def big_file(request, tmp_path_factory) -> tuple[Path, list[str]]:
    """One file of ~100 KB of text in the given format, and its documents in order."""
    root = tmp_path_factory.mktemp(f"big-{request.param}")
    docs = make_documents(400, seed=11)
    if request.param == "zst":
        path = root / "corpus.jsonl.zst"
        path.write_bytes(zstandard.ZstdCompressor(level=3).compress(_jsonl(docs)))
    elif request.param == "gz":
        path = root / "corpus.jsonl.gz"
        path.write_bytes(gzip.compress(_jsonl(docs), mtime=0))
    else:
        path = root / "corpus.parquet"
        pq.write_table(pa.table({"text": docs}), path, row_group_size=len(docs))  # one group
    return path, docs


def _args(path: Path, out: Path, workers: str) -> list[str]:
    return ["tokenize", str(path), "--out", str(out), "--unit-mb", UNIT_MB, "--shard-mb",
            "0.01", "--workers", workers, "--json"]  # fmt: skip


@pytest.mark.subprocess
def test_one_big_file_is_many_units_and_byte_identical_for_any_worker_count(big_file, tmp_path):
    path, docs = big_file
    trees, units = [], []
    for workers in ("1", "2"):
        result = run_cli(*_args(path, tmp_path / f"w{workers}", workers))
        assert result.returncode == 0, result.stderr
        units.append(json.loads(result.stdout)["units"])
        trees.append(tree_bytes(tmp_path / f"w{workers}"))
    assert units[0] == units[1] > 4  # one file, many units: the same whatever the workers
    assert trees[0] == trees[1]
    src = open_source(tmp_path / "w2")
    assert src.n_docs == len(docs)
    assert [src.decode(src.doc(i)) for i in range(len(docs))] == docs


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_kill_after_a_unit_of_a_split_file_resumes_to_the_same_bytes(big_file, tmp_path):
    path, _ = big_file
    reference = run_cli(*_args(path, tmp_path / "ref", "1"))
    assert reference.returncode == 0, reference.stderr
    args = _args(path, tmp_path / "s", "2")
    killed = run_cli(*args, env={"TOKENTAPE_CRASH_AT": "after-unit"})
    assert killed.returncode == -signal.SIGKILL
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["status"] == "resumed" and summary["units_reused"] >= 1
    assert tree_bytes(tmp_path / "s") == tree_bytes(tmp_path / "ref")


@pytest.mark.parametrize("kind", ["jsonl", "zst", "parquet"])
def test_a_unit_reports_its_input_bytes_as_it_reads_them(kind, tmp_path):
    """Progress moves inside a unit (issue 14 item 3): the unit's input bytes arrive in many
    reports as its documents are read, adding up to the unit's size exactly."""
    docs = make_documents(3000, seed=5)
    text = _jsonl(docs)
    if kind == "jsonl":
        path = tmp_path / "c.jsonl"
        path.write_bytes(text)
    elif kind == "zst":
        path = tmp_path / "c.jsonl.zst"
        path.write_bytes(zstandard.ZstdCompressor().compress(text))
    else:
        path = tmp_path / "c.parquet"
        pq.write_table(pa.table({"text": docs}), path, row_group_size=len(docs))
    [file] = expand_inputs([str(path)])
    unit_bytes = len(text) // 2 if kind == "zst" else file.size + 1  # zst: cut in its text
    unit = plan_units([file], unit_bytes)[0]
    settings = WorkerSettings("text", "uint16", 257, str(tmp_path))
    counters = RecordingCounters()
    result = tokenize_unit(unit, load_tokenizer("bytes"), parse_filters(()), settings, counters)
    reports = [n for n in counters.input_reports if n > 0]
    assert result.docs_in > 5 * 256 // (2 if kind == "zst" else 1)
    assert len(reports) >= 4  # a batch of 256 documents at a time, not once at the end
    assert sum(counters.input_reports) == unit.n_bytes and max(reports) < unit.n_bytes


def test_a_long_document_moves_the_progress_while_its_pieces_are_encoded(tmp_path):
    """A heartbeat (issue 14 item 3): one document of 5 MB is encoded in pieces of 1 MiB, and
    the unit's input bytes are reported piece by piece, not once when it is done."""
    words = "some words of a very long log dump " * 150_000  # 5.25 MB, spaces between letters
    path = tmp_path / "one.jsonl"
    path.write_bytes(_jsonl([words]))
    [file] = expand_inputs([str(path)])
    [unit] = plan_units([file], file.size + 1)
    settings = WorkerSettings("text", "uint16", 257, str(tmp_path))
    counters = RecordingCounters()
    result = tokenize_unit(unit, load_tokenizer("bytes"), parse_filters(()), settings, counters)
    reports = [n for n in counters.input_reports if n > 0]
    assert result.docs_in == 1 and result.n_tokens == len(words) + 1
    assert len(reports) >= 4 and sum(counters.input_reports) == unit.n_bytes


# --- determinism: cuts are a function of the decompressed text only


def test_line_cuts_do_not_depend_on_how_the_text_is_blocked():
    text = _jsonl(_docs())
    want = streams.line_cuts(iter([text]), UNIT)
    assert len(want) > 5
    for size in (1, 2, 3, 7, 64, 1000, 1999, 2000, 2001, 4096):
        blocks = (text[i : i + size] for i in range(0, len(text), size))
        assert streams.line_cuts(blocks, UNIT) == want, size
    # Every cut is a line start, the last one the end of the text.
    assert want[0] == 0 and want[-1] == len(text)
    assert all(text[c - 1 : c] == b"\n" for c in want[1:])


@pytest.mark.parametrize("kind", list(COMPRESSORS))
def test_every_compression_of_the_same_text_is_cut_the_same_way(kind, tmp_path):
    """gzip, zstd, several zstd frames, several gzip members: the same units."""
    text = _jsonl(_docs())
    reference = _starts(_units(_write(tmp_path, "ref", "zst", text)))
    units = _units(_write(tmp_path, "c", kind, text))
    assert _starts(units) == reference and len(units) > 5
    assert [t for u in units for t in _read(u)] == _docs()


@pytest.mark.parametrize("final_newline", [True, False])
def test_compressed_text_is_cut_where_the_same_plain_jsonl_is(final_newline, tmp_path):
    """Random line lengths and unit sizes: a .jsonl.gz, a .jsonl.zst and the plain .jsonl of
    the same text make the same byte ranges."""
    rng = random.Random(17)
    docs = ["w" * rng.choice([0, 1, 5, 40, 300, 2500]) for _ in range(300)]
    text = _jsonl(docs)
    text = text if final_newline else text.rstrip(b"\n")
    plain = tmp_path / "p.jsonl"
    plain.write_bytes(text)
    gz, zst = _write(tmp_path, "g", "gz", text), _write(tmp_path, "z", "zst", text)
    for unit_bytes in (1, 50, 333, 2500, 2501, 9999, len(text) - 1):
        want = _starts(_units(plain, unit_bytes))
        for path in (gz, zst):
            got = _units(path, unit_bytes)
            if len(want) == 1:  # not cut: the whole file
                assert unit_bytes == len(text) - 1 and len(got) == 1
            else:
                assert _starts(got) == want, (path, unit_bytes)


@pytest.mark.parametrize("kind", ["gz-members", "zst-frames"])
def test_an_error_on_the_first_line_of_each_unit_names_that_line(kind, tmp_path):
    """A missing field on the first line of unit k (same length: the cuts stay): the message
    names the line counted in the whole decompressed text, blank lines included."""
    docs = _docs()
    text = _jsonl(docs).replace(b"\n", b"\n\n", 7)  # a few blank lines early on
    units = _units(_write(tmp_path, "ok", kind, text))
    for k in (1, len(units) // 2, len(units) - 1):
        start = units[k].parts[0].start
        bad = text[:start] + text[start:].replace(b'{"text"', b'{"tExt"', 1)
        path = _write(tmp_path, f"bad{k}", kind, bad)
        bad_units = _units(path)
        assert _starts(bad_units) == _starts(units)
        line = text[:start].count(b"\n") + 1
        assert _read_or_error(bad_units[k]) == (
            f"{path}:{line}: no field 'text' (fields: tExt); choose the field with --text-key"
        )


# --- edge cases of compressed files


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_a_bom_empty_and_newline_free_compressed_file(kind, tmp_path):
    docs = _docs()
    bom = _units(_write(tmp_path, "bom", kind, b"\xef\xbb\xbf" + _jsonl(docs)))
    assert len(bom) > 5 and [t for u in bom for t in _read(u)] == docs
    empty = _units(_write(tmp_path, "empty", kind, b""), 1)
    assert len(empty) == 1 and _read(empty[0]) == []
    one = json.dumps({"text": "z" * 10_000}).encode()  # no newline at all: one unit
    units = _units(_write(tmp_path, "one", kind, one), 100)
    assert len(units) == 1 and _read(units[0]) == ["z" * 10_000]
    units = _units(_write(tmp_path, "blank", kind, b"\n" * 5000), 100)  # blank lines only
    assert len(units) > 10 and all(_read(u) == [] for u in units)


def test_a_truncated_split_file_is_refused_in_one_line(tmp_path):
    """A file that shrank after planning (same size check fails) or is corrupt: one line."""
    path = _write(tmp_path, "c", "zst", _jsonl(_docs()))
    units = _units(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as info:
        _read(units[-1])
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_skippable_zstd_frames_between_data_frames_are_ignored(tmp_path):
    docs = _docs()
    text = _jsonl(docs)
    skip = struct.pack("<II", 0x184D2A50, 8) + b"metadata"
    c = zstandard.ZstdCompressor()
    path = tmp_path / "s.jsonl.zst"
    path.write_bytes(skip + c.compress(text[:20000]) + skip + c.compress(text[20000:]) + skip)
    units = _units(path)
    assert len(units) > 5 and [t for u in units for t in _read(u)] == docs


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_a_file_corrupt_in_the_middle_is_refused_in_one_line_while_planning(kind, tmp_path):
    path = _write(tmp_path, "c", kind, _jsonl(_docs()))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="corrupt") as info:
        _units(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{path}: ")


# --- parquet


def test_a_null_in_the_middle_of_a_split_row_group_names_its_row(tmp_path):
    docs: list[str | None] = list(_docs(600))
    docs[333] = None
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": pa.array(docs, pa.string())}), path, row_group_size=600)
    units = _units(path)
    assert len(units) > 3
    errors = [e for u in units if (e := _read_or_error(u)) is not None]
    assert errors == [f"{path}: row 333: field 'text' is null"]


def _mixed_parquet(path: Path, docs: list[str], empty_groups: bool) -> None:
    """Tiny row groups, one huge one, and (optionally) row groups of 0 rows around it."""
    empty = pa.table({"text": pa.array([], pa.string())})
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as w:
        for i in range(0, 40, 2):
            w.write_table(pa.table({"text": docs[i : i + 2]}))
        if empty_groups:
            w.write_table(empty)
        w.write_table(pa.table({"text": docs[40:380]}))
        if empty_groups:
            w.write_table(empty)
        for i in range(380, len(docs), 2):
            w.write_table(pa.table({"text": docs[i : i + 2]}))


@pytest.mark.parametrize("unit_bytes", [50, 500, 2000, 10**9])
def test_tiny_row_groups_around_a_huge_one_partition_the_rows(unit_bytes, tmp_path):
    docs = _docs()
    path = tmp_path / "m.parquet"
    _mixed_parquet(path, docs, empty_groups=True)
    units = _units(path, unit_bytes)
    assert [t for u in units for t in _read(u)] == docs
    assert [t for u in reversed(units) for t in reversed(_read(u))] == docs[::-1]
    cuts = [c for u in units for c in (u.parts[0].start, u.parts[0].stop)]
    assert cuts == sorted(cuts) and cuts[0] == 0 and cuts[-1] == len(docs)


def test_row_groups_of_no_rows_make_no_empty_unit(tmp_path):
    docs = _docs()
    path = tmp_path / "m.parquet"
    _mixed_parquet(path, docs, empty_groups=True)
    units = _units(path, 1)
    assert [t for u in units for t in _read(u)] == docs
    assert all(p.start < p.stop for u in units for p in u.parts)


# --- progress inside units


@pytest.mark.parametrize("kind", ["gz", "zst-frames", "parquet", "mixed"])
def test_input_bytes_of_every_unit_add_up_exactly_and_never_go_back(kind, tmp_path):
    docs = _docs(3000, seed=7)
    if kind == "parquet":
        path = tmp_path / "c.parquet"
        pq.write_table(pa.table({"text": docs}), path, row_group_size=len(docs))
        files = expand_inputs([str(path)])
    elif kind == "mixed":  # small files sharing units, a bom, a split file, a .txt
        (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + _jsonl(docs[:3]))
        (tmp_path / "b.txt").write_text(docs[3])
        _write(tmp_path, "c", "gz", _jsonl(docs[4:2000]))
        (tmp_path / "d.jsonl").write_bytes(_jsonl(docs[2000:]).rstrip(b"\n"))  # no final \n
        files = expand_inputs([str(tmp_path)])
    else:
        files = expand_inputs([str(_write(tmp_path, "c", kind, _jsonl(docs)))])
    units = plan_units(files, 20_000)
    assert len(units) > 3
    total = sum(u.n_bytes for u in units)
    settings = WorkerSettings("text", "uint16", 257, str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    counters = RecordingCounters()
    seen = 0
    for unit in units:
        before = len(counters.input_reports)
        tokenize_unit(unit, load_tokenizer("bytes"), parse_filters(()), settings, counters)
        reports = counters.input_reports[before:]
        assert all(n >= 0 for n in reports)
        assert sum(reports) == unit.n_bytes
        seen += sum(reports)
        assert seen <= total
    assert seen == total == counters.snapshot()[3]
    # The parts of a split file cover its size up to rounding (one byte per cut at most).
    by_file: dict[str, int] = {}
    for u in units:
        for p in u.parts:
            by_file[p.file.path] = by_file.get(p.file.path, 0) + p.n_bytes
    for f in files:
        assert f.size - len(units) <= by_file[f.path] <= f.size


# --- whole runs: worker counts, object storage


@pytest.mark.subprocess
@pytest.mark.slow
def test_split_files_of_every_kind_are_byte_identical_for_1_and_2_workers(tmp_path):
    docs = _mixed_dir(tmp_path / "in")
    root = tmp_path / "in"
    trees = []
    for workers in (1, 2):
        streams.forget()
        config = TokenizeConfig(inputs=(str(root),), out=str(tmp_path / f"w{workers}"),
                                unit_mb=UNIT / 2**20, shard_mb=0.01, workers=workers)  # fmt: skip
        summary = tokenize(config).to_json()
        assert summary["units"] > 10 and summary["n_docs"] == len(docs)
        trees.append(tree_bytes(tmp_path / f"w{workers}"))
    assert trees[0] == trees[1]


def _mixed_dir(root: Path) -> list[str]:
    """Split files of every kind (a BOM, zstd frames, gzip members, tiny/huge/empty row
    groups) and small files between them; returns the documents in order."""
    docs = _docs(900, seed=21)
    root.mkdir()
    _write(root, "a", "zst-frames", b"\xef\xbb\xbf" + _jsonl(docs[:300]))
    (root / "b.jsonl").write_bytes(_jsonl(docs[300:302]))
    _write(root, "c", "gz-members", _jsonl(docs[302:600]))
    _mixed_parquet(root / "d.parquet", docs[600:], empty_groups=True)
    return docs


def test_progress_reports_of_a_job_end_exactly_at_the_total(tmp_path):
    _mixed_dir(tmp_path / "in")
    reports = []
    config = TokenizeConfig(inputs=(str(tmp_path / "in"),), out=str(tmp_path / "out"),
                            unit_mb=UNIT / 2**20, shard_mb=0.01)  # fmt: skip
    tokenize(config, progress=reports.append)
    assert reports and reports[-1].final
    done = [r.done_bytes for r in reports]
    assert done == sorted(done) and all(0 <= r.done_bytes <= r.total_bytes for r in reports)
    assert done[-1] == reports[-1].total_bytes > 0


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_kill_after_a_unit_of_mixed_split_files_resumes_to_the_same_bytes(tmp_path):
    _mixed_dir(tmp_path / "in")

    def args(out: str, workers: str) -> list[str]:
        unit_mb = str(UNIT / 2**20)
        return ["tokenize", str(tmp_path / "in"), "--out", str(tmp_path / out), "--unit-mb",
                unit_mb, "--shard-mb", "0.01", "--workers", workers, "--json"]  # fmt: skip

    reference = run_cli(*args("ref", "1"))
    assert reference.returncode == 0, reference.stderr
    killed = run_cli(*args("s", "2"), env={"TOKENTAPE_CRASH_AT": "after-unit"})
    assert killed.returncode == -signal.SIGKILL
    rerun = run_cli(*args("s", "2"))
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["status"] == "resumed" and summary["units_reused"] >= 1
    assert tree_bytes(tmp_path / "s") == tree_bytes(tmp_path / "ref")


@pytest.mark.ray
@pytest.mark.subprocess
@pytest.mark.slow
def test_split_files_on_ray_are_byte_identical_to_the_local_executor(tmp_path):
    """Ray workers take units in no fixed order and are reused from task to task: the
    streams they keep open must still give each unit its own documents."""
    ray = pytest.importorskip("ray")
    docs = _mixed_dir(tmp_path / "in")
    trees = []
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for executor, workers in (("local", 1), ("ray", 2), ("ray", 2)):
            out = tmp_path / f"{executor}{len(trees)}"
            config = TokenizeConfig(inputs=(str(tmp_path / "in"),), out=str(out),
                                    unit_mb=UNIT / 2**20, shard_mb=0.01, workers=workers,
                                    executor=executor)  # fmt: skip
            assert tokenize(config).to_json()["n_docs"] == len(docs)
            trees.append(tree_bytes(out))
    finally:
        ray.shutdown()
    assert trees[1] == trees[0] and trees[2] == trees[0]


@pytest.mark.s3
def test_split_compressed_and_parquet_objects_are_byte_identical_to_local(s3, tmp_path):
    docs = _docs(600, seed=13)
    root = tmp_path / "in"
    root.mkdir()
    _write(root, "a", "zst-frames", _jsonl(docs[:200]))
    _write(root, "b", "gz", _jsonl(docs[200:400]))
    pq.write_table(pa.table({"text": docs[400:]}), root / "c.parquet", row_group_size=200)
    prefix = s3.upload_tree(root, f"{s3.url}/split")
    local, remote = (
        plan_units(expand_inputs([str(root)]), UNIT),
        plan_units(expand_inputs([prefix]), UNIT),
    )
    assert _starts(local) == _starts(remote) and len(local) > 10
    order = list(range(len(local)))
    random.Random(1).shuffle(order)
    for i in order:
        assert _read(remote[i]) == _read(local[i]), i
