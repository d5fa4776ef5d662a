"""Shard writer and memory-mapped reader, against a plain in-memory model of the stream."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers import write_store
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentape import TokentapeError, open_source
from tokentape._src.store.format import (
    MANIFEST_NAME,
    choose_dtype,
    read_manifest,
)
from tokentape._src.store.tokenizers import load_tokenizer
from tokentape._src.store.writer import ShardWriter
from tokentape._src.verify.stores import check_store
from tokentape.errors import ArgumentError, OutOfRangeError

EOD = 256


docs_strategy = st.lists(
    st.lists(st.integers(0, 255), min_size=0, max_size=40), min_size=1, max_size=30
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(docs=docs_strategy, shard_tokens=st.integers(1, 120), seq_len=st.integers(1, 50))
def test_reader_matches_the_concatenated_stream(docs, shard_tokens, seq_len):
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_store(Path(tmp) / "s", docs, shard_tokens)
        src = open_source(Path(tmp) / "s")
        stream = [t for d in docs for t in [*d, EOD]]
        starts = np.cumsum([0] + [len(d) + 1 for d in docs])[:-1]
        assert src.n_tokens == len(stream) and src.n_docs == len(docs)
        assert list(src.tokens(0, src.n_tokens)) == stream
        for i, d in enumerate(docs):
            assert list(src.doc(i)) == d
        # Shards hold whole documents and stay within the target unless one document is larger.
        for s in manifest.shards:
            assert s.n_tokens <= shard_tokens or s.n_docs == 1
        n = (len(stream) - 1) // seq_len
        assert src.n_samples(seq_len) == max(n, 0)
        for k in range(n):
            lo, hi = k * seq_len, k * seq_len + seq_len + 1
            assert list(src.window(k, seq_len)) == stream[lo:hi]
            ends = [*starts[1:], len(stream)]
            expected = [i for i in range(len(docs)) if starts[i] < hi and ends[i] > lo]
            assert src.docs_in(k, seq_len) == expected


def test_hashes_match_the_files(tmp_path):
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(0, 256, size=int(rng.integers(1, 300)))) for _ in range(50)]
    manifest = write_store(tmp_path / "s", docs, shard_tokens=1000, block_bytes=100)
    assert len(manifest.shards) > 2
    for s in manifest.shards:
        data = (tmp_path / "s" / s.bin_file).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s.bin_sha256
        blocks = [hashlib.sha256(data[i : i + 100]).hexdigest() for i in range(0, len(data), 100)]
        assert list(s.block_sha256) == blocks
        idx = (tmp_path / "s" / s.idx_file).read_bytes()
        assert hashlib.sha256(idx).hexdigest() == s.idx_sha256
        assert len(idx) == s.idx_bytes
        starts = np.load(tmp_path / "s" / s.idx_file, allow_pickle=False)
        assert starts.dtype == np.int64 and starts[0] == 0 and np.all(np.diff(starts) > 0)
    # The manifest reads back to the same value.
    assert read_manifest(tmp_path / "s") == manifest


def test_window_spans_a_shard_boundary(tmp_path):
    docs = [[1] * 9, [2] * 9, [3] * 9]  # 10 tokens each with EOD; one document per shard
    manifest = write_store(tmp_path / "s", docs, shard_tokens=10)
    assert [s.n_tokens for s in manifest.shards] == [10, 10, 10]
    src = open_source(tmp_path / "s")
    assert list(src.window(1, 8)) == [1, EOD] + [2] * 7  # tokens 8..16
    assert src.docs_in(1, 8) == [0, 1]


def test_open_refuses_a_truncated_shard(tmp_path):
    write_store(tmp_path / "s", [[5] * 100], shard_tokens=1000)
    shard = tmp_path / "s" / "part-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(TokentapeError, match=r"part-00000\.bin: size is 200 bytes.*202"):
        open_source(tmp_path / "s")


def test_open_refuses_an_incomplete_store(tmp_path):
    (tmp_path / "s").mkdir()
    with pytest.raises(TokentapeError, match=r"no manifest\.json"):
        open_source(tmp_path / "s")
    with pytest.raises(TokentapeError, match="no such directory"):
        open_source(tmp_path / "missing")
    (tmp_path / "mix.toml").write_text("seq_len = 8\n")
    for opened in (open_source, read_manifest):  # a file is named as one
        with pytest.raises(TokentapeError, match=r"'.*mix\.toml': not a directory \(a store is"):
            opened(tmp_path / "mix.toml")


def test_manifest_validation_names_the_field(tmp_path):
    write_store(tmp_path / "s", [[1, 2]], shard_tokens=10)
    path = tmp_path / "s" / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["n_docs"] = "one"
    path.write_text(json.dumps(data))
    with pytest.raises(TokentapeError, match="field 'n_docs' is str, expected int"):
        read_manifest(tmp_path / "s")
    data["n_docs"] = 1
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(TokentapeError, match="format_version 99 is not supported"):
        read_manifest(tmp_path / "s")


@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [(257, "uint16"), (65_536, "uint16"), (65_537, "uint32"), (128_256, "uint32")],
)
def test_dtype_rule(vocab, dtype):
    assert choose_dtype(vocab) == dtype


def test_decode_uses_the_stored_tokenizer(tmp_path):
    text = "héllo wörld"
    write_store(tmp_path / "s", [list(text.encode())], shard_tokens=100)
    src = open_source(tmp_path / "s")
    assert src.decode(src.doc(0)) == text


def _window_sums(args: tuple[str, int]) -> list[int]:
    directory, seq_len = args
    src = open_source(directory)
    return [
        int(src.window(k, seq_len).astype(np.int64).sum()) for k in range(src.n_samples(seq_len))
    ]


@pytest.mark.subprocess
@pytest.mark.slow
def test_many_processes_read_one_store_at_once(tmp_path):
    rng = np.random.default_rng(1)
    docs = [list(rng.integers(0, 256, size=int(rng.integers(1, 200)))) for _ in range(200)]
    write_store(tmp_path / "s", docs, shard_tokens=2000)
    expected = _window_sums((str(tmp_path / "s"), 64))
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_window_sums, [(str(tmp_path / "s"), 64)] * 8)
    assert all(r == expected for r in results) and len(expected) > 100


# --- an open store keeps reading what it opened --------------------------------------------


def _views(src, seq_len: int = 7) -> dict:
    """Everything an open store serves: windows, documents, segments, decoded text."""
    n = src.n_samples(seq_len)
    samples = np.arange(n)
    out = np.zeros((n, seq_len + 1), dtype=np.int64)
    src.windows_into(samples, seq_len, out)
    segment, position = np.zeros_like(out), np.zeros_like(out)
    src.segments_into(samples, seq_len, segment, position)
    return {
        "windows": [src.window(k, seq_len).tolist() for k in range(n)],
        "into": out.tolist(),
        "segments": (segment.tolist(), position.tolist()),
        "docs": [src.doc(i).tolist() for i in range(src.n_docs)],
        "docs_in": [src.docs_in(k, seq_len) for k in range(n)],
        "text": src.decode(src.tokens(0, min(40, src.n_tokens))),
    }


@pytest.mark.parametrize("then", ["deleted", "swapped"])
def test_an_open_store_survives_replacement(tmp_path, hf_tokenizer_json, then):
    """`tokenize --overwrite` swaps a new directory in and deletes the old one: a reader that
    opened the old store (its document starts and tokenizer copy not yet read) keeps reading
    the old store's bytes, documents and tokenizer."""
    hf = load_tokenizer(str(hf_tokenizer_json))
    old_docs = [hf.encode(f"old document {i} " * (1 + i % 4)) for i in range(30)]
    new_docs = [hf.encode(f"a new text {i}") for i in range(11)]
    path = tmp_path / "store"
    write_store(path, old_docs, shard_tokens=50, tok=hf)
    expected = _views(open_source(path))
    src = open_source(path)  # nothing beyond the headers read yet
    path.rename(tmp_path / "old")
    if then == "swapped":  # a new store at the path: other documents, other shard layout
        write_store(path, new_docs, shard_tokens=13, tok=hf)
        assert _views(open_source(path)) != expected
    shutil.rmtree(tmp_path / "old")
    assert _views(src) == expected
    assert src.tokenizer.fingerprint == hf.fingerprint


