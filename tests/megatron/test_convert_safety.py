"""`tokentape convert` never loses or clobbers data: an existing output is replaced only once the
new one is complete, only with --overwrite, and only when it is recognisably ours (a store
directory of tokentape's own file names, a prefix whose .idx is a Megatron index its .bin
matches). Failures are one line, exit 2; an interrupted run leaves no temporaries and a rerun
gives what an uninterrupted run gives."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import socket
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import write_store

from tokentape._src.megatron import convert
from tokentape._src.megatron.format import MegatronWriter
from tokentape._src.megatron.source import MegatronSource
from tokentape._src.program import main
from tokentape._src.store.format import sha256_stream
from tokentape._src.store.reader import Source
from tokentape._src.store.writer import ShardWriter
from tokentape.errors import ArgumentError

with warnings.catch_warnings():  # megatron-core warns that Apex / Transformer Engine are absent
    warnings.simplefilter("ignore")
    mcore = pytest.importorskip("megatron.core.datasets.indexed_dataset")
torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # megatron-core's numpy use
    pytest.mark.megatron,
    pytest.mark.torch,
]

VOCAB, EOD = 257, 256
FROM_ARGS = ("--vocab-size", VOCAB, "--eod-id", EOD, "--shard-mb", "0.0005")


def cli(capsys, *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("tokentape: error")
    return err


def docs_of(seed: int, n: int = 60) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(0, EOD, rng.integers(1, 20)), EOD) for _ in range(n)]


def build(prefix: Path, docs: list[np.ndarray]) -> None:
    """A Megatron dataset written by megatron-core itself."""
    builder = mcore.IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for doc in docs:
        builder.add_document(torch.from_numpy(doc.astype(np.int64)), [len(doc)])
    builder.finalize(f"{prefix}.idx")


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (hidden ones included) and its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def prefix_files(prefix: Path) -> dict[str, bytes]:
    return {s: Path(f"{prefix}{s}").read_bytes() for s in (".bin", ".idx")}


def fail_after(monkeypatch, cls: type, calls: int, exc: BaseException) -> None:
    """Make ``cls.add`` raise ``exc`` after ``calls`` calls (a Ctrl-C, a full disk mid-run)."""
    original, seen = cls.add, []

    def add(self, *args, **kwargs):
        seen.append(1)
        if len(seen) > calls:
            raise exc
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "add", add)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(convert, "CHUNK_TOKENS", 32)  # many chunks: fail in a late one


# --- an interrupted --overwrite leaves the old output ------------------------------------------


def test_an_interrupted_overwrite_to_megatron_keeps_the_old_dataset(
    tmp_path, capsys, monkeypatch, small_chunks
):
    write_store(tmp_path / "old_store", [list(d[:-1]) for d in docs_of(1)], shard_tokens=64)
    write_store(tmp_path / "store", [list(d[:-1]) for d in docs_of(2)], shard_tokens=64)
    out = tmp_path / "data" / "web"
    assert cli(capsys, "convert", "--to", "megatron", tmp_path / "old_store", out)[0] == 0
    old = prefix_files(out)
    before = sorted(os.listdir(out.parent))
    args = ("convert", "--to", "megatron", tmp_path / "store", out, "--overwrite")

    with monkeypatch.context() as m:  # Ctrl-C in a late chunk
        fail_after(m, MegatronWriter, 5, KeyboardInterrupt())
        code, _, err = cli(capsys, *args)
    assert code == 130 and "interrupted" in err
    assert prefix_files(out) == old and sorted(os.listdir(out.parent)) == before  # no temporaries
    assert len(mcore.IndexedDataset(str(out))) == len(docs_of(1))
    assert MegatronSource(out, VOCAB, EOD).n_docs == len(docs_of(1))

    with monkeypatch.context() as m:  # a full disk
        fail_after(m, MegatronWriter, 5, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        code, _, err = cli(capsys, *args)
    assert code == 2 and f"'{out}.bin': No space left on device" in one_line_error(err)
    assert prefix_files(out) == old and sorted(os.listdir(out.parent)) == before

    # The rerun starts clean and writes what an uninterrupted run writes.
    assert cli(capsys, *args)[0] == 0
    fresh = tmp_path / "fresh" / "web"
    assert cli(capsys, "convert", "--to", "megatron", tmp_path / "store", fresh)[0] == 0
    assert prefix_files(out) == prefix_files(fresh) != old
    assert sorted(os.listdir(out.parent)) == before
    peer = mcore.IndexedDataset(str(out))
    assert [peer[i].tolist() for i in range(len(peer))] == [d.tolist() for d in docs_of(2)]
    # Its new identity was recorded (the old sidecar does not linger).
    source = MegatronSource(out, VOCAB, EOD)
    assert source.manifest.content_hash == MegatronSource(fresh, VOCAB, EOD).manifest.content_hash


def test_an_interrupted_overwrite_from_megatron_keeps_the_old_store(
    tmp_path, capsys, monkeypatch, small_chunks
):
    build(tmp_path / "old", docs_of(1))
    build(tmp_path / "new", docs_of(2))
    bad = docs_of(2)
    bad[-3][0] = 300  # an id above the vocabulary, in a late chunk
    build(tmp_path / "bad", bad)
    store = tmp_path / "stores" / "web"
    assert cli(capsys, "convert", "--from", "megatron", tmp_path / "old", store, *FROM_ARGS)[0] == 0
    old = snapshot(store)
    old_hash = Source(store).manifest.content_hash
    before = sorted(os.listdir(store.parent))

    def convert_from(prefix: str) -> tuple[int, str, str]:
        src = tmp_path / prefix
        return cli(capsys, "convert", "--from", "megatron", src, store, *FROM_ARGS, "--overwrite")

    code, _, err = convert_from("bad")
    assert code == 2 and "has id 300" in one_line_error(err)
    with monkeypatch.context() as m:
        fail_after(m, ShardWriter, 5, KeyboardInterrupt())
        assert convert_from("new")[0] == 130
    with monkeypatch.context() as m:
        fail_after(m, ShardWriter, 5, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        code, _, err = convert_from("new")
    assert code == 2 and f"'{store}': No space left on device" in one_line_error(err)
    # Each time: the old store untouched and still good, nothing left beside it.
    assert snapshot(store) == old and sorted(os.listdir(store.parent)) == before
    assert cli(capsys, "verify", store)[0] == 0
    assert Source(store).manifest.content_hash == old_hash

    assert convert_from("new")[0] == 0
    fresh = tmp_path / "fresh"
    assert cli(capsys, "convert", "--from", "megatron", tmp_path / "new", fresh, *FROM_ARGS)[0] == 0
    assert snapshot(store) == snapshot(fresh) != old
    assert sorted(os.listdir(store.parent)) == before
    assert cli(capsys, "verify", store)[0] == 0


def test_an_interrupted_first_conversion_leaves_nothing_and_a_rerun_works(
    tmp_path, capsys, monkeypatch, small_chunks
):
    build(tmp_path / "m", docs_of(3))
    store, empty = tmp_path / "store", tmp_path / "empty"
    empty.mkdir()
    for out in (store, empty):
        args = ("convert", "--from", "megatron", tmp_path / "m", out, *FROM_ARGS)
        before = sorted(os.listdir(tmp_path))
        with monkeypatch.context() as m:
            fail_after(m, ShardWriter, 3, KeyboardInterrupt())
            assert cli(capsys, *args)[0] == 130
        assert sorted(os.listdir(tmp_path)) == before and os.listdir(empty) == []
        assert cli(capsys, *args)[0] == 0  # no --overwrite needed: nothing was left
    assert snapshot(store) == snapshot(empty)


# --- only what is ours is ever replaced -------------------------------------------------------


def test_foreign_files_are_never_removed(tmp_path, capsys):
    build(tmp_path / "m", docs_of(4))
    out = tmp_path / "raw"
    out.mkdir()
    for i in range(3):  # Spark output, a Hugging Face tokenizer config: not ours
        (out / f"part-0000{i}-1b2c.snappy.parquet").write_bytes(b"PAR1 precious")
    (out / "tokenizer_config.json").write_text("{}")
    before = snapshot(out)
    for extra in ((), ("--overwrite",)):
        code, _, err = cli(
            capsys, "convert", "--from", "megatron", tmp_path / "m", out, *FROM_ARGS, *extra
        )
        assert code == 2 and "found 'part-00000-1b2c.snappy.parquet'" in one_line_error(err)
        assert snapshot(out) == before
    # One foreign file among a store's is enough to refuse.
    store = tmp_path / "store"
    args = ("convert", "--from", "megatron", tmp_path / "m", store, *FROM_ARGS)
    assert cli(capsys, *args)[0] == 0
    (store / "notes.txt").write_text("mine")
    code, _, err = cli(capsys, *args, "--overwrite")
    assert code == 2 and "found 'notes.txt'" in one_line_error(err)
    assert (store / "notes.txt").read_text() == "mine" and (store / "manifest.json").exists()


def test_part_of_a_store_is_replaced_only_with_overwrite(tmp_path, capsys):
    build(tmp_path / "m", docs_of(5))
    out = tmp_path / "store"
    write_store(out, [[1, 2, 3]] * 20, shard_tokens=100)
    (out / "manifest.json").unlink()  # an unfinished store of ours: shard pairs, no manifest
    before = snapshot(out)
    args = ("convert", "--from", "megatron", tmp_path / "m", out, *FROM_ARGS)
    code, _, err = cli(capsys, *args)
    assert code == 2 and "pass --overwrite" in one_line_error(err)
    assert snapshot(out) == before
    assert cli(capsys, *args, "--overwrite")[0] == 0
    assert Source(out).n_docs == len(docs_of(5))


def test_a_lone_shard_file_is_not_ours_to_replace(tmp_path, capsys):
    """A ``part-00000.bin`` nothing vouches for (no manifest, no index beside it, no run) may be
    another tool's: refused with or without --overwrite, never suggested it, left in place."""
    build(tmp_path / "m", docs_of(5))
    out = tmp_path / "store"
    out.mkdir()
    (out / "part-00000.bin").write_bytes(b"\0\0")
    args = ("convert", "--from", "megatron", tmp_path / "m", out, *FROM_ARGS)
    for extra in ((), ("--overwrite",)):
        code, _, err = cli(capsys, *args, *extra)
        line = one_line_error(err)
        assert code == 2 and "part-00000.bin" in line and "pass --overwrite" not in line
        assert snapshot(out) == {"part-00000.bin": b"\0\0"}


