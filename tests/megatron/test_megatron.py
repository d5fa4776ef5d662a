"""Megatron prefixes without megatron-core: datasets written with tokentape's own code
(``helpers.build``: ``MegatronWriter`` and its ``.idx`` layout, the bytes megatron-core's builder
writes, as test_megatron_interop.py checks) are read in place (documents, tokens, windows, a plan
and its loader), `tokentape convert` and `verify` work on them, their identity is recorded and
trusted only while current, and every malformed input is one line, exit 2.

Expectations are derived from the documents the tests build (plain numpy), never from the code
under test.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    MEGATRON_DTYPES,
    Docs,
    age,
    build,
    check_reads_as,
    cli,
    random_docs,
    starts_of,
    stream_of,
    write_store,
)

from tokentape._src.megatron import format as megatron_mod
from tokentape._src.megatron import identity as megatron_identity
from tokentape._src.megatron import source as megatron_source
from tokentape._src.megatron.format import MegatronWriter, read_index
from tokentape._src.megatron.source import MegatronSource
from tokentape._src.plan.load import load_plan
from tokentape._src.plan.open import open_source
from tokentape._src.plan.plan import resolve_plan
from tokentape._src.plan.spec import parse_plan
from tokentape._src.program import main
from tokentape._src.store.reader import Source
from tokentape._src.train.batch import Batcher
from tokentape._src.train.loader import Loader
from tokentape._src.train.partition import BatchConfig
from tokentape._src.verify import megatron as verify_megatron
from tokentape.errors import ArgumentError, TokentapeError


@pytest.fixture(autouse=True)
def trusted_timestamps(monkeypatch):
    """Files just written may have their identity recorded: utime can date the mtime back but
    not the ctime, and every test writes its data just before it reads it. The tests of the
    racy rule set RACY_SECONDS back."""
    monkeypatch.setattr(megatron_identity, "RACY_SECONDS", 0.0)


# --- reading Megatron files in place --------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "vocab"), MEGATRON_DTYPES, ids=[d.__name__ for d, _ in MEGATRON_DTYPES]
)
def test_reads_every_dtype_in_place(tmp_path, dtype, vocab):
    eod = vocab - 1
    docs = random_docs(int(vocab), 40, vocab, eod)
    prefix = tmp_path / "data_text_document"
    build(prefix, docs, dtype)
    src = MegatronSource(prefix, vocab, eod)
    check_reads_as(src, docs, dtype)
    # A document is its sequences between two document indices.
    assert np.array_equal(
        src.index.document_indices, np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    )


def test_empty_and_tiny_datasets(tmp_path):
    build(tmp_path / "empty", [], np.uint16)
    empty = MegatronSource(tmp_path / "empty", 10, 9)
    assert (empty.n_docs, empty.n_tokens, empty.n_samples(4)) == (0, 0, 0)
    build(tmp_path / "eod", [[np.array([9])]], np.uint16)  # one document: just the EOD
    tiny = MegatronSource(tmp_path / "eod", 10, 9)
    assert (tiny.n_docs, tiny.n_tokens, tiny.doc(0).size, tiny.doc_span(0)) == (1, 1, 0, (0, 1))


def test_open_store_detects_the_format_and_needs_a_vocabulary(tmp_path):
    build(tmp_path / "m", random_docs(1, 5, 257, 256), np.uint16)
    write_store(tmp_path / "store", [[1, 2, 3]], shard_tokens=100)
    assert type(open_source(tmp_path / "m", vocab_size=257, eod_id=256)).__name__ == (
        "MegatronSource"
    )
    assert open_source(tmp_path / "m", tokenizer="bytes").eod_id == 256
    assert type(open_source(tmp_path / "store")).__name__ == "Source"
    with pytest.raises(TokentapeError, match="records no vocabulary: give vocab_size"):
        open_source(tmp_path / "m")
    with pytest.raises(TokentapeError, match=r"without \.bin"):
        open_source(tmp_path / "m.bin", vocab_size=257, eod_id=256)
    with pytest.raises(TokentapeError, match="eod_id 300 differs from the tokenizer's"):
        open_source(tmp_path / "m", eod_id=300, tokenizer="bytes")


# --- a plan with Megatron sources -------------------------------------------------------------

PLAN = """\
seq_len = 8
seed = 7
total_samples = 400
weight_denominator = 1024
[[source]]
name = "store"
path = "store"
weight = 2
max_repeats = 100
[[source]]
name = "mega"
path = "mega/data_text_document"
format = "megatron"
vocab_size = 257
eod_id = 256
weight = 1
max_repeats = 100
[[source]]
name = "mega2"
path = "mega2"
tokenizer = "bytes"
weight = 1
max_repeats = 100
"""


@pytest.fixture
def mixed(tmp_path) -> tuple[Path, dict[str, Docs]]:
    """A tokentape store and two Megatron datasets (bytes vocabulary: 257 ids, EOD 256)."""
    store_docs = [list(d[0][:-1]) for d in random_docs(5, 60, 257, 256, max_seqs=1)]
    write_store(tmp_path / "store", store_docs, shard_tokens=50)
    (tmp_path / "mega").mkdir()
    docs = {"mega": random_docs(6, 50, 257, 256), "mega2": random_docs(7, 40, 257, 256)}
    build(tmp_path / "mega" / "data_text_document", docs["mega"], np.uint16)
    build(tmp_path / "mega2", docs["mega2"], np.int32)
    return tmp_path, docs


def expected_rows(plan, streams: list[np.ndarray], positions: np.ndarray) -> np.ndarray:
    r = plan.tape().resolve(positions)
    L = plan.seq_len
    return np.stack(
        [
            streams[d][k * L : k * L + L + 1]
            for d, k in zip(r.source.tolist(), r.sample.tolist(), strict=True)
        ]
    )


def test_a_plan_mixing_stores_and_megatron_data_reads_the_expected_windows(mixed):
    root, docs = mixed
    plan = resolve_plan(parse_plan(PLAN, "mix.toml", str(root)), "mix.toml")
    assert [s.format for s in plan.sources] == ["tokentape", "megatron", "megatron"]
    assert [s.dtype for s in plan.sources] == ["uint16", "uint16", "int32"]
    assert [s.n_tokens for s in plan.sources[1:]] == [len(stream_of(docs[n])) for n in docs]
    store = Source(root / "store")
    streams = [store.tokens(0, store.n_tokens), stream_of(docs["mega"]), stream_of(docs["mega2"])]
    positions = np.arange(64)
    batch = Batcher(plan).batch(positions)
    assert set(batch.source.tolist()) == {0, 1, 2}
    assert np.array_equal(batch.tokens, expected_rows(plan, streams, positions))
    with Loader(plan, 1, BatchConfig(dp_size=2, micro=3, accum=2)) as loader:
        step = loader.step()
        got = np.concatenate([m.tokens for m in step.micro_batches])
        assert np.array_equal(got, expected_rows(plan, streams, np.arange(6, 12)))


def test_the_index_hash_covers_every_byte_and_the_identity_is_cached(mixed, monkeypatch):
    root, docs = mixed
    prefix = root / "mega" / "data_text_document"
    age(prefix)
    age(root / "mega2")

    def index_hash() -> str:
        return resolve_plan(parse_plan(PLAN, "mix.toml", str(root)), "mix.toml").index_hash

    h0 = index_hash()
    assert Path(f"{prefix}.tokentape.json").is_file()
    plan0 = resolve_plan(parse_plan(PLAN, "mix.toml", str(root)), "mix.toml")

    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed although the sidecar is current")

    with monkeypatch.context() as m:  # the cached identity is used while the files are unchanged
        m.setattr(megatron_identity, "hash_files", no_hashing)
        assert index_hash() == h0
    # One token of .bin changes (same size, same inode, an old mtime): a new identity.
    bin_file = Path(f"{prefix}.bin")
    mtime = bin_file.stat().st_mtime_ns
    with open(bin_file, "r+b") as f:
        f.seek(2)
        value = struct.unpack("<H", f.read(2))[0]
        f.seek(2)
        f.write(struct.pack("<H", (value + 1) % 256))
    os.utime(bin_file, ns=(mtime + 1000, mtime + 1000))
    h1 = index_hash()
    assert h1 != h0
    with pytest.raises(TokentapeError, match="changed since the plan was made"):
        Batcher(plan0)
    # The same documents with other sequence boundaries: a new .idx (and the .bin as before).
    one_sequence_each = [[np.concatenate(seqs)] for seqs in docs["mega"]]
    build(prefix, one_sequence_each, np.uint16)
    age(prefix)
    h2 = index_hash()
    assert len({h0, h1, h2}) == 3
    plan2 = resolve_plan(parse_plan(PLAN, "mix.toml", str(root)), "mix.toml")
    positions = np.arange(40)
    store = Source(root / "store")
    streams = [store.tokens(0, store.n_tokens), stream_of(docs["mega"]), stream_of(docs["mega2"])]
    assert np.array_equal(
        Batcher(plan2).batch(positions).tokens, expected_rows(plan2, streams, positions)
    )


def test_recent_files_are_not_cached_and_a_read_only_place_falls_back(tmp_path, monkeypatch):
    prefix = tmp_path / "m"
    build(prefix, random_docs(3, 10, 257, 256), np.uint16)
    monkeypatch.setattr(megatron_identity, "RACY_SECONDS", 2.0)
    MegatronSource(prefix, 257, 256)
    assert not Path(f"{prefix}.tokentape.json").exists()  # just written: timestamps can't tell
    age(prefix)  # the mtime dated back, but utime set the ctime to now: still too recent
    MegatronSource(prefix, 257, 256)
    assert not Path(f"{prefix}.tokentape.json").exists()
    monkeypatch.setattr(megatron_identity, "RACY_SECONDS", 0.0)  # as if 2 s had passed
    Path(f"{prefix}.tokentape.json").mkdir()  # the place beside the data cannot take the file
    monkeypatch.setenv("TOKENTAPE_CACHE_DIR", str(tmp_path / "cache"))
    first = MegatronSource(prefix, 257, 256).manifest.content_hash
    assert len(list((tmp_path / "cache").glob("megatron-*.json"))) == 1
    monkeypatch.setattr(megatron_identity, "hash_files", None)  # would fail if called
    assert MegatronSource(prefix, 257, 256).manifest.content_hash == first


# --- convert ----------------------------------------------------------------------------------


def test_from_megatron_with_a_tokenizer_and_append_eod(tmp_path, capsys):
    text = [b"hello world", b"", b"megatron"]  # an empty document too
    docs = [[np.frombuffer(t, dtype=np.uint8).astype(np.int64)] for t in text]
    build(tmp_path / "noeod", docs, np.uint16)
    out = tmp_path / "store"
    code, _, err = cli(
        capsys, "convert", "--from", "megatron", tmp_path / "noeod", out, "--tokenizer", "bytes"
    )
    assert code == 2 and "document 0" in err and "--append-eod" in err and not out.exists()
    code, _, _ = cli(
        capsys,
        "convert",
        "--from",
        "megatron",
        tmp_path / "noeod",
        out,
        "--tokenizer",
        "bytes",
        "--append-eod",
    )
    assert code == 0
    src = Source(out)
    assert [src.decode(src.doc(i)).encode() for i in range(src.n_docs)] == text
    assert src.tokens(0, src.n_tokens).tolist().count(256) == 3
    assert src.manifest.tokenizer["kind"] == "bytes"


# --- errors: one line, exit 2 -----------------------------------------------------------------

N_DOCS = 6


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _idx_layout(prefix: Path) -> tuple[int, int]:
    head = Path(f"{prefix}.idx").read_bytes()[:34]
    return struct.unpack("<Q", head[18:26])[0], struct.unpack("<Q", head[26:34])[0]


def _corrupt(prefix: Path, case: str) -> None:
    idx, data = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    n_seq, n_entries = _idx_layout(prefix)
    lengths, pointers, entries = 34, 34 + 4 * n_seq, 34 + 12 * n_seq
    if case == "magic":
        _patch(idx, 0, b"NOTMEGATR")
    elif case == "version":
        _patch(idx, 9, struct.pack("<Q", 2))
    elif case == "dtype code":
        _patch(idx, 17, bytes([9]))
    elif case == "float dtype":
        _patch(idx, 17, bytes([7]))
    elif case == "truncated idx":
        idx.write_bytes(idx.read_bytes()[:-4])
    elif case == "truncated header":
        idx.write_bytes(idx.read_bytes()[:20])
    elif case == "truncated bin":
        data.write_bytes(data.read_bytes()[:-4])
    elif case == "longer bin":
        data.write_bytes(data.read_bytes() + b"\0\0\0\0")
    elif case == "sequence count":
        _patch(idx, 18, struct.pack("<Q", n_seq + 2))
    elif case == "document index end":
        _patch(idx, entries + 8 * (n_entries - 1), struct.pack("<q", n_seq - 1))
    elif case == "document index order":
        _patch(idx, entries + 8, struct.pack("<q", n_seq))
    elif case == "document index wraps":  # its int64 differences overflow, all positive
        _patch(idx, entries + 8, struct.pack("<qq", 3 * 2**61, -(2**62)))
    elif case == "negative length":
        _patch(idx, lengths, struct.pack("<i", -1))
    elif case == "pointers":
        _patch(idx, pointers + 8, struct.pack("<q", 4 * 1000))
    elif case == "missing eod":
        _patch(data, 4 * 2, struct.pack("<i", 5))  # document 0's last token is its third
    elif case == "negative id":
        _patch(data, 0, struct.pack("<i", -5))
    elif case == "id too large":
        _patch(data, 0, struct.pack("<i", 1000))
    else:
        raise AssertionError(case)


ERRORS = {
    "magic": "not a Megatron index",
    "version": "index version 2 is not supported",
    "dtype code": "dtype code 9 is unknown",
    "float dtype": "holds floats",
    "truncated idx": "truncated",
    "truncated header": "shorter than the 34-byte header",
    "truncated bin": "truncated",
    "longer bin": "longer than its index says",
    "sequence count": "or its header's counts are wrong",
    "document index end": "the document index ends at sequence",
    "document index order": "decreases",
    "document index wraps": f"document 1 starts at sequence {3 * 2**61}, outside the",
    "negative length": "negative length",
    "pointers": "back to back",
    "missing eod": "document 0 (tokens [0, 3)) ends with id 5",
    "negative id": "negative",
    "id too large": "id 1000, not below vocab_size 300",
}


@pytest.fixture
def valid(tmp_path) -> Path:
    """A small int32 dataset (vocabulary 300, EOD 299); document 0 is [1, 2, EOD]."""
    docs = [[np.array([1, 2, 299])], *random_docs(21, N_DOCS - 1, 300, 299)]
    build(tmp_path / "ok", docs, np.int32)
    return tmp_path / "ok"


@pytest.mark.parametrize("case", list(ERRORS))
def test_malformed_data_is_one_line_exit_2(valid, tmp_path, capsys, case):
    _corrupt(valid, case)
    (tmp_path / "mix.toml").write_text(
        'seq_len = 2\nseed = 0\ntotal_samples = 4\n[[source]]\nname = "m"\npath = "ok"\n'
        "weight = 1\nmax_repeats = 100\nvocab_size = 300\neod_id = 299\n"
    )
    for args in (
        ("plan", tmp_path / "mix.toml"),
        (
            "convert",
            "--from",
            "megatron",
            valid,
            tmp_path / "out",
            "--vocab-size",
            300,
            "--eod-id",
            299,
        ),
    ):
        code, out, err = cli(capsys, *args)
        assert (code, out) == (2, "")
        assert err.count("\n") == 1 and err.startswith("tokentape: error: ")
        assert ERRORS[case] in err
    assert not (tmp_path / "out").exists()


def test_an_empty_document_is_refused_in_place(tmp_path, capsys):
    build(tmp_path / "m", [[np.array([1, 9])], [], [np.array([9])]], np.uint16)
    code, _, err = cli(
        capsys,
        "convert",
        "--from",
        "megatron",
        tmp_path / "m",
        tmp_path / "o",
        "--vocab-size",
        10,
        "--eod-id",
        9,
    )
    assert code == 2 and "document 1 is empty" in err and err.count("\n") == 1


def test_verify_a_megatron_prefix(valid, capsys):
    age(valid)
    code, out, _ = cli(capsys, "verify", valid, "--vocab-size", 300, "--eod-id", 299)
    assert code == 0 and "ok" in out
    assert Path(f"{valid}.tokentape.json").is_file()  # the identity is recorded now
    bin_file = Path(f"{valid}.bin")
    mtime = bin_file.stat().st_mtime_ns
    _patch(bin_file, 4, struct.pack("<i", 7))  # document 0's second token: still valid ids
    os.utime(bin_file, ns=(mtime, mtime))  # even with the old timestamp, verify rehashes
    code, out, _ = cli(capsys, "verify", valid)
    assert code == 1 and "sha256 mismatch (sidecar)" in out
    code, out, _ = cli(capsys, "verify", valid, "--quick")
    assert code == 1 and "block 0 sha256 mismatch" in out
    code, out, _ = cli(capsys, "verify", valid, "--eod-id", 5)
    assert code == 1 and "missing end-of-document id" in out


# --- the end-of-document check at open ---------------------------------------------------------


def counted_checks(monkeypatch) -> list[str]:
    """Record every gather over the document ends (``check_documents``) an open runs."""
    calls: list[str] = []
    real = megatron_source.check_documents

    def counted(tokens, doc_starts, eod_id, where):
        calls.append(where)
        return real(tokens, doc_starts, eod_id, where)

    monkeypatch.setattr(megatron_source, "check_documents", counted)
    return calls


def sidecar_identity(prefix: Path) -> dict:
    return json.loads(Path(f"{prefix}.tokentape.json").read_text())["identity"]


def expected_end_id(docs: Docs) -> int | None:
    """The id every document ends with if there is one (no document empty), else None."""
    flat = [np.concatenate([np.zeros(0, dtype=np.int64), *seqs]) for seqs in docs]
    ends = {int(d[-1]) for d in flat if len(d)}
    return ends.pop() if flat and all(len(d) for d in flat) and len(ends) == 1 else None


def test_a_current_sidecar_spares_reading_the_document_ends(tmp_path, monkeypatch):
    prefix = tmp_path / "m"
    build(prefix, random_docs(31, 50, 257, 256), np.uint16)
    age(prefix)
    calls = counted_checks(monkeypatch)
    first = MegatronSource(prefix, 257, 256)  # no sidecar yet: checked, then hashed
    assert len(calls) == 1
    assert sidecar_identity(prefix)["end_id"] == 256  # found while hashing
    for identify in (True, False):
        src = MegatronSource(prefix, 257, 256, identify=identify)
        assert "doc_starts" not in vars(src)  # not even the document starts were computed
        assert src.n_docs == 50
    assert len(calls) == 1
    assert src.manifest.content_hash == first.manifest.content_hash
    # Every plan opening the source, and its loader, skip it too.
    (tmp_path / "p.toml").write_text(
        'seq_len = 4\nseed = 0\ntotal_samples = 8\n[[source]]\nname = "m"\npath = "m"\n'
        "weight = 1\nmax_repeats = 100\nvocab_size = 257\neod_id = 256\n"
    )
    plan = resolve_plan(parse_plan((tmp_path / "p.toml").read_text(), "p.toml", str(tmp_path)), "p")
    Batcher(plan).batch(np.arange(8))
    assert len(calls) == 1
    # Another EOD id than the one recorded: the documents are read, and refused.
    with pytest.raises(TokentapeError, match="ends with id 256, not the end-of-document id 3"):
        MegatronSource(prefix, 257, 3)
    assert len(calls) == 2
    # check_eod=False reads no document end either way.
    Path(f"{prefix}.tokentape.json").unlink()
    MegatronSource(prefix, 257, 3, check_eod=False, identify=False)
    assert len(calls) == 2


def test_a_changed_end_is_refused_despite_the_sidecar(valid, monkeypatch):
    age(valid)
    calls = counted_checks(monkeypatch)
    MegatronSource(valid, 300, 299)
    assert sidecar_identity(valid)["end_id"] == 299
    bin_file = Path(f"{valid}.bin")
    mtime = bin_file.stat().st_mtime_ns
    _patch(bin_file, 4 * 2, struct.pack("<i", 5))  # document 0's EOD; same size and inode
    os.utime(bin_file, ns=(mtime + 1000, mtime + 1000))  # an old timestamp, but another one
    for identify in (True, False):
        with pytest.raises(TokentapeError, match=r"document 0 \(tokens \[0, 3\)\) ends with id 5"):
            MegatronSource(valid, 300, 299, identify=identify)
    assert len(calls) == 3
    # Hashed without the check (as `convert --append-eod` may): no end id is recorded, so the
    # next open reads the document ends again and refuses them.
    MegatronSource(valid, 300, 299, check_eod=False)
    assert sidecar_identity(valid)["end_id"] is None
    with pytest.raises(TokentapeError, match=r"document 0 .* ends with id 5"):
        MegatronSource(valid, 300, 299)
    assert len(calls) == 4


def test_a_sidecar_without_the_end_id_is_completed_once(tmp_path, monkeypatch):
    prefix = tmp_path / "m"
    build(prefix, random_docs(32, 30, 257, 256), np.int32)
    age(prefix)
    MegatronSource(prefix, 257, 256)
    sidecar = Path(f"{prefix}.tokentape.json")
    data = json.loads(sidecar.read_text())
    del data["identity"]["end_id"]  # as written before the end id was recorded
    sidecar.write_text(json.dumps(data))
    calls = counted_checks(monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(megatron_identity, "hash_files", None)  # no rehash: would fail
        content = MegatronSource(prefix, 257, 256).manifest.content_hash
        assert len(calls) == 1  # checked once ...
        assert sidecar_identity(prefix)["end_id"] == 256  # ... and recorded
        assert MegatronSource(prefix, 257, 256).manifest.content_hash == content
        assert len(calls) == 1
    # An older sidecar of data without EOD is refused, and completed with nothing.
    build(prefix, [[np.array([1, 2])], [np.array([3])]], np.int32)
    age(prefix)
    MegatronSource(prefix, 257, 256, check_eod=False)  # hashes (the sidecar is stale)
    data = json.loads(sidecar.read_text())
    del data["identity"]["end_id"]
    sidecar.write_text(json.dumps(data))
    for _ in range(2):
        with pytest.raises(TokentapeError, match=r"document 0 .* ends with id 2"):
            MegatronSource(prefix, 257, 256)
    assert len(calls) == 3
    assert "end_id" not in sidecar_identity(prefix)


@pytest.mark.parametrize("ends", ["mixed", "another id"])
def test_documents_not_all_ending_with_the_eod_are_checked_and_refused(tmp_path, monkeypatch, ends):
    docs = random_docs(33, 20, 300, 299)
    bad = 7 if ends == "mixed" else 3
    for i in range(3 if ends == "mixed" else 0, len(docs)):
        docs[i][-1][-1] = bad
    prefix = tmp_path / "m"
    build(prefix, docs, np.uint16)
    age(prefix)
    MegatronSource(prefix, 300, 299, check_eod=False)  # hashed: the sidecar is written
    assert sidecar_identity(prefix)["end_id"] == (None if ends == "mixed" else bad)
    calls = counted_checks(monkeypatch)
    first = 3 if ends == "mixed" else 0
    start = int(starts_of(docs)[first])
    for identify in (True, False):
        with pytest.raises(TokentapeError, match=rf"document {first} \(tokens \[{start}, "):
            MegatronSource(prefix, 300, 299, identify=identify)
    assert len(calls) == 2
    if ends == "another id":  # every document ends with 3: read with that id, unchecked
        MegatronSource(prefix, 300, 3)
        assert len(calls) == 2


def test_the_end_id_is_found_while_hashing_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(megatron_identity, "CHUNK_BYTES", 6)  # 3 uint16 tokens a read
    monkeypatch.setattr(megatron_identity, "CHUNK", 2)  # 2 documents a piece of the index
    mixed = random_docs(34, 9, 257, 256)
    mixed[5][-1][-1] = 4
    cases = {
        "eod": random_docs(35, 17, 257, 256),
        "mixed": mixed,
        "empty document": [*random_docs(36, 5, 257, 256), [], *random_docs(37, 3, 257, 256)],
        "empty sequences": [*random_docs(38, 4, 257, 256), [np.zeros(0, dtype=np.int64)]],
        "one document": [[np.array([256])]],
        "no document": [],
    }
    for name, docs in cases.items():
        build(tmp_path / name, docs, np.uint16)
        found = megatron_identity.hash_files(read_index(tmp_path / name)).end_id
        assert found == expected_end_id(docs), name
    assert [expected_end_id(cases[c]) for c in ("eod", "mixed", "empty document")] == [
        256,
        None,
        None,
    ]


def test_the_writer_records_the_end_id(tmp_path):
    for lengths, tokens, expected in (
        ([2, 1, 3], [5, 9, 9, 1, 2, 9], 9),
        ([2, 1, 3], [5, 9, 8, 1, 2, 9], None),
        ([2, 0, 1], [5, 9, 9], None),
        ([], [], None),
    ):
        writer = MegatronWriter(tmp_path / "w", "uint16")
        writer.add(np.array(tokens), np.array(lengths))
        identity = writer.finish()
        assert identity.end_id == expected
        assert megatron_identity.hash_files(read_index(tmp_path / "w")).end_id == expected


def test_the_command_line_refuses_mixed_up_flags(tmp_path, capsys):
    write_store(tmp_path / "store", [[1, 2]], shard_tokens=100)
    code, _, err = cli(
        capsys, "convert", "--to", "megatron", tmp_path / "store", tmp_path / "o", "--vocab-size", 5
    )
    assert code == 2 and "--vocab-size applies to --from megatron only" in err
    code, _, err = cli(
        capsys, "convert", "--to", "megatron", tmp_path / "store", tmp_path / "o", "--dtype", "int8"
    )
    assert code == 2 and "cannot hold" in err
    shutil.rmtree(tmp_path / "store")


# --- the identity: recorded once, trusted only while current ------------------------------------

MEGA_PLAN = """\
seq_len = 8
seed = 3
total_samples = 64
[[source]]
name = "m"
path = "{path}"
{vocab}
weight = 1
max_repeats = 100
"""


def megatron_plan(root: Path, path: str, vocab: str = "vocab_size = 257\neod_id = 256"):
    text = MEGA_PLAN.format(path=path, vocab=vocab)
    return resolve_plan(parse_plan(text, "m.toml", str(root)), "m.toml")


def forbid_hashing(monkeypatch) -> None:
    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed")

    monkeypatch.setattr(megatron_identity, "hash_files", no_hashing)


def forbid_index_scans(monkeypatch) -> None:
    def no_scan(*args, **kwargs):
        raise AssertionError("scanned the whole .idx")

    monkeypatch.setattr(megatron_mod, "_check_sequences", no_scan)
    monkeypatch.setattr(megatron_mod, "_check_documents", no_scan)


def rewrite_in_place(path: Path, offset: int, data: bytes) -> None:
    """Change bytes of ``path`` keeping its size, inode and mtime (rsync --inplace -t)."""
    st = path.stat()
    _patch(path, offset, data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == (st.st_mtime_ns, st.st_ino)


def test_the_loader_takes_the_identity_from_the_plan_and_never_hashes(tmp_path, monkeypatch):
    # The data directory is reached through a symbolic link, cannot take a sidecar, and each
    # node has its own ~/.cache: the plan records the identity, the loader needs nothing else.
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    prefix = tmp_path / "real" / "d"
    docs = random_docs(41, 60, 257, 256)
    build(prefix, docs, np.uint16)
    age(prefix)
    Path(f"{prefix}.tokentape.json").mkdir()
    monkeypatch.setenv("TOKENTAPE_CACHE_DIR", str(tmp_path / "login-node-cache"))
    plan = megatron_plan(tmp_path, "link/d")
    record = plan.sources[0].megatron
    assert record is not None and record.end_id == 256 and record.min_id >= 0
    assert record.files == megatron_identity.file_keys(prefix)
    (tmp_path / "PLAN.json").write_text(plan.to_json())
    plan = load_plan(tmp_path / "PLAN.json")
    assert plan.sources[0].megatron == record
    assert isinstance(hash(plan), int)  # plans are cached by value (audit.runs.tape_of)
    monkeypatch.setenv("TOKENTAPE_CACHE_DIR", str(tmp_path / "compute-node-cache"))
    calls = counted_checks(monkeypatch)
    with monkeypatch.context() as m:
        forbid_hashing(m)
        forbid_index_scans(m)
        batcher = Batcher(plan)
        positions = np.arange(plan.sources[0].n_samples)
        expected = expected_rows(plan, [stream_of(docs)], positions)
        assert np.array_equal(batcher.batch(positions).tokens, expected)
        assert "doc_starts" not in vars(batcher.sources[0])
    assert calls == []  # the plan's end id vouches for every document end
    assert not (tmp_path / "compute-node-cache").exists()
    # The bytes change in place, mtime restored: the plan's record no longer holds, and
    # without a sidecar either, the loader refuses at once instead of hashing on every rank.
    rewrite_in_place(Path(f"{prefix}.bin"), 2, struct.pack("<H", 7))
    with monkeypatch.context() as m:
        forbid_hashing(m)
        with pytest.raises(
            TokentapeError, match=r"no current identity: its \.bin or \.idx changed"
        ):
            Batcher(plan)
    # Run once where a sidecar all nodes see can be written: the loader then compares.
    monkeypatch.setenv("TOKENTAPE_CACHE_DIR", str(tmp_path / "shared"))
    assert main(["verify", str(prefix)]) == 0
    with pytest.raises(TokentapeError, match="changed since the plan was made"):
        Batcher(plan)


def test_a_plan_without_a_record_needs_a_sidecar_to_load(tmp_path, monkeypatch, capsys):
    prefix = tmp_path / "d"
    build(prefix, random_docs(42, 20, 257, 256), np.uint16)
    monkeypatch.setattr(megatron_identity, "RACY_SECONDS", 3600.0)  # too recent to record
    plan = megatron_plan(tmp_path, "d")
    assert plan.sources[0].megatron is None
    assert not Path(f"{prefix}.tokentape.json").exists()
    with monkeypatch.context() as m:
        forbid_hashing(m)
        with pytest.raises(TokentapeError) as excinfo:
            Batcher(plan)
    message = str(excinfo.value)
    assert "\n" not in message and "the plan recorded none" in message
    assert f"run `tokentape verify {prefix}`" in message and "TOKENTAPE_CACHE_DIR" in message
    monkeypatch.setattr(megatron_identity, "RACY_SECONDS", 0.0)
    assert cli(capsys, "verify", prefix)[0] == 0  # once: records the sidecar
    with monkeypatch.context() as m:
        forbid_hashing(m)
        forbid_index_scans(m)
        Batcher(plan).batch(np.arange(4))
    # A tokentape store's plan entry is as before: no Megatron record, same index hash.
    write_store(tmp_path / "store", [[1, 2, 3, 4, 5]] * 10, shard_tokens=100)
    store_plan = megatron_plan(tmp_path, "store", vocab="")
    assert "megatron" not in json.loads(store_plan.to_json())["sources"][0]


def test_a_hand_edited_plan_record_vouches_for_nothing(tmp_path, monkeypatch):
    prefix = tmp_path / "d"
    build(prefix, random_docs(49, 20, 257, 256), np.uint16)
    age(prefix)
    data = json.loads(megatron_plan(tmp_path, "d").to_json())
    Path(f"{prefix}.tokentape.json").unlink()
    data["sources"][0]["megatron"]["bin_sha256"] = "0" * 64  # no longer gives the content hash
    (tmp_path / "PLAN.json").write_text(json.dumps(data))
    with monkeypatch.context() as m:
        forbid_hashing(m)
        with pytest.raises(TokentapeError, match="no current identity"):
            Batcher(load_plan(tmp_path / "PLAN.json"))
    data["sources"][0]["megatron"]["files"] = "x"
    (tmp_path / "PLAN.json").write_text(json.dumps(data))
    with pytest.raises(TokentapeError, match="field 'megatron' is malformed"):
        load_plan(tmp_path / "PLAN.json")


def test_an_in_place_rewrite_with_the_mtime_restored_is_not_vouched_for(tmp_path):
    prefix = tmp_path / "d"
    build(prefix, [[np.array([1, 2, 256])], *random_docs(43, 10, 257, 256)], np.uint16)
    age(prefix)
    before = MegatronSource(prefix, 257, 256).manifest.content_hash
    assert Path(f"{prefix}.tokentape.json").is_file()
    rewrite_in_place(Path(f"{prefix}.bin"), 0, struct.pack("<H", 9))  # same size, inode, mtime
    src = MegatronSource(prefix, 257, 256)
    assert src.manifest.content_hash != before
    assert src.tokens(0, 1).tolist() == [9]
    assert sidecar_identity(prefix)["content_hash"] == src.manifest.content_hash


def test_a_current_identity_skips_the_index_scan_but_not_the_header_checks(
    valid, tmp_path, monkeypatch
):
    age(valid)
    MegatronSource(valid, 300, 299)  # records the sidecar
    with monkeypatch.context() as m:
        forbid_hashing(m)
        forbid_index_scans(m)
        src = MegatronSource(valid, 300, 299)
        assert src.n_docs == N_DOCS and "doc_starts" not in vars(src)
        assert src.doc_span(0) == (0, 3)  # built when asked for
    # A header that no longer fits the recorded identity (here: a grown .bin) is refused.
    Path(f"{valid}.bin").write_bytes(Path(f"{valid}.bin").read_bytes() + b"\0\0\0\0")
    with pytest.raises(TokentapeError, match="longer than its index says"):
        MegatronSource(valid, 300, 299)


SIDECAR_DAMAGE = {
    "max_id a string": lambda d: d["identity"].update(max_id="255"),
    "n_tokens a string": lambda d: d["identity"].update(n_tokens="1"),
    "a count a bool": lambda d: d["identity"].update(block_bytes=True),
    "end_id a bool": lambda d: d["identity"].update(end_id=True),
    "no id range": lambda d: d["identity"].update(min_id=None, max_id=None),
    "blocks not digests": lambda d: d["identity"].update(block_sha256=[1]),
    "blocks missing": lambda d: d["identity"].update(block_sha256=[]),
    "identity a list": lambda d: d.update(identity=[]),
    "unknown field": lambda d: d["identity"].update(extra=1),
    "file size a string": lambda d: d["files"]["bin"].update(size="1"),
    "files a string": lambda d: d.update(files="x"),
    "version a string": lambda d: d.update(version="2"),
}


@pytest.mark.parametrize("damage", list(SIDECAR_DAMAGE))
def test_a_malformed_sidecar_counts_as_absent(tmp_path, capsys, damage):
    prefix = tmp_path / "d"
    build(prefix, random_docs(44, 20, 257, 256), np.uint16)
    age(prefix)
    content = MegatronSource(prefix, 257, 256).manifest.content_hash
    sidecar = Path(f"{prefix}.tokentape.json")
    data = json.loads(sidecar.read_text())
    SIDECAR_DAMAGE[damage](data)
    sidecar.write_text(json.dumps(data))
    (tmp_path / "p.toml").write_text(
        MEGA_PLAN.format(path="d", vocab="vocab_size = 257\neod_id = 256")
    )
    code, _, err = cli(capsys, "plan", tmp_path / "p.toml")  # hashes again
    assert (code, err) == (0, "")
    sidecar.write_text(json.dumps(data))
    assert megatron_identity.read_sidecar(prefix, None) is None
    assert MegatronSource(prefix, 257, 256).manifest.content_hash == content
    assert megatron_identity.read_sidecar(prefix, None) is not None  # rewritten


def test_the_racy_window_ends_when_the_keys_were_taken(tmp_path, monkeypatch):
    prefix = tmp_path / "d"
    build(prefix, random_docs(45, 20, 257, 256), np.uint16)
    monkeypatch.setattr(megatron_identity, "RACY_SECONDS", 600.0)  # the files are recent
    real = megatron_identity.hash_files

    class Clock:  # the identity module's clock: 20 minutes on once the hash is done
        ahead = 0

        def time_ns(self) -> int:
            return time.time_ns() + self.ahead

    clock = Clock()

    def slow(*args, **kwargs):  # a long hash: written well after the files' last change
        identity = real(*args, **kwargs)
        clock.ahead = 1200 * 10**9
        return identity

    monkeypatch.setattr(megatron_identity, "time", clock)
    monkeypatch.setattr(megatron_identity, "hash_files", slow)
    MegatronSource(prefix, 257, 256)
    assert not Path(f"{prefix}.tokentape.json").exists()  # recent when the keys were taken


def test_bytes_swapped_in_after_the_open_are_not_recorded(tmp_path):
    prefix = tmp_path / "d"
    build(prefix, random_docs(46, 20, 257, 256), np.uint16)
    age(prefix)
    src = MegatronSource(prefix, 257, 256, identify=False)
    # Another dataset with other documents is renamed onto the prefix before the hash.
    build(tmp_path / "other", random_docs(47, 30, 257, 256), np.uint16)
    age(tmp_path / "other")
    for suffix in (".bin", ".idx"):
        os.replace(f"{tmp_path / 'other'}{suffix}", f"{prefix}{suffix}")
    with pytest.raises(TokentapeError, match="changed since it was opened"):
        _ = src.manifest
    assert not Path(f"{prefix}.tokentape.json").exists()


def test_verify_reads_no_document_end_when_the_end_id_answers(valid, monkeypatch, capsys):
    age(valid)
    calls: list[str] = []
    real = verify_megatron.check_documents

    def counted(*args):
        calls.append("gather")
        return real(*args)

    monkeypatch.setattr(verify_megatron, "check_documents", counted)
    flags = ("--vocab-size", 300, "--eod-id", 299)
    assert cli(capsys, "verify", valid, *flags)[0] == 0  # full: the end id found while hashing
    assert cli(capsys, "verify", valid, "--quick", *flags)[0] == 0  # quick: the recorded one
    assert calls == []
    code, out, _ = cli(capsys, "verify", valid, "--quick", "--vocab-size", 300, "--eod-id", 5)
    assert code == 1 and "missing end-of-document id" in out and calls == ["gather"]


def test_verify_prefers_the_current_sidecar_and_checks_the_derived_fields(
    valid, tmp_path, monkeypatch, capsys
):
    age(valid)
    monkeypatch.setenv("TOKENTAPE_CACHE_DIR", str(tmp_path / "cache"))
    beside, cached = megatron_identity.sidecar_paths(valid)
    assert cli(capsys, "verify", valid)[0] == 0
    stale = beside.read_text()
    rewrite_in_place(Path(f"{valid}.bin"), 4, struct.pack("<i", 7))  # the data changes ...
    assert cli(capsys, "verify", valid)[0] == 1  # ... and the sidecar beside it is stale
    MegatronSource(valid, 300, 299)  # an open hashes the changed files and records them
    assert cli(capsys, "verify", valid)[0] == 0
    # The current record now sits in the cache, a stale one beside the data (say the data's
    # directory was writable once): verify compares with the current one.
    cached.parent.mkdir(parents=True, exist_ok=True)
    os.replace(beside, cached)
    beside.write_text(stale)
    for quick in ((), ("--quick",)):
        code, out, _ = cli(capsys, "verify", valid, *quick)
        assert code == 0, out
    # A sidecar whose id range or end id disagree with the bytes (which match) is reported
    # (an open trusts those fields) and corrected.
    beside.unlink()
    data = json.loads(cached.read_text())
    data["identity"]["max_id"] -= 1
    cached.write_text(json.dumps(data))
    code, out, _ = cli(capsys, "verify", valid)
    assert code == 1 and "max_id mismatch (sidecar)" in out
    assert cli(capsys, "verify", valid)[0] == 0


def tiktoken_file(path: Path, order: int = 1) -> str:
    """A ranks file of the 256 single bytes (vocabulary 257 with its EOD 256, as ``bytes``),
    ranked in byte order (``order=1``) or reversed: another tokenizer, same vocabulary."""
    ranks = range(256) if order == 1 else range(255, -1, -1)
    path.write_bytes(
        b"".join(base64.b64encode(bytes([b])) + b" %d\n" % r for b, r in enumerate(ranks))
    )
    return f"tiktoken:{path.name}"


def test_the_tokenizer_is_loaded_only_when_needed_and_checked_against_the_plan(tmp_path):
    prefix = tmp_path / "d"
    build(prefix, random_docs(48, 20, 257, 256), np.uint16)
    age(prefix)
    spec = tiktoken_file(tmp_path / "tok.tiktoken")
    plan = megatron_plan(tmp_path, "d", vocab=f'tokenizer = "{spec}"')
    assert (plan.sources[0].vocab_size, plan.sources[0].eod_id) == (257, 256)
    (tmp_path / "tok.tiktoken").rename(tmp_path / "elsewhere.tiktoken")  # not on this node
    batcher = Batcher(plan)  # tokens need no tokenizer
    batcher.batch(np.arange(4))
    with pytest.raises(TokentapeError, match="not found"):
        _ = batcher.sources[0].tokenizer
    tiktoken_file(tmp_path / "tok.tiktoken", order=-1)  # another file at the same path
    with pytest.raises(TokentapeError, match="the tokenizer changed since the plan was made"):
        _ = Batcher(plan).sources[0].tokenizer
    tiktoken_file(tmp_path / "tok.tiktoken")
    assert Batcher(plan).sources[0].decode(np.array([104, 105])) == "hi"


# --- sidecars are read only as regular files -------------------------------------------------


def test_a_symlinked_sidecar_is_ignored_and_never_written_through(tmp_path):
    """A sidecar that is a symbolic link (here to a sidecar that would be current) is not
    read: the identity is computed again, and recording it replaces the link by a regular
    file without touching what it pointed to."""
    prefix = tmp_path / "d"
    build(prefix, random_docs(45, 20, 257, 256), np.uint16)
    age(prefix)
    content = MegatronSource(prefix, 257, 256).manifest.content_hash
    sidecar = Path(f"{prefix}.tokentape.json")
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(sidecar, elsewhere)
    sidecar.symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    assert megatron_identity.read_sidecar(prefix, None) is None
    assert MegatronSource(prefix, 257, 256).manifest.content_hash == content  # hashed again
    assert not sidecar.is_symlink() and json.loads(sidecar.read_text())["format"]
    assert elsewhere.read_bytes() == before


@pytest.mark.subprocess
def test_a_fifo_sidecar_counts_as_absent_without_blocking(tmp_path):
    """Reading a FIFO waits for a writer forever: a sidecar (or cache entry) that is not a
    regular file is not opened for reading at all. Checked in a child process, with a limit."""
    prefix = tmp_path / "d"
    build(prefix, random_docs(46, 10, 257, 256), np.uint16)
    age(prefix)
    os.mkfifo(f"{prefix}.tokentape.json")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.mkfifo(cache / megatron_identity.sidecar_paths(prefix)[1].name)  # the cache entry
    code = (
        "import sys; from tokentape._src.megatron.source import MegatronSource; "
        f"print(MegatronSource({str(prefix)!r}, 257, 256).manifest.content_hash)"
    )
    env = os.environ | {"TOKENTAPE_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == MegatronSource(prefix, 257, 256).manifest.content_hash


def test_writer_misuse_names_the_argument(tmp_path):
    writer = MegatronWriter(tmp_path / "d", "uint16")
    with pytest.raises(ArgumentError, match="lengths add up to 3 tokens, tokens has 2"):
        writer.add(np.array([1, 2]), np.array([3]))
    writer.abort()
    assert not list(tmp_path.iterdir())


def test_open_misuse_names_the_argument(valid):
    for kwargs, message in [
        ({"vocab_size": "300", "eod_id": 299}, "vocab_size must be an integer, got '300'"),
        ({"vocab_size": 300, "eod_id": 299.0}, "eod_id must be an integer, got 299.0"),
        ({"vocab_size": True, "eod_id": 0}, "vocab_size must be an integer, got True"),
    ]:
        with pytest.raises(ArgumentError, match=re.escape(message)):
            MegatronSource(valid, **kwargs)