# --- damaged document indexes ----------------------------------------------------------------


def _replace_index(store: Path, shard: int, array: np.ndarray, **save) -> Path:
    """Write ``array`` as shard ``shard``'s .idx.npy and record its size in the manifest (so
    only its content is wrong)."""
    data = json.loads((store / MANIFEST_NAME).read_text())
    path = store / f"{data['shards'][shard]['name']}.idx.npy"
    path.unlink()
    np.save(path, array, **save)
    data["shards"][shard]["idx_bytes"] = path.stat().st_size
    (store / MANIFEST_NAME).write_text(json.dumps(data))
    return path


def _index_cases(n_docs: int, n_tokens: int) -> list[tuple[str, np.ndarray, dict, str]]:
    starts = np.arange(n_docs, dtype=np.int64) * 2
    negative, down, beyond, first = starts.copy(), starts.copy(), starts.copy(), starts.copy()
    negative[1] = -5
    wraps = starts.copy()  # differences that overflow int64 all look positive
    wraps[1:4] = [3 * 2**61, -(2**62), 5]
    down[2], down[3] = down[3], down[2]
    beyond[-1] = n_tokens
    first[0] = 1
    pickled = np.array([{"x": 1}] * n_docs, dtype=object)
    return [
        ("negative", negative, {}, "document 1 starts at -5, not inside the shard's"),
        ("wraps", wraps, {}, f"document 1 starts at {3 * 2**61}, not inside the shard's"),
        ("not ascending", down, {}, "document 3 starts at 4, not after document 2 (6)"),
        ("beyond", beyond, {}, f"document {n_docs - 1} starts at {n_tokens}, not inside"),
        ("first", first, {}, "the first document starts at 1, expected 0"),
        ("int32", starts.astype(np.int32), {}, f"found shape ({n_docs},) dtype int32"),
        ("2-D", starts.reshape(1, -1), {}, f"found shape (1, {n_docs}) dtype int64"),
        ("big-endian", starts.astype(">i8"), {}, "dtype >i8"),
        ("pickled", pickled, {"allow_pickle": True}, "dtype object"),
    ]