def test_an_unrelated_bin_or_idx_is_not_replaced(tmp_path, capsys):
    write_store(tmp_path / "store", [[1, 2, 3]] * 20, shard_tokens=100)
    build(tmp_path / "other", docs_of(6))
    cases = {
        "model": {".bin": b"weights" * 10},  # a .bin without any .idx
        "junk": {".bin": b"weights" * 10, ".idx": b"not an index at all"},
        # A real index whose .bin does not match it (here: another dataset's index).
        "mismatch": {".bin": b"weights" * 10, ".idx": Path(f"{tmp_path}/other.idx").read_bytes()},
        "truncated": {".idx": Path(f"{tmp_path}/other.idx").read_bytes()[:-8]},
    }
    for name, files in cases.items():
        for suffix, data in files.items():
            Path(f"{tmp_path / name}{suffix}").write_bytes(data)
        out = tmp_path / name
        code, _, err = cli(
            capsys, "convert", "--to", "megatron", tmp_path / "store", out, "--overwrite"
        )
        assert code == 2 and "refusing to replace" in one_line_error(err), name
        for suffix, data in files.items():
            assert Path(f"{tmp_path / name}{suffix}").read_bytes() == data
    # A Megatron dataset (or its index alone) is replaced.
    Path(f"{tmp_path}/other.bin").unlink()
    for prefix in (tmp_path / "other", tmp_path / "m2"):
        if prefix.name == "m2":
            build(prefix, docs_of(7))
        code, _, _ = cli(
            capsys, "convert", "--to", "megatron", tmp_path / "store", prefix, "--overwrite"
        )
        assert code == 0 and len(mcore.IndexedDataset(str(prefix))) == 20