@pytest.mark.parametrize("case", range(9))
def test_damaged_document_index_is_one_error_naming_the_file(tmp_path, case):
    docs = [[1, 2, 3]] * 12
    manifest = write_store(tmp_path / "s", docs, shard_tokens=1000)
    shard = manifest.shards[0]
    name, array, save, message = _index_cases(shard.n_docs, shard.n_tokens)[case]
    path = _replace_index(tmp_path / "s", 0, array, **save)
    with pytest.raises(TokentapeError) as info:
        src = open_source(tmp_path / "s")
        src.doc(0)  # the starts are checked when first needed
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, name
    assert text.endswith("the store is damaged (run `tokentape verify`)")


def test_index_that_is_not_npy_is_one_error(tmp_path):
    manifest = write_store(tmp_path / "s", [[1, 2]] * 3, shard_tokens=1000)
    path = tmp_path / "s" / manifest.shards[0].idx_file
    path.write_bytes(
        b"\x93NUMPY\x01\x00" + b"{'descr': <bad" + b" " * (manifest.shards[0].idx_bytes - 22)
    )
    with pytest.raises(TokentapeError, match=r"not a readable \.npy array"):
        open_source(tmp_path / "s")


# --- API misuse names the argument -----------------------------------------------------------


def test_misuse_raises_errors_naming_the_argument(tmp_path):
    write_store(tmp_path / "s", [[1, 2, 3]] * 10, shard_tokens=7)
    src = open_source(tmp_path / "s")
    n = src.n_samples(4)
    out, seg, pos = (np.zeros((1, 5), dtype=np.int64) for _ in range(3))
    cases = [
        (lambda: src.window(-1, 4), OutOfRangeError, f"sample k = -1 is not in [0, {n})"),
        (lambda: src.window(n, 4), OutOfRangeError, f"sample k = {n} is not in [0, {n})"),
        (lambda: src.window(1.5, 4), ArgumentError, "k must be an integer, got 1.5"),
        (lambda: src.window(0, 0), ArgumentError, "seq_len must be a positive integer, got 0"),
        (lambda: src.window(0, True), ArgumentError, "seq_len must be a positive integer"),
        (lambda: src.doc(-1), OutOfRangeError, "document i = -1 is not in [0, 10)"),
        (lambda: src.doc(10), OutOfRangeError, "document i = 10 is not in [0, 10)"),
        (lambda: src.doc_span("0"), ArgumentError, "i must be an integer, got '0'"),
        (lambda: src.docs_in(-1, 4), OutOfRangeError, "sample k = -1"),
        (lambda: src.tokens(5, 3), OutOfRangeError, "[start, stop) = [5, 3) is not inside"),
        (lambda: src.tokens(-1, 3), OutOfRangeError, "[start, stop) = [-1, 3)"),
        (lambda: src.tokens(0, 41), OutOfRangeError, "[start, stop) = [0, 41)"),
        (lambda: src.windows_into([n], 4, out), OutOfRangeError, f"samples: {n} is not in"),
        (lambda: src.windows_into([-2], 4, out), OutOfRangeError, "samples: -2 is not in"),
        (lambda: src.windows_into([0.5], 4, out), ArgumentError, "samples must be integers"),
        (lambda: src.windows_into([0], 3, out), ArgumentError, "out must have rows of"),
        (lambda: src.windows_into([0], 4, out, [0, 1]), ArgumentError, "rows must have one"),
        (lambda: src.segments_into([-1], 4, seg, pos), OutOfRangeError, "samples: -1 is not"),
        (lambda: src.segments_into([n], 4, seg, pos), OutOfRangeError, f"samples: {n} is not"),
        (lambda: src.segments_into([0, 1], 4, seg, pos), ArgumentError, "segment must have"),
    ]
    cases.append((lambda: open_source(None), ArgumentError, "path must be a path, got None"))
    for call, kind, message in cases:
        with pytest.raises(kind) as info:
            call()
        assert message in str(info.value), message
        assert isinstance(info.value, ValueError | IndexError)  # what callers caught before


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"eod_id": 257}, "eod_id 257 is not below vocab_size 257"),
        ({"content_hash": "sha256:" + "0" * 64}, "does not follow from the shard records"),
    ],
)
def test_an_edited_manifest_is_refused_at_open_and_reported_by_verify(tmp_path, edit, message):
    """What verify reports as a problem (exit 1), opening refuses: a content hash that does
    not follow from the shard records (a plan's index hash would trust it) and an EOD id
    outside the vocabulary."""
    write_store(tmp_path / "s", [[1, 2, 3]] * 10, shard_tokens=7)
    path = tmp_path / "s" / MANIFEST_NAME
    path.write_text(json.dumps(json.loads(path.read_text()) | edit))
    with pytest.raises(TokentapeError) as info:
        open_source(tmp_path / "s")
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)
    with pytest.raises(TokentapeError, match=message):
        read_manifest(tmp_path / "s")
    assert not check_store(tmp_path / "s").ok