# --- I/O errors are one line ------------------------------------------------------------------


def test_io_errors_on_the_output_are_one_line(tmp_path, capsys):
    write_store(tmp_path / "store", [[1, 2, 3]] * 5, shard_tokens=100)
    build(tmp_path / "m", docs_of(8))
    (tmp_path / "file").write_text("a file, not a directory")
    code, _, err = cli(
        capsys, "convert", "--to", "megatron", tmp_path / "store", tmp_path / "file" / "x"
    )
    assert code == 2 and f"'{tmp_path / 'file'}'" in one_line_error(err)
    for out in (tmp_path / "file" / "store", tmp_path / "file"):
        code, _, err = cli(capsys, "convert", "--from", "megatron", tmp_path / "m", out, *FROM_ARGS)
        assert code == 2 and str(tmp_path / "file") in one_line_error(err)
    assert (tmp_path / "file").read_text() == "a file, not a directory"
    if os.geteuid() != 0:  # no permission to write beside the output
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            code, _, err = cli(capsys, "convert", "--to", "megatron", tmp_path / "store", ro / "x")
            assert code == 2 and "Permission denied" in one_line_error(err)
            assert f"'{ro}/x.bin'" in err and ".tokentape-" not in err
        finally:
            ro.chmod(0o755)


# --- temporaries of a killed run --------------------------------------------------------------


def test_a_killed_runs_temporaries_are_cleaned_and_others_are_kept(tmp_path, capsys):
    write_store(tmp_path / "store", [[1, 2, 3]] * 5, shard_tokens=100)
    build(tmp_path / "m", docs_of(9))
    host = socket.gethostname()
    dead = 2**22 + 12345  # above Linux's largest process id: no such process
    stale = [
        f".web.tokentape-convert-{host}-{dead}-0123abcd.bin",
        f".web.tokentape-convert-{host}-{dead}-0123abcd.idx",
        f"..web.tokentape-convert-{host}-{dead}-4567cdef.bin.tmp-{dead}",
        f"..web.tokentape-convert-{host}-{dead}-4567cdef.bin.tmp-{host}-{dead}-0a1b2c3d",
    ]
    kept = [
        f".web.tokentape-convert-{host}-{os.getppid()}-0123abcd.bin",  # still running
        f".web.tokentape-convert-otherhost-{dead}-0123abcd.bin",  # another machine's
        f".web.tokentape-convert-{host}-{dead}-0123abcd.bin.txt",  # not a name we write
        f".web.tokentape-old-{host}-{dead}-0123abcd.idx",  # a moved-aside old index: kept
    ]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"x")
    assert cli(capsys, "convert", "--to", "megatron", tmp_path / "store", tmp_path / "web")[0] == 0
    names = set(os.listdir(tmp_path))
    assert not names & set(stale) and set(kept) <= names
    # A store's temporary sibling directory: removed only when it holds store files alone.
    gone = tmp_path / f".s.tokentape-convert-{host}-{dead}-89abcdef"
    mixed = tmp_path / f".s.tokentape-convert-{host}-{dead}-fedcba98"
    for d in (gone, mixed):
        d.mkdir()
        (d / "part-00000.bin").write_bytes(b"x")
        (d / f".manifest.json.tmp-{host}-{dead}-0a1b2c3d").write_bytes(b"x")
        (d / f".part-00001.bin.tmp-{dead}").write_bytes(b"x")
    (mixed / "mine.txt").write_text("x")
    args = ("convert", "--from", "megatron", tmp_path / "m", tmp_path / "s", *FROM_ARGS)
    assert cli(capsys, *args)[0] == 0
    assert not gone.exists() and (mixed / "mine.txt").exists()


# --- streaming helpers ------------------------------------------------------------------------


class _Stream:
    def __init__(self, starts: np.ndarray, n_tokens: int) -> None:
        self.doc_starts, self.n_tokens, self.n_docs = starts, n_tokens, len(starts)


def test_doc_chunks_are_whole_documents_within_the_limit():
    rng = np.random.default_rng(0)
    for trial in range(200):
        lengths = rng.integers(0, 12, rng.integers(1, 40))  # empty documents too
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        n_tokens, limit = int(lengths.sum()), int(rng.integers(1, 30))
        chunks = list(convert.doc_chunks(_Stream(starts, n_tokens), limit))
        assert [c[0] for c in chunks] == [0, *[c[1] for c in chunks[:-1]]]
        assert chunks[-1][1] == len(lengths)
        ends = np.cumsum(lengths)
        for first, stop in chunks:  # as many documents as fit (at least one)
            size = int(lengths[first:stop].sum())
            assert stop == first + 1 or size <= limit
            fits = stop < len(lengths) and ends[stop] - starts[first] <= limit
            assert not fits, (trial, first, stop)


def test_the_index_is_hashed_in_chunks(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(1000))
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    with open(path, "rb") as f:
        assert sha256_stream(f, 7) == expected


# --- bad flags: one line naming the flag, nothing written ---------------------------------