def test_a_tokenizer_copy_missing_at_open_is_never_read_later(tmp_path, hf_tokenizer_json):
    """Tokens read without the tokenizer; asking for it names the missing copy, even once a
    file appears there (the store seen is the one opened)."""
    hf = load_tokenizer(str(hf_tokenizer_json))
    write_store(tmp_path / "s", [hf.encode("some text")] * 3, shard_tokens=50, tok=hf)
    copy = tmp_path / "s" / "tokenizer.json"
    data = copy.read_bytes()
    copy.unlink()
    src = open_source(tmp_path / "s")
    assert src.doc(0).tolist() == hf.encode("some text")
    copy.write_bytes(data)
    with pytest.raises(TokentapeError) as info:
        _ = src.tokenizer
    assert str(info.value) == (
        f"{copy}: the tokenizer copy the manifest names was missing when the store was opened"
    )
    assert open_source(tmp_path / "s").tokenizer.fingerprint == hf.fingerprint


@pytest.mark.parametrize("shard_tokens", [0, -5, 2.5, True, "8"])
def test_shard_writer_names_a_bad_shard_size(tmp_path, shard_tokens):
    with pytest.raises(ArgumentError, match="shard_tokens must be a positive integer"):
        ShardWriter(tmp_path, "uint16", shard_tokens)
    assert list(tmp_path.iterdir()) == []


def test_shard_writer_refuses_lengths_that_do_not_add_up(tmp_path):
    writer = ShardWriter(tmp_path, "uint16", 100)
    with pytest.raises(ArgumentError, match="lengths add up to 5 tokens, tokens has 4"):
        writer.add(np.arange(4), np.array([2, 3]))