BAD_CONVERT_FLAGS = [
    # (direction arguments after SRC OUT, what the one line must say)
    (("--to", "--dtype", "float32"), "dtype 'float32' is not a Megatron integer dtype"),
    (("--to", "--shard-mb", "1"), "--shard-mb applies to --from megatron only"),
    (("--to", "--vocab-size", "300"), "--vocab-size applies to --from megatron only"),
    (
        ("--from", "--shard-mb", "inf"),
        "--shard-mb must be a number of MiB in (0, 1048576], got inf",
    ),
    (
        ("--from", "--shard-mb", "nan"),
        "--shard-mb must be a number of MiB in (0, 1048576], got nan",
    ),
    (("--from", "--shard-mb", "0"), "--shard-mb must be a number of MiB"),
    (("--from", "--shard-mb", "-2"), "--shard-mb must be a number of MiB"),
    (("--from", "--shard-mb", "1e300"), "--shard-mb must be a number of MiB"),
    (("--from", "--vocab-size", "0"), "--vocab-size must be between 1 and 4,294,967,296, got 0"),
    (("--from", "--vocab-size", "-5"), "--vocab-size must be between 1 and 4,294,967,296"),
    (("--from", "--vocab-size", "9" * 25), "--vocab-size must be between 1 and 4,294,967,296"),
    (("--from", "--eod-id", "-1"), "--eod-id must be between 0 and 4,294,967,295, got -1"),
    (("--from", "--eod-id", "257"), "--eod-id 257 is not below --vocab-size 257"),
    (("--from", "--dtype", "int8"), "--dtype 'int8': a tokentape store is uint16 or uint32"),
    (("--from", "--tokenizer", ""), "--tokenizer must not be empty"),
]


@pytest.mark.parametrize(("extra", "expected"), BAD_CONVERT_FLAGS, ids=lambda v: repr(v)[:40])
def test_a_bad_convert_flag_is_one_line_naming_it(extra, expected, tmp_path, capsys):
    write_store(tmp_path / "store", [list(d[:-1]) for d in docs_of(1)], shard_tokens=64)
    build(tmp_path / "m", docs_of(1))
    direction, *flags = extra
    given = {"--vocab-size": str(VOCAB), "--eod-id": str(EOD)}
    if direction == "--from":
        given.update(dict(zip(flags[::2], flags[1::2], strict=True)))
        if "--tokenizer" in given:
            del given["--vocab-size"], given["--eod-id"]
        args = ["--from", "megatron", tmp_path / "m", tmp_path / "out" / "s"]
        args += [x for kv in given.items() for x in kv]
    else:
        args = ["--to", "megatron", tmp_path / "store", tmp_path / "out" / "p", *flags]
    before = snapshot(tmp_path)
    code, out, err = cli(capsys, "convert", *args)
    assert code == 2 and out == ""
    assert expected in one_line_error(err), err
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("shard_mb", "1", "shard_mb must be a number of MiB, got '1'"),
        ("shard_mb", float("inf"), "shard_mb must be a number of MiB"),
        ("vocab_size", 257.0, "vocab_size must be an integer, got 257.0"),
        ("eod_id", True, "eod_id must be an integer, got True"),
        ("prefix", "", "prefix must not be empty"),
        ("out", None, "out must be a path, got None"),
        ("append_eod", "yes", "append_eod: expected True or False"),
        ("overwrite", 1, "overwrite: expected True or False"),
        ("dtype", "int32", "dtype 'int32': a tokentape store is uint16 or uint32"),
    ],
)
def test_from_megatron_settings_refuse_bad_values(field, value, expected, tmp_path):
    settings = {"prefix": str(tmp_path / "m"), "out": str(tmp_path / "s")}
    settings |= {"vocab_size": VOCAB, "eod_id": EOD}
    with pytest.raises(ArgumentError, match="^" + re.escape(expected)):
        convert.FromMegatron(**(settings | {field: value}))


def test_to_megatron_refuses_bad_arguments(tmp_path):
    write_store(tmp_path / "store", [list(d[:-1]) for d in docs_of(1)], shard_tokens=64)
    with pytest.raises(ArgumentError, match=r"^dtype must be a string, got 5"):
        convert.to_megatron(tmp_path / "store", tmp_path / "p", dtype=5)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="overwrite: expected True or False"):
        convert.to_megatron(tmp_path / "store", tmp_path / "p", overwrite="no")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=r"^prefix must be a path, got None"):
        convert.to_megatron(tmp_path / "store", None)  # type: ignore[arg-type]
    assert sorted(os.listdir(tmp_path)) == ["store"]
